"""Ours against the best peer row, decision by decision (`vs_best_peer_paired`).

`bench all` times our rows first and the peers minutes later, and this host's speed drifts by
10-30 % in that time, so `vs_best_peer` from one run moves by as much. Here the best peer row is
kept running (`peers.serve_row`: its worker in its own venv serves one decision per request) and
its decisions alternate with ours on the same decision prefixes: per prefix ours warm (the
previous frame's static prefix kept, as in the node), the peer's, ours cold (cache emptied), the
peer's again, strictly alternating (`ORDERS`; odd rounds start with the peer). Whoever runs right
after the other process finds the CPU's caches holding the other's weights, so each side always
runs right after the other. (Until 2026-12-06 our cold decision always ran right after our warm
one and half our warm ones right after our cold one, on caches still holding our weights, which
flattered us on hosts with a large cold-cache penalty; docs/BENCHMARKS.md, "The paired bench,
alternating strictly".) A round is every prefix `REPEATS` times; its ratio is the peer's median ms
over ours; the headline is the median over the rounds.

    python -m sol_control.bench.paired --bundle models/qc [--rounds 4] [--engine ort-genai] [--precision int4] [--mode plain]
"""
from __future__ import annotations

import argparse
import statistics

from ..decoding import open_decoder, speculate_heads
from .common import default_bundle
from .decode_bench import decision_prefixes

OURS = "int8 + heads"  # the node's fast path (decoding.fast_precision int8, draft heads)
REPEATS = 5  # passes over the 16 prefixes a round
ORDERS = (("warm", "peer", "cold", "peer"), ("peer", "warm", "peer", "cold"))  # a prefix's four decisions


def one_round(sess, peer, prefixes, n_tokens: int, first: int) -> dict:
    """Every prefix REPEATS times: ours warm, ours cold and two of the peer's, alternating (ORDERS,
    by `first`'s parity); medians."""
    got = {"peer": [], "warm": [], "cold": []}
    for _ in range(REPEATS):
        for p in prefixes:
            for who in ORDERS[first % 2]:
                if who == "peer":
                    got[who].append(peer.ask({"prefix": p.tolist()})["ms"])
                    continue
                if who == "cold":
                    sess.reset()
                got[who].append(speculate_heads(sess, p, n_tokens).stats.wall_ms)  # warm: after the previous prefix's
    return {"peer_ms": statistics.median(got["peer"]), "ours_warm_ms": statistics.median(got["warm"]),
            "ours_cold_ms": statistics.median(got["cold"])}


def paired(bundle, best: dict, rounds: int, suffix: str = "", progress=print, open_peer=None) -> dict:
    """`vs_best_peer{suffix}_paired` (and `_cold`): the best peer row's ms per decision over ours,
    median over `rounds` rounds; the rounds themselves under `paired{suffix}`. `open_peer()` gives
    the served peer row (default `peers.serve_row(bundle, best)`)."""
    from . import peers

    sess = open_decoder(bundle, "target", "int8")
    prefixes = decision_prefixes(bundle, 16)  # the peers' workload (peers.decision_workload)
    n_tokens = len(bundle.manifest.actions)
    for p in prefixes[:2]:  # first runs allocate
        speculate_heads(sess, p, n_tokens)
    per_round = []
    with (open_peer or (lambda: peers.serve_row(bundle, best)))() as peer:
        for rnd in range(rounds):
            r = one_round(sess, peer, prefixes, n_tokens, rnd)
            per_round.append(r)
            progress(f"paired {bundle.manifest.name} round {rnd + 1}/{rounds}: {best['engine']} {r['peer_ms']:.2f} ms, "
                     f"ours {r['ours_warm_ms']:.2f} / {r['ours_cold_ms']:.2f} ms warm / cold")
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
