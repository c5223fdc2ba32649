"""Two versions of a policy bundle side by side: ms per decision of the target's draft heads path
(`speculate_heads`, all guesses checked), rounds alternating between the bundles, each decision
warm (the previous frame's static prefix kept, as in the node) and cold. Checks that both emit the
same tokens (same target weights), so only speed and verify passes may differ; with
`--requantized` (the same target quantized another way) it reports how many decisions agree instead.

What BENCHMARKS quotes for a change of the graph builder or of the heads, before and after:

    .venv/bin/python tools/compare_bundles.py models/grasp /tmp/new/grasp --precision int8 [--rounds 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sol_control.bench.decode_bench import decision_prefixes  # noqa: E402
from sol_control.bundle import Bundle  # noqa: E402
from sol_control.decoding import open_decoder, speculate_heads  # noqa: E402


def one_round(sess, prefixes, n_tokens: int) -> dict:
    """Medians over the prefixes: cold (cache emptied first), then warm (frame after frame)."""
    cold = []
    for p in prefixes:
        sess.reset()
        cold.append(speculate_heads(sess, p, n_tokens).stats.wall_ms)
    results = [speculate_heads(sess, p, n_tokens) for p in prefixes]
    return {"warm": statistics.median(r.stats.wall_ms for r in results), "cold": statistics.median(cold),
            "passes": statistics.mean(r.stats.verify_passes for r in results), "tokens": [r.tokens for r in results]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--precision", default="int8", choices=["fp32", "int8", "int4"])
    ap.add_argument("--decisions", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=15, help="the first is a warm-up, not counted")
    ap.add_argument("--requantized", action="store_true",
                    help="the bundles' quantized graphs may answer differently (same fp32 target)")
    args = ap.parse_args(argv)
    bundles = {"before": Bundle.load(args.before), "after": Bundle.load(args.after)}
    sessions = {name: open_decoder(b, "target", args.precision) for name, b in bundles.items()}
    prefixes = decision_prefixes(bundles["before"], args.decisions)
    n_tokens = len(bundles["before"].manifest.actions)
    rounds = {name: [] for name in sessions}
    for rnd in range(args.rounds):
        print(f"\rround {rnd + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        for name, sess in sessions.items():
            rounds[name].append(one_round(sess, prefixes, n_tokens))
    print(file=sys.stderr)
    before, after = rounds["before"][0]["tokens"], rounds["after"][0]["tokens"]
    if before != after and not args.requantized:
        raise SystemExit("the bundles emit different tokens: not the same target (--requantized?)")
    if args.requantized:
        print(f"decisions with the same tokens: {sum(a == b for a, b in zip(before, after))} of {len(before)}")
    print(f"{args.precision} + heads, {len(prefixes)} decisions of {n_tokens} tokens, {args.rounds - 1} rounds "
          "(medians of the round medians)")
    for name, per in rounds.items():
        counted = per[1:]
        med = {k: statistics.median(r[k] for r in counted) for k in ("warm", "cold", "passes")}
        print(f"  {name:6s} warm {med['warm']:.3f} ms  cold {med['cold']:.3f} ms  verify passes {med['passes']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
