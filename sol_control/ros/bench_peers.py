"""The two peer processes of `sol-control bench node` (rclpy lives here, not in bench/).

    python -m sol_control.ros.bench_peers publish --task qc --seconds 10 --out pub.json
        camera images (rgb8, test-split scenes, stamped at send) at --image-hz and joint states at
        --joint-hz, starting once the node reports `active` on /diagnostics
    python -m sol_control.ros.bench_peers subscribe --task qc --out sub.json
        records every decision: stamp, receipt time (ROS clock), source, deadline_met, stage times,
        CPU ms; stops on SIGINT
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import ExternalShutdownException
from sensor_msgs.msg import Image, JointState

from sol_control.ros import qos
from sol_control.ros.convert import image_to_ros, stamp_to_ros


def scene_pool(task: str, n: int) -> list:
    """(image, joints or None) of the task's first `n` test-split scenes."""
    from sol_control.tasks import grasp, qc

    make_sample = (qc if task == "qc" else grasp).make_sample
    return [(s.image, getattr(s, "joints_rad", None)) for s in (make_sample("test", i) for i in range(n))]


def _wait_active(node, timeout_s: float) -> bool:
    state = {"active": False}

    def on_diag(msg: DiagnosticArray) -> None:
        for s in msg.status:
            if s.name == "sol_control: node" and any(v.key == "state" and v.value == "active" for v in s.values):
                state["active"] = True
    sub = node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    t0 = time.monotonic()
    while not state["active"] and time.monotonic() - t0 < timeout_s:
        rclpy.spin_once(node, timeout_sec=0.05)
    node.destroy_subscription(sub)
    return state["active"]


def publish(args: argparse.Namespace) -> int:
    rclpy.init()
    node = rclpy.create_node("sol_control_bench_publisher")
    images = node.create_publisher(Image, "camera/image_raw", qos.sensor_qos(1000.0))
    joints = node.create_publisher(JointState, "joint_states", qos.sensor_qos(1000.0))
    scenes = scene_pool(args.task, args.scenes)
    if not _wait_active(node, args.wait_s):
        print("node never became active", file=sys.stderr)
        return 1
    time.sleep(0.5)
    print("publishing", flush=True)
    clock = node.get_clock()
    stamps: list[int] = []
    t0 = time.monotonic()
    next_img, next_joint, i = t0, t0, 0
    joint_period, img_period = 1.0 / max(args.joint_hz, 1e-9), 1.0 / args.image_hz
    while (now := time.monotonic()) - t0 < args.seconds:
        if now >= next_joint and args.joint_hz > 0:
            q = scenes[i % len(scenes)][1]
            pos = [float(x) for x in q] if q is not None else [0.0] * 6
            j = JointState(name=[f"joint{k + 1}" for k in range(len(pos))], position=pos)
            j.header.stamp = stamp_to_ros(clock.now().nanoseconds)
            joints.publish(j)
            next_joint += joint_period
        if now >= next_img:
            stamp = clock.now().nanoseconds
            images.publish(image_to_ros(scenes[i % len(scenes)][0], stamp, f"{args.task}_camera"))
            stamps.append(stamp)
            i += 1
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
    topic = "qc/verdict" if args.task == "qc" else "grasp/decision"
    node.create_subscription(DiagnosticStatus, topic, on_decision, qos.decision_qos(0))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["publish", "subscribe"])
    ap.add_argument("--task", choices=["qc", "grasp"], default="qc")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--image-hz", type=float, default=30.0)
    ap.add_argument("--joint-hz", type=float, default=500.0)
    ap.add_argument("--scenes", type=int, default=30)
    ap.add_argument("--wait-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    return publish(args) if args.role == "publish" else subscribe(args)


if __name__ == "__main__":
    sys.exit(main())
