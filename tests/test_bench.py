"""The benchmark report's own logic (speed is never asserted: the figures are the benchmark's job)."""
from __future__ import annotations

import math

from .conftest import FIXTURES, bundle_dir
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


def test_scaling_leaves_out_rows_longer_than_a_fused_graphs_kv_length_and_says_why():
    bundle = Bundle.load(bundle_dir("qc"))  # fused graphs: their KV length is fixed when built
    ctx = bundle.manifest.max_context
    rows = scaling(bundle, lengths=(4,), prefix_lens=(8, ctx), rounds=1)
    assert [(r["prefix_len"], r["new_tokens"]) for r in rows] == [(8, 4), (ctx, 4)]
    assert "skipped" not in rows[0] and rows[0]["fast_tokens_per_s"] > 0
    assert rows[1]["skipped"].startswith(f"needs {ctx + 4} KV positions; target_fp32's graph holds {ctx} ")


def test_a_failing_stage_is_reported_and_the_others_still_run(capsys):
    from argparse import Namespace

    from sol_control.bench.report import markdown, run_stages

    ran = []

    def ok(name):
        return lambda args, bundles, summary: ran.append(name)

    def boom(args, bundles, summary):
        raise ValueError("max_context must be in 1..64 (the graph's KV length), got 192")

    stages = {"decode": ok("decode"), "peers": ok("peers"), "paired": ok("paired"), "scaling": boom,
              "memory": ok("memory")}
    summary = {"machine": {"cpu": "x", "cores": 2, "onnxruntime": "1", "date": "d", "isa": {"variant": "avx2"}},
               "command": "c"}
    run_stages(Namespace(skip=["peers"]), {}, summary, stages)
    assert ran == ["decode", "memory"]  # peers skipped, and paired with it; scaling failed, memory still ran
    assert summary["failed"] == {"scaling": "ValueError: max_context must be in 1..64 (the graph's KV length), got 192"}
    assert "stage scaling failed" in capsys.readouterr().err
    text = markdown(summary)
    assert "**Stage scaling failed**: ValueError" in text and "native kernels avx2" in text


def test_end_to_end_rounds_are_summarised_by_their_median_and_range():
    from sol_control.bench.node_bench import _median_run

    runs = [{"p50_ms": p50, "p99_ms": 2 * p50, "hit_rate": 1.0, "sources": {"fast": 10}, "decisions_received": 10}
            for p50 in (9.0, 30.0, 10.0, 8.0, 11.0)]
    m = _median_run(runs)
    assert (m["p50_ms"], m["p50_ms_min"], m["p50_ms_max"]) == (10.0, 8.0, 30.0)  # one slow round does not move it
    assert m["p99_ms"] == 20.0 and m["sources"] == {"fast": 50} and m["decisions"] == 50


def test_the_slowest_percent_of_decisions_is_broken_down_by_stage():
    from sol_control.bench.node_bench import summarize

    # [stamp, received, source, met, node ms, reason, queue, perception, fast, full, cpu]; 1 ms = 1e6 ns
    rows = [[i, i + 5_000_000, "fast", True, 4.0, "", 1.0, 1.5, 1.5, math.nan, 3.0] for i in range(99)]
    rows.append([99, 99 + 20_000_000, "fast", True, 19.0, "", 2.0, 6.0, 9.0, math.nan, 11.0])
    s = summarize("qc", 20.0, {"stamps": list(range(100)), "seconds": 3.0}, rows, 30.0)
    t = s["tail_ms"]
    assert t["decisions"] == 1 and t["e2e"] == 20.0  # only the slow one is at or over the p99
    assert (t["queue"], t["perception"], t["fast"], t["cpu"]) == (2.0, 6.0, 9.0, 11.0)
    assert t["off_cpu"] == 7.0 and math.isnan(t["full_precision"])  # 20 - 2 queued - 11 on the CPU


def test_each_round_times_every_row_alone_in_turn_and_also_interleaved(monkeypatch):
    from sol_control.bench import decode_bench

    calls = []  # (row, cold) of every decision, in order
    decode = decode_bench.Row.decode

    def logged(self, prefix, max_new, stops=(), k=None, cold=False):
        calls.append((self.name, cold))
        return decode(self, prefix, max_new, stops, k, cold)

    monkeypatch.setattr(decode_bench.Row, "decode", logged)
    monkeypatch.setattr(decode_bench, "PACE_S", 0.0)
    bundle = Bundle.load(bundle_dir("qc"))  # a shipped bundle: draft heads, so heads rows
    rep = decode_bench.run_bench(bundle, decisions=2, rounds=2, new_tokens=4, threads=1, k=None)
    names = [r["name"] for r in rep["rows"]]
    speculative = {r["name"]: r["speculative"] for r in rep["rows"]}
    n, paced = len(names), min(2, decode_bench.PACED_DECISIONS)
    calls = calls[2 * n:]  # the warm-up: two cold decisions a row
    for rnd in range(2):
        interleaved, calls = calls[:2 * n], calls[2 * n:]
        assert interleaved == [(name, False) for _ in range(2) for name in names]  # turns, decision by decision
        for name in names[rnd:] + names[:rnd]:  # then each row alone: cold, warm, paced; the order rotates
            block = [(name, True)] * 2 + [(name, False)] * 2
            block += [(name, False)] * (paced if speculative[name] else 0)
            assert calls[:len(block)] == block, (rnd, name)
            calls = calls[len(block):]
    assert calls == []
    for r in rep["rows"]:
        assert r["decision_ms_p50"] > 0 and r["interleaved_decision_ms_p50"] > 0 and r["cold_decision_ms_p50"] > 0
        assert (r["paced_decision_ms_p50"] is not None) == r["speculative"], r["name"]
    by = {r["name"]: r for r in rep["rows"]}
    best, std = by[rep["ultrafast"]], by["standard fp32"]
    for key, field in (("ratios", "decision_ms_p50"), ("ratios_interleaved", "interleaved_decision_ms_p50")):
        assert math.isclose(rep[key]["ultrafast_vs_standard_decision"], std[field] / best[field])
    assert math.isclose(rep["ratios_interleaved"]["ultrafast_vs_standard"],
                        best["interleaved_decode_tokens_per_s"] / std["interleaved_decode_tokens_per_s"])
    heads = [r for r in rep["rows"] if r["mode"] == "heads"]
    assert heads and all(r["pass_ms_p50"] is None for r in rep["rows"] if r["mode"] != "heads")
    k = bundle.manifest.target.draft_heads
    assert all(set(r["pass_ms_p50"]) == {"1", str(k + 1)} for r in heads)
    if best["mode"] == "heads":  # a perfect draft: K + 1 tokens a pass of K + 1 rows, over standard's rate
        ms = best["pass_ms_p50"][str(k + 1)]
        assert math.isclose(rep["ceiling_tokens"], (k + 1) / ms * 1e3 / std["decode_tokens_per_s"])
    else:
        assert rep["ceiling_tokens"] is None


def test_peers_are_compared_with_our_fastest_speculative_row():
    from sol_control.bench.report import vs_best_peer

    ours = {"name": "int8 + draft", "speculative": True, "decision_ms_p50": 4.0, "cold_decision_ms_p50": 5.0}
    other = {**ours, "name": "int4 + draft", "decision_ms_p50": 4.5}
    plain = {**ours, "name": "int8 plain", "speculative": False, "decision_ms_p50": 1.0}
    peer = {"engine": "ort-genai", "mode": "plain", "precision": "int4", "decision_ms_p50": 6.0}
    got = vs_best_peer({"rows": [plain, ours, other]}, [peer, {**peer, "decision_ms_p50": 8.0}])
    assert got["vs_best_peer"] == 1.5 and got["vs_best_peer_cold"] == 1.2  # the best peer row over our faster row
    assert got["ours_vs_peer"] == {"name": "int8 + draft", "decision_ms_p50": 4.0, "cold_decision_ms_p50": 5.0}
    assert vs_best_peer({"rows": [ours]}, [peer], "_qc")["vs_best_peer_qc"] == 1.5


def test_the_node_fast_path_is_compared_with_its_solo_and_paced_decisions():
    from sol_control.bench.report import markdown, node_fast_path

    row = {"name": "int8 + heads", "decision_ms_p50": 1.0, "paced_decision_ms_p50": 2.5}
    decode = {"grasp": {"rows": [{"name": "int4 + heads", "decision_ms_p50": 0.5}, row]},
              "qc": {"rows": [row]}}
    e2e = {"grasp": {"ultrafast": {"fast_path_p50_ms": 3.0}}, "qc": {"ultrafast": {"fast_path_p50_ms": float("nan")}}}
    got = node_fast_path(decode, e2e)
    assert set(got) == {"grasp"}  # qc: no fast-path figure from the node, so no ratio
    assert got["grasp"]["vs_solo"] == 3.0 and got["grasp"]["vs_paced"] == 1.2
    text = markdown({"machine": {"cpu": "x", "cores": 2, "onnxruntime": "1", "date": "d"}, "command": "c",
                     "node_fast_path": got})
    assert "3.00x its decision alone" in text and "1.20x alone at 30 Hz" in text
