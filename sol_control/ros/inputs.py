"""The node's inputs, from configure to cleanup: they validate, convert and offer; they never infer.

    camera/image_raw, camera/image_raw/compressed ─► ImagePump (its own thread and wait set)
        ─► convert + budget start (the stamp on the monotonic clock) ─► Frame
        ─► + the newest side-stream samples ─► TaskRunner.offer(Telemetry): each task's slot
    joint states, wrench, conveyor (SideStreams): never spun; taken with each image, and by a
        timer every SIDE_POLL_S, so that their rejections are counted without frames too

A message that cannot be decided on is rejected (`reject(reason, detail)`: the node counts it and
rate-limits the log); a malformed one never takes the node down.
"""
from __future__ import annotations

import time
from typing import Callable

from sensor_msgs.msg import CompressedImage, Image

from sol_control.config import NodeConfig
from sol_control.ros import convert, qos
from sol_control.ros.image_pump import ImagePump
from sol_control.ros.side_streams import SIDE_TYPES, Polled, SideStreams
from sol_control.runner import TaskRunner
from sol_control.telemetry import Frame, InputRejected

SIDE_POLL_S = 0.1
# The node's ROS inputs (docs/ROS_INTERFACE.md); its outputs are ros.outputs.OUTPUTS.
IMAGES = {"camera/image_raw": Image, "camera/image_raw/compressed": CompressedImage}
SUBSCRIBED = {**IMAGES, **SIDE_TYPES}


class NodeInputs:
    """The subscriptions, image pump and side streams of a configured node, offering every admitted
    snapshot to `runners`. `config` returns the node's live config."""

    def __init__(self, node, config: Callable[[], NodeConfig], runners: dict[str, TaskRunner],
                 reject: Callable[[str, str], None]):
        self._node, self._config, self._reject, self._runners = node, config, reject, tuple(runners.values())
        tasks = tuple(runners)
        self._last_frame_stamp_ns = 0
        in_qos = qos.sensor_qos(config().deadline.max_staleness_ms)
        self.side_streams = SideStreams(node, lambda: self._config().inputs, in_qos, reject, tasks)
        polled = Polled()  # taken by the image pump, not the executor
        self._subs = [node.create_subscription(kind, topic, lambda m: None, in_qos, callback_group=polled)
                      for topic, kind in IMAGES.items()]
        self._images = ImagePump(node.context, list(zip(self._subs, (self._on_image, self._on_compressed))),
                                 lambda detail: reject("image_take_error", f"image: {detail}"))
        self._images.start()
        # without frames nobody takes the side streams: count their rejections within SIDE_POLL_S
        self._side_timer = node.create_timer(SIDE_POLL_S, self.side_streams.take)

    def restart(self) -> None:
        """At activation: no side-stream sample from before, and a restarted (sim) clock must not
        make the next frames look out of order."""
        self.side_streams.clear()
        self._last_frame_stamp_ns = 0

    def destroy(self) -> None:
        node = self._node
        node.destroy_timer(self._side_timer)
        self._images.stop()
        self.side_streams.destroy(node)
        for s in self._subs:
            node.destroy_subscription(s)
        self._subs = []

    # -- the image thread ------------------------------------------------------------------------
    def _admit(self, msg, make_frame, info=None) -> None:
        recv = time.monotonic_ns()
        transport_ns = 0
        if info is not None and info.get("source_timestamp"):
            transport_ns = min(max(time.time_ns() - int(info["source_timestamp"]), 0), 10**9)
        d = self._config().deadline
        try:
            stamp = convert.stamp_from_ros(msg.header.stamp)
            start = convert.budget_start_ns(stamp, self._node.get_clock().now().nanoseconds, recv,
                                            self._last_frame_stamp_ns, d.max_future_ms, d.max_staleness_ms,
                                            transport_ns)
            frame = make_frame(stamp, start)
        except InputRejected as e:
            self._reject(e.reason, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a malformed message never takes the node down
            self._reject("conversion_error", f"{type(e).__name__}: {e}")
            return
        self._last_frame_stamp_ns = stamp
        telemetry = self.side_streams.snapshot(frame, d.max_staleness_ms)
        for runner in self._runners:
            runner.offer(telemetry)

    def _on_image(self, msg: Image, info) -> None:  # info: rclpy MessageInfo (DDS source timestamp)
        self._admit(msg, lambda stamp, start: Frame(
            convert.image_from_ros(msg, self._config().inputs.max_image_pixels), stamp, start, msg.header.frame_id),
            info)

    def _on_compressed(self, msg: CompressedImage, info) -> None:
        def make(stamp: int, start: int) -> Frame:
            data, kind = convert.compressed_from_ros(msg, self._config().inputs.max_compressed_bytes)
            return Frame(None, stamp, start, msg.header.frame_id, compressed=data, compressed_format=kind)
        self._admit(msg, make, info)
