"""The line fails safe when a coprocessor node dies, and the node comes back (issue 15).

1. The cell's rules in simulated time, without ROS (MuJoCo cell, no rendering): only a pass verdict
   lets a part through; a part without one is pushed off at its divert cutoff; an outage is counted
   apart; the pick station holds while the grasp node is gone and images the scene again after.
2. The chaos run in lock-step over real DDS (ROS_DOMAIN_ID 90): both nodes SIGKILLed at seeded sim
   times, respawned by the demo's supervisor; the divert rule asserted in sim time, the liveliness
   events only checked to arrive.
"""
import os

import pytest

import mujoco  # noqa: F401  (a runtime pin: missing is a failure, not a skip)

from sol_control.sim.cell import Cell  # noqa: E402
from sol_control.sim.config import CellConfig  # noqa: E402

pytestmark = pytest.mark.sim

STEP_S = CellConfig().timestep_s


def qc_cell(seed: int = 1) -> Cell:
    return Cell(CellConfig(seed=seed, grasp=False), render=False)


def run_qc(cell: Cell, duration_s: float, on_trigger) -> list[dict]:
    """Step the QC line; `on_trigger(cell, event)` plays the controller; returns the part outcomes."""
    outcomes = []
    for _ in range(round(duration_s / STEP_S)):
        for e in cell.step():
            if e["type"] == "qc_trigger":
                on_trigger(cell, e)
            elif e["type"] == "qc_outcome":
                outcomes.append(e)
    return outcomes


def transit_to_cutoff_s(cell: Cell) -> float:
    """Camera to divert cutoff in sim time: the part's ride to the ejector minus the pusher's lead."""
    c = cell.cfg.conveyor
    return c.camera_to_ejector_m / c.belt_speed_mps - cell.conveyor.pusher_lead_s


def test_only_a_pass_verdict_lets_a_part_through():
    verdicts = {0: "pass", 1: None, 2: "uncertain", 3: "pass", 4: None, 5: "uncertain"}

    def controller(cell, e):
        v = verdicts.get(e["part_id"])
        if v is not None:
            cell.apply_qc_verdict(v, cell.eject_time_s(e["t_s"]), e["t_s"])

    cell = qc_cell()
    outcomes = {o["part_id"]: o for o in run_qc(cell, 14.0, controller) if o["part_id"] in verdicts}
    assert sorted(outcomes) == sorted(verdicts)
    for pid, v in verdicts.items():
        o = outcomes[pid]
        if v == "pass":
            assert not o["rejected"] and o["outcome"] in ("correct_accept", "missed_defect"), o
            assert o["diverted_t_s"] is None
        else:   # no verdict or uncertain: pushed off by the cell at the cutoff, in sim time
            assert o["rejected"] and o["outcome"] == ("manual" if v else "no_verdict"), o
            assert o["diverted_t_s"] == pytest.approx(o["trigger_t_s"] + transit_to_cutoff_s(cell), abs=2 * STEP_S)
            assert o["diverted_t_s"] < o["t_s"] < o["diverted_t_s"] + 0.5     # it left the belt right after
    assert cell.tally.summary()["unverified_passes"] == 0


def test_outage_parts_are_counted_apart_and_late_verdicts_ignored():
    """Liveliness lost while parts are between camera and cutoff: they are outage_diverted, not
    part of qc_accuracy_all; a verdict arriving after a part's cutoff does not release it."""
    late: dict[int, float] = {}

    def controller(cell, e):
        pid = e["part_id"]
        if pid == 1:
            cell.set_controller_alive("qc", False)      # the QC node dies with part 1 under the camera
        elif pid == 2:
            cell.set_controller_alive("qc", True)       # back before part 2
        if pid == 3:
            late[pid] = e["t_s"]                         # answered only after its cutoff (below)
        elif pid != 1:
            cell.apply_qc_verdict("pass", cell.eject_time_s(e["t_s"]), e["t_s"])

    cell = qc_cell()
    outcomes = []
    for _ in range(round(14.0 / STEP_S)):
        outcomes += [e for e in run_qc(cell, STEP_S, controller)]
        for pid, t in list(late.items()):
            if cell.time_s > t + transit_to_cutoff_s(cell) + 0.05:
                assert cell.apply_qc_verdict("pass", cell.eject_time_s(t), t) is None
                del late[pid]
    by_id = {o["part_id"]: o for o in outcomes}
    assert by_id[1]["outcome"] == "outage_diverted" and by_id[1]["rejected"] and by_id[1]["outage"]
    assert by_id[3]["outcome"] == "no_verdict" and by_id[3]["rejected"]
    summary = cell.tally.summary()
    assert summary["late_verdicts"] == 1 and summary["unverified_passes"] == 0 and summary["outage_diverted"] == 1
    correct = summary["qc"].get("correct_accept", 0) + summary["qc"].get("correct_reject", 0)
    assert summary["qc_accuracy_all"] == pytest.approx(correct / (summary["parts"] - 1))


def test_pick_station_holds_while_the_grasp_node_is_gone():
    from sol_control.sim import oracle

    cell = Cell(CellConfig(seed=2, qc=False), render=False)
    events = cell.step_until_event(5.0)
    assert any(e["type"] == "pick_trigger" for e in events)      # waiting for its decision
    q_before = cell.pick.q_cmd.copy()
    hold = cell.set_controller_alive("grasp", False)
    assert [e["type"] for e in hold] == ["grasp_outage_hold"]
    assert not cell.apply_grasp(oracle.grasp_decision(cell))       # nothing new moves
    gone = cell.step_for(10.0)                                     # longer than the decision timeout
    assert not any(e["type"] in ("pick_trigger", "grasp_outcome") for e in gone)
    assert (cell.pick.q_cmd == q_before).all()
    assert cell.set_controller_alive("grasp", True) == []
    back = cell.step_until_event(1.0)
    assert any(e["type"] == "pick_trigger" for e in back)         # the same scene, imaged again
    assert cell.pick.scene_id == hold[0]["scene_id"]
    retry_s = cell.cfg.pick.hold_retry_s                           # no decision yet: it looks again
    again = cell.step_until_event(2 * retry_s)
    assert [e["type"] for e in again][-1:] == ["pick_trigger"] and again[-1]["scene_id"] == cell.pick.scene_id
    assert again[-1]["t_s"] - back[-1]["t_s"] == pytest.approx(retry_s, abs=cell.cfg.control_period_s)
    assert cell.apply_grasp(oracle.grasp_decision(cell))


# -- the lock-step chaos run over real DDS ----------------------------------------------------------
DOMAIN = 90


@pytest.mark.ros
@pytest.mark.process
def test_lockstep_chaos_both_nodes_killed_and_respawned(tmp_path, monkeypatch):
    import rclpy  # noqa: F401  (a runtime pin: missing is a failure, not a skip)
    from tests.ros_helpers import bundle_params, set_ros_env

    set_ros_env(DOMAIN)
    monkeypatch.setenv("ROS_DOMAIN_ID", str(DOMAIN))   # closed_loop gives the nodes and itself this domain
    os.environ.setdefault("MUJOCO_GL", "egl")
    from sol_control.sim import scene
    from sol_control.sim.chaos import ChaosPlan
    from sol_control.sim.config import BridgeConfig
    from sol_control.sim.demo import closed_loop

    # lock-step is about the rules, not timing: generous deadlines, thresholds open, quick warm-up
    params = [f"{k}:={v}" for k, v in (bundle_params() or {}).items()]
    params += ["deadline.qc_ms:=5000.0", "deadline.grasp_ms:=5000.0", "audit_rate:=0.0", "decoding.warmup_runs:=2",
               "qc.min_confidence:=0.0", "qc.uncertain_below:=0.0", "grasp.min_confidence:=0.0"]
    cfg = BridgeConfig(mode="lockstep", duration_s=16.0, decision_timeout_s=30.0, controller_wait_s=120.0,
                       cell={"seed": 3})
    plans = [ChaosPlan("qc", 3.0), ChaosPlan("grasp", 5.0)]
    summary, events = closed_loop(cfg, ("qc", "grasp"), params, tmp_path / "logs", chaos=plans)

    chaos = summary["chaos"]
    for task in ("qc", "grasp"):
        c = chaos[task]
        assert c["killed"] and summary["respawns"][task][0]["returncode"] == -9, (task, c)
        live = [(e["alive"], e["t_s"]) for e in events if e["type"] == "liveliness" and e["task"] == task]
        assert [a for a, _ in live] == [True, False, True], live       # the events arrive: lost, then back
        assert live[1][1] == pytest.approx(c["killed_t_s"])             # lock-step: the world waited there
        decided_after = [e for e in events if e["type"] == "decision" and e["task"] == task
                         and e["stamp_ns"] > c["killed_t_s"] * 1e9]
        assert decided_after, f"no {task} decision from the respawned node"
    # exactly the two frames sent to the killed nodes went unanswered
    assert summary["decisions_lost"] == 2 and summary["decision_timeouts"] == 0, \
        (summary["lost_frames"], summary["decision_timeouts"], summary["resent_images"], chaos)
    # QC: the part under the camera at the kill is diverted at its cutoff, in sim time; nothing
    # left the line without a pass verdict
    parts = [e for e in events if e["type"] == "qc_outcome"]
    outage = [p for p in parts if p["outcome"] == "outage_diverted"]
    assert [p["trigger_t_s"] for p in outage] == [pytest.approx(chaos["qc"]["killed_t_s"], abs=2 * STEP_S)]
    c = cfg.cell.conveyor
    lead_s = c.pusher_stroke_s * -scene.PUSHER_REST_Y_M / (scene.PUSHER_REACH_Y_M - scene.PUSHER_REST_Y_M)
    assert outage[0]["rejected"] and outage[0]["verdict"] is None
    assert outage[0]["diverted_t_s"] == pytest.approx(
        outage[0]["trigger_t_s"] + c.camera_to_ejector_m / c.belt_speed_mps - lead_s, abs=2 * STEP_S)
    assert summary["unverified_passes"] == 0 and not any(p["outcome"] == "unverified_pass" for p in parts)
    # grasp: the station held the scene whose frame was lost, and the respawned node decided it
    holds = [e for e in events if e["type"] == "grasp_outage_hold"]
    assert len(holds) == 1 and holds[0]["t_s"] == pytest.approx(chaos["grasp"]["killed_t_s"])
    scene = [e for e in events if e["type"] == "grasp_outcome" and e["scene_id"] == holds[0]["scene_id"]]
    assert scene and scene[0]["outcome"] != "no_decision", scene
