"""Helpers for ROS tests: environment, an in-process harness around the real node, and a
stand-alone publisher process (`python -m tests.ros_helpers publish ...`) for cross-process tests.

Every ROS participant here runs with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, the shipped Fast DDS
profile (shared memory + loopback UDP) and a ROS_DOMAIN_ID picked per test module (10-29).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.waiting import wait_for  # noqa: F401 (re-exported for the ROS tests)

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "config" / "fastdds_localhost.xml"


def ros_env(domain_id: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"ROS_DOMAIN_ID": str(domain_id), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp", "FASTDDS_DEFAULT_PROFILES_FILE": str(PROFILE),
                "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", "")})
    return env


def set_ros_env(domain_id: int) -> None:
    """Set the environment of this process before its first rclpy participant exists (the domain
    itself is passed to rclpy.init, so other test modules keep their own ROS_DOMAIN_ID)."""
    for k, v in ros_env(domain_id).items():
        if k not in ("PYTHONPATH", "ROS_DOMAIN_ID"):
            os.environ[k] = v


def bundle_params() -> dict[str, str] | None:
    """Bundle parameters for the node under test: the shipped models/ (None if absent).
    SOL_CONTROL_TEST_BUNDLES=<dir with qc/ and grasp/> points tests at other bundles (development)."""
    alt = os.environ.get("SOL_CONTROL_TEST_BUNDLES")
    if alt:
        return {"qc.bundle": str(Path(alt) / "qc"), "grasp.bundle": str(Path(alt) / "grasp")}
    if all((REPO / "models" / t / "manifest.json").is_file() for t in ("qc", "grasp")):
        return {}
    return None


def now_ns(node) -> int:
    return node.get_clock().now().nanoseconds


class Harness:
    """The real CoprocessorNode plus a client node in one process, spun by one executor thread."""

    def __init__(self, domain_id: int, params: dict[str, Any], autostart: bool = True):
        set_ros_env(domain_id)
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
        from geometry_msgs.msg import PoseStamped, WrenchStamped
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter import Parameter
        from sensor_msgs.msg import CompressedImage, Image, JointState

        from sol_control.ros.node import CoprocessorNode

        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        overrides = [Parameter(k, value=v) for k, v in {**params, "autostart": autostart}.items()]
        self.node = CoprocessorNode(context=self.ctx, parameter_overrides=overrides)
        self.client = rclpy.create_node("sol_control_test_client", context=self.ctx)
        self.lock = threading.Lock()
        self.got: dict[str, list] = {"qc": [], "grasp": [], "pose": [], "diagnostics": []}
        rel = 10
        self.client.create_subscription(DiagnosticStatus, "qc/verdict", lambda m: self._add("qc", m), rel)
        self.client.create_subscription(DiagnosticStatus, "grasp/decision", lambda m: self._add("grasp", m), rel)
        self.client.create_subscription(PoseStamped, "grasp/pose", lambda m: self._add("pose", m), rel)
        self.client.create_subscription(DiagnosticArray, "/diagnostics", lambda m: self._add("diagnostics", m), rel)
        self.pub_image = self.client.create_publisher(Image, "camera/image_raw", rel)
        self.pub_compressed = self.client.create_publisher(CompressedImage, "camera/image_raw/compressed", rel)
        self.pub_joints = self.client.create_publisher(JointState, "joint_states", rel)
        self.pub_conveyor = self.client.create_publisher(JointState, "conveyor/joint_states", rel)
        self.pub_wrench = self.client.create_publisher(WrenchStamped, "wrench", rel)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.executor.add_node(self.client)
        if autostart:
            assert self.node.autostart(), self.node.config_error
        self._spin = threading.Thread(target=self._run, daemon=True)
        self._spin.start()

    def _run(self) -> None:
        spin_until_shutdown(self.executor, self.ctx)

    def _add(self, key: str, msg) -> None:
        with self.lock:
            self.got[key].append(msg)

    def count(self, key: str) -> int:
        with self.lock:
            return len(self.got[key])

    def messages(self, key: str) -> list:
        with self.lock:
            return list(self.got[key])

    def wait_connected(self, timeout_s: float = 10.0) -> bool:
        return wait_for(lambda: self.pub_image.get_subscription_count() > 0
                        and self.client.count_publishers("qc/verdict") + self.client.count_publishers("grasp/decision") > 0,
                        timeout_s)

    def close(self) -> None:
        import rclpy

        self.node._release()
        self.ctx.try_shutdown() if hasattr(self.ctx, "try_shutdown") else rclpy.shutdown(context=self.ctx)
        self._spin.join(timeout=5.0)
        self.executor.shutdown()
        self.node.destroy_node()
        self.client.destroy_node()


# -- stand-alone publisher process -----------------------------------------------------------------
def publish_main(argv: list[str]) -> int:
    """Publish QC test-split images (rgb8, current stamps) on camera/image_raw, then exit."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--rate-hz", type=float, default=10.0)
    ap.add_argument("--task", choices=["qc", "grasp"], default="qc")
    ap.add_argument("--wait-s", type=float, default=10.0, help="wait this long for a subscriber")
    args = ap.parse_args(argv)
    import rclpy
    from sensor_msgs.msg import Image, JointState

    from sol_control.ros.convert import image_to_ros
    from sol_control.tasks import grasp, qc

    rclpy.init()
    node = rclpy.create_node("sol_control_test_publisher")
    pub = node.create_publisher(Image, "camera/image_raw", 10)
    joints = node.create_publisher(JointState, "joint_states", 10)
    t0 = time.monotonic()
    while pub.get_subscription_count() == 0 and time.monotonic() - t0 < args.wait_s:
        rclpy.spin_once(node, timeout_sec=0.02)
    time.sleep(0.3)  # let the subscriber's side finish matching
    for i in range(args.count):
        if args.task == "qc":
            img, q = qc.make_sample("test", i).image, None
        else:
            s = grasp.make_sample("test", i)
            img, q = s.image, s.joints_rad
        stamp = node.get_clock().now().nanoseconds
        if q is not None:
            j = JointState(name=[f"joint{k + 1}" for k in range(len(q))], position=[float(x) for x in q])
            j.header.stamp = node.get_clock().now().to_msg()
            joints.publish(j)
        pub.publish(image_to_ros(img, stamp, "qc_camera" if args.task == "qc" else "grasp_camera"))
        rclpy.spin_once(node, timeout_sec=1.0 / args.rate_hz)
    print(f"published {args.count}", flush=True)
    node.destroy_node()
    rclpy.shutdown()
    return 0


def run_publisher(domain_id: int, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.ros_helpers", "publish", *args], cwd=REPO,
                          env=ros_env(domain_id), capture_output=True, text=True, timeout=timeout_s)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "publish":
        sys.exit(publish_main(sys.argv[2:]))
    print("usage: python -m tests.ros_helpers publish [--count N] [--rate-hz R] [--task qc|grasp]")
    sys.exit(2)


def spin_until_shutdown(executor, ctx) -> None:
    """Spin an executor on a test thread until its context shuts down."""
    while ctx.ok():
        try:
            executor.spin_once(timeout_sec=0.05)
        except Exception:  # noqa: BLE001 - context shut down under us at teardown
            if not ctx.ok():
                return
            raise
