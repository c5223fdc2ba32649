"""The simulated cell without ROS: rendering geometry, scoring, determinism (real MuJoCo, EGL).

The controller here is the analytic oracle (`sol_control.sim.oracle`, ground truth), not the
coprocessor: these tests check the cell itself. The closed loop with the real node is in
tests/test_sim_closed_loop.py.
"""
import dataclasses
import hashlib
import math

import numpy as np
import pytest

import mujoco  # noqa: F401  (a runtime pin: missing is a failure, not a skip)

from sol_control.sim import oracle  # noqa: E402
from sol_control.sim.cell import Cell  # noqa: E402
from sol_control.sim.config import CellConfig  # noqa: E402
from sol_control.tasks.common import BELT_RGB, GRASP_IMAGE_PX, QC_IMAGE_PX, TABLE_RGB  # noqa: E402

pytestmark = pytest.mark.sim


def _run_oracle(seed: int, duration_s: float, **cfg):
    cell = Cell(CellConfig(seed=seed, **cfg))
    digest = hashlib.sha256()
    oracle.run(cell, duration_s, lambda cam, e, img: digest.update(img.tobytes()))
    outcomes = [(e["part_id"], e["outcome"]) for e in cell.tally.qc_events]
    outcomes += [(e["scene_id"], e["outcome"], e.get("risen_m")) for e in cell.tally.grasp_events]
    cell.close()
    return cell, outcomes, digest.hexdigest()


def test_renders_match_the_training_generator():
    """Sim images and generator images of the same part/scene differ only at anti-aliased edges."""
    from sol_control.sim.compare import mean_abs_diff, pairs

    got = pairs(seed=5, n=3)
    for sim, _ in got["qc"]:
        assert sim.shape == (QC_IMAGE_PX, QC_IMAGE_PX, 3) and tuple(sim[0, 0]) == BELT_RGB
    for sim, _ in got["pick"]:
        assert sim.shape == (GRASP_IMAGE_PX, GRASP_IMAGE_PX, 3) and tuple(sim[0, 0]) == TABLE_RGB
    qc_diffs = [mean_abs_diff(s, g) for s, g in got["qc"]]
    pick_diffs = [mean_abs_diff(s, g) for s, g in got["pick"]]
    # a part shifted by one pixel or turned by a few degrees already gives > 3
    assert max(qc_diffs) < 2.0, qc_diffs
    assert max(pick_diffs) < 2.0, pick_diffs
    shifted = np.roll(got["qc"][0][0], 1, axis=1)
    assert mean_abs_diff(shifted, got["qc"][0][1]) > max(qc_diffs)


def test_oracle_controller_scores_correctly():
    cell, _, _ = _run_oracle(seed=3, duration_s=30.0)
    qc, grasp = cell.tally.qc, cell.tally.grasp
    assert qc["correct_reject"] >= 1 and qc["correct_accept"] >= 1
    assert qc["false_reject"] == qc["missed_defect"] == qc["no_verdict"] == 0
    assert cell.tally.qc_accuracy() == 1.0
    assert grasp["success"] >= 5 and grasp["failure"] == 0
    assert all(e["risen_m"] >= 0.05 and e["pads"] == 2 for e in cell.tally.grasp_events)


def test_same_seed_same_run_other_seed_other_run():
    _, outcomes_a, hash_a = _run_oracle(seed=7, duration_s=12.0)
    _, outcomes_b, hash_b = _run_oracle(seed=7, duration_s=12.0)
    _, outcomes_c, hash_c = _run_oracle(seed=8, duration_s=12.0)
    assert outcomes_a and outcomes_a == outcomes_b
    assert hash_a == hash_b
    assert hash_c != hash_a


def _drive(cell: Cell, duration_s: float, qc_fn=None, grasp_fn=None) -> None:
    while cell.time_s < duration_s:
        for e in cell.step_until_event(duration_s - cell.time_s):
            if e["type"] == "qc_trigger" and qc_fn is not None:
                qc_fn(cell, e)
            elif e["type"] == "pick_trigger" and grasp_fn is not None:
                grasp_fn(cell, e)


def test_wrong_verdicts_are_scored_as_errors():
    """Inverted verdicts: every good part rejected, every defect passed; uncertain → manual."""
    cell = Cell(CellConfig(seed=2, grasp=False), render=False)
    seen = []

    def invert(c, e):
        verdict, eject_s = oracle.qc_decision(c, e["part_id"], e["t_s"])
        seen.append(e["part_id"])
        if len(seen) % 5 == 0:
            c.apply_qc_verdict("uncertain", eject_s, e["t_s"])
        else:
            c.apply_qc_verdict("pass" if verdict == "reject" else "reject", eject_s, e["t_s"])

    _drive(cell, 25.0, qc_fn=invert)
    qc = cell.tally.qc
    assert qc["false_reject"] >= 1 and qc["missed_defect"] >= 1 and qc["manual"] >= 1
    assert qc["correct_accept"] == qc["correct_reject"] == 0


def test_reject_at_the_wrong_time_misses_the_part():
    cell = Cell(CellConfig(seed=4, grasp=False, conveyor={"defect_rate": 1.0}), render=False)
    _drive(cell, 12.0, qc_fn=lambda c, e: c.apply_qc_verdict("reject", c.eject_time_s(e["t_s"]) + 0.6, e["t_s"]))
    assert cell.tally.qc["missed_defect"] >= 2
    assert cell.tally.qc["correct_reject"] == 0


def test_bad_grasps_fail_and_holds_are_not_attempts():
    cell = Cell(CellConfig(seed=6, qc=False, pick={"max_holds": 1}), render=False)
    kinds = ["too_narrow", "too_high", "hold", "good"]
    done = []

    def grasp(c, e):
        cmd = oracle.grasp_decision(c)
        kind = kinds[len(done) % len(kinds)]
        done.append(kind)
        if kind == "hold":
            c.apply_grasp_hold()
            return
        if kind == "too_narrow":            # fingers land on top of the object
            cmd = dataclasses.replace(cmd, width_m=0.01)
        elif kind == "too_high":             # closes in the air above it
            cmd = dataclasses.replace(cmd, z_m=cmd.z_m + 0.08)
        c.apply_grasp(cmd)

    _drive(cell, 30.0, grasp_fn=grasp)
    events = cell.tally.grasp_events
    by_kind = {}
    for kind, ev in zip(done, events):
        by_kind.setdefault(kind, []).append(ev["outcome"])
    assert set(by_kind["too_narrow"]) == {"failure"}
    assert set(by_kind["too_high"]) == {"failure"}
    assert set(by_kind["hold"]) == {"held"}
    assert set(by_kind["good"]) == {"success"}
    assert math.isclose(cell.tally.grasp_success(), len(by_kind["good"]) / (len(events) - len(by_kind["hold"])))


def test_a_hold_looks_again_before_giving_up():
    cell = Cell(CellConfig(seed=6, qc=False, pick={"max_holds": 3, "hold_retry_s": 0.5}), render=False)
    triggers = []

    def hold(c, e):
        triggers.append((e["scene_id"], e["t_s"]))
        c.apply_grasp_hold()

    _drive(cell, 3.0, grasp_fn=hold)
    first = [t for s, t in triggers if s == 0]
    assert len(first) == 3 and np.allclose(np.diff(first), 0.5, atol=0.011)
    assert cell.tally.grasp_events[0]["outcome"] == "held" and cell.tally.grasp_events[0]["holds"] == 3
    assert triggers[3][0] == 1          # then a new scene


def test_ik_reaches_the_workspace():
    from sol_control.sim.ik import ArmIK, tool_rotation
    from sol_control.sim.pick import READY_SEED_RAD

    cell = Cell(CellConfig(seed=0, qc=False), render=False)
    ik = ArmIK(cell.pick.model)
    rng = np.random.default_rng(0)
    for _ in range(20):
        target = np.array([rng.uniform(-0.1, 0.1), rng.uniform(-0.1, 0.1), rng.uniform(0.01, 0.25)])
        yaw = rng.uniform(-math.pi / 2, math.pi / 2)
        q, err = ik.solve(READY_SEED_RAD, target, yaw)
        pos, rot = ik.forward(q)
        assert np.linalg.norm(pos - target) < 1e-3, (target, pos)
        assert np.abs(rot - tool_rotation(yaw)).max() < 1e-2
