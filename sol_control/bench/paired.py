"""Ours against the best peer row in alternating rounds (`vs_best_peer_paired`).

`bench all` times our rows first and the peers minutes later, and this host's speed drifts by
10-30 % in that time, so `vs_best_peer` from one run moves by as much. Here each round runs the
best peer row's engine and precision once (its own process and venv, `peers.run_all`) and then our
int8 + heads decisions alone, on the same decision prefixes: warm (the previous frame's static
prefix kept, as in the node) and cold (cache emptied). The ratio is the median over the rounds.

    python -m sol_control.bench.paired --bundle models/qc [--rounds 4] [--engine ort-genai] [--precision int4] [--mode plain]
"""
from __future__ import annotations

import argparse
import statistics

from ..decoding import open_decoder, speculate_heads
from .common import default_bundle
from .decode_bench import decision_prefixes

OURS = "int8 + heads"  # the node's fast path (decoding.fast_precision int8, draft heads)


def peer_ms(bundle, best: dict) -> float:
    """One run of the peer benchmark for `best`'s engine and precision: its row of `best`'s mode."""
    from . import peers

    rep = peers.run_all(bundle, engines=(best["engine"],), precisions=[best["precision"]])
    row = next((r for r in rep.get("rows", []) if r["mode"] == best["mode"]), None)
    if row is None:
        raise RuntimeError(f"peer {best['engine']} gave no {best['mode']} {best['precision']} row: "
                           f"{rep.get('errors') or rep.get('note')}")
    return row["decision_ms_p50"]


def ours_ms(sess, prefixes, n_tokens: int, repeats: int = 5) -> tuple[float, float]:
    """(warm, cold) medians of our decisions over `repeats` passes of the prefixes."""
    warm, cold = [], []
    for _ in range(repeats):
        warm += [speculate_heads(sess, p, n_tokens).stats.wall_ms for p in prefixes]
        for p in prefixes:
            sess.reset()
            cold.append(speculate_heads(sess, p, n_tokens).stats.wall_ms)
    return statistics.median(warm), statistics.median(cold)


def paired(bundle, best: dict, rounds: int, suffix: str = "", progress=print) -> dict:
    """`vs_best_peer{suffix}_paired` (and `_cold`): the best peer row's ms per decision over ours,
    median over `rounds` alternating rounds; the rounds themselves under `paired{suffix}`."""
    sess = open_decoder(bundle, "target", "int8")
    prefixes = decision_prefixes(bundle, 16)  # the peers' workload (peers.run_all)
    n_tokens = len(bundle.manifest.actions)
    ours_ms(sess, prefixes[:2], n_tokens, 1)  # first runs allocate
    per_round = []
    for rnd in range(rounds):
        peer = peer_ms(bundle, best)
        warm, cold = ours_ms(sess, prefixes, n_tokens)
        per_round.append({"peer_ms": peer, "ours_warm_ms": warm, "ours_cold_ms": cold})
        progress(f"paired {bundle.manifest.name} round {rnd + 1}/{rounds}: {best['engine']} {peer:.2f} ms, "
                 f"ours {warm:.2f} / {cold:.2f} ms warm / cold")
    return {f"vs_best_peer{suffix}_paired": statistics.median(r["peer_ms"] / r["ours_warm_ms"] for r in per_round),
            f"vs_best_peer{suffix}_paired_cold": statistics.median(r["peer_ms"] / r["ours_cold_ms"] for r in per_round),
            f"paired{suffix}": {"peer": best, "ours": OURS, "rounds": per_round}}


def main(argv: list[str] | None = None) -> int:
    from ..bundle import Bundle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default=default_bundle("grasp"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--engine", default="ort-genai")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--mode", default="plain")
    args = ap.parse_args(argv)
    best = {"engine": args.engine, "precision": args.precision, "mode": args.mode}
    rep = paired(Bundle.load(args.bundle), best, args.rounds)
    print(f"median ratio: {rep['vs_best_peer_paired']:.2f}x warm, {rep['vs_best_peer_paired_cold']:.2f}x cold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
