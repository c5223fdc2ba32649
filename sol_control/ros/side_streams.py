"""Side streams as the node reads them: joint states, wrench and the conveyor encoder.

Conversions come in pairs (`x_from_ros` / `x_to_ros`, tested by round trip); a message the node
will not use raises InputRejected with a countable reason. The subscriptions sit in a callback
group no executor waits on (`Polled`): their newest samples are taken when an image arrives (the
streams its tasks read, so the snapshot is time-aligned with the image) and by a slow timer (all of
them, so a bad message is counted even when no images come). Each executor wake is ~0.4 ms of
Python holding the GIL the decision workers need; at 500 Hz joint states that was most of a core.
A sample's age counts from its DDS receipt, not from the take.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

import numpy as np
from geometry_msgs.msg import WrenchStamped
from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from sensor_msgs.msg import JointState

from sol_control.budget import NS_PER_MS, NS_PER_S
from sol_control.config import InputConfig
from sol_control.ros.convert import header, stamp_from_ros
from sol_control.telemetry import Conveyor, Frame, InputRejected, Joints, Telemetry, Wrench

# topic -> its message type, the telemetry field it fills; and which of them a task's decision reads
SIDE_TYPES = {"joint_states": JointState, "wrench": WrenchStamped, "conveyor/joint_states": JointState}
TOPICS = {"joint_states": "joints", "wrench": "wrench", "conveyor/joint_states": "conveyor"}
SIDE_READS = {"qc": ("conveyor/joint_states",), "grasp": ("joint_states",)}


def _finite_bounded(values: np.ndarray, max_abs: float, what: str) -> None:
    if not np.all(np.isfinite(values)):
        raise InputRejected(f"{what}_nonfinite", "NaN or inf")
    if values.size and float(np.max(np.abs(values))) > max_abs:
        raise InputRejected(f"{what}_out_of_range", f"|value| > {max_abs}")


def joints_from_ros(msg: JointState, max_abs: float, max_joints: int = 64) -> Joints:
    n = max(len(msg.position), len(msg.velocity), len(msg.name))
    if n > max_joints:
        raise InputRejected("joints_too_many", f"{n} entries, at most {max_joints}")
    pos = np.asarray(msg.position, np.float64)
    vel = np.asarray(msg.velocity, np.float64)
    names = tuple(msg.name)
    if pos.size == 0:
        raise InputRejected("joints_empty", "no positions")
    if names and len(names) != pos.size:
        raise InputRejected("joints_length_mismatch", f"{len(names)} names, {pos.size} positions")
    if vel.size not in (0, pos.size):
        raise InputRejected("joints_length_mismatch", f"{vel.size} velocities, {pos.size} positions")
    _finite_bounded(pos, max_abs, "joints")
    _finite_bounded(vel, max_abs, "joints")
    return Joints(names, pos, vel, stamp_from_ros(msg.header.stamp))


def joints_to_ros(j: Joints, frame_id: str = "") -> JointState:
    return JointState(header=header(j.stamp_ns, frame_id), name=list(j.names),
                      position=[float(x) for x in j.position_rad], velocity=[float(x) for x in j.velocity])


def conveyor_from_ros(msg: JointState, max_speed_mps: float) -> Conveyor:
    """Belt as a prismatic joint: position[0] in m, velocity[0] in m/s."""
    if len(msg.position) == 0 or len(msg.velocity) == 0:
        raise InputRejected("conveyor_empty", "needs position[0] and velocity[0]")
    pos, vel = float(msg.position[0]), float(msg.velocity[0])
    if not (math.isfinite(pos) and math.isfinite(vel)):
        raise InputRejected("conveyor_nonfinite", "NaN or inf")
    if abs(vel) > max_speed_mps:
        raise InputRejected("conveyor_out_of_range", f"|{vel}| m/s > {max_speed_mps}")
    return Conveyor(pos, vel, stamp_from_ros(msg.header.stamp))


def conveyor_to_ros(c: Conveyor, name: str = "belt") -> JointState:
    return JointState(header=header(c.stamp_ns, ""), name=[name], position=[c.position_m], velocity=[c.velocity_mps])


def wrench_from_ros(msg: WrenchStamped, max_abs: float) -> Wrench:
    f, t = msg.wrench.force, msg.wrench.torque
    force = np.array([f.x, f.y, f.z], np.float64)
    torque = np.array([t.x, t.y, t.z], np.float64)
    _finite_bounded(np.concatenate([force, torque]), max_abs, "wrench")
    return Wrench(force, torque, stamp_from_ros(msg.header.stamp))


def wrench_to_ros(w: Wrench, frame_id: str = "tool0") -> WrenchStamped:
    msg = WrenchStamped(header=header(w.stamp_ns, frame_id))
    msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = (float(x) for x in w.force_n)
    msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = (float(x) for x in w.torque_nm)
    return msg


def _from_ros(topic: str, msg, inputs: InputConfig):
    if topic == "joint_states":
        return joints_from_ros(msg, inputs.max_joint_abs, inputs.max_joints)
    if topic == "wrench":
        return wrench_from_ros(msg, inputs.max_wrench_abs)
    return conveyor_from_ros(msg, inputs.max_belt_speed_mps)


class Polled(CallbackGroup):
    """Subscriptions no executor waits on: their samples are taken by `SideStreams.take`."""

    def can_execute(self, entity) -> bool:
        return False

    def beginning_execution(self, entity) -> bool:
        return False

    def ending_execution(self, entity) -> None:
        pass


class SideStreams:
    """The node's side-stream subscriptions and the newest valid sample of each."""

    def __init__(self, node: Node, inputs: Callable[[], InputConfig], qos, reject: Callable[[str, str], None],
                 tasks: tuple[str, ...]):
        self._inputs, self._reject = inputs, reject
        self.reads = tuple(sorted({t for task in tasks for t in SIDE_READS[task]}))
        self._lock = threading.Lock()
        self._newest: dict[str, tuple[object, int]] = {}  # topic -> (sample, arrival on the monotonic clock)
        polled = Polled()
        self.subs = {topic: node.create_subscription(kind, topic, lambda m: None, qos, callback_group=polled)
                     for topic, kind in SIDE_TYPES.items()}

    def take(self, topics: tuple[str, ...] | None = None) -> None:
        """Take the newest sample (keep-last-1: at most one waits) of `topics` (default: all),
        convert and validate it; a bad one is counted and dropped, the previous one stays."""
        with self._lock:
            for topic, sub in self.subs.items():
                if topics is None or topic in topics:
                    self._take_one(topic, sub)

    def _take_one(self, topic: str, sub) -> None:
        try:
            with sub.handle:
                taken = sub.handle.take_message(sub.msg_type, sub.raw)
        except Exception as e:  # noqa: BLE001 - an rmw error on one stream skips it this time
            self._reject("side_take_error", f"side stream {topic}: {type(e).__name__}: {e}")
            return
        if taken is None:
            return
        msg, info = taken
        waited_ns = time.time_ns() - int(info.get("received_timestamp") or 0)
        arrived_ns = time.monotonic_ns() - min(max(waited_ns, 0), NS_PER_S)
        try:
            self._newest[topic] = (_from_ros(topic, msg, self._inputs()), arrived_ns)
        except InputRejected as e:
            self._reject(e.reason, str(e))
        except Exception as e:  # noqa: BLE001 - a malformed message never takes the node down
            self._reject("conversion_error", f"{type(e).__name__}: {e}")

    def snapshot(self, frame: Frame, max_age_ms: float) -> Telemetry:
        """The frame with the newest samples of the streams its tasks read, taken now; samples
        older than `max_age_ms` (by arrival) are left out."""
        self.take(self.reads)
        now = time.monotonic_ns()
        with self._lock:
            fresh = {TOPICS[t]: v for t, (v, arrived) in self._newest.items()
                     if now - arrived <= max_age_ms * NS_PER_MS}
        return Telemetry(frame, **fresh)

    def latest(self, topic: str):
        """The newest valid sample of `topic` (Joints, Wrench or Conveyor), or None."""
        with self._lock:
            entry = self._newest.get(topic)
        return entry[0] if entry else None

    def clear(self) -> None:
        with self._lock:
            self._newest = {}

    def destroy(self, node: Node) -> None:
        with self._lock:
            for s in self.subs.values():
                node.destroy_subscription(s)
            self.subs = {}
