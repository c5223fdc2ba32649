"""ROS messages <-> core types, in pairs (`x_from_ros` / `x_to_ros`) tested by round trip.

Inputs are validated here; anything the node will not decide on raises InputRejected with a short
reason key that /diagnostics counts. Images: `np.frombuffer(msg.data)` to read (no copy), `bytes`
to write (`msg.data = ndarray` costs ~60 ms for 640x480 in rclpy, bytes ~0.1 ms).

QC verdicts and grasp decisions travel as diagnostic_msgs/DiagnosticStatus (see docs/ROS_INTERFACE.md):
level OK = pass / grasp, WARN = uncertain / hold, ERROR = reject; key-values carry the fields.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from geometry_msgs.msg import Pose, PoseArray, PoseStamped
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Header

from sol_control.actions import GraspDecision, QCVerdict
from sol_control.budget import NS_PER_MS, NS_PER_S
from sol_control.decision import STAGE_FIELDS, Decision, Failure
from sol_control.telemetry import InputRejected, compressed_kind

CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4, "bgra8": 4}
GRIPPER_JOINT = "sol_control_gripper"
LEVEL = {"pass": DiagnosticStatus.OK, "uncertain": DiagnosticStatus.WARN, "reject": DiagnosticStatus.ERROR}
QC_STATUS_NAME = "sol_control/qc"
GRASP_STATUS_NAME = "sol_control/grasp"


# -- time -----------------------------------------------------------------------------------------
def stamp_to_ros(stamp_ns: int) -> Time:
    return Time(sec=int(stamp_ns // NS_PER_S), nanosec=int(stamp_ns % NS_PER_S))


def stamp_from_ros(t: Time) -> int:
    return int(t.sec) * NS_PER_S + int(t.nanosec)


def budget_start_ns(stamp_ns: int, now_ns: int, recv_mono_ns: int, last_stamp_ns: int, max_future_ms: float,
                    max_staleness_ms: float, transport_ns: int = 0) -> int:
    """A frame's budget start on the monotonic clock, or InputRejected (zero, future, stale, or not
    newer than the last admitted stamp). `now_ns` = the node's clock (ROS time) at receipt.

    Under sim time the host clock only moves with /clock, so the DDS transport time (source timestamp
    to now, system clock) is taken as the age when it is larger: a budget never starts after the frame
    was sent. Before the first /clock the clock reads 0 (a respawned node can get a frame first):
    then the transport time is the only age there is."""
    age_ns = now_ns - stamp_ns if now_ns else transport_ns
    if stamp_ns == 0:
        raise InputRejected("stamp_zero")
    if age_ns < -max_future_ms * NS_PER_MS:
        raise InputRejected("stamp_future", f"{-age_ns / NS_PER_MS:.1f} ms ahead")
    if age_ns > max_staleness_ms * NS_PER_MS:
        raise InputRejected("stale", f"{age_ns / NS_PER_MS:.1f} ms old")
    if stamp_ns <= last_stamp_ns:
        raise InputRejected("stamp_out_of_order", f"{stamp_ns} <= {last_stamp_ns}")
    return recv_mono_ns - max(age_ns, transport_ns, 0)


def header(stamp_ns: int, frame_id: str) -> Header:
    return Header(stamp=stamp_to_ros(stamp_ns), frame_id=frame_id)


# -- images ---------------------------------------------------------------------------------------
def image_from_ros(msg: Image, max_pixels: int) -> np.ndarray:
    """sensor_msgs/Image (rgb8, bgr8, mono8, rgba8, bgra8) -> [H, W, 3] uint8 RGB."""
    ch = CHANNELS.get(msg.encoding)
    if ch is None:
        raise InputRejected("encoding_unsupported", repr(msg.encoding))
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h == 0 or w == 0:
        raise InputRejected("empty_image", f"{w}x{h}")
    if h * w > max_pixels:
        raise InputRejected("too_many_pixels", f"{w}x{h} > {max_pixels}")
    if step < w * ch:
        raise InputRejected("step_mismatch", f"step {step} < width {w} * {ch} channels")
    n = len(msg.data)
    if n != step * h:
        raise InputRejected("truncated_data" if n < step * h else "size_mismatch",
                            f"{n} bytes, step*height = {step * h}")
    arr = np.frombuffer(msg.data, np.uint8).reshape(h, step)[:, : w * ch].reshape(h, w, ch)  # [H, W, C]
    if msg.encoding == "rgb8":
        return arr
    if msg.encoding == "bgr8":
        return np.ascontiguousarray(arr[..., ::-1])
    if msg.encoding == "mono8":
        return np.repeat(arr, 3, axis=2)
    if msg.encoding == "rgba8":
        return np.ascontiguousarray(arr[..., :3])
    return np.ascontiguousarray(arr[..., 2::-1])  # bgra8


def image_to_ros(rgb: np.ndarray, stamp_ns: int, frame_id: str = "camera", encoding: str = "rgb8") -> Image:
    """[H, W, 3] uint8 RGB -> sensor_msgs/Image in `encoding`."""
    assert rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.dtype == np.uint8, rgb.shape
    if encoding == "rgb8":
        px = rgb
    elif encoding == "bgr8":
        px = rgb[..., ::-1]
    elif encoding == "mono8":
        px = rgb[..., :1]
    elif encoding == "rgba8":
        px = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
    elif encoding == "bgra8":
        px = np.concatenate([rgb[..., ::-1], np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
    else:
        raise ValueError(f"encoding must be one of {sorted(CHANNELS)}, got {encoding!r}")
    h, w, ch = px.shape
    msg = Image(header=header(stamp_ns, frame_id), height=h, width=w, encoding=encoding,
                is_bigendian=0, step=w * ch)
    msg.data = np.ascontiguousarray(px).tobytes()
    return msg


def compressed_from_ros(msg: CompressedImage, max_bytes: int) -> tuple[bytes, str]:
    """CompressedImage -> (jpeg/png bytes, kind); decoding happens on the worker thread."""
    kind = compressed_kind(msg.format)
    if not kind:
        raise InputRejected("format_unsupported", repr(msg.format))
    n = len(msg.data)
    if n == 0:
        raise InputRejected("empty_image", "no compressed bytes")
    if n > max_bytes:
        raise InputRejected("too_many_bytes", f"{n} > {max_bytes}")
    return bytes(msg.data), kind


def compressed_to_ros(rgb: np.ndarray, stamp_ns: int, frame_id: str = "camera", kind: str = "jpeg",
                      quality: int = 95) -> CompressedImage:
    import cv2

    ext, params = (".png", []) if kind == "png" else (".jpg", [cv2.IMWRITE_JPEG_QUALITY, quality])
    ok, buf = cv2.imencode(ext, np.ascontiguousarray(rgb[..., ::-1]), params)
    assert ok, kind
    msg = CompressedImage(header=header(stamp_ns, frame_id), format=f"rgb8; {kind} compressed bgr8")
    msg.data = buf.tobytes()
    return msg


# -- decisions ------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return repr(float(x))


def _common_values(d: Decision) -> list[KeyValue]:
    return [KeyValue(key="confidence", value=_fmt(d.action.confidence)),
            KeyValue(key="source", value=d.source),
            KeyValue(key="reason", value=d.reason),
            KeyValue(key="latency_ms", value=f"{d.latency_ms:.4f}"),
            KeyValue(key="deadline_ms", value=_fmt(d.deadline_ms)),
            KeyValue(key="deadline_met", value="true" if d.deadline_met else "false"),
            KeyValue(key="stamp", value=str(int(d.stamp_ns))),
            KeyValue(key="frame_id", value=d.frame_id),
            *(KeyValue(key=k, value=f"{getattr(d, k):.4f}") for k in STAGE_FIELDS),
            KeyValue(key="cpu_ms", value=f"{d.cpu_ms:.4f}"),
            KeyValue(key="policy_overruled", value="true" if d.policy_overruled else "false"),
            KeyValue(key="bundle_sha256", value=d.bundle_sha256)]


def decision_to_status(d: Decision) -> DiagnosticStatus:
    """A QC verdict or a grasp decision as one DiagnosticStatus (the published decision record)."""
    a = d.action
    if isinstance(a, QCVerdict):
        values = [KeyValue(key="verdict", value=a.verdict), KeyValue(key="defect", value=a.defect),
                  KeyValue(key="u", value=_fmt(a.u)), KeyValue(key="v", value=_fmt(a.v)),
                  KeyValue(key="severity", value=_fmt(a.severity)),
                  KeyValue(key="eject_time", value=str(int(d.eject_time_ns)))]
        message = a.verdict if a.defect in ("ok", "unknown") else f"{a.verdict}: {a.defect}"
        return DiagnosticStatus(level=LEVEL[a.verdict], name=QC_STATUS_NAME, message=message,
                                hardware_id=d.frame_id, values=values + _common_values(d))
    values = [KeyValue(key="hold", value="true" if a.hold else "false"),
              KeyValue(key="x", value=_fmt(a.x_m)), KeyValue(key="y", value=_fmt(a.y_m)),
              KeyValue(key="z", value=_fmt(a.z_m)), KeyValue(key="yaw", value=_fmt(a.yaw_rad)),
              KeyValue(key="width", value=_fmt(a.width_m)), KeyValue(key="force", value=_fmt(a.force_n)),
              KeyValue(key="approach", value=";".join(",".join(_fmt(c) for c in p) for p in a.approach_m))]
    return DiagnosticStatus(level=DiagnosticStatus.WARN if a.hold else DiagnosticStatus.OK, name=GRASP_STATUS_NAME,
                            message="hold" if a.hold else "grasp", hardware_id=d.frame_id,
                            values=values + _common_values(d))


def decision_from_status(s: DiagnosticStatus) -> Decision:
    """The inverse of decision_to_status; ValueError for a status that is not a decision record."""
    if s.name not in (QC_STATUS_NAME, GRASP_STATUS_NAME):
        raise ValueError(f"not a sol_control decision status: name {s.name!r}")
    try:
        return _decision_from_kv(s.name, {v.key: v.value for v in s.values})
    except KeyError as e:
        raise ValueError(f"{s.name} status without key {e}") from None


def _decision_from_kv(name: str, kv: dict[str, str]) -> Decision:
    conf = float(kv["confidence"])
    if name == QC_STATUS_NAME:
        task = "qc"
        action = QCVerdict(kv["defect"], kv["verdict"], float(kv["u"]), float(kv["v"]), float(kv["severity"]), conf)
    else:
        task = "grasp"
        approach = tuple(tuple(float(c) for c in p.split(",")) for p in kv["approach"].split(";") if p)
        action = GraspDecision(float(kv["x"]), float(kv["y"]), float(kv["z"]), float(kv["yaw"]),
                               float(kv["width"]), float(kv["force"]), approach, conf, hold=kv["hold"] == "true")
    fast_failure, _, full_failure = kv["reason"].partition(">")
    return Decision(task, action, kv["source"], float(kv["latency_ms"]), float(kv["deadline_ms"]),
                    kv["deadline_met"] == "true", int(kv["stamp"]), kv["frame_id"],
                    fast_failure=Failure.parse(fast_failure), full_failure=Failure.parse(full_failure),
                    eject_time_ns=int(kv.get("eject_time", "0")), cpu_ms=float(kv.get("cpu_ms", "nan")),
                    policy_overruled=kv.get("policy_overruled") == "true", bundle_sha256=kv.get("bundle_sha256", ""),
                    **{k: float(kv.get(k, "nan")) for k in STAGE_FIELDS})


@dataclass(frozen=True)
class GraspMessages:
    pose: PoseStamped
    gripper: JointState
    approach: PoseArray


def _pose(x: float, y: float, z: float, yaw: float) -> Pose:
    p = Pose()
    p.position.x, p.position.y, p.position.z = float(x), float(y), float(z)
    p.orientation.z, p.orientation.w = math.sin(yaw / 2.0), math.cos(yaw / 2.0)  # rotation about +z
    return p


def _yaw(p: Pose) -> float:
    q = p.orientation
    return math.atan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z))


def grasp_to_ros(g: GraspDecision, stamp_ns: int, frame_id: str) -> GraspMessages:
    """Grasp pose (orientation = yaw about the table's +z; the gripper approaches along -z),
    gripper command (JointState: position = opening width in m, effort = grip force in N) and
    the approach waypoints (PoseArray, same yaw)."""
    h = header(stamp_ns, frame_id)
    pose = PoseStamped(header=h, pose=_pose(g.x_m, g.y_m, g.z_m, g.yaw_rad))
    gripper = JointState(header=h, name=[GRIPPER_JOINT], position=[float(g.width_m)], effort=[float(g.force_n)])
    approach = PoseArray(header=h, poses=[_pose(x, y, z, g.yaw_rad) for x, y, z in g.approach_m])
    return GraspMessages(pose, gripper, approach)


def grasp_from_ros(m: GraspMessages, confidence: float = 1.0) -> GraspDecision:
    p = m.pose.pose
    approach = tuple((q.position.x, q.position.y, q.position.z) for q in m.approach.poses)
    return GraspDecision(p.position.x, p.position.y, p.position.z, _yaw(p), m.gripper.position[0],
                         m.gripper.effort[0], approach, confidence)


def decision_messages(d: Decision, frame_id: str, marker_id: int) -> list[tuple[str, object]]:
    """Everything one decision publishes, as (output, message): its record ("qc" / "grasp"); for a
    grasp to execute, its "pose", "gripper" and "approach"; and the RViz "markers"."""
    out: list[tuple[str, object]] = [(d.task, decision_to_status(d))]
    if d.task == "grasp" and not d.action.hold:
        m = grasp_to_ros(d.action, d.stamp_ns, frame_id)
        out += [("pose", m.pose), ("gripper", m.gripper), ("approach", m.approach)]
    out.append(("markers", markers_for(d, frame_id, marker_id)))
    return out


# -- markers (one way: for RViz / Foxglove) ------------------------------------------------------
def markers_for(d: Decision, frame_id: str, marker_id: int = 0):
    """A MarkerArray for one decision: grasp = arrow at the grasp pose + approach spheres;
    QC = a text label coloured by verdict (green pass, yellow uncertain, red reject)."""
    from builtin_interfaces.msg import Duration as RosDuration
    from visualization_msgs.msg import Marker, MarkerArray

    h = header(d.stamp_ns, frame_id)
    life = RosDuration(sec=1)
    out = MarkerArray()
    a = d.action
    if isinstance(a, QCVerdict):
        m = Marker(header=h, ns="sol_control/qc", id=marker_id, type=Marker.TEXT_VIEW_FACING,
                   action=Marker.ADD, lifetime=life, text=f"{a.verdict} {a.defect} {a.confidence:.2f} [{d.source}]")
        m.pose.orientation.w = 1.0
        m.scale.z = 0.02
        m.color.r, m.color.g, m.color.b, m.color.a = {"pass": (0.1, 0.8, 0.1), "uncertain": (0.9, 0.8, 0.1),
                                                      "reject": (0.9, 0.1, 0.1)}[a.verdict] + (1.0,)
        out.markers.append(m)
        return out
    if a.hold:
        m = Marker(header=h, ns="sol_control/grasp", id=marker_id, action=Marker.DELETEALL)
        out.markers.append(m)
        return out
    arrow = Marker(header=h, ns="sol_control/grasp", id=marker_id, type=Marker.ARROW, action=Marker.ADD,
                   lifetime=life, pose=_pose(a.x_m, a.y_m, a.z_m, a.yaw_rad))
    arrow.scale.x, arrow.scale.y, arrow.scale.z = 0.05, 0.005, 0.005
    arrow.color.g, arrow.color.b, arrow.color.a = 0.6, 1.0, 1.0
    out.markers.append(arrow)
    for i, (x, y, z) in enumerate(a.approach_m, start=1):
        s = Marker(header=h, ns="sol_control/approach", id=marker_id * 8 + i, type=Marker.SPHERE,
                   action=Marker.ADD, lifetime=life, pose=_pose(x, y, z, 0.0))
        s.scale.x = s.scale.y = s.scale.z = 0.01
        s.color.r, s.color.g, s.color.b, s.color.a = 1.0, 0.5, 0.0, 0.8
        out.markers.append(s)
    return out
