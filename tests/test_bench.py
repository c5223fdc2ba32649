"""The benchmark report's own logic (speed is never asserted: the figures are the benchmark's job)."""
from __future__ import annotations

import math

from .conftest import FIXTURES
from sol_control.bench.report import scaling
from sol_control.bundle import Bundle


def test_scaling_runs_past_the_trained_context_and_says_so():
    bundle = Bundle.load(FIXTURES / "tiny")
    ctx = bundle.manifest.max_context
    rows = scaling(bundle, lengths=(8, ctx), prefix_lens=(8,), rounds=1)
    assert [(r["prefix_len"], r["new_tokens"]) for r in rows] == [(8, 8), (8, ctx)]
    assert [r["beyond_trained_context"] for r in rows] == [False, True]  # 8 + ctx > ctx
    for r in rows:
        for key in ("std", "fast"):
            assert r[f"{key}_tokens_per_s"] > 0 and r[f"{key}_decision_ms"] > 0
        assert math.isclose(r["ratio_tokens"], r["fast_tokens_per_s"] / r["std_tokens_per_s"])
        assert 0.0 <= r["fast_acceptance"] <= 1.0 and r["fast_mean_accepted"] >= 1.0


def test_end_to_end_rounds_are_summarised_by_their_median_and_range():
    from sol_control.bench.node_bench import _median_run

    runs = [{"p50_ms": p50, "p99_ms": 2 * p50, "hit_rate": 1.0, "sources": {"fast": 10}, "decisions_received": 10}
            for p50 in (9.0, 30.0, 10.0, 8.0, 11.0)]
    m = _median_run(runs)
    assert (m["p50_ms"], m["p50_ms_min"], m["p50_ms_max"]) == (10.0, 8.0, 30.0)  # one slow round does not move it
    assert m["p99_ms"] == 20.0 and m["sources"] == {"fast": 50} and m["decisions"] == 50
