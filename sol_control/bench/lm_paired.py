"""`sol-control bench lm`, paired: our fastest row (and the ultrafast row) against the best peer row, prompt by prompt.

The peers run after all of our rows, minutes later and each in its own venv, and this host's speed
drifts by ±10 % in that time: two runs an hour apart gave `vs_best_peer` 0.79 and 0.97 while our
own rows agreed within 3 %. Here the best peer row's worker is kept running (`peers.lm.PeerServer`)
and its answers alternate with our rows' prompt by prompt (who goes first rotates), so a
drift hits both alike. A round is every prompt once each; its ratio is our median decode tokens/s
over the peer's (medians over the prompts, as in the main run); `vs_best_peer_paired` is the median
of the rounds' ratios for our best row, `vs_best_peer_paired_ultrafast` the same for the ultrafast
row (both in the same rounds, when they differ). `--paired N` rounds (0: off; no peer row: null and a note).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from .lm_report import _headline
from .lm_rows import Row, say

# peer(ids, max_new_tokens) -> its decode tokens/s on that prompt (None: an answer of one token)
PeerAnswer = Callable[[list[int], int], "float | None"]


def paired(rows: list[Row], prompts: list[list[int]], max_new: int, stops: tuple[int, ...], peer: PeerAnswer,
           rounds: int) -> dict:
    """`rounds` rounds over the prompts, the peer's answer and each row's alternating prompt by
    prompt (who goes first rotating); per row, the median of the rounds' ratios."""
    out = []
    names = ["peer"] + [r.name for r in rows]
    by_name = {r.name: r for r in rows}
    for i in range(rounds):
        got = {n: [] for n in names}
        for j, ids in enumerate(prompts):
            k = (i + j) % len(names)
            for n in names[k:] + names[:k]:
                got[n].append(peer(ids, max_new) if n == "peer" else
                              by_name[n].generate(ids, max_new, stops, fresh=True).decode_tokens_per_s)
        p = statistics.median(v for v in got["peer"] if v is not None)
        ours = {r.name: statistics.median(v for v in got[r.name] if v is not None) for r in rows}
        out.append({"peer_tokens_per_s": p, "peer_by_prompt": got["peer"],
                    "rows": {n: {"tokens_per_s": o, "ratio": o / p, "by_prompt": got[n]} for n, o in ours.items()}})
        say(f"paired round {i + 1}/{rounds}: peer {p:.1f} tok/s; " +
            ", ".join(f"{n} {o:.1f} tok/s ({o / p:.2f}x)" for n, o in ours.items()))
    return {"vs_best_peer_paired": {r.name: statistics.median(x["rows"][r.name]["ratio"] for x in out) for r in rows},
            "rounds": out}


def paired_summary(summary: dict, rows: list[Row], tok, workload: dict, gguf: Path | None, rounds: int,
                   open_peer: Callable | None = None) -> dict:
    """`vs_best_peer_paired` (our best row's, at the headline thread count as `vs_best_peer`) and
    `vs_best_peer_paired_ultrafast` (the ultrafast row's, when it is another row), each with
    `_by_threads`, and the rounds under `paired`; null with `vs_best_peer_paired_note` where it did
    not run. `open_peer(t, peer)` gives a context manager with `decode_tokens_per_s(ids, max_new)`
    (default: the peer's worker, `PeerServer.start`)."""
    result = {"vs_best_peer_paired": None, "vs_best_peer_paired_by_threads": {}, "vs_best_peer_paired_ultrafast": None,
              "vs_best_peer_paired_ultrafast_by_threads": {}, "paired": {}, "vs_best_peer_paired_note": ""}
    if not summary.get("best_peer") or gguf is None or rounds < 1:
        result["vs_best_peer_paired_note"] = "not run: " + ("--paired 0" if summary.get("best_peer") else "no peer row")
        return result
    if open_peer is None:
        from .peers.lm import PeerServer

        def open_peer(t: int, peer: dict):
            return PeerServer.start(gguf, workload, t, peer)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"]]
    for t, best in summary["best_peer"].items():
        names = dict.fromkeys([best["ours"]["name"], summary.get("ultrafast_row", {}).get(t, best["ours"]["name"])])
        mine = [next(r for r in rows if r.name == n and r.threads == int(t)) for n in names]
        try:
            with open_peer(int(t), best["peer"]) as server:
                result["paired"][t] = paired(mine, prompts, workload["max_new_tokens"], tok.stop_ids,
                                             server.decode_tokens_per_s, rounds)
        except RuntimeError as err:
            result["vs_best_peer_paired_note"] += f"{t} thread(s): {err}; "
            continue
        ratios = result["paired"][t]["vs_best_peer_paired"]
        result["vs_best_peer_paired_by_threads"][t] = ratios[mine[0].name]
        result["vs_best_peer_paired_ultrafast_by_threads"][t] = ratios[mine[-1].name]
    for key in ("vs_best_peer_paired", "vs_best_peer_paired_ultrafast"):
        result[key] = _headline(result[f"{key}_by_threads"], summary["threads"])
    return result
