"""The ROS-free co-processor: telemetry slots, compressed images, eject time, and `step` on the
shipped bundles (real perception, real ONNX Runtime sessions)."""
import math
import threading
import time

import cv2
import numpy as np
import pytest

from sol_control.budget import Budget, ManualClock
from sol_control.config import from_flat
from sol_control.coprocessor import Coprocessor, eject_time_ns
from sol_control.telemetry import Conveyor, Frame, InputRejected, LatestSlot, Telemetry, decode_compressed
from tests.ros_helpers import bundle_params
from tests.waiting import wait_for

S = 1_000_000_000


def test_eject_time():
    # belt at 2.0 m moving 0.5 m/s, read 0.2 s after the image: the part passed the camera at
    # belt position 1.9 m and reaches the ejector (0.6 m on) at 2.5 m, i.e. 1.2 s after the image
    c = Conveyor(position_m=2.0, velocity_mps=0.5, stamp_ns=10 * S + S // 5)
    assert eject_time_ns(10 * S, c, 0.6) == pytest.approx(10 * S + int(1.2 * S), abs=1000)
    assert eject_time_ns(10 * S, Conveyor(2.0, 0.0, 10 * S), 0.6) == 0  # stopped belt: unknown
    assert eject_time_ns(10 * S, Conveyor(2.0, -0.5, 10 * S), 0.6) == 0
    assert eject_time_ns(10 * S, None, 0.6) == 0


def test_latest_slot_keeps_only_the_newest():
    clock = ManualClock()
    slot: LatestSlot[int] = LatestSlot(clock)
    for i in range(5):
        slot.put(i)
    assert slot.superseded == 4 and slot.peek() == 4
    assert slot.take() == 4 and slot.take() is None
    slot.put(7)
    clock.advance_ms(20.0)
    assert slot.peek(max_age_ms=19.9) is None and slot.peek(max_age_ms=20.0) == 7
    # a polled sample ages from when it arrived, not from when it was taken
    slot.put(8, arrived_mono_ns=clock.now_ns() - 50_000_000)
    assert slot.peek(max_age_ms=49.9) is None and slot.peek(max_age_ms=50.0) == 8


def test_latest_slot_wakes_a_waiting_taker():
    slot: LatestSlot[str] = LatestSlot()
    got = []
    t = threading.Thread(target=lambda: got.append(slot.take(timeout_s=5.0)))
    t.start()
    assert wait_for(lambda: slot._ready._waiters, 5.0)  # the taker waits on the slot's condition
    slot.put("frame")
    t.join(2.0)
    assert got == ["frame"]


@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_decode_compressed_round_trip(kind):
    rgb = np.zeros((40, 60, 3), np.uint8)
    rgb[:, :30] = (200, 30, 10)
    ok, buf = cv2.imencode(".png" if kind == "png" else ".jpg", rgb[..., ::-1])
    out = decode_compressed(buf.tobytes(), kind)
    assert out.shape == (40, 60, 3)
    err = np.abs(out.astype(int) - rgb)
    assert (err.max() == 0) if kind == "png" else (err.mean() < 3.0)


def test_decode_compressed_refuses_bad_data():
    with pytest.raises(InputRejected) as e:
        decode_compressed(b"\x89PNG\r\n\x1a\n" + bytes(50), "png")
    assert e.value.reason == "corrupt_compressed"
    with pytest.raises(InputRejected) as e:
        decode_compressed(b"GIF89a....", "gif")
    assert e.value.reason == "format_unsupported"
    # a PNG whose header claims 100000 x 100000 pixels is refused before decoding
    head = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + (100000).to_bytes(4, "big") * 2 + bytes(20)
    with pytest.raises(InputRejected) as e:
        decode_compressed(head, "png", max_pixels=4_000_000)
    assert e.value.reason == "too_many_pixels"


BUNDLES = bundle_params()
assert BUNDLES is not None, "the shipped bundles models/qc and models/grasp are part of the repository"


@pytest.fixture(scope="module")
def cop():
    cfg = from_flat({**BUNDLES, "audit_rate": 0.0, "deadline.qc_ms": 500.0, "deadline.grasp_ms": 500.0,
                     "decoding.warmup_runs": 2})
    c = Coprocessor(cfg)
    c.warmup()
    yield c
    c.close()


def _telemetry(image, joints=None) -> Telemetry:
    from sol_control.telemetry import Joints

    j = Joints(tuple(f"joint{i}" for i in range(6)), joints, np.zeros(0), 1) if joints is not None else None
    return Telemetry(Frame(image, 123, time.monotonic_ns(), "cam"), joints=j)


def test_qc_step_decides_test_parts(cop):
    from sol_control.tasks.qc import make_sample

    decisions = []
    for i in range(6):
        s = make_sample("test", i)
        d = cop.step(_telemetry(s.image), task="qc")
        assert d.task == "qc" and d.stamp_ns == 123 and d.frame_id == "cam" and d.latency_ms > 0
        decisions.append((d, s.label["defect"]))
    assert sum(d.source == "fast" for d, _ in decisions) >= 4, [(d.source, d.reason) for d, _ in decisions]
    fast = [(d, label) for d, label in decisions if d.source == "fast"]
    assert sum(d.action.defect == label for d, label in fast) >= len(fast) - 1


def test_grasp_step_decides_inside_limits(cop):
    from sol_control.actions import limit_violations
    from sol_control.tasks.grasp import make_sample

    for i in range(3):
        s = make_sample("test", i)
        d = cop.step(_telemetry(s.image, s.joints_rad), task="grasp")
        if d.source != "safe_default":
            assert limit_violations(d.action, cop.config().limits) == []
            assert abs(d.action.x_m - s.label["x"]) < 0.02, (d.action, s.label)


@pytest.mark.parametrize("task", ["qc", "grasp"])
def test_the_warm_up_frame_runs_every_stage_of_perception(cop, task):
    """warmup() measures a noise frame first (the first frame's perception costs 10-14 ms more than
    the next): it must not be rejected early, or the later stages would stay cold."""
    p = cop.pipelines[task]
    image, joints = p.warmup_frame()
    prefix = p.observation.encode(image, joints)
    assert len(prefix) == p.bundle.manifest.observation["prefix_len"]
    assert np.array_equal(p.warmup_frame()[0], image)  # seeded: the same frame every start


def test_unusable_image_is_rejected_not_decided(cop):
    blank = np.empty((128, 128, 3), np.uint8)
    blank[:] = (58, 62, 66)  # belt only, no part
    with pytest.raises(InputRejected) as e:
        cop.step(_telemetry(blank), task="qc")
    assert e.value.reason == "image_unusable"


def test_expired_budget_gives_safe_default(cop):
    from sol_control.tasks.qc import make_sample

    tel = _telemetry(make_sample("test", 0).image)
    d = cop.step(tel, Budget.after_ms(0.001), task="qc")
    assert d.source == "safe_default" and not d.deadline_met and math.isnan(d.action.u)
