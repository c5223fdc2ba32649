"""The ROS side of `sol-control bench node` and `bench cold-start` (rclpy lives here, not in bench/):
a camera that feeds the node test-split scenes, and listeners for its decisions and diagnostics.

    python -m sol_control.ros.bench_peers publish '{"task": "qc", "seconds": 10, "image_hz": 30,
                                                    "joint_hz": 500, "out": "pub.json"}'
        camera images (rgb8, test-split scenes, stamped at send) at image_hz and joint states at
        joint_hz, starting once the node reports `active` on /diagnostics
    python -m sol_control.ros.bench_peers subscribe '{"task": "qc", "out": "sub.json"}'
        records every decision: stamp, receipt time (ROS clock), source, deadline_met, stage times,
        CPU ms; stops on SIGINT

Cold start (`starts`, in the bench's process): per start, spawn the node while the camera publishes
a fresh image every 20 ms (and joint states for grasp); time the spawn to the first decision on one
of this start's frames (a sensor-timeout safe default does not count), with the node's `startup.*`
diagnostics; then SIGKILL the node, as a crash would, so the next start meets the dead node's DDS
leftovers, as a respawn does.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import ExternalShutdownException
from sensor_msgs.msg import Image, JointState

from sol_control.ros import qos
from sol_control.ros.convert import header, image_to_ros

NODE_STATUS = "sol_control: node"  # the node's own status on /diagnostics
IMAGE_PERIOD_S = 0.02  # cold start: a fresh image every 20 ms
START_TIMEOUT_S = 120.0  # for the node to become active, or to decide on a cold start's frames
SCENES = 30  # test-split scenes the publisher cycles through


def scene_pool(task: str, n: int) -> list:
    """(image, joints or None) of the task's first `n` test-split scenes."""
    from sol_control.tasks import grasp, qc

    make_sample = (qc if task == "qc" else grasp).make_sample
    return [(s.image, getattr(s, "joints_rad", None)) for s in (make_sample("test", i) for i in range(n))]


def decision_topic(task: str) -> str:
    return "qc/verdict" if task == "qc" else "grasp/decision"


class Camera:
    """The node's camera on `node`: test-split scenes, each image stamped when sent, with the
    scene's joint states; and the node's own status on /diagnostics (`state`, `startup.*` times)."""

    def __init__(self, node, task: str, scenes: int):
        self.node, self.task, self.scenes, self.i = node, task, scene_pool(task, scenes), 0
        self.images = node.create_publisher(Image, "camera/image_raw", qos.sensor_qos(1000.0))
        self.joints = node.create_publisher(JointState, "joint_states", qos.sensor_qos(1000.0))
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.state, self.startup = "", {}
        self.since_ns = 0  # diagnostics stamped before it are ignored

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        if msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec < self.since_ns:
            return
        for kv in ({v.key: v.value for v in s.values} for s in msg.status if s.name == NODE_STATUS):
            self.state = kv.get("state", self.state)
            got = {k[len("startup."):-2]: float(v)  # startup.<stage>_s
                   for k, v in kv.items() if k.startswith("startup.")}
            if "first_decision" in got:
                self.startup = got

    def send_joints(self, stamp_ns: int, zeros: bool = False) -> None:
        """The current scene's joint states (six zeros for a scene without joints when `zeros`)."""
        q = self.scenes[self.i % len(self.scenes)][1]
        q = [0.0] * 6 if q is None and zeros else q
        if q is not None:
            names = [f"joint{k + 1}" for k in range(len(q))]
            self.joints.publish(JointState(header=header(stamp_ns, ""), name=names,
                                           position=[float(x) for x in q]))

    def send_image(self, stamp_ns: int) -> int:
        """The current scene's image, then the next scene; its stamp."""
        image = self.scenes[self.i % len(self.scenes)][0]
        self.images.publish(image_to_ros(image, stamp_ns, f"{self.task}_camera"))
        self.i += 1
        return stamp_ns


# ---- `bench node`: the publisher and the subscriber processes ---------------------------------------

def publish(args: argparse.Namespace) -> int:
    rclpy.init()
    node = rclpy.create_node("sol_control_bench_publisher")
    camera, t0 = Camera(node, args.task, SCENES), time.monotonic()
    while camera.state != "active" and time.monotonic() - t0 < START_TIMEOUT_S:
        rclpy.spin_once(node, timeout_sec=0.05)
    if camera.state != "active":
        print("node never became active", file=sys.stderr)
        return 1
    time.sleep(0.5)
    print("publishing", flush=True)
    clock = node.get_clock()
    stamps: list[int] = []
    t0 = time.monotonic()
    next_img, next_joint = t0, t0
    joint_period, img_period = 1.0 / max(args.joint_hz, 1e-9), 1.0 / args.image_hz
    while (now := time.monotonic()) - t0 < args.seconds:
        if now >= next_joint and args.joint_hz > 0:
            camera.send_joints(clock.now().nanoseconds, zeros=True)
            next_joint += joint_period
        if now >= next_img:
            stamps.append(camera.send_image(clock.now().nanoseconds))
            next_img += img_period
        time.sleep(max(0.0, min(next_img, next_joint if args.joint_hz > 0 else next_img) - time.monotonic()))
    with open(args.out, "w") as f:
        json.dump({"stamps": stamps, "seconds": time.monotonic() - t0}, f)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def subscribe(args: argparse.Namespace) -> int:
    rclpy.init()
    node = rclpy.create_node("sol_control_bench_subscriber")
    clock = node.get_clock()
    rows: list[list] = []

    def on_decision(msg: DiagnosticStatus) -> None:
        recv = clock.now().nanoseconds
        kv = {v.key: v.value for v in msg.values}
        rows.append([int(kv["stamp"]), recv, kv["source"], kv["deadline_met"] == "true", float(kv["latency_ms"]),
                     kv["reason"], float(kv.get("queue_ms", "nan")), float(kv.get("perception_ms", "nan")),
                     float(kv.get("fast_ms", "nan")), float(kv.get("full_ms", "nan")), float(kv.get("cpu_ms", "nan"))])
    node.create_subscription(DiagnosticStatus, decision_topic(args.task), on_decision, qos.decision_qos(0))
    try:
        while rclpy.ok():
            rclpy.spin_once(node, timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:  # written however spinning ends (a loaded run can end spinning by an exception)
        with open(args.out, "w") as f:
            json.dump({"rows": rows}, f)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


# ---- `bench cold-start`: spawn, first decision, SIGKILL -----------------------------------------------

class Probe(Camera):
    """The camera the node decides on, and a listener for its decisions and startup times."""

    def __init__(self, task: str):
        super().__init__(rclpy.create_node("sol_control_cold_start_probe"), task, 8)
        self.node.create_subscription(DiagnosticStatus, decision_topic(task), self._on_decision,
                                      qos.decision_qos(0.0))
        self.first_decision_mono: float | None = None
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

    def publish(self) -> None:
        stamp = self.node.get_clock().now().nanoseconds
        self.send_joints(stamp)
        self.sent.add(self.send_image(stamp))


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


def main(argv: list[str] | None = None) -> int:
    """`publish SPEC` or `subscribe SPEC` (the module doc; SPEC is JSON): `bench node` starts it."""
    role, spec = sys.argv[1:3] if argv is None else argv
    return (publish if role == "publish" else subscribe)(argparse.Namespace(**json.loads(spec)))


if __name__ == "__main__":
    sys.exit(main())
