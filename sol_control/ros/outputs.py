"""The node's decision topics: lifecycle publishers with their QoS, and one decision onto them.

They exist only while the node is active (`create` in on_activate, `destroy` in on_deactivate), so
a subscriber's liveliness event says whether a node that decides is there.
"""
from __future__ import annotations

from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray, PoseStamped
from rclpy.event_handler import PublisherEventCallbacks
from sensor_msgs.msg import JointState
from visualization_msgs.msg import MarkerArray

from sol_control.config import NodeConfig
from sol_control.decision import Decision
from sol_control.ros import convert, qos

# The node's outputs (docs/ROS_INTERFACE.md), by the key convert.decision_messages uses.
OUTPUTS = {"qc": ("qc/verdict", DiagnosticStatus), "grasp": ("grasp/decision", DiagnosticStatus),
           "pose": ("grasp/pose", PoseStamped), "gripper": ("grasp/gripper", JointState),
           "approach": ("grasp/approach", PoseArray), "markers": ("decisions/markers", MarkerArray)}
OUTPUTS_OF = {"qc": ("qc", "markers"), "grasp": ("grasp", "pose", "gripper", "approach", "markers")}
RECORDS = ("qc", "grasp")
MARKER_IDS = 64


class DecisionOutputs:
    def __init__(self, node, on_deadline_missed):
        self.node, self._events = node, PublisherEventCallbacks(deadline=on_deadline_missed)
        self._pubs: dict[str, Any] = {}
        self._marker_id = 0

    def create(self, cfg: NodeConfig, tasks: tuple[str, ...]) -> None:
        """Decision records carry the offered QoS deadline (and count its misses); records and grasp
        commands offer AUTOMATIC liveliness with the configured lease; markers neither."""
        for key in sorted({k for task in tasks for k in OUTPUTS_OF[task]}):
            topic, kind = OUTPUTS[key]
            if key == "markers":
                out_qos = qos.decision_qos(0.0)
            else:
                out_qos = qos.decision_qos(cfg.deadline.output_deadline_ms, cfg.qos.liveliness_lease_ms)
            events = self._events if key in RECORDS else None
            self._pubs[key] = self.node.create_lifecycle_publisher(kind, topic, out_qos, event_callbacks=events)

    def destroy(self) -> None:
        for p in self._pubs.values():
            self.node.destroy_lifecycle_publisher(p)
        self._pubs = {}

    def publish(self, d: Decision, frame_id: str) -> None:
        """Every message of one decision; raises if a publisher is gone (the caller counts it)."""
        self._marker_id = (self._marker_id + 1) % MARKER_IDS
        for output, msg in convert.decision_messages(d, frame_id, self._marker_id):
            self._pubs[output].publish(msg)
