"""Build options of the fused graph, side by side: block size, zero points, lm_head bits, accuracy
level, int8 vs int4. Per decision (prefill + greedy steps, cold cache, variants alternating decision
by decision), one-token call time, and agreement with the fp32 graph's greedy tokens.

    python -m sol_control.bench.graph_options [--rounds 9] [--decisions 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .common import default_bundle, table

# name -> build_decoder(precision, **options)
OPTIONS = {
    "int4 b32 zero points, head 8 (default)": ("int4", {}),
    "int4 default without the query pad": ("int4", {"query_pad": False}),
    "int4 b32 symmetric, head 8": ("int4", {"symmetric": True}),
    "int4 b64 zero points, head 8": ("int4", {"block_size": 64}),
    "int4 b128 zero points, head 8": ("int4", {"block_size": 128}),
    "int4 b32 zero points, head 4": ("int4", {"head_bits": 4}),
    "int4 b32 zero points, head fp32": ("int4", {"head_bits": None}),
    "int4 b32, accuracy level 1 (fp32 math)": ("int4", {"accuracy_level": 1}),
    "int8 b32 symmetric (default)": ("int8", {}),
    "int8 b32 zero points": ("int8", {"symmetric": False}),
    "int8 b128 symmetric": ("int8", {"block_size": 128}),
    "fp32": ("fp32", {}),
}


def run(bundle, rounds: int, decisions: int, agreement_n: int = 200) -> dict:
    from ..decoding.fused import FusedDecoderSession
    from ..graph.from_onnx import read_decoder
    from ..graph.llama import build_decoder
    from .decode_bench import decision_prefixes
    from .engine_v2 import WORK, agreement, decide_fn, per_decision, time_call

    m = bundle.manifest
    weights = read_decoder(bundle.verify(m.target.files["fp32"]), m.max_context)
    out = WORK / m.name / "options"
    sessions = {name: FusedDecoderSession(build_decoder(weights, out / f"option_{i}.onnx", prec, **opts), name=name)
                for i, (name, (prec, opts)) in enumerate(OPTIONS.items())}
    new_tokens = len(m.actions) or 15
    deciders = {name: decide_fn(s, new_tokens) for name, s in sessions.items()}
    prefixes = decision_prefixes(bundle, decisions)
    wall, _ = per_decision(deciders, prefixes, rounds)
    rng = np.random.default_rng(0)
    one_us = {name: float(np.median([time_call(s, prefixes[0], 1, rng)[0] for _ in range(rounds)]))
              for name, s in sessions.items()}
    agree = agreement(deciders, decision_prefixes(bundle, agreement_n, seed=1000), "fp32")
    return {"bundle": m.name, "rounds": rounds, "decisions": len(prefixes), "per_decision_ms": wall,
            "one_token_us": one_us, "agreement_with_fp32": agree, "load": __import__("os").getloadavg()[0]}


def print_report(rep: dict) -> None:
    wall, base = rep["per_decision_ms"], "int4 b32 zero points, head 8 (default)"
    print(f"\nbundle {rep['bundle']}: {rep['rounds']} rounds x {rep['decisions']} decisions, load {rep['load']:.2f}")
    rows = [[name, f"{np.median(v):.2f}", f"{np.median(np.array(wall[base]) / np.array(v)):.2f}x",
             f"{rep['one_token_us'][name]:.0f}", f"{rep['agreement_with_fp32'][name]['tokens']:.3f}",
             f"{rep['agreement_with_fp32'][name]['decisions']:.2f}"] for name, v in wall.items()]
    print(table(["graph", "ms/decision", "vs default int4", "T=1 µs", "tokens = fp32", "decisions = fp32"], rows))


def main(argv: list[str] | None = None) -> int:
    from ..bundle import Bundle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--decisions", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rep = run(Bundle.load(args.bundle or default_bundle()), args.rounds, args.decisions)
    print_report(rep)
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
