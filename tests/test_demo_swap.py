"""`sol-control demo --qc-families` and `--swap-qc DIR@SECONDS` (sol_control/sim/swap.py).

1. Bad values fail with one clear line before anything starts (these tests carry no process / ros /
   sim marker: tests/conftest.py fails them if they start a process, DDS or MuJoCo).
2. The conveyor carries the families asked for; by default it draws exactly the parts it drew
   before the option existed (same seed, same parts).
3. Short lock-step demos over real DDS (ROS_DOMAIN_ID 84, the QC node only): a copy of the shipped
   QC bundle (new manifest sha256) swapped in mid-run splits the verdicts between the two bundles
   at the swap and loses no decision; a bundle that fails verification is refused, the old one
   keeps deciding, and the report says why.
"""
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sol_control.bundle import MANIFEST, sha256_file
from sol_control.cli import main as cli
from sol_control.sim import report as rep
from tests.conftest import bundle_dir

DOMAIN = 84


# -- 1. bad values, before anything starts -----------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["--qc-families", "hexnut,bolt"], "--qc-families 'hexnut,bolt': families must be among plate, ring, bracket, "
                                      "hexnut, tab, got 'bolt'"),
    (["--qc-families", ","], "families must name at least one of"),
    (["--swap-qc", "models/qc"], "--swap-qc must be DIR@SECONDS"),
    (["--swap-qc", "/nonexistent/qc_hexnut@5"], "--swap-qc: no bundle folder '/nonexistent/qc_hexnut'"),
    (["--swap-qc", "models/qc@later"], "SECONDS must be a number, got 'later'"),
    (["--swap-qc", "models/qc@30"], "SECONDS must lie inside the run (0, 10) s, got 30"),
    (["--swap-qc", "models/qc@5", "--only", "grasp"], "not with --oracle, --only grasp or --chaos"),
])
def test_bad_values_fail_clearly_before_anything_starts(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])   # models/qc: a folder that exists
    assert cli(["demo", "--duration", "10", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and err.count("\n") == 0, err


# -- 2. the families on the belt ---------------------------------------------------------------------
def _belt_parts(families=None, n: int = 5) -> list:
    from sol_control.sim.cell import Cell
    from sol_control.sim.config import CellConfig

    conveyor = {"families": families} if families else {}
    cell = Cell(CellConfig(seed=5, grasp=False, conveyor=conveyor), render=False)
    seen: dict[int, object] = {}
    while len(seen) < n:
        cell.step()
        seen.update((bp.part_id, bp.part) for bp in cell.conveyor.parts)
    cell.close()
    return [seen[k] for k in sorted(seen)[:n]]


@pytest.mark.sim
def test_conveyor_carries_the_families_asked_for_and_by_default_the_same_parts_as_before():
    from sol_control.sim.config import ConveyorConfig
    from sol_control.tasks import qc as qc_task
    from sol_control.tasks.common import QC_DEFECTS

    assert {p.spec.family for p in _belt_parts(("hexnut",))} == {"hexnut"}
    assert {p.spec.family for p in _belt_parts(("hexnut", "tab"), n=8)} == {"hexnut", "tab"}
    # the default: the draws of the recipe before --qc-families (sample_spec without families, the
    # defect at the line's rate, the yaw, then the spacing jitter), from the cell's QC seed
    cfg = ConveyorConfig()
    rng = np.random.default_rng(np.random.SeedSequence(5).spawn(2)[0])
    before = []
    for _ in range(5):
        spec = qc_task.sample_spec(rng, heldout=False)
        if rng.random() >= cfg.defect_rate:
            spec = dataclasses.replace(spec, defect="ok", severity=0.0)
        else:
            spec = dataclasses.replace(spec, defect=QC_DEFECTS[1 + int(rng.integers(len(QC_DEFECTS) - 1))],
                                       severity=float(rng.uniform(0.0, 1.0)))
        before.append((spec, float(rng.uniform(0, 2 * np.pi))))
        rng.uniform(-cfg.pitch_jitter_m, cfg.pitch_jitter_m)
    assert [(p.spec, p.yaw_rad) for p in _belt_parts()] == before


# -- 3. the swap in a running demo -------------------------------------------------------------------
def _shipped_qc() -> Path:
    qc = bundle_dir("qc")
    assert qc is not None, "no QC bundle (models/qc/manifest.json): make models"
    return qc


def _copy(src: Path, dst: Path, description: str) -> Path:
    """The bundle under a new manifest sha256 (its description changed), as bench node's swap_copy."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    manifest["description"] = manifest.get("description", "") + description
    (dst / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return dst


def _demo(tmp_path: Path, monkeypatch, swap: str, duration_s: float) -> tuple[dict, str]:
    from tests.ros_helpers import set_ros_env

    set_ros_env(DOMAIN)
    monkeypatch.setenv("ROS_DOMAIN_ID", str(DOMAIN))   # the demo gives its nodes and itself this domain
    out = tmp_path / "demo"
    rc = cli(["demo", "--only", "qc", "--lockstep", "--duration", str(duration_s), "--seed", "3",
              "--qc-families", "hexnut", "--swap-qc", swap, "--param", f"qc.bundle={_shipped_qc()}",
              "--param", "audit_rate=0.0", "--sim-nice", "0", "--node-nice", "0", "--quiet", "--out", str(out)])
    assert rc == 0
    return json.loads((out / "report.json").read_text()), (out / "events.jsonl").read_text()


def _no_decision_lost(r: dict) -> None:
    s = r["swap"]
    assert s["decisions_lost"] == r["decisions_lost"] == 0 and s["decision_timeouts"] == 0, s
    assert s["parts_without_verdict"] == r["no_verdict"] == 0 and r["unverified_passes"] == 0
    assert sum(b["verdicts"] for b in s["by_bundle"].values()) == s["qc_decisions"] == r["decisions"]
    for b in s["by_bundle"].values():
        assert b["right"] + b["wrong"] + b["manual"] + b["no_outcome"] == b["verdicts"], b


@pytest.mark.process
@pytest.mark.ros
@pytest.mark.sim
def test_demo_swaps_in_a_new_qc_bundle_mid_run_and_loses_no_decision(tmp_path, monkeypatch, capsys):
    shipped = _shipped_qc()
    new = _copy(shipped, tmp_path / "qc_new", " (a copy, swapped into the demo)")
    old_sha, new_sha = sha256_file(shipped / MANIFEST), sha256_file(new / MANIFEST)
    assert old_sha != new_sha
    r, events = _demo(tmp_path, monkeypatch, f"{new}@7", duration_s=14.0)
    s = r["swap"]
    assert s["successful"] and s["reason"] == "" and s["to_sha256"] == new_sha, s
    assert r["qc_families"] == ["hexnut"]
    # lock-step: asked right before the first QC image at or after 7 s, the world waiting for the answer
    assert 7.0 <= s["sent_t_s"] == s["done_t_s"] < 14.0, s
    assert list(s["by_bundle"]) == [old_sha, new_sha]
    old, fresh = s["by_bundle"][old_sha], s["by_bundle"][new_sha]
    assert old["last_t_s"] < s["sent_t_s"] <= fresh["first_t_s"], s["by_bundle"]
    assert old["verdicts"] >= 2 and fresh["verdicts"] >= 2
    _no_decision_lost(r)
    decisions = [json.loads(line) for line in events.splitlines() if '"type": "decision"' in line]
    assert [d["bundle_sha256"] for d in decisions] == [old_sha] * old["verdicts"] + [new_sha] * fresh["verdicts"]
    printed = capsys.readouterr().out
    assert "QC bundle swap at 7 s (sim)" in printed and f"bundle {new_sha[:12]} (new)" in printed


@pytest.mark.process
@pytest.mark.ros
@pytest.mark.sim
def test_demo_goes_on_with_the_old_bundle_when_the_swap_is_refused(tmp_path, monkeypatch, capsys):
    shipped = _shipped_qc()
    broken = _copy(shipped, tmp_path / "qc_broken", " (a copy with a damaged file)")
    victim = broken / "reference.npz"                    # same size, one byte changed: sha256 mismatch
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r, _ = _demo(tmp_path, monkeypatch, f"{broken}@4", duration_s=8.0)
    s = r["swap"]
    assert not s["successful"] and "refused" in s["reason"] and "sha256 mismatch" in s["reason"], s
    assert list(s["by_bundle"]) == [sha256_file(shipped / MANIFEST)]      # the old bundle decided throughout
    _no_decision_lost(r)
    printed = capsys.readouterr().out
    assert f"swap refused: {s['reason']}" in printed


def test_report_table_shows_a_refused_swap_and_the_split():
    why = "qc.bundle /tmp/qc_new refused, qc keeps deciding on ff8fae0cef8c: bundle /tmp/qc_new: no manifest.json"
    s = {"at_s": 20.0, "successful": False, "reason": why,
         "sent_t_s": 20.1, "done_t_s": 20.4, "to_sha256": "b" * 64, "qc_decisions": 3, "parts": 2,
         "parts_without_verdict": 0,
         "by_bundle": {"a" * 64: {"verdicts": 3, "right": 1, "wrong": 1, "manual": 0, "no_outcome": 1,
                                  "accuracy": 0.5, "deadline_hit_rate": 2 / 3}}}
    rows = dict(rep._swap_rows(s))
    assert rows["QC bundle swap at 20 s (sim)"] == "refused" and rows["  why"] == why[:59] + "…"
    assert rows["  bundle aaaaaaaaaaaa: verdicts / right / wrong / manual / no outcome"] == "3 / 1 / 1 / 0 / 1"
    assert rows["    QC accuracy / deadline hit rate"] == "50.00% / 66.67%"
    assert rep._swap_rows({}) == []
