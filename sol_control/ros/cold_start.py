"""`sol-control bench cold-start`: process start to first decision, as a respawn sees it.

Per start: spawn `python -m sol_control.ros.node` (mode = --task, the shipped bundles, default
parameters unless --param) while this process publishes a fresh camera image every 20 ms (and
joint states for grasp); time the spawn to the first decision received. Then SIGKILL the node, as
a crash would, and start the next one (the next start meets the dead node's DDS leftovers, as a
respawn does). The node reports where its time went on /diagnostics (`startup.*`, process age per
stage, docs/ROS_INTERFACE.md): imports (interpreter start and module imports), init (rclpy, the
node, its parameters), configure (of which bundle_check = sha256 of every bundle file, sessions =
tokenizers, ONNX Runtime sessions, KV caches), warmup, active (publishers, runner threads),
first_decision (active to the first decision on a frame: discovery of the camera's publisher,
the frame's wait and its decision; a sensor-timeout safe default does not count).
Medians over the starts; --json writes every start.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from sensor_msgs.msg import Image, JointState

from sol_control.ros import qos
from sol_control.ros.bench_peers import _scenes
from sol_control.ros.convert import header, image_to_ros

IMAGE_PERIOD_S = 0.02
START_TIMEOUT_S = 120.0
PHASES = ("imports", "init", "configure", "bundle_check", "sessions", "warmup", "active", "first_decision")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--task", choices=["qc", "grasp"], default="qc")
    p.add_argument("--json", help="write every start here")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="node parameter override, e.g. decoding.warmup_runs=2 (repeatable)")


class Probe:
    """The camera (and joints) the node decides on, and the listener for its decisions and diagnostics."""

    def __init__(self, task: str):
        self.node = rclpy.create_node("sol_control_cold_start_probe")
        self.task, self.scenes, self.i = task, _scenes(task, 8), 0
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


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def run(args: argparse.Namespace) -> int:
    from sol_control.sim.demo import ros_env, ros_params

    env = ros_env()
    cmd = [sys.executable, "-m", "sol_control.ros.node", "--ros-args", "-p", f"mode:={args.task}"]
    for p in ros_params(args.param):
        cmd += ["-p", p]
    rclpy.init(domain_id=int(env["ROS_DOMAIN_ID"]))
    probe = Probe(args.task)
    try:
        starts = [one_start(probe, cmd, env) for _ in range(args.starts)]
    finally:
        probe.node.destroy_node()
        rclpy.try_shutdown()
    med = {"spawn_to_decision_s": _median([s["spawn_to_decision_s"] for s in starts])}
    med.update({k: _median([s["startup_s"].get(k, float("nan")) for s in starts]) for k in PHASES})
    print(f"cold start to first decision, {args.task}, {len(starts)} starts (median s; load {os.getloadavg()[0]:.1f}):")
    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    for i, s in enumerate(starts):
        print(f"  start {i}: {s['spawn_to_decision_s']:.3f} s (" +
              ", ".join(f"{k} {s['startup_s'].get(k, float('nan')):.3f}" for k in PHASES) + ")")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"task": args.task, "median_s": med, "starts": starts, "params": args.param,
                       "load_1min": os.getloadavg()[0]}, f, indent=1)
    return 0
