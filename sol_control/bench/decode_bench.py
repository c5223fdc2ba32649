"""`sol-control bench decode`: standard vs quantized vs speculative, side by side in one run.

Rows (those the bundle can run): the standard (fp32 target, plain greedy), int8 and int4 plain,
int8 / int4 with the target's own draft heads, int8 / int4 with the draft model, and the plain and
heads rows the native pass runs again on ONNX Runtime (`· ORT`). Every row decodes the same
decision prefixes on sessions of its own. Each round times every row alone, one after another (the
order rotating from round to round), as a deployment runs one configuration; ratios are taken
within the run.

Per round and row: every prefix cold (the cache emptied first: what a peer without cross-frame
caches pays), then warm, as the node runs it (the session keeps what it cached for the previous
frame, so a static-first prefix is not computed again): `decision_ms_*` and tokens/s are warm.
Speculative rows then run paced (`paced_decision_ms_p50`): one decision every 1/30 s with the
thread asleep in between, as the node meets its camera frames (on a shared host the CPU's caches do
not survive the sleep). Interleaved (`interleaved_decision_ms_p50`, `ratios_interleaved`): each
round also decodes the prefixes warm with all rows taking turns decision by decision, their weights
evicting each other from the caches: a figure of no deployment, kept for comparison. CPU time per
decision (the decoding thread) and joules (sol_control.energy) come with every row.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..config import shipped_bundle
from ..decoding import open_decoder
from ..decoding.native import NativeDecoderSession
from ..energy import EnergyMeter, energy_row
from ..eval import encode_scenes, scenes
from ..perception import ObservationTokenizer
from . import row
from .common import (ceiling, equal_share, memory_bandwidth_gbs, pct, progress, rate, rotated, table,
                     write_json)

PACE_S = 1 / 30  # paced timing: one decision per camera frame at 30 Hz, asleep in between
PACED_DECISIONS = 20  # per round (each costs a frame period of wall time)
PHASES = ("warm", "cold", "paced", "interleaved")
CONFIGS = [  # (row name, target precision, how it drafts)
    ("standard fp32", "fp32", "plain"), ("int8 plain", "int8", "plain"), ("int4 plain", "int4", "plain"),
    ("int8 + heads", "int8", "heads"), ("int4 + heads", "int4", "heads"),
    ("int8 + draft", "int8", "draft"), ("int4 + draft", "int4", "draft"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, default=None, help="bundle folder (default: models/grasp)")
    p.add_argument("--quick", action="store_true", help="fewer decisions and rounds (< 45 s)")
    p.add_argument("--decisions", type=int, default=None, help="decision prefixes per round")
    p.add_argument("--rounds", type=int, default=None, help="rounds (>= 5 for medians)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per decision (default: the bundle's action length)")
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads for every session")
    p.add_argument("--k", type=int, default=None, help="fixed draft length of the draft-model rows (default: adaptive)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")


@dataclass
class Row(row.Row):
    backend: str = "auto"  # open_decoder's; "onnxruntime" for the twins of rows the native pass runs
    # phase -> [round][decision] DecodeStats: warm and cold (this row alone), paced (speculative rows:
    # warm, one decision per PACE_S), interleaved (warm, the rows taking turns decision by decision)
    rounds: dict[str, list[list]] = field(default_factory=lambda: {p: [] for p in PHASES})
    pass_ms: dict[int, list[float]] = field(default_factory=dict)  # heads rows: rows of a call -> ms of such calls
    cpu_s: float = 0.0  # the decoding thread's, over the decisions alone (cold and warm)
    outputs: list[list[int]] = field(default_factory=list)  # the first round's warm answers

    def summary(self, standard: list[list[int]], plain: list[list[int]], meter: EnergyMeter) -> dict:
        p50 = lambda xs: pct(xs, 50)  # noqa: E731
        ms = {phase: [s.wall_ms for r in rounds for s in r] for phase, rounds in self.rounds.items()}
        warm, alone = sum(self.rounds["warm"], []), sum(self.rounds["warm"] + self.rounds["cold"], [])
        decode = [_decode_rate(r) for r in self.rounds["warm"]]
        passes, proposed = sum(s.verify_passes for s in warm), sum(s.proposed for s in warm)
        return {
            "name": self.name, "precision": self.precision, "speculative": self.speculative, "mode": self.mode,
            "backend": "native" if isinstance(self.target, NativeDecoderSession) else "onnxruntime",
            "decision_ms_p50": p50(ms["warm"]), "decision_ms_p99": pct(ms["warm"], 99),
            "cold_decision_ms_p50": p50(ms["cold"]),
            "paced_decision_ms_p50": p50(ms["paced"]) if ms["paced"] else None,
            "interleaved_decision_ms_p50": p50(ms["interleaved"]),
            "decode_tokens_per_s": p50(decode),
            "interleaved_decode_tokens_per_s": p50([_decode_rate(r) for r in self.rounds["interleaved"]]),
            "pass_ms_p50": {str(rows): p50(ms) for rows, ms in sorted(self.pass_ms.items())} or None,
            "decode_tokens_per_s_min": min(decode), "decode_tokens_per_s_max": max(decode),
            "tokens_per_s": p50([sum(s.new_tokens for s in r) / sum(s.wall_ms for s in r) * 1e3
                                 for r in self.rounds["warm"]]),
            "ttft_ms_p50": p50([s.ttft_ms for s in warm]),
            "mean_accepted": sum(s.new_tokens - 1 for s in warm) / passes if self.speculative and passes else None,
            "draft_acceptance": sum(s.accepted for s in warm) / proposed if proposed else None,
            "match_standard": equal_share(self.outputs, standard),
            "match_plain_same_target": equal_share(self.outputs, plain),
            **energy_row(self.cpu_s, len(alone), meter, sum(s.new_tokens for s in alone)),
        }


def _decode_rate(stats: list) -> float:
    """Tokens after the prefill call over the time after it (a guessed prefill's extra tokens came in
    its TTFT)."""
    return rate(sum(s.decode_tokens for s in stats), sum(s.decode_ms for s in stats))


def decision_prefixes(bundle: Bundle, n: int, seed: int = 0) -> list[np.ndarray]:
    """Observation prefixes for real decisions (test split) for QC and grasp bundles; random
    observation tokens (any tokens for a plain LM) for other bundles."""
    m = bundle.manifest
    if m.task in ("qc", "grasp"):
        obs = ObservationTokenizer.from_bundle(bundle)
        prefixes, _ = encode_scenes(obs, scenes(m.task, "test", n, seed))
        return [p for p in prefixes if p is not None]  # None: an unusable image
    rng = np.random.default_rng(seed)
    lo, hi = m.vocab.observation or (0, m.vocab.size)  # a plain LM: any token
    length = max(4, min(24, m.max_context // 4))
    return [np.concatenate([[m.vocab.bos], rng.integers(lo, hi, length), [m.vocab.sep]]).astype(np.int64)
            for _ in range(n)]


def make_rows(bundle: Bundle, threads: int) -> list[Row]:
    """The rows this bundle can run, each with sessions of its own, then the `· ORT` twins of the
    plain and heads rows the native pass runs: what the C pass buys, measured in the same run."""
    m = bundle.manifest
    modes = {"plain": True, "heads": m.target.draft_heads > 0, "draft": m.draft is not None}
    rows = [Row(n, p, mode) for n, p, mode in CONFIGS if p in m.target.precisions and modes[mode]]
    for r in rows:
        r.target = open_decoder(bundle, "target", r.precision, threads, name=r.name)
        if r.mode == "draft":
            r.open_draft(bundle, threads, f"{r.name} draft")
    twins = [Row(f"{r.name} · ORT", r.precision, r.mode, backend="onnxruntime") for r in rows
             if isinstance(r.target, NativeDecoderSession) and r.mode in ("plain", "heads")]
    for t in twins:
        t.target = open_decoder(bundle, "target", t.precision, threads, name=t.name, backend="onnxruntime")
    return rows + twins


def run_bench(bundle: Bundle, decisions: int, rounds: int, new_tokens: int, threads: int,
              k: int | None) -> dict:
    prefixes = decision_prefixes(bundle, decisions)
    rows = make_rows(bundle, threads)
    meter = EnergyMeter()
    for r in rows:  # warm up every session (first ORT runs allocate arenas)
        for prefix in prefixes[:2]:
            r.decode(prefix, new_tokens, k=k, cold=True)
    t_start = time.monotonic()
    for rnd in range(rounds):
        _interleaved(rows, prefixes, new_tokens, k)
        for j, r in enumerate(rotated(rows, rnd)):
            _alone(r, prefixes, new_tokens, k, rnd == 0)
            progress(f"round {rnd + 1}/{rounds}  row {j + 1}/{len(rows)}  {time.monotonic() - t_start:5.1f} s")
    progress("", end="\n")
    meter.update()
    plain = {(r.precision, r.backend): r.outputs for r in rows if not r.speculative}
    out_rows = [r.summary(rows[0].outputs, plain[(r.precision, r.backend)], meter) for r in rows]
    targets = {r.precision: r.target for r in rows if r.backend != "onnxruntime"}
    return _report(bundle, out_rows, targets, new_tokens, len(prefixes), rounds, threads)


def _timed(r: Row, prefix, new_tokens: int, k, cold: bool):
    """A decision alone, its thread's CPU time counted on the row."""
    c0 = time.thread_time_ns()
    res = r.decode(prefix, new_tokens, k=k, cold=cold)
    r.cpu_s += (time.thread_time_ns() - c0) / 1e9
    return res


def _alone(r: Row, prefixes, new_tokens: int, k, first_round: bool) -> None:
    """One round of row `r` alone: every prefix cold, then warm (the figures of record), then for a
    speculative row PACED_DECISIONS warm ones a frame period (PACE_S) apart; a heads row last times
    its passes (`_time_passes`)."""
    r.rounds["cold"].append([_timed(r, prefix, new_tokens, k, cold=True).stats for prefix in prefixes])
    warm = [_timed(r, prefix, new_tokens, k, cold=False) for prefix in prefixes]
    r.rounds["warm"].append([res.stats for res in warm])
    if first_round:
        r.outputs = [res.tokens for res in warm]
    if r.speculative:
        r.rounds["paced"].append([])
        for prefix in prefixes[:PACED_DECISIONS]:
            time.sleep(PACE_S)
            r.rounds["paced"][-1].append(r.decode(prefix, new_tokens, k=k).stats)
    if r.mode == "heads":
        _time_passes(r, prefixes)


def _time_passes(r: Row, prefixes) -> None:
    """What a call of 1 and of K + 1 tokens (K draft heads, switched on) costs after each prefix:
    the pass a perfect draft would need for K + 1 tokens, for `ceiling_tokens`."""
    t, k = r.target, r.target.draft_heads
    t.use_heads(True)
    for i, prefix in enumerate(prefixes):
        answer = np.resize(np.asarray(r.outputs[i % len(r.outputs)], np.int64), k + 1)  # real ids
        for rows, ms in row.call_ms(t, prefix, answer, (1, k + 1)).items():
            r.pass_ms.setdefault(rows, []).append(ms)


def _interleaved(rows: list[Row], prefixes, new_tokens: int, k) -> None:
    """One warm pass with the rows taking turns decision by decision; its decisions count in no
    other figure (CPU time and joules come from the rows alone)."""
    for r in rows:
        r.rounds["interleaved"].append([])
    for prefix in prefixes:
        for r in rows:
            r.rounds["interleaved"][-1].append(r.decode(prefix, new_tokens, k=k).stats)


def _ratios(best: dict, std: dict, plain: dict, prefix: str = "") -> dict:
    """Ultrafast over standard and speculative over plain on the same target, in decode tokens/s and
    ms per decision (`prefix` "interleaved_": the interleaved figures)."""
    tok, ms = f"{prefix}decode_tokens_per_s", f"{prefix}decision_ms_p50"
    return {"speculative_vs_plain": best[tok] / plain[tok], "ultrafast_vs_standard": best[tok] / std[tok],
            "ultrafast_vs_standard_decision": std[ms] / best[ms]}


def _weight_streaming(targets: dict, by: dict, bw: float) -> dict:
    """Per precision: ms per decoded token against the ms to stream the weights once at `bw` GB/s."""
    stream = {}
    for prec, sess in targets.items():
        weight_bytes = sess.path.stat().st_size
        per_token_ms = 1e3 / by["standard fp32" if prec == "fp32" else f"{prec} plain"]["decode_tokens_per_s"]
        stream_ms = weight_bytes / (bw * 1e9) * 1e3
        stream[prec] = {"weight_bytes": weight_bytes, "per_token_ms": per_token_ms,
                        "stream_ms": stream_ms, "ratio": per_token_ms / stream_ms}
    return stream


def _report(bundle, rows, targets, new_tokens, n_prefixes, rounds, threads) -> dict:
    by = {r["name"]: r for r in rows}
    std = by["standard fp32"]
    best = max((r for r in rows if r["speculative"]), key=lambda r: r["decode_tokens_per_s"])
    plain = next(r for r in rows if r["mode"] == "plain" and r["precision"] == best["precision"]
                 and r["backend"] == best["backend"])
    twin = by.get(f"{best['name']} · ORT")
    bw = memory_bandwidth_gbs()
    return {
        "bundle": bundle.manifest.name, "task": bundle.manifest.task,
        "new_tokens": new_tokens, "decisions": n_prefixes, "rounds": rounds, "threads": threads,
        "ratios": {
            **_ratios(best, std, plain),
            "ultrafast_vs_standard_e2e_tokens": best["tokens_per_s"] / std["tokens_per_s"],
            # the ultrafast row on the native pass over the same row on ONNX Runtime (None: no native row)
            "native_vs_onnxruntime": twin and best["decode_tokens_per_s"] / twin["decode_tokens_per_s"],
            "native_vs_onnxruntime_decision": twin and twin["decision_ms_p50"] / best["decision_ms_p50"],
        },
        "ratios_interleaved": _ratios(best, std, plain, "interleaved_"),
        "ultrafast": best["name"],
        "ceiling_tokens": _ceiling(best, std),
        "outputs_match_standard": all(r["match_standard"] == 1.0 for r in rows),
        "speculative_lossless": all(r["match_plain_same_target"] == 1.0 for r in rows),
        "mean_accepted": best["mean_accepted"],
        "memory_bandwidth_gbs": bw,
        "weight_streaming": _weight_streaming(targets, by, bw),
        "rows": rows,
    }


def _ceiling(best: dict, std: dict) -> float | None:
    """Decode tokens/s over standard's that the ultrafast row's pass would give if every guess were
    right: K + 1 tokens a call of K + 1 rows (`pass_ms_p50`). None for a draft-model row."""
    if not best["pass_ms_p50"]:
        return None
    rows = max(best["pass_ms_p50"], key=int)
    return ceiling(int(rows) - 1, 1e3 / std["decode_tokens_per_s"], best["pass_ms_p50"][rows])


def rows_table(rows: list[dict]) -> str:
    head = ["config", "decode tok/s (min-max)", "tok/s incl. prefill", "ms/decision p50", "p99", "cold p50",
            "interleaved p50", "TTFT ms", "mean acc.", "CPU ms", "mJ", "= std", "= plain"]
    return table(head, [[
        r["name"], f"{r['decode_tokens_per_s']:8.0f} ({r['decode_tokens_per_s_min']:.0f}-{r['decode_tokens_per_s_max']:.0f})",
        f"{r['tokens_per_s']:.0f}", f"{r['decision_ms_p50']:.2f}", f"{r['decision_ms_p99']:.2f}",
        f"{r['cold_decision_ms_p50']:.2f}", f"{r['interleaved_decision_ms_p50']:.2f}", f"{r['ttft_ms_p50']:.2f}",
        "-" if r["mean_accepted"] is None else f"{r['mean_accepted']:.2f}", f"{r['cpu_ms_per_decision']:.2f}",
        f"{1e3 * r['joules_per_decision']:.1f}", f"{r['match_standard']:.0%}", f"{r['match_plain_same_target']:.0%}"]
        for r in rows])


def report_lines(rep: dict) -> list[str]:
    """The report in Markdown: `bench decode` prints it, `bench all` puts it in its README."""
    rows, ra = rep["rows"], rep["ratios"]
    best = next(r for r in rows if r["name"] == rep["ultrafast"])
    lines = [f"**{rep['bundle']}** ({rep['task']}): {rep['decisions']} decisions x "
             f"{rep['rounds']} rounds, {rep['new_tokens']} tokens each, {rep['threads']} "
             "thread(s), each row alone in turn; ms/decision warm (static prefix kept, as in "
             "the node), cold = empty cache, interleaved = warm with the rows taking turns "
             "decision by decision (weights evicting each other)",
             "", "```", rows_table(rows), "```", ""]
    for label, r in (("alone", ra), ("interleaved", rep["ratios_interleaved"])):
        lines.append(f"- {label}: ultrafast ({best['name']}) vs standard "
                     f"{r['ultrafast_vs_standard']:.2f}x decode tok/s, "
                     f"{r['ultrafast_vs_standard_decision']:.2f}x ms/decision; "
                     f"speculative vs plain (same target) {r['speculative_vs_plain']:.2f}x")
    lines += [f"- {r['name']} paced: {r['paced_decision_ms_p50']:.2f} ms (one decision every "
              f"{1e3 * PACE_S:.0f} ms, asleep between)" for r in rows if r["paced_decision_ms_p50"]]
    if ra["native_vs_onnxruntime"]:
        lines.append(f"- {best['name']} on the native pass vs on ONNX Runtime: "
                     f"{ra['native_vs_onnxruntime']:.2f}x decode tok/s, "
                     f"{ra['native_vs_onnxruntime_decision']:.2f}x ms/decision")
    passes = best["pass_ms_p50"]
    ceiling = "" if passes is None else (
        f"; a call of {' / '.join(passes)} rows {' / '.join(f'{ms:.3f}' for ms in passes.values())}"
        f" ms: with every guess right {rep['ceiling_tokens']:.2f}x standard's decode tok/s at most")
    lines.append(f"- mean accepted {best['mean_accepted'] or 0:.2f}{ceiling}")
    energy = rows[0]
    lines.append(f"- energy: {energy['joules_per_decision_basis']} ({energy['energy_assumption']})")
    for prec, w in rep["weight_streaming"].items():
        lines.append(f"- {prec}: {w['per_token_ms']:.3f} ms/token vs {w['stream_ms']:.3f} ms to "
                     f"stream {w['weight_bytes'] / 1e6:.1f} MB at "
                     f"{rep['memory_bandwidth_gbs']:.1f} GB/s -> {w['ratio']:.2f}x")
    return lines + [""]


def run(args: argparse.Namespace) -> int:
    bundle = Bundle.load(args.bundle or shipped_bundle("grasp"))
    if bundle.manifest.draft is None and not bundle.manifest.target.draft_heads:
        raise ValueError(f"bundle {bundle.root} has neither draft heads nor a draft decoder: nothing to speculate with")
    new_tokens = args.new_tokens or len(bundle.manifest.actions) or 32
    rep = run_bench(bundle, args.decisions or (12 if args.quick else 40), args.rounds or 5, new_tokens,
                    args.threads, args.k)
    print("\n".join(report_lines(rep)))
    if args.json:
        write_json(args.json, rep)
    return 0
