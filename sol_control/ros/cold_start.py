"""The ROS side of `sol-control bench cold-start` (`sol_control.bench.cold_start`): a camera that
publishes a fresh image every 20 ms (and joint states for grasp), and a listener for the node's
decisions and its `startup.*` diagnostics.

Per start: spawn the node while the camera runs; time the spawn to the first decision on one of
this start's frames (a sensor-timeout safe default does not count); then SIGKILL the node, as a
crash would, so the next start meets the dead node's DDS leftovers, as a respawn does.
"""
from __future__ import annotations

import signal
import subprocess
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from sensor_msgs.msg import Image, JointState

from sol_control.ros import qos
from sol_control.ros.bench_peers import scene_pool
from sol_control.ros.convert import header, image_to_ros

IMAGE_PERIOD_S = 0.02
START_TIMEOUT_S = 120.0


class Probe:
    """The camera (and joints) the node decides on, and the listener for its decisions and diagnostics."""

    def __init__(self, task: str):
        self.node = rclpy.create_node("sol_control_cold_start_probe")
        self.task, self.scenes, self.i = task, scene_pool(task, 8), 0
        self.images = self.node.create_publisher(Image, "camera/image_raw", qos.sensor_qos(1000.0))
        self.joints = self.node.create_publisher(JointState, "joint_states", qos.sensor_qos(1000.0))
        topic = "qc/verdict" if task == "qc" else "grasp/decision"
        self.node.create_subscription(DiagnosticStatus, topic, self._on_decision, qos.decision_qos(0.0))
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.first_decision_mono: float | None = None
        self.startup: dict[str, float] = {}
        self.since_ns = 0
        self.sent: set[int] = set()

    def reset(self) -> None:
        """Forget the last start; diagnostics stamped before now are the dead node's."""
        self.first_decision_mono, self.startup, self.sent = None, {}, set()
        self.since_ns = self.node.get_clock().now().nanoseconds

    def _on_decision(self, msg: DiagnosticStatus) -> None:
        """Only a decision on one of this start's frames counts (not a sensor-timeout safe default)."""
        stamp = next((int(v.value) for v in msg.values if v.key == "stamp"), 0)
        if self.first_decision_mono is None and stamp in self.sent:
            self.first_decision_mono = time.monotonic()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        if msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec < self.since_ns:
            return
        for s in msg.status:
            if s.name == "sol_control: node":
                got = {v.key[len("startup."):-2]: float(v.value) for v in s.values if v.key.startswith("startup.")}
                if "first_decision" in got:
                    self.startup = got

    def publish(self) -> None:
        image, q = self.scenes[self.i % len(self.scenes)]
        stamp = self.node.get_clock().now().nanoseconds
        if q is not None:
            self.joints.publish(JointState(header=header(stamp, ""), name=[f"joint{k + 1}" for k in range(len(q))],
                                           position=[float(x) for x in q]))
        self.images.publish(image_to_ros(image, stamp, f"{self.task}_camera"))
        self.sent.add(stamp)
        self.i += 1


def one_start(probe: Probe, cmd: list[str], env: dict) -> dict:
    probe.reset()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    next_image = t0
    try:
        while time.monotonic() - t0 < START_TIMEOUT_S and proc.poll() is None:
            if time.monotonic() >= next_image:
                probe.publish()
                next_image += IMAGE_PERIOD_S
            rclpy.spin_once(probe.node, timeout_sec=0.005)
            if probe.first_decision_mono is not None and probe.startup:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    if probe.first_decision_mono is None:
        raise ValueError(f"no decision within {START_TIMEOUT_S:.0f} s of the start (exit code {proc.returncode})")
    return {"spawn_to_decision_s": probe.first_decision_mono - t0, "startup_s": probe.startup}


def starts(task: str, cmd: list[str], env: dict, n: int) -> list[dict]:
    """`n` starts of the node command `cmd`, one after another, on the ROS domain of `env`."""
    rclpy.init(domain_id=int(env["ROS_DOMAIN_ID"]))
    probe = Probe(task)
    try:
        return [one_start(probe, cmd, env) for _ in range(n)]
    finally:
        probe.node.destroy_node()
        rclpy.try_shutdown()
