"""Several QC lines on one ROS graph (real rclpy + Fast DDS, localhost, ROS_DOMAIN_ID 96-97).

Two recordings of the simulated cell (seeds 1 and 2, the ground-truth oracle deciding, so no model
runs while recording) feed two coprocessor processes started as
`python -m sol_control.ros.node --ros-args -r __ns:=/line1` and `... __ns:=/line2` (what a launch
file's namespace does) on one domain and one /clock. Every frame of a line is decided exactly once
on that line's own topic, no decision crosses lines, and the shared /diagnostics names each line.
"""
import pytest

import mujoco  # noqa: F401  (a runtime pin: missing is a failure, not a skip)
import rclpy  # noqa: F401  (a runtime pin: missing is a failure, not a skip)

from tests.ros_helpers import bundle_params, ros_env, set_ros_env  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.sim, pytest.mark.process]

RECORD_DOMAIN, LINES_DOMAIN = 96, 97


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    from sol_control.sim.bridge import Session
    from sol_control.sim.config import BridgeConfig

    set_ros_env(RECORD_DOMAIN)
    out = []
    for seed in (1, 2):
        bag = tmp_path_factory.mktemp(f"line_seed{seed}") / "bag"
        cfg = BridgeConfig(mode="lockstep", duration_s=12.0, record_path=str(bag),
                           cell={"seed": seed, "qc": True, "grasp": False})
        with Session(cfg, RECORD_DOMAIN, oracle=True) as session:
            summary = session.run()
        assert summary["decision_timeouts"] == 0 and summary["parts"] >= 4
        out.append(bag)
    return out


def test_recorded_lines_are_told_apart_by_frame_and_stamp(bags):
    from sol_control.sim.line_player import load_line

    one, two = load_line(bags[0], "line1"), load_line(bags[1], "line2")
    assert one.frame_id == "line1/qc_camera" and two.frame_id == "line2/qc_camera"
    assert len(one.image_stamps) >= 5 and len(two.image_stamps) >= 5
    assert one.image_stamps != two.image_stamps  # different seeds: parts cross the camera at other times
    assert set(one.defective) == one.image_stamps  # ground truth for every frame


def test_two_lines_on_one_graph_decide_only_their_own_frames(bags, tmp_path):
    assert bundle_params() is not None, "the shipped QC bundle (models/qc) is missing"
    from sol_control.sim.lines import run_lines

    set_ros_env(LINES_DOMAIN)
    params = [f"{k}:={v}" for k, v in bundle_params().items()]
    result = run_lines(bags, params, LINES_DOMAIN, rate=2.0, log_dir=tmp_path / "logs", env=ros_env(LINES_DOMAIN))
    for name in ("line1", "line2"):
        s = result["lines"][name]
        # every frame of this line decided exactly once, on its own topic; nothing else arrived there
        assert s["frames"] >= 5 and s["own_frames_decided"] == s["frames"] == s["decisions"], s
        assert s["cross_talk"] == 0 and s["unmatched"] == 0, s
        # /diagnostics is one absolute topic; each status names its line
        qc = result["diagnostics"][f"{name}/sol_control: qc"]
        node = result["diagnostics"][f"{name}/sol_control: node"]
        assert qc["hardware_id"] == node["hardware_id"] == name and node["state"] == "active"
        assert qc["decisions"] == str(s["decisions"])
        # the node's clock is the one shared /clock (sim time from 0), not a /lineN/clock or the wall
        assert 0.0 < qc["stamp_s"] <= result["sim_time_s"] + 1e-9
    assert set(result["diagnostics"]) == {f"line{k}/sol_control: {s}" for k in (1, 2) for s in ("node", "qc")}


def test_params_file_applies_to_a_node_in_a_line_namespace(tmp_path):
    """The shipped params file's key (/**) reaches /line1/sol_control; a `sol_control:` key would not
    (rcl matches it against /sol_control only), so a launch with namespace:=line1 would silently run
    on defaults."""
    import rclpy
    from rclpy.context import Context

    from sol_control.config import render_yaml
    from sol_control.ros.node import CoprocessorNode

    set_ros_env(LINES_DOMAIN)
    given = render_yaml().replace("qc_ms: 20.0", "qc_ms: 12.5")
    assert given != render_yaml()
    for key, expect in (("/**", 12.5), ("sol_control", 20.0)):
        path = tmp_path / f"{len(key)}.yaml"
        path.write_text(given.replace("/**:\n", f"{key}:\n"))
        ctx = Context()
        rclpy.init(context=ctx, domain_id=LINES_DOMAIN, args=["--ros-args", "--params-file", str(path)])
        try:
            node = CoprocessorNode(context=ctx, namespace="line1")
            assert node.get_fully_qualified_name() == "/line1/sol_control"
            assert node.cfg.deadline.qc_ms == expect, key
            node.destroy_node()
        finally:
            ctx.try_shutdown()
