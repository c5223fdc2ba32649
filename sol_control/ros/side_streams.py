"""Side streams (joint states, wrench, conveyor) taken when needed, never spun by the executor.

The side streams are only needed when a frame is decided, so their subscriptions sit in a callback
group no executor waits on (`Polled`); a task's worker takes the newest sample of the streams its
decision reads right before deciding, and a slow timer takes all of them so a bad message is
counted even when no frames come. Each executor wake is ~0.4 ms of Python holding the GIL the
decision workers need; at 500 Hz joint states that was most of a core. A sample's age counts from
its DDS receipt, not from the take.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from geometry_msgs.msg import WrenchStamped
from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from sensor_msgs.msg import JointState

from sol_control.budget import NS_PER_S
from sol_control.config import NodeConfig
from sol_control.ros import convert
from sol_control.telemetry import InputRejected, TelemetrySlots

# the side streams a task's decision reads (coprocessor.py): its worker takes only these (~50 us a take)
SIDE_READS = {"qc": ("conveyor/joint_states",), "grasp": ("joint_states",)}


class Polled(CallbackGroup):
    """Subscriptions no executor waits on: their samples are taken by `SideStreams.take`."""

    def can_execute(self, entity) -> bool:
        return False

    def beginning_execution(self, entity) -> bool:
        return False

    def ending_execution(self, entity) -> None:
        pass


class SideStreams:
    """The node's side-stream subscriptions and the slots their newest samples go to."""

    def __init__(self, node: Node, slots: TelemetrySlots, config: Callable[[], NodeConfig], qos,
                 reject: Callable[[str, str], None]):
        self.slots, self._config, self._reject = slots, config, reject
        self._lock = threading.Lock()
        polled = Polled()
        self.subs = {topic: node.create_subscription(kind, topic, lambda m: None, qos, callback_group=polled)
                     for topic, kind in (("joint_states", JointState), ("wrench", WrenchStamped),
                                         ("conveyor/joint_states", JointState))}

    def take(self, topics: tuple[str, ...] | None = None) -> None:
        """Take the newest sample (keep-last-1: at most one waits) of `topics` (default: all),
        convert and validate it into its slot; a bad one is counted and dropped."""
        with self._lock:
            for topic, sub in self.subs.items():
                if topics is not None and topic not in topics:
                    continue
                try:
                    with sub.handle:
                        taken = sub.handle.take_message(sub.msg_type, sub.raw)
                except Exception as e:  # noqa: BLE001 - an rmw error on one stream skips it this time
                    self._reject("side_take_error", f"side stream {topic}: {type(e).__name__}: {e}")
                    continue
                if taken is not None:
                    msg, info = taken
                    waited_ns = time.time_ns() - int(info.get("received_timestamp") or 0)
                    self._put(topic, msg, time.monotonic_ns() - min(max(waited_ns, 0), NS_PER_S))

    def _put(self, topic: str, msg, arrived_mono_ns: int) -> None:
        inputs = self._config().inputs
        try:
            if topic == "joint_states":
                self.slots.joints.put(convert.joints_from_ros(msg, inputs.max_joint_abs, inputs.max_joints),
                                      arrived_mono_ns)
            elif topic == "wrench":
                self.slots.wrench.put(convert.wrench_from_ros(msg, inputs.max_wrench_abs), arrived_mono_ns)
            else:
                self.slots.conveyor.put(convert.conveyor_from_ros(msg, inputs.max_belt_speed_mps), arrived_mono_ns)
        except InputRejected as e:
            self._reject(e.reason, str(e))
        except Exception as e:  # noqa: BLE001 - a malformed message never takes the node down
            self._reject("conversion_error", f"{type(e).__name__}: {e}")

    def destroy(self, node: Node) -> None:
        with self._lock:
            for s in self.subs.values():
                node.destroy_subscription(s)
            self.subs = {}
