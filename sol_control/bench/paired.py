"""Ours against the best peer row in alternating rounds: this host's speed drifts by 10-30 % in the
minutes between our rows and the peers', so a ratio from two separate runs moves by as much. Here
the best peer row is kept running (its worker, in its own venv, serves one answer per request) and
its answers alternate with ours on the same inputs; a round's ratio compares the two sides' medians,
and the headline is the median over the rounds.

Decisions (`bench all`, `paired`): per decision prefix ours warm (the previous frame's static prefix
kept, as in the node), the peer's, ours cold (cache emptied), the peer's again, strictly alternating
(`ORDERS`; odd rounds start with the peer), so whoever runs right after the other process finds the
CPU's caches holding the other's weights. A round is every prefix `REPEATS` times; its ratio is the
peer's median ms over ours.

LM prompts (`bench lm --paired N`, `paired_lm`; its figures: `lm_report.paired_summary`): our best
row (and the ultrafast row, when it is another) and the peer answer every prompt, who goes first
rotating prompt by prompt and round by round; a round's ratio is our median decode tokens/s over
the peer's.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

from ..decoding import open_decoder, speculate_heads
from .common import rotated

OURS = "int8 + heads"  # the node's fast path (decoding.fast_precision int8, draft heads)
REPEATS = 5  # passes over the 16 prefixes a round
ORDERS = (("warm", "peer", "cold", "peer"), ("peer", "warm", "peer", "cold"))  # a prefix's four decisions


def one_round(sess, peer, prefixes, n_tokens: int, first: int) -> dict:
    """Every prefix REPEATS times: ours warm, ours cold and two of the peer's (ORDERS by `first`'s
    parity); medians."""
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
    from .decode_bench import decision_prefixes

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


# peer(ids, max_new_tokens) -> its decode tokens/s on that prompt (None: an answer of one token)
PeerAnswer = Callable[[list[int], int], "float | None"]


def paired_lm(rows: list, prompts: list[list[int]], max_new: int, stops: tuple[int, ...], peer: PeerAnswer,
              rounds: int, say=print) -> dict:
    """`rounds` rounds over the prompts, the peer's answer and each row's (`lm_rows.Row`) taking
    turns prompt by prompt (who goes first rotating); per row, the median of the rounds' ratios."""
    out, by_name = [], {r.name: r for r in rows}
    names = ["peer"] + list(by_name)
    for i in range(rounds):
        got = {n: [] for n in names}
        for j, ids in enumerate(prompts):
            for n in rotated(names, i + j):
                got[n].append(peer(ids, max_new) if n == "peer" else
                              by_name[n].generate(ids, max_new, stops, fresh=True).decode_tokens_per_s)
        p = statistics.median(v for v in got["peer"] if v is not None)
        ours = {n: statistics.median(v for v in got[n] if v is not None) for n in by_name}
        out.append({"peer_tokens_per_s": p, "peer_by_prompt": got["peer"],
                    "rows": {n: {"tokens_per_s": o, "ratio": o / p, "by_prompt": got[n]} for n, o in ours.items()}})
        say(f"paired round {i + 1}/{rounds}: peer {p:.1f} tok/s; " +
            ", ".join(f"{n} {o:.1f} tok/s ({o / p:.2f}x)" for n, o in ours.items()))
    return {"vs_best_peer_paired": {n: statistics.median(x["rows"][n]["ratio"] for x in out) for n in by_name},
            "rounds": out}
