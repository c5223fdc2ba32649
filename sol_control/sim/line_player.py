"""The ROS side of `sol-control lines`: read a recorded line (rclpy messages), play the lines into
their namespaces on one /clock, and listen to each line's verdicts and the shared /diagnostics.

    /clock (absolute, one for all lines) ◄── LinePlayer ──► /<line>/qc/camera/image_raw, /<line>/conveyor/joint_states
    /<line>/qc/verdict ──► received[line]          /diagnostics ──► latest status per name

Its own rclpy context and executor, so it can share a process with other ROS code (tests). The
executor runs on its own thread once playing starts (`wait_active` spins it before, from the caller).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState

from sol_control.ros import convert
from sol_control.sim.line_bag import QC_TOPICS, TRUTH_TOPIC, LineBag

CLOCK_PERIOD_NS = 10_000_000   # /clock every 10 ms of sim time
RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def load_line(path: str | Path, name: str) -> LineBag:
    """The QC camera, the belt and the QC ground truth of one recording, as rclpy messages (the
    bag holds rclpy's CDR); each image's frame_id gets the line's prefix."""
    from rosbags.rosbag2 import Reader

    kinds = {QC_TOPICS[0]: Image, QC_TOPICS[1]: JointState, TRUTH_TOPIC: DiagnosticStatus}
    line = LineBag(name, [])
    with Reader(path) as reader:
        conns = [c for c in reader.connections if c.topic in kinds]
        for conn, t_ns, raw in reader.messages(connections=conns):
            msg = deserialize_message(raw, kinds[conn.topic])
            if conn.topic == TRUTH_TOPIC:
                kv = {v.key: v.value for v in msg.values}
                if msg.name.endswith("/qc"):
                    line.defective[int(kv["stamp"])] = kv["defective"] == "true"
                continue
            if conn.topic == QC_TOPICS[0]:
                msg.header.frame_id = line.frame_id
            line.messages.append((int(t_ns), conn.topic, msg))
    if not line.image_stamps:
        raise ValueError(f"bag {path} has no {QC_TOPICS[0]} images (record one with sol-control demo --record)")
    return line


class LinePlayer:
    def __init__(self, lines: list[LineBag], domain_id: int):
        self.lines = lines
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        self.node = rclpy.create_node("line_player", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.clock_pub = self.node.create_publisher(Clock, "/clock", RELIABLE)
        kinds = {(line.name, topic): type(msg) for line in lines for _, topic, msg in line.messages}
        self.pubs = {(name, topic): self.node.create_publisher(kind, f"/{name}/{topic}", RELIABLE)
                     for (name, topic), kind in kinds.items()}
        self.received: dict[str, list[dict]] = {line.name: [] for line in lines}
        self.diagnostics: dict[str, tuple[int, str, dict[str, str]]] = {}  # name -> (stamp ns, hardware_id, values)
        for line in lines:
            self.node.create_subscription(DiagnosticStatus, f"/{line.name}/qc/verdict",
                                          lambda m, name=line.name: self._on_verdict(name, m), RELIABLE)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, RELIABLE)
        self.sim_ns = 0
        self._wall0, self._rate = time.monotonic(), 1.0
        self._spinner: threading.Thread | None = None
        self._stop = False

    # -- listening -------------------------------------------------------------------------------
    def _on_verdict(self, line: str, msg: DiagnosticStatus) -> None:
        kv = {v.key: v.value for v in msg.values}
        self.received[line].append({"stamp": int(kv["stamp"]), "frame_id": kv["frame_id"], "source": kv["source"],
                                    "verdict": kv["verdict"], "latency_ms": float(kv["latency_ms"]),
                                    "cpu_ms": float(kv.get("cpu_ms", "nan"))})

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        stamp = convert.stamp_from_ros(msg.header.stamp)
        for s in msg.status:
            self.diagnostics[s.name] = (stamp, s.hardware_id, {v.key: v.value for v in s.values})

    # -- start-up --------------------------------------------------------------------------------
    def wait_active(self, timeout_s: float, alive: Callable[[], bool]) -> dict[str, str]:
        from sol_control.sim.bridge import wait_active

        return wait_active(self.node, self.executor, [f"{line.name}/sol_control" for line in self.lines],
                           timeout_s, alive)

    # -- playing ---------------------------------------------------------------------------------
    def play(self, rate: float, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Every line's messages in sim-time order from 0, /clock every CLOCK_PERIOD_NS and right
        before each message, paced at `rate` x real time. Verdicts and diagnostics are taken by a
        spinning thread meanwhile (publishing from this one)."""
        events = sorted(((t, i, topic, msg) for i, line in enumerate(self.lines) for t, topic, msg in line.messages),
                        key=lambda e: (e[0], e[1]))
        self._start_spinning()
        self._wall0, self._rate = time.monotonic(), rate
        for t, i, topic, msg in events:
            if should_stop():
                return
            self._advance_to(t)
            self.pubs[(self.lines[i].name, topic)].publish(msg)

    def keep_ticking(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Sim time goes on after the recordings end (the nodes' 1 Hz diagnostics run on it) until
        `done()` or `timeout_s` of wall time."""
        self._start_spinning()
        t_end = time.monotonic() + timeout_s
        while not done() and time.monotonic() < t_end:
            self._advance_to(self.sim_ns + CLOCK_PERIOD_NS)
        return done()

    def _advance_to(self, t_ns: int) -> None:
        while True:
            next_tick = min(t_ns, (self.sim_ns // CLOCK_PERIOD_NS + 1) * CLOCK_PERIOD_NS)
            time.sleep(max(0.0, self._wall0 + next_tick / 1e9 / self._rate - time.monotonic()))
            self.sim_ns = next_tick
            self.clock_pub.publish(Clock(clock=convert.stamp_to_ros(next_tick)))
            if next_tick >= t_ns:
                return

    def _start_spinning(self) -> None:
        if self._spinner is None:
            self._spinner = threading.Thread(target=self._spin, name="line_player-spin", daemon=True)
            self._spinner.start()

    def _spin(self) -> None:
        while self.ctx.ok() and not self._stop:
            self.executor.spin_once(timeout_sec=0.05)

    def close(self) -> None:
        self._stop = True
        if self._spinner is not None:
            self._spinner.join(timeout=5.0)
        self.executor.shutdown()
        self.node.destroy_node()
        self.ctx.try_shutdown()
