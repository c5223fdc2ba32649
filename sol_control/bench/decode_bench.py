"""`sol-control bench decode`: standard vs quantized vs speculative, side by side in one run.

Rows (those the bundle can run): the standard (fp32 target, plain greedy), int8 and int4 plain,
int8 / int4 with the target's own draft heads, int8 / int4 with the draft model. Every row decodes
the same decision prefixes on sessions of its own. Each round times every row alone, one after
another (the order rotating from round to round), as a deployment runs one configuration; rounds
alternate the rows, so a noisy neighbour slows all of them alike, and ratios are taken within the
run.

A decision is timed twice per round. Warm, as the node runs it: the session keeps what it cached
for the previous frame, so a static-first prefix (the grasp prefix's parked-arm joints) is not
computed again; everything that depends on the frame is. Cold: the cache is emptied first (what a
peer without cross-frame caches pays). `decision_ms_*` are warm; `cold_decision_ms_p50` beside
them. Tokens/s are from the warm runs. CPU time per decision (the decoding thread, ONNX Runtime's
included at 1 intra-op thread) and joules (sol_control.energy) come with every row.

Interleaved (`interleaved_decision_ms_p50`, `ratios_interleaved`): each round also decodes the
prefixes warm with all rows taking turns decision by decision, as this bench timed every row until
2026-12-07. Seven configurations' weights then evict each other from the CPU caches between two
decisions of one row, which costs the small speculative rows most (grasp int8 + heads on the Zen 4
host: 1.65 ms a decision interleaved, 1.14-1.18 ms alone; the standard row 4.43 against 3.92 ms):
a figure of no deployment, kept beside the main one for comparison with earlier reports.

Paced (`paced_decision_ms_p50`, speculative rows): the same row, warm, one decision every 1/30 s
with the thread asleep in between, as the node meets its camera frames. On a shared or virtualised
host the CPU's caches do not survive the sleep: on the AVX-512 host of docs/BENCHMARKS.md ("A
decision after an idle frame") a grasp int8 + heads decision took 1.1-1.3 ms back to back and
3.0-3.3 ms after 10-30 ms asleep, its first ONNX Runtime call 0.9 ms instead of 0.28. That, not the
node, is most of the fast path's gap between the node and its decision alone.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..decoding import AdaptiveK, greedy, open_decoder, speculate, speculate_heads
from ..decoding.native import NativeDecoderSession
from ..energy import EnergyMeter, energy_row
from .common import default_bundle, memory_bandwidth_gbs, pct, progress, table

PACE_S = 1 / 30  # paced timing: one decision per camera frame at 30 Hz, asleep in between
PACED_DECISIONS = 20  # per round (each costs a frame period of wall time)

# (row name, target precision, how it drafts)
CONFIGS = [
    ("standard fp32", "fp32", "plain"),
    ("int8 plain", "int8", "plain"),
    ("int4 plain", "int4", "plain"),
    ("int8 + heads", "int8", "heads"),
    ("int4 + heads", "int4", "heads"),
    ("int8 + draft", "int8", "draft"),
    ("int4 + draft", "int4", "draft"),
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
class Row:
    name: str
    precision: str
    mode: str  # plain | heads | draft
    backend: str = "auto"  # open_decoder's; "onnxruntime" for the twins of rows the native pass runs
    target: object = None
    draft: object = None
    controller: AdaptiveK | None = None
    decision_ms: list[float] = field(default_factory=list)  # warm, this row alone
    cold_ms: list[float] = field(default_factory=list)
    paced_ms: list[float] = field(default_factory=list)  # warm, one decision per PACE_S (speculative rows)
    interleaved_ms: list[float] = field(default_factory=list)  # warm, the rows taking turns decision by decision
    decode_tok_s: list[float] = field(default_factory=list)  # per round: tokens after the prefill call / decode time
    interleaved_decode_tok_s: list[float] = field(default_factory=list)
    pass_ms: dict[int, list[float]] = field(default_factory=dict)  # heads rows: rows of a call -> ms of such calls
    e2e_tok_s: list[float] = field(default_factory=list)  # per round: all new tokens / total wall time
    ttft_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    decisions: int = 0
    tokens: int = 0
    accepted: int = 0
    verify_passes: int = 0
    proposed: int = 0
    draft_accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    def decode(self, prefix: np.ndarray, new_tokens: int, k: int | None, cold: bool):
        if cold:
            self.target.reset()
            if self.draft is not None:
                self.draft.reset()
        if self.mode == "heads":
            return speculate_heads(self.target, prefix, new_tokens)
        if self.mode == "draft":
            return speculate(self.draft, self.target, prefix, new_tokens, k=k, controller=self.controller)
        return greedy(self.target, prefix, new_tokens)

    def summary(self, standard: list[list[int]], plain: list[list[int]], meter: EnergyMeter) -> dict:
        return {
            "name": self.name, "precision": self.precision, "speculative": self.speculative, "mode": self.mode,
            "backend": "native" if isinstance(self.target, NativeDecoderSession) else "onnxruntime",
            "decision_ms_p50": pct(self.decision_ms, 50), "decision_ms_p99": pct(self.decision_ms, 99),
            "cold_decision_ms_p50": pct(self.cold_ms, 50),
            "paced_decision_ms_p50": pct(self.paced_ms, 50) if self.paced_ms else None,
            "interleaved_decision_ms_p50": pct(self.interleaved_ms, 50),
            "decode_tokens_per_s": pct(self.decode_tok_s, 50),
            "interleaved_decode_tokens_per_s": pct(self.interleaved_decode_tok_s, 50),
            "pass_ms_p50": {str(rows): pct(ms, 50) for rows, ms in sorted(self.pass_ms.items())} or None,
            "decode_tokens_per_s_min": min(self.decode_tok_s), "decode_tokens_per_s_max": max(self.decode_tok_s),
            "tokens_per_s": pct(self.e2e_tok_s, 50),
            "ttft_ms_p50": pct(self.ttft_ms, 50),
            "mean_accepted": self.accepted / self.verify_passes if self.speculative and self.verify_passes else None,
            "draft_acceptance": self.draft_accepted / self.proposed if self.proposed else None,
            "match_standard": _agreement(self.outputs, standard),
            "match_plain_same_target": _agreement(self.outputs, plain),
            **energy_row(self.cpu_s, self.decisions, meter, self.tokens),
        }


def _agreement(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """Fraction of decisions whose tokens are identical to the reference row's."""
    return sum(a == b for a, b in zip(outputs, reference)) / max(len(reference), 1)


def decision_prefixes(bundle: Bundle, n: int, seed: int = 0) -> list[np.ndarray]:
    """Observation prefixes for real decisions (test split) for QC and grasp bundles; random
    observation tokens (any tokens for a plain LM) for other bundles."""
    m = bundle.manifest
    if m.task in ("qc", "grasp"):
        from ..eval import encode_scenes, scenes  # numpy + OpenCV only
        from ..perception import ObservationTokenizer

        prefixes, _ = encode_scenes(ObservationTokenizer.from_bundle(bundle), scenes(m.task, "test", n, start=seed))
        return [p for p in prefixes if p is not None]
    rng = np.random.default_rng(seed)
    lo, hi = m.vocab.observation or (0, m.vocab.size)  # a plain LM: any token
    length = max(4, min(24, m.max_context // 4))
    return [np.concatenate([[m.vocab.bos], rng.integers(lo, hi, length), [m.vocab.sep]]).astype(np.int64)
            for _ in range(n)]


def make_rows(bundle: Bundle, threads: int) -> list[Row]:
    """The rows this bundle can run, each with sessions of its own (warm caches stay per row)."""
    m = bundle.manifest
    have = set(m.target.precisions)
    modes = {"plain": True, "heads": m.target.draft_heads > 0, "draft": m.draft is not None}
    rows = [Row(n, p, mode) for n, p, mode in CONFIGS if p in have and modes[mode]]
    draft_prec = None
    if m.draft is not None:
        draft_prec = "int8" if "int8" in m.draft.precisions else m.draft.precisions[0]
    for r in rows:
        r.target = open_decoder(bundle, "target", r.precision, threads, name=r.name)
        if r.mode == "draft":
            r.draft = open_decoder(bundle, "draft", draft_prec, threads, name=f"{r.name} draft")
            r.controller = AdaptiveK()
    return rows + _onnxruntime_twins(bundle, rows, threads)


def _onnxruntime_twins(bundle: Bundle, rows: list[Row], threads: int) -> list[Row]:
    """The plain and heads rows the native pass runs, again on ONNX Runtime (`· ORT`): what the C
    pass buys, measured in the same run."""
    twins = []
    for r in rows:
        if isinstance(r.target, NativeDecoderSession) and r.mode in ("plain", "heads"):
            twin = Row(f"{r.name} · ORT", r.precision, r.mode, backend="onnxruntime")
            twin.target = open_decoder(bundle, "target", r.precision, threads, name=twin.name, backend="onnxruntime")
            twins.append(twin)
    return twins


def _timed(row: Row, prefix, new_tokens: int, k, cold: bool):
    c0 = time.thread_time_ns()
    res = row.decode(prefix, new_tokens, k, cold)
    row.cpu_s += (time.thread_time_ns() - c0) / 1e9
    row.decisions += 1
    row.tokens += res.stats.new_tokens
    return res


def run_bench(bundle: Bundle, decisions: int, rounds: int, new_tokens: int, threads: int,
              k: int | None, show_progress: bool = True) -> dict:
    prefixes = decision_prefixes(bundle, decisions)
    rows = make_rows(bundle, threads)
    meter = EnergyMeter()
    for r in rows:  # warm up every session (first ORT runs allocate arenas)
        for prefix in prefixes[:2]:
            r.decode(prefix, new_tokens, k, cold=True)
    t_start = time.monotonic()
    for rnd in range(rounds):
        _interleaved(rows, prefixes, new_tokens, k)
        turn = rnd % len(rows)
        for j, r in enumerate(rows[turn:] + rows[:turn]):
            _alone(r, prefixes, new_tokens, k, rnd == 0)
            if show_progress:
                progress(f"round {rnd + 1}/{rounds}  row {j + 1}/{len(rows)}  {time.monotonic() - t_start:5.1f} s")
    if show_progress:
        progress("", end="\n")
    meter.update()
    plain = {(r.precision, r.backend): r.outputs for r in rows if not r.speculative}
    out_rows = [r.summary(rows[0].outputs, plain[(r.precision, r.backend)], meter) for r in rows]
    targets = {r.precision: r.target for r in rows if r.backend != "onnxruntime"}
    return _report(bundle, out_rows, targets, new_tokens, len(prefixes), rounds, threads)


def _alone(r: Row, prefixes, new_tokens: int, k, first_round: bool) -> None:
    """One round of row `r` alone: every prefix cold, then warm (frame after frame, the figures of
    record), then, for a speculative row, PACED_DECISIONS warm with the thread asleep for a frame
    period (PACE_S) before each; for a heads row last, what its passes cost (`_time_passes`)."""
    for prefix in prefixes:
        r.cold_ms.append(_timed(r, prefix, new_tokens, k, cold=True).stats.wall_ms)
    acc = [0, 0.0, 0, 0.0]  # tokens, wall ms, decode tokens, decode ms
    for prefix in prefixes:
        res = _timed(r, prefix, new_tokens, k, cold=False)
        _record(r, res, acc, first_round)
    tok, ms, dtok, dms = acc
    r.e2e_tok_s.append(tok / ms * 1e3)
    r.decode_tok_s.append(_rate(dtok, dms))
    if r.speculative:
        for prefix in prefixes[:PACED_DECISIONS]:
            time.sleep(PACE_S)
            r.paced_ms.append(r.decode(prefix, new_tokens, k, cold=False).stats.wall_ms)
    if r.mode == "heads":
        _time_passes(r, prefixes)


def _time_passes(r: Row, prefixes) -> None:
    """What a call of 1 and of K + 1 tokens (K draft heads, switched on) costs after each prefix:
    the pass a perfect draft would need for K + 1 tokens, for `ceiling_tokens`."""
    t, k = r.target, r.target.draft_heads
    t.use_heads(True)
    for i, prefix in enumerate(prefixes):
        answer = np.asarray(r.outputs[i % len(r.outputs)], np.int64)  # real ids; how many are right hardly matters
        for rows in (1, k + 1):
            t.prefill(prefix)
            n = t.length
            t0 = time.perf_counter_ns()
            t.forward(np.resize(answer, rows))
            r.pass_ms.setdefault(rows, []).append((time.perf_counter_ns() - t0) / 1e6)
            t.rewind(n)


def _interleaved(rows: list[Row], prefixes, new_tokens: int, k) -> None:
    """One warm pass with the rows taking turns decision by decision (the module docstring); its
    decisions count in no other figure (CPU time and joules come from the rows alone)."""
    acc = {r.name: [0, 0.0] for r in rows}  # decode tokens, decode ms
    for prefix in prefixes:
        for r in rows:
            s = r.decode(prefix, new_tokens, k, cold=False).stats
            r.interleaved_ms.append(s.wall_ms)
            acc[r.name][0] += s.decode_tokens
            acc[r.name][1] += s.decode_ms
    for r in rows:
        r.interleaved_decode_tok_s.append(_rate(*acc[r.name]))


def _rate(tokens: int, ms: float) -> float:
    return tokens / ms * 1e3 if ms > 0 else float("nan")


def _record(r: Row, res, acc: list, first_round: bool) -> None:
    """A warm decision alone: its times, its tokens into `acc` (tokens, wall ms, decode tokens,
    decode ms), its output (first round) and acceptance."""
    s = res.stats
    r.decision_ms.append(s.wall_ms)
    r.ttft_ms.append(s.ttft_ms)
    acc[0] += s.new_tokens
    acc[1] += s.wall_ms
    acc[2] += s.decode_tokens  # a guessed prefill's extra tokens came in its TTFT, not here
    acc[3] += s.decode_ms
    if first_round:
        r.outputs.append(res.tokens)
    r.accepted += s.new_tokens - 1
    r.verify_passes += s.verify_passes
    r.proposed += s.proposed
    r.draft_accepted += s.accepted


def _report(bundle, rows, targets, new_tokens, n_prefixes, rounds, threads) -> dict:
    by = {r["name"]: r for r in rows}
    std = by["standard fp32"]
    spec = [r for r in rows if r["speculative"]]
    best = max(spec, key=lambda r: r["decode_tokens_per_s"])
    plain_same = next(r for r in rows if r["mode"] == "plain" and r["precision"] == best["precision"]
                      and r["backend"] == best["backend"])
    twin = by.get(f"{best['name']} · ORT")
    bw = memory_bandwidth_gbs()
    stream = {}
    for prec, sess in targets.items():
        weight_bytes = sess.path.stat().st_size
        plain = by.get("standard fp32" if prec == "fp32" else f"{prec} plain")
        per_token_ms = 1e3 / plain["decode_tokens_per_s"]
        stream_ms = weight_bytes / (bw * 1e9) * 1e3
        stream[prec] = {"weight_bytes": weight_bytes, "per_token_ms": per_token_ms,
                        "stream_ms": stream_ms, "ratio": per_token_ms / stream_ms}
    return {
        "bundle": bundle.manifest.name, "task": bundle.manifest.task,
        "new_tokens": new_tokens, "decisions": n_prefixes, "rounds": rounds, "threads": threads,
        "ratios": {
            "speculative_vs_plain": best["decode_tokens_per_s"] / plain_same["decode_tokens_per_s"],
            "ultrafast_vs_standard": best["decode_tokens_per_s"] / std["decode_tokens_per_s"],
            "ultrafast_vs_standard_decision": std["decision_ms_p50"] / best["decision_ms_p50"],
            "ultrafast_vs_standard_e2e_tokens": best["tokens_per_s"] / std["tokens_per_s"],
            # the ultrafast row on the native pass over the same row on ONNX Runtime (None: no native row)
            "native_vs_onnxruntime": twin and best["decode_tokens_per_s"] / twin["decode_tokens_per_s"],
            "native_vs_onnxruntime_decision": twin and twin["decision_ms_p50"] / best["decision_ms_p50"],
        },
        "ratios_interleaved": {  # the same rows, timed decision by decision in turns (module docstring)
            "speculative_vs_plain": best["interleaved_decode_tokens_per_s"] / plain_same["interleaved_decode_tokens_per_s"],
            "ultrafast_vs_standard": best["interleaved_decode_tokens_per_s"] / std["interleaved_decode_tokens_per_s"],
            "ultrafast_vs_standard_decision": std["interleaved_decision_ms_p50"] / best["interleaved_decision_ms_p50"],
        },
        "ultrafast": best["name"],
        "ceiling_tokens": _ceiling(best, std),
        "outputs_match_standard": all(r["match_standard"] == 1.0 for r in rows),
        "speculative_lossless": all(r["match_plain_same_target"] == 1.0 for r in rows),
        "mean_accepted": best["mean_accepted"],
        "memory_bandwidth_gbs": bw,
        "weight_streaming": stream,
        "rows": rows,
    }


def _ceiling(best: dict, std: dict) -> float | None:
    """Decode tokens/s over standard's that the ultrafast row's pass would give if every guess were
    right: K + 1 tokens a call of K + 1 rows (`pass_ms_p50`). None for a draft-model row."""
    if not best["pass_ms_p50"]:
        return None
    rows = max(best["pass_ms_p50"], key=int)
    return int(rows) / best["pass_ms_p50"][rows] * 1e3 / std["decode_tokens_per_s"]


def print_report(rep: dict) -> None:
    head = ["config", "decode tok/s (min-max)", "tok/s incl. prefill", "ms/decision p50", "p99", "cold p50",
            "interleaved p50", "TTFT ms", "mean acc.", "CPU ms", "mJ", "= std", "= plain"]
    body = []
    for r in rep["rows"]:
        body.append([r["name"],
                     f"{r['decode_tokens_per_s']:8.0f} ({r['decode_tokens_per_s_min']:.0f}-{r['decode_tokens_per_s_max']:.0f})",
                     f"{r['tokens_per_s']:.0f}", f"{r['decision_ms_p50']:.2f}", f"{r['decision_ms_p99']:.2f}",
                     f"{r['cold_decision_ms_p50']:.2f}", f"{r['interleaved_decision_ms_p50']:.2f}",
                     f"{r['ttft_ms_p50']:.2f}",
                     "-" if r["mean_accepted"] is None else f"{r['mean_accepted']:.2f}",
                     f"{r['cpu_ms_per_decision']:.2f}", f"{1e3 * r['joules_per_decision']:.1f}",
                     f"{r['match_standard']:.0%}", f"{r['match_plain_same_target']:.0%}"])
    print(f"\nbundle {rep['bundle']} ({rep['task']}): {rep['decisions']} decisions x {rep['rounds']} rounds, "
          f"{rep['new_tokens']} tokens each, {rep['threads']} thread(s), each row alone in turn; ms/decision warm "
          f"(static prefix kept, as in the node), cold = empty cache, interleaved = warm with the rows taking turns "
          f"decision by decision")
    print(table(head, body))
    for r in rep["rows"]:
        if r["paced_decision_ms_p50"] is not None:
            print(f"{r['name']} paced: {r['paced_decision_ms_p50']:.2f} ms (one decision every "
                  f"{1e3 * PACE_S:.0f} ms, asleep between)")
    for label, ra in (("", rep["ratios"]), ("interleaved: ", rep["ratios_interleaved"])):
        print(f"{label}speculative vs plain (same target): {ra['speculative_vs_plain']:.2f}x   "
              f"ultrafast ({rep['ultrafast']}) vs standard: {ra['ultrafast_vs_standard']:.2f}x decode tok/s, "
              f"{ra['ultrafast_vs_standard_decision']:.2f}x ms/decision")
    if rep["ratios"]["native_vs_onnxruntime"]:
        print(f"{rep['ultrafast']} on the native pass vs on ONNX Runtime: "
              f"{rep['ratios']['native_vs_onnxruntime']:.2f}x decode tok/s, "
              f"{rep['ratios']['native_vs_onnxruntime_decision']:.2f}x ms/decision")
    passes = next(r["pass_ms_p50"] for r in rep["rows"] if r["name"] == rep["ultrafast"])
    ceiling = "" if passes is None else (
        f"; a call of {' / '.join(passes)} rows {' / '.join(f'{ms:.3f}' for ms in passes.values())} ms: with every "
        f"guess right {rep['ceiling_tokens']:.2f}x standard's decode tok/s at most")
    print(f"mean accepted {rep['mean_accepted']:.2f}{ceiling}")
    print(f"energy: {rep['rows'][0]['joules_per_decision_basis']} ({rep['rows'][0]['energy_assumption']})")
    for prec, s in rep["weight_streaming"].items():
        print(f"  {prec}: {s['per_token_ms']:.3f} ms/token vs {s['stream_ms']:.3f} ms to stream "
              f"{s['weight_bytes'] / 1e6:.1f} MB at {rep['memory_bandwidth_gbs']:.1f} GB/s -> {s['ratio']:.2f}x")


def run(args: argparse.Namespace) -> int:
    bundle = Bundle.load(args.bundle or default_bundle())
    if bundle.manifest.draft is None and not bundle.manifest.target.draft_heads:
        raise ValueError(f"bundle {bundle.root} has neither draft heads nor a draft decoder: nothing to speculate with")
    n_actions = len(bundle.manifest.actions)
    new_tokens = args.new_tokens or n_actions or 32
    decisions = args.decisions or (12 if args.quick else 40)
    rounds = args.rounds or 5
    rep = run_bench(bundle, decisions, rounds, new_tokens, args.threads, args.k)
    print_report(rep)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rep, indent=2))
        print(f"wrote {args.json}")
    return 0
