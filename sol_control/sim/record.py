"""Record the cell's telemetry, ground truth and the decisions it received as a rosbag2 MCAP.

ROS-free: the bridge hands over CDR bytes (`rclpy.serialization.serialize_message`), rosbags
writes them; `sol-control replay BAG` reads them back without rclpy. Timestamps are sim time.
"""
from __future__ import annotations

from pathlib import Path

from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

TRUTH_TOPIC = "sim/truth"          # diagnostic_msgs/DiagnosticStatus per camera image (not for the node)


class BagRecorder:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists():
            raise ValueError(f"record path {self.path} exists; rosbag2 needs a new folder")
        self.typestore = get_typestore(Stores.LATEST)
        self.writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        self.writer.open()
        self.connections: dict[str, object] = {}
        self.count = 0

    def write(self, topic: str, msgtype: str, stamp_ns: int, cdr: bytes) -> None:
        """msgtype like 'sensor_msgs/msg/Image'; cdr = the serialized message."""
        conn = self.connections.get(topic)
        if conn is None:
            conn = self.writer.add_connection(topic, msgtype, typestore=self.typestore)
            self.connections[topic] = conn
        self.writer.write(conn, int(stamp_ns), cdr)
        self.count += 1

    def close(self) -> None:
        self.writer.close()
