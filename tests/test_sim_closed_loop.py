"""The simulated cell on ROS (real rclpy + Fast DDS, localhost, ROS_DOMAIN_ID 40-41).

1. The bridge with the ground-truth oracle controller (clearly not the coprocessor): what it
   publishes looks like Gazebo + ros_gz_bridge, and decision records drive the cell.
2. The closed loop with the real coprocessor nodes (needs the shipped bundles; skipped without):
   a reject and a successful grasp happen and are scored correctly, and two lock-step runs with
   the same seed give the same images, decisions and outcomes.
"""
import os

import pytest

import mujoco  # noqa: F401  (a runtime pin: missing is a failure, not a skip)
import rclpy  # noqa: F401  (a runtime pin: missing is a failure, not a skip)

from tests.ros_helpers import REPO, bundle_params, set_ros_env  # noqa: E402


@pytest.mark.ros
@pytest.mark.sim
def test_bridge_lockstep_over_ros_with_oracle_controller(tmp_path):
    set_ros_env(40)
    os.environ.setdefault("MUJOCO_GL", "egl")
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import CameraInfo, Image, JointState

    from sol_control.sim.bridge import CellBridge, OracleController
    from sol_control.sim.config import BridgeConfig
    from sol_control.tasks.common import GRASP_IMAGE_PX, QC_IMAGE_PX

    rclpy.init(domain_id=40)
    try:
        node, oracle_node, probe = (rclpy.create_node(n) for n in ("cell_sim", "oracle", "probe"))
        seen: dict[str, list] = {k: [] for k in ("clock", "qc", "pick", "qc_info", "joints", "conveyor")}
        q = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT)   # the sensors are best effort
        probe.create_subscription(Clock, "/clock", lambda m: seen["clock"].append(m), q)
        probe.create_subscription(Image, "qc/camera/image_raw", lambda m: seen["qc"].append(m), q)
        probe.create_subscription(Image, "pick/camera/image_raw", lambda m: seen["pick"].append(m), q)
        probe.create_subscription(CameraInfo, "qc/camera/camera_info", lambda m: seen["qc_info"].append(m), q)
        probe.create_subscription(JointState, "joint_states", lambda m: seen["joints"].append(m), q)
        probe.create_subscription(JointState, "conveyor/joint_states", lambda m: seen["conveyor"].append(m), q)
        bag = tmp_path / "bag"
        # the oracle is in this process: no liveliness lease (sol_control.ros.liveliness)
        bridge = CellBridge(BridgeConfig(mode="lockstep", duration_s=14.0, record_path=str(bag), cell={"seed": 3},
                                         liveliness_lease_ms=0.0), node)
        OracleController(oracle_node, bridge.cell)
        executor = SingleThreadedExecutor()
        for n in (node, oracle_node, probe):
            executor.add_node(n)
        summary = bridge.run(executor)
        bridge.close()
    finally:
        rclpy.try_shutdown()
    assert summary["decision_timeouts"] == 0 and summary["unmatched_verdicts"] == 0
    assert summary["qc"].get("correct_reject", 0) >= 1 and summary["qc_accuracy"] == 1.0
    assert summary["grasp"].get("success", 0) >= 1 and summary["grasp_success"] == 1.0
    assert summary["sources"] == {"oracle": summary["decisions"]}
    # what a Gazebo + ros_gz_bridge cell would publish
    assert seen["qc"] and seen["pick"] and seen["clock"]
    img = seen["qc"][0]
    assert (img.width, img.height, img.encoding) == (QC_IMAGE_PX, QC_IMAGE_PX, "rgb8")
    assert (seen["pick"][0].width, seen["pick"][0].height) == (GRASP_IMAGE_PX, GRASP_IMAGE_PX)
    assert seen["qc_info"][0].k[0] == pytest.approx(QC_IMAGE_PX / 0.20)       # px per metre
    assert list(seen["joints"][-1].name) == ["j1", "j2", "j3", "j4", "j5", "j6"]
    # the recording holds every image with its ground truth and every decision received
    from collections import Counter

    from sol_control.sim.replay import read_bag

    kinds = Counter(kind for kind, *_ in read_bag(bag, ("qc", "grasp")))
    assert kinds["image"] == kinds["truth"] == summary["images"]
    assert kinds["live"] == summary["decisions"] and kinds["joints"] > 100 and kinds["conveyor"] > 100
    belt = seen["conveyor"][-1]
    t_s = belt.header.stamp.sec + belt.header.stamp.nanosec * 1e-9
    assert belt.velocity[0] == pytest.approx(0.2) and belt.position[0] == pytest.approx(0.2 * t_s)


@pytest.mark.ros
@pytest.mark.sim
@pytest.mark.process  # the coprocessor nodes run as processes
def test_closed_loop_with_coprocessor_lockstep_is_reproducible(tmp_path, monkeypatch):
    set_ros_env(41)
    monkeypatch.setenv("ROS_DOMAIN_ID", "41")        # closed_loop gives the nodes and itself this domain
    os.environ.setdefault("MUJOCO_GL", "egl")
    from sol_control.sim.config import BridgeConfig
    from sol_control.sim.demo import closed_loop

    # Lock-step is about reproducibility, not timing: generous deadlines make every decision's path
    # depend on the model only (a loaded CI machine must not turn fast into full_precision). The
    # confidence thresholds are opened so this tests the loop (the models' calibration is eval's job).
    params = [f"{k}:={v}" for k, v in (bundle_params() or {}).items()]
    params += ["deadline.qc_ms:=5000.0", "deadline.grasp_ms:=5000.0", "audit_rate:=0.0",
               "qc.min_confidence:=0.0", "qc.uncertain_below:=0.0", "grasp.min_confidence:=0.0"]
    runs = []
    for k in range(2):
        cfg = BridgeConfig(mode="lockstep", duration_s=14.0, decision_timeout_s=20.0, cell={"seed": 3},
                           record_path=str(tmp_path / "bag") if k == 0 else "")
        summary, events = closed_loop(cfg, ("qc", "grasp"), params, tmp_path / f"logs{k}")
        outcomes = [(e["type"], e.get("part_id", e.get("scene_id")), e["outcome"])
                    for e in events if e["type"] in ("qc_outcome", "grasp_outcome")]
        decisions = [(e["task"], e["stamp_ns"], e["source"], e.get("verdict"), e.get("hold"))
                     for e in events if e["type"] == "decision"]
        runs.append((summary, outcomes, decisions))
    (s1, o1, d1), (s2, o2, d2) = runs
    assert s1["decision_timeouts"] == 0, s1
    assert s1["qc"].get("correct_reject", 0) >= 1, s1["qc"]
    assert s1["grasp"].get("success", 0) >= 1, s1["grasp"]
    assert s1["image_sha256"] == s2["image_sha256"]
    assert o1 == o2 and d1 == d2
    # replaying the recording offline through the same Coprocessor gives the same decisions
    from sol_control.config import NodeConfig, apply_overrides
    from sol_control.sim.replay import replay

    node_cfg = apply_overrides(NodeConfig(), [p.replace(":=", "=", 1) for p in params])
    rep = replay(tmp_path / "bag", node_cfg, ("qc", "grasp"))
    assert rep["decisions"] == s1["images"] and rep["live_agreement"] == 1.0, rep


def test_gz_bridge_yaml_gives_the_node_what_cell_sim_publishes():
    """config/gz_bridge.yaml: every Gazebo→ROS topic is one cell_sim publishes, with the same type."""
    import yaml

    from sol_control.sim.bridge import PUBLISHED

    entries = yaml.safe_load((REPO / "config" / "gz_bridge.yaml").read_text())
    published = {topic: f"{kind.__module__.split('.')[0]}/msg/{kind.__name__}" for topic, kind in PUBLISHED.values()}
    to_ros = [e for e in entries if e["direction"] == "GZ_TO_ROS"]
    assert {e["ros_topic_name"] for e in to_ros} >= {"/clock", "qc/camera/image_raw", "pick/camera/image_raw",
                                                      "joint_states", "conveyor/joint_states"}
    for e in to_ros:
        assert published.get(e["ros_topic_name"]) == e["ros_type_name"], e
        assert e["gz_type_name"].startswith("gz.msgs.")


@pytest.mark.ros
def test_cell_sim_parameters_go_through_the_typed_config():
    """cell_sim declares every BridgeConfig field as a described, ranged ROS parameter (the node's
    machinery); overrides arrive typed; a bad value is refused naming the field and the value."""
    set_ros_env(42)
    import rclpy
    from rclpy.parameter import Parameter

    from sol_control.sim.bridge import _declare

    rclpy.init(domain_id=42)
    try:
        node = rclpy.create_node("cell_sim", parameter_overrides=[
            Parameter("cell.seed", value=7), Parameter("cell.conveyor.defect_rate", value=0.5)])
        cfg = _declare(node)
        assert cfg.cell.seed == 7 and cfg.cell.conveyor.defect_rate == 0.5 and cfg.mode == "realtime"
        d = node.describe_parameters(["cell.conveyor.belt_speed_mps"])[0]
        assert d.description.startswith("belt velocity") and d.floating_point_range[0].to_value == 2.0
        assert 0.0 < d.floating_point_range[0].from_value < 1e-300  # gt=0: the nearest valid value
        node.destroy_node()
        bad = rclpy.create_node("cell_sim", parameter_overrides=[Parameter("cell.conveyor.defect_rate", value=1.5)])
        with pytest.raises(ValueError, match=r"cell.conveyor.defect_rate.*1.5"):
            _declare(bad)
        bad.destroy_node()
    finally:
        rclpy.try_shutdown()
