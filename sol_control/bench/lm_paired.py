"""`sol-control bench lm`, paired: our fastest row against the best peer row, prompt by prompt.

The peers run after all of our rows, minutes later and each in its own venv, and this host's speed
drifts by ±10 % in that time: two runs an hour apart gave `vs_best_peer` 0.79 and 0.97 while our
own rows agreed within 3 %. Here the best peer row's worker is kept running (`peers.lm.PeerServer`)
and its answers alternate with our row's prompt by prompt (who goes first alternates too), so a
drift hits both alike. A round is every prompt once each; its ratio is our median decode tokens/s
over the peer's (medians over the prompts, as in the main run); `vs_best_peer_paired` is the median
of the rounds' ratios. `--paired N` rounds (0: off; no peer row: null and a note).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from .lm_report import _headline
from .lm_rows import Row, say

# peer(ids, max_new_tokens) -> its decode tokens/s on that prompt (None: an answer of one token)
PeerAnswer = Callable[[list[int], int], "float | None"]


def paired(row: Row, prompts: list[list[int]], max_new: int, stops: tuple[int, ...], peer: PeerAnswer,
           rounds: int) -> dict:
    """`rounds` rounds over the prompts, the peer's answer and ours alternating prompt by prompt;
    the median of the rounds' ratios."""
    out = []
    for i in range(rounds):
        ours, theirs = [], []
        for j, ids in enumerate(prompts):
            peer_first = (i + j) % 2 == 0
            if peer_first:
                theirs.append(peer(ids, max_new))
            ours.append(row.generate(ids, max_new, stops, fresh=True).decode_tokens_per_s)
            if not peer_first:
                theirs.append(peer(ids, max_new))
        o = statistics.median(v for v in ours if v is not None)
        p = statistics.median(v for v in theirs if v is not None)
        out.append({"peer_tokens_per_s": p, "ours_tokens_per_s": o, "ratio": o / p,
                    "peer_by_prompt": theirs, "ours_by_prompt": ours})
        say(f"paired round {i + 1}/{rounds}: ours {o:.1f} tok/s, peer {p:.1f} tok/s, {o / p:.2f}x")
    return {"vs_best_peer_paired": statistics.median(r["ratio"] for r in out), "rounds": out}


def paired_summary(summary: dict, rows: list[Row], tok, workload: dict, gguf: Path | None, rounds: int,
                   open_peer: Callable | None = None) -> dict:
    """`vs_best_peer_paired` (the headline thread count's, as `vs_best_peer`), `_by_threads` and the
    rounds under `paired`; null with `vs_best_peer_paired_note` where it did not run. `open_peer(t,
    peer)` gives a context manager with `decode_tokens_per_s(ids, max_new)` (default: the peer's
    worker, `PeerServer.start`)."""
    result = {"vs_best_peer_paired": None, "vs_best_peer_paired_by_threads": {}, "paired": {},
              "vs_best_peer_paired_note": ""}
    if not summary.get("best_peer") or gguf is None or rounds < 1:
        result["vs_best_peer_paired_note"] = "not run: " + ("--paired 0" if summary.get("best_peer") else "no peer row")
        return result
    if open_peer is None:
        from .peers.lm import PeerServer

        def open_peer(t: int, peer: dict):
            return PeerServer.start(gguf, workload, t, peer)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"]]
    for t, best in summary["best_peer"].items():
        row = next(r for r in rows if r.name == best["ours"]["name"] and r.threads == int(t))
        try:
            with open_peer(int(t), best["peer"]) as server:
                result["paired"][t] = paired(row, prompts, workload["max_new_tokens"], tok.stop_ids,
                                             server.decode_tokens_per_s, rounds)
        except RuntimeError as err:
            result["vs_best_peer_paired_note"] += f"{t} thread(s): {err}; "
            continue
        result["vs_best_peer_paired_by_threads"][t] = result["paired"][t]["vs_best_peer_paired"]
    result["vs_best_peer_paired"] = _headline(result["vs_best_peer_paired_by_threads"], summary["threads"])
    return result
