"""`sol-control bench lm`, paired: our fastest row against the best peer row, round by round.

The peers run after all of our rows, minutes later and each in its own venv, and this host's speed
drifts by ±10 % in that time: two runs an hour apart gave `vs_best_peer` 0.79 and 0.97 while our
own rows agreed within 3 %. Here each round runs the best peer row once more (its worker, the
prompts; the agent loop cut to its first round) and then our row on the same prompts;
`vs_best_peer_paired` is the median of the rounds' ratios of decode tokens/s (each the median over
the prompts, as in the main run). `--paired N` rounds (0: off; no peer row: null and a note).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from .lm_report import _headline
from .lm_rows import Row, say


def prompts_only(workload: dict) -> dict:
    """The workload with its agent loop cut to the first round (the peer workers need one)."""
    loop = workload["agent_loop"]
    return {**workload, "agent_loop": {**loop, "tool_results": loop["tool_results"][:1]}}


def peer_tokens_per_s(gguf: Path, workload: dict, threads: int, peer: dict) -> float:
    """One more run of the peer row `peer` (engine, precision, spec_mode) on the prompts."""
    from .peers.lm import run_lm_peers

    rows = run_lm_peers(gguf, prompts_only(workload), threads, engines=(peer["engine"],),
                        modes={peer["engine"]: [(peer["precision"], peer["spec_mode"])]})
    if not rows or rows[0].get("skipped") or not rows[0].get("decode_tokens_per_s"):
        raise RuntimeError(f"peer {peer['engine']} {peer['spec_mode']} {peer['precision']}: "
                           f"{rows[0].get('note') if rows else 'no row'}")
    return rows[0]["decode_tokens_per_s"]


def ours_tokens_per_s(row: Row, prompts: list[list[int]], max_new: int, stops: tuple[int, ...]) -> float:
    """Our row on the prompts, each from an empty cache: the median decode tokens/s."""
    return statistics.median(row.generate(ids, max_new, stops, fresh=True).decode_tokens_per_s for ids in prompts)


def paired(row: Row, prompts: list[list[int]], max_new: int, stops: tuple[int, ...],
           peer_run: Callable[[], float], rounds: int) -> dict:
    """`rounds` rounds of (the peer row, then ours); the median of the rounds' ratios."""
    out = []
    for i in range(rounds):
        peer = peer_run()
        ours = ours_tokens_per_s(row, prompts, max_new, stops)
        out.append({"peer_tokens_per_s": peer, "ours_tokens_per_s": ours, "ratio": ours / peer})
        say(f"paired round {i + 1}/{rounds}: ours {ours:.1f} tok/s, peer {peer:.1f} tok/s, {ours / peer:.2f}x")
    return {"vs_best_peer_paired": statistics.median(r["ratio"] for r in out), "rounds": out}


def paired_summary(summary: dict, rows: list[Row], tok, workload: dict, gguf: Path | None, rounds: int,
                   peer_run: Callable[[int, dict], float] | None = None) -> dict:
    """`vs_best_peer_paired` (the headline thread count's, as `vs_best_peer`), `_by_threads` and the
    rounds under `paired`; null with `vs_best_peer_paired_note` where it did not run."""
    result = {"vs_best_peer_paired": None, "vs_best_peer_paired_by_threads": {}, "paired": {},
              "vs_best_peer_paired_note": ""}
    if not summary.get("best_peer") or gguf is None or rounds < 1:
        result["vs_best_peer_paired_note"] = "not run: " + ("--paired 0" if summary.get("best_peer") else "no peer row")
        return result
    if peer_run is None:
        def peer_run(t: int, peer: dict) -> float:
            return peer_tokens_per_s(gguf, workload, t, peer)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"]]
    for t, best in summary["best_peer"].items():
        row = next(r for r in rows if r.name == best["ours"]["name"] and r.threads == int(t))
        try:
            result["paired"][t] = paired(row, prompts, workload["max_new_tokens"], tok.stop_ids,
                                         lambda: peer_run(int(t), best["peer"]), rounds)
        except RuntimeError as err:
            result["vs_best_peer_paired_note"] += f"{t} thread(s): {err}; "
            continue
        result["vs_best_peer_paired_by_threads"][t] = result["paired"][t]["vs_best_peer_paired"]
    result["vs_best_peer_paired"] = _headline(result["vs_best_peer_paired_by_threads"], summary["threads"])
    return result
