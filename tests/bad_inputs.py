"""The bad-input corpus: messages the node must refuse, as data plus message builders.

Each `BadCase` names the input topic, the reason key the node counts (`rejected.<reason>` in
/diagnostics) and a builder `build(ctx) -> list[msg]` that makes the offending message(s) from a
good frame and the current time. The corpus assumes the node runs with `CORPUS_PARAMS` (limits
small enough that "too large" cases stay cheap to send). Reusable by any test that can publish:

    from tests.bad_inputs import CASES, CORPUS_PARAMS, Ctx
    for case in CASES:
        for msg in case.build(Ctx(stamp_ns=now, last_good_stamp_ns=prev, image_rgb=img)):
            publishers[case.topic].publish(msg)

"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

TOPICS = {"image": "camera/image_raw", "compressed": "camera/image_raw/compressed",
          "joints": "joint_states", "wrench": "wrench", "conveyor": "conveyor/joint_states"}

MAX_IMAGE_PIXELS = 640 * 480
MAX_COMPRESSED_BYTES = 256 * 1024

# Node parameters the corpus is written against (flat ROS names).
CORPUS_PARAMS = {
    "inputs.max_image_pixels": MAX_IMAGE_PIXELS,
    "inputs.max_compressed_bytes": MAX_COMPRESSED_BYTES,
    "inputs.max_joint_abs": 1000.0,
    "inputs.max_wrench_abs": 10000.0,
    "inputs.max_belt_speed_mps": 10.0,
    "deadline.max_staleness_ms": 1000.0,
    "deadline.max_future_ms": 20.0,
}


@dataclass(frozen=True)
class Ctx:
    stamp_ns: int  # "now" on the ROS clock
    last_good_stamp_ns: int  # stamp of the last good frame the node accepted
    image_rgb: np.ndarray  # [H, W, 3] uint8, a good frame
    frame_id: str = "qc_camera"


@dataclass(frozen=True)
class BadCase:
    name: str
    topic: str  # key of TOPICS
    reason: str  # counted as rejected.<reason>
    build: Callable[[Ctx], list]
    what: str  # one line for docs/RELIABILITY.md
    min_count: int = 1  # rejections the case must add at least (bursts may lose samples in DDS)


# -- message builders -------------------------------------------------------------------------------
def stamp(ns: int):
    from builtin_interfaces.msg import Time

    return Time(sec=int(ns // NS_PER_S), nanosec=int(ns % NS_PER_S))


def good_image(ctx: Ctx, encoding: str = "rgb8"):
    from sol_control.ros.convert import image_to_ros

    return image_to_ros(ctx.image_rgb, ctx.stamp_ns, ctx.frame_id, encoding)


def _image(ctx: Ctx, **fields):
    msg = good_image(ctx)
    for k, v in fields.items():
        if k == "stamp_ns":
            msg.header.stamp = stamp(v)
        else:
            setattr(msg, k, v)
    return msg


def encoded(ctx: Ctx, kind: str) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png" if kind == "png" else ".jpg", np.ascontiguousarray(ctx.image_rgb[..., ::-1]))
    assert ok
    return buf.tobytes()


def compressed(ctx: Ctx, data: bytes, fmt: str):
    from sensor_msgs.msg import CompressedImage

    msg = CompressedImage(format=fmt)
    msg.header.stamp = stamp(ctx.stamp_ns)
    msg.header.frame_id = ctx.frame_id
    msg.data = data
    return msg


def png_claiming(ctx: Ctx, width: int, height: int) -> bytes:
    """A real PNG whose IHDR says width x height (a decompression bomb as far as headers go)."""
    data = bytearray(encoded(ctx, "png"))
    data[16:20], data[20:24] = width.to_bytes(4, "big"), height.to_bytes(4, "big")
    return bytes(data)


def scaled_jpeg(ctx: Ctx, width: int, height: int) -> bytes:
    """The good frame scaled up to width x height, as a JPEG of a few tens of kB."""
    import cv2

    big = cv2.resize(np.ascontiguousarray(ctx.image_rgb[..., ::-1]), (width, height), interpolation=cv2.INTER_NEAREST)
    return cv2.imencode(".jpg", big, [cv2.IMWRITE_JPEG_QUALITY, 80])[1].tobytes()


def joints(ctx: Ctx, position, velocity=(), names=None):
    from sensor_msgs.msg import JointState

    pos = [float(x) for x in position]
    msg = JointState(name=list(names if names is not None else [f"joint{i + 1}" for i in range(len(pos))]),
                     position=pos, velocity=[float(x) for x in velocity])
    msg.header.stamp = stamp(ctx.stamp_ns)
    return msg


def wrench(ctx: Ctx, force=(0.0, 0.0, 0.0), torque=(0.0, 0.0, 0.0)):
    from geometry_msgs.msg import WrenchStamped

    msg = WrenchStamped()
    msg.header.stamp = stamp(ctx.stamp_ns)
    msg.header.frame_id = "tool0"
    (msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z) = (float(x) for x in force)
    (msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z) = (float(x) for x in torque)
    return msg


def conveyor(ctx: Ctx, position=(1.0,), velocity=(0.2,)):
    from sensor_msgs.msg import JointState

    msg = JointState(name=["belt"][: len(position)], position=[float(x) for x in position],
                     velocity=[float(x) for x in velocity])
    msg.header.stamp = stamp(ctx.stamp_ns)
    return msg


def _one(fn: Callable[[Ctx], object]) -> Callable[[Ctx], list]:
    return lambda ctx: [fn(ctx)]


def _w(ctx: Ctx) -> int:
    return ctx.image_rgb.shape[1]


def _h(ctx: Ctx) -> int:
    return ctx.image_rgb.shape[0]


# -- the corpus --------------------------------------------------------------------------------------
CASES: list[BadCase] = [
    # raw images: encoding
    BadCase("encoding_yuv422", "image", "encoding_unsupported", _one(lambda c: _image(c, encoding="yuv422_yuy2")),
            "encoding yuv422_yuy2 (not rgb8/bgr8/mono8/rgba8/bgra8)"),
    BadCase("encoding_empty", "image", "encoding_unsupported", _one(lambda c: _image(c, encoding="")),
            "empty encoding string"),
    BadCase("encoding_16uc1", "image", "encoding_unsupported", _one(lambda c: _image(c, encoding="16UC1")),
            "depth encoding 16UC1"),
    BadCase("encoding_case", "image", "encoding_unsupported", _one(lambda c: _image(c, encoding="RGB8")),
            "encoding in the wrong case (RGB8)"),
    # raw images: geometry and size
    BadCase("step_too_small", "image", "step_mismatch", _one(lambda c: _image(c, step=_w(c) * 3 - 1)),
            "step one byte shorter than width * 3"),
    BadCase("step_zero", "image", "step_mismatch", _one(lambda c: _image(c, step=0, data=b"")),
            "step 0 with no data"),
    BadCase("rgba_with_rgb_step", "image", "step_mismatch", _one(lambda c: _image(c, encoding="rgba8")),
            "rgba8 label on rgb8 rows (step = width * 3 < width * 4)"),
    BadCase("data_too_long", "image", "size_mismatch",
            _one(lambda c: _image(c, data=bytes(good_image(c).data) + b"\x00" * 7)), "7 extra bytes after the rows"),
    BadCase("mono_label_rgb_data", "image", "size_mismatch",
            _one(lambda c: _image(c, encoding="mono8", step=_w(c))), "mono8 label on rgb8 data (3x the bytes)"),
    BadCase("truncated_half", "image", "truncated_data",
            _one(lambda c: _image(c, data=bytes(good_image(c).data)[: _w(c) * _h(c) * 3 // 2])), "half the rows"),
    BadCase("no_data", "image", "truncated_data", _one(lambda c: _image(c, data=b"")),
            "valid header, zero data bytes"),
    BadCase("empty_image", "image", "empty_image", _one(lambda c: _image(c, height=0, width=0, step=0, data=b"")),
            "0 x 0 image"),
    BadCase("zero_width", "image", "empty_image", _one(lambda c: _image(c, width=0, step=0, data=b"")),
            "width 0, height > 0"),
    BadCase("too_many_pixels", "image", "too_many_pixels",
            _one(lambda c: _image(c, height=800, width=800, step=2400, data=bytes(800 * 800 * 3))),
            "800 x 800 rgb8 > max_image_pixels 640*480"),
    BadCase("huge_dims_small_data", "image", "too_many_pixels",
            _one(lambda c: _image(c, height=100_000, width=100_000, step=300_000)),
            "header claims 100000 x 100000 (no allocation may follow)"),
    # stamps (raw images)
    BadCase("stamp_future", "image", "stamp_future", _one(lambda c: _image(c, stamp_ns=c.stamp_ns + 60 * NS_PER_S)),
            "stamp 60 s in the future"),
    BadCase("stamp_future_small", "image", "stamp_future",
            _one(lambda c: _image(c, stamp_ns=c.stamp_ns + 500 * NS_PER_MS)), "stamp 0.5 s ahead (> max_future_ms 20)"),
    BadCase("stamp_ancient", "image", "stale", _one(lambda c: _image(c, stamp_ns=NS_PER_S)),
            "stamp 1 s after the epoch"),
    BadCase("stamp_stale", "image", "stale", _one(lambda c: _image(c, stamp_ns=c.stamp_ns - 5 * NS_PER_S)),
            "stamp 5 s old (> max_staleness_ms 1000)"),
    BadCase("stamp_zero", "image", "stamp_zero", _one(lambda c: _image(c, stamp_ns=0)), "stamp 0 (unset header)"),
    BadCase("stamp_out_of_order", "image", "stamp_out_of_order",
            _one(lambda c: _image(c, stamp_ns=c.last_good_stamp_ns - 50 * NS_PER_MS)),
            "stamp 50 ms before the last accepted frame"),
    BadCase("stamp_duplicate", "image", "stamp_out_of_order",
            _one(lambda c: _image(c, stamp_ns=c.last_good_stamp_ns)), "same stamp as the last accepted frame"),
    # compressed images
    BadCase("jpeg_header_then_zeros", "compressed", "corrupt_compressed",
            _one(lambda c: compressed(c, b"\xff\xd8\xff\xe0" + bytes(200), "jpeg")), "JPEG SOI + 200 zero bytes"),
    BadCase("jpeg_truncated", "compressed", "corrupt_compressed",
            _one(lambda c: compressed(c, encoded(c, "jpeg")[:len(encoded(c, "jpeg")) // 2], "jpeg")),
            "first half of a real JPEG"),
    BadCase("png_truncated", "compressed", "corrupt_compressed",
            _one(lambda c: compressed(c, encoded(c, "png")[:len(encoded(c, "png")) // 2], "png")),
            "first half of a real PNG"),
    BadCase("png_signature_garbage", "compressed", "corrupt_compressed",
            _one(lambda c: compressed(c, b"\x89PNG\r\n\x1a\n" + bytes(100), "png")), "PNG signature + zeros"),
    BadCase("png_labelled_jpeg", "compressed", "corrupt_compressed",
            _one(lambda c: compressed(c, encoded(c, "png"), "rgb8; jpeg compressed bgr8")),
            "PNG bytes in a message whose format says jpeg"),
    BadCase("format_tiff", "compressed", "format_unsupported",
            _one(lambda c: compressed(c, encoded(c, "png"), "tiff")), "format 'tiff'"),
    BadCase("compressed_empty", "compressed", "empty_image", _one(lambda c: compressed(c, b"", "png")),
            "zero compressed bytes"),
    BadCase("compressed_too_many_bytes", "compressed", "too_many_bytes",
            _one(lambda c: compressed(c, b"\xff\xd8" + bytes(MAX_COMPRESSED_BYTES + 1000), "jpeg")),
            "over max_compressed_bytes 256 KiB"),
    BadCase("png_bomb_header", "compressed", "too_many_pixels",
            _one(lambda c: compressed(c, png_claiming(c, 60_000, 60_000), "png")),
            "PNG IHDR claims 60000 x 60000 (refused before decoding)"),
    BadCase("jpeg_over_max_image_pixels", "compressed", "too_many_pixels",
            _one(lambda c: compressed(c, scaled_jpeg(c, 800, 800), "jpeg")),
            "a real 800 x 800 JPEG (under max_compressed_bytes) > max_image_pixels 640*480"),
    # joints
    BadCase("joints_nan", "joints", "joints_nonfinite", _one(lambda c: joints(c, [0.1, math.nan])), "NaN position"),
    BadCase("joints_inf_velocity", "joints", "joints_nonfinite",
            _one(lambda c: joints(c, [0.1, 0.2], velocity=[0.0, -math.inf])), "-inf velocity"),
    BadCase("joints_huge", "joints", "joints_out_of_range", _one(lambda c: joints(c, [1e12, 0.0])),
            "position 1e12 (> max_joint_abs 1000)"),
    BadCase("joints_names_mismatch", "joints", "joints_length_mismatch",
            _one(lambda c: joints(c, [0.1], names=["j1", "j2"])), "2 names, 1 position"),
    BadCase("joints_velocity_mismatch", "joints", "joints_length_mismatch",
            _one(lambda c: joints(c, [0.1, 0.2, 0.3], velocity=[0.0])), "3 positions, 1 velocity"),
    BadCase("joints_empty", "joints", "joints_empty", _one(lambda c: joints(c, [], names=[])), "no positions"),
    # wrench
    BadCase("wrench_nan_force", "wrench", "wrench_nonfinite", _one(lambda c: wrench(c, force=(0, 0, math.nan))),
            "NaN force z"),
    BadCase("wrench_inf_torque", "wrench", "wrench_nonfinite", _one(lambda c: wrench(c, torque=(math.inf, 0, 0))),
            "inf torque x"),
    BadCase("wrench_huge", "wrench", "wrench_out_of_range", _one(lambda c: wrench(c, force=(1e9, 0, 0))),
            "force 1e9 N (> max_wrench_abs)"),
    # conveyor
    BadCase("conveyor_empty", "conveyor", "conveyor_empty", _one(lambda c: conveyor(c, (), ())),
            "no position / velocity"),
    BadCase("conveyor_nan", "conveyor", "conveyor_nonfinite", _one(lambda c: conveyor(c, (math.nan,), (0.2,))),
            "NaN belt position"),
    BadCase("conveyor_too_fast", "conveyor", "conveyor_out_of_range", _one(lambda c: conveyor(c, (1.0,), (1000.0,))),
            "belt at 1000 m/s (> max_belt_speed_mps 10)"),
    # bursts
    BadCase("burst_bad_images", "image", "step_mismatch",
            lambda c: [_image(c, step=_w(c) * 3 - 1) for _ in range(50)],
            "50 bad images back to back (DDS keep-last-1 may drop some)", min_count=1),
    BadCase("burst_nan_joints", "joints", "joints_nonfinite",
            lambda c: [joints(c, [math.nan] * 6) for _ in range(50)], "50 NaN joint states back to back",
            min_count=1),
]

# Inputs that are not refused by design (documented in docs/RELIABILITY.md, checked by tests):
# - a missing side stream (no conveyor, no joints): decided; QC eject_time = 0 ("unknown").
# - side-stream stamps (joints, wrench, conveyor) are not checked against the clock; their
#   freshness is judged by arrival time (max_staleness_ms) in the latest-value slots.


def by_reason() -> dict[str, int]:
    """Minimum rejections per reason the whole corpus must produce."""
    out: dict[str, int] = {}
    for c in CASES:
        out[c.reason] = out.get(c.reason, 0) + c.min_count
    return out
