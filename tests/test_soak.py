"""`sol-control soak`: the 60-second CI run, and a check that the soak's leak detector can fail.

The soak runs the ROS-free Coprocessor core in its own process (no DDS; see
sol_control/bench/soak.py), so its resident memory is not mixed with pytest's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def bundle_params() -> list[str] | None:
    alt = os.environ.get("SOL_CONTROL_TEST_BUNDLES")
    out = []
    for task in ("qc", "grasp"):
        for d in ([Path(alt) / task] if alt else []) + [REPO / "models" / task]:
            if (d / "manifest.json").is_file():
                out += ["--param", f"{task}.bundle={d}"]
                break
    return out or None


PARAMS = bundle_params()
assert PARAMS is not None, "the shipped bundles models/qc and models/grasp are part of the repository"


def soak(tmp_path: Path, *args: str, timeout_s: float = 240.0) -> tuple[int, dict, str]:
    out = tmp_path / "soak.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "sol_control.cli", "soak", "--json", str(out), *PARAMS, *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    res = json.loads(out.read_text()) if out.exists() else {}
    return r.returncode, res, r.stdout + r.stderr


def test_soak_60s_at_3x(tmp_path):
    # qc.min_confidence 0: fast answers are used whenever valid and in time, so the whole fast path
    # (draft, speculative verification, KV rewinds) runs for the minute, not only its fallbacks.
    code, res, log = soak(tmp_path, "--minutes", "1", "--rate-x", "3", "--param", "qc.min_confidence=0")
    assert res, log
    print(log)
    assert res["rate_hz"] == pytest.approx(90.0) and res["wall_s"] >= 59.0
    for task, s in res["tasks"].items():
        # real work: at least a tenth of the post-warm-up frames were decided for each task (at a load
        # average of 12 on 2 cores a third were; the rest are skipped, latest value wins)
        assert s["decisions"] >= (res["wall_s"] - res["warmup_s"]) * res["rate_hz"] / 10, (task, s["decisions"])
        assert sum(s["sources"].values()) == s["decisions"]
        assert len(s["window_p99_ms"]) >= 3
    assert res["rss_growth_mb"] < 5.0, res["rss_mb"]
    # The co-processor's own CPU per decision does not creep up grossly (a leak that makes each
    # decision dearer). Only gross: CPU time per decision moves by 20 % within a minute on a shared
    # VM (caches, neighbours), and speed is the benchmarks' to judge, not the tests'; the soak's own
    # verdict on wall-clock p99 stability is checked against its exit code below.
    assert abs(res["cpu_drift"]) < 0.5, {t: s["cpu_ms_per_decision"] for t, s in res["tasks"].items()}
    print("window p99:", {t: s["window_p99_ms"] for t, s in res["tasks"].items()}, "load:", res["load_1min"])
    # Every decision is relabelled right before it is recorded (as the node does before publishing),
    # with the publish margin; the workers get the GIL back within 0.5 ms (share_gil_quickly). None
    # may say "on time" and arrive later than deadline + margin + the 5 ms preemption allowance.
    assert res["unlabelled_misses"] == 0, \
        {t: (s["mislabelled"], s["late_after_label"], s["label_lag_max_ms"]) for t, s in res["tasks"].items()}
    assert code == (0 if res["pass"] else 1), log


def test_soak_detects_a_leak(tmp_path):
    """1 MB/s kept alive on purpose (the TEST ONLY hook): the soak must fail on memory."""
    code, res, log = soak(tmp_path, "--minutes", "0.3", "--rate-x", "0.5", "--leak-kb-per-s", "1024")
    assert res, log
    assert res["rss_growth_mb"] > 5.0 and not res["criteria"]["rss_growth_under_5mb"], res["rss_mb"]
    assert code == 1 and "FAIL" in log


def test_soak_refuses_bad_arguments(tmp_path):
    code, res, log = soak(tmp_path, "--minutes", "0", timeout_s=60.0)
    assert code == 2 and "--minutes and --rate-x must be positive" in log and "Traceback" not in log
