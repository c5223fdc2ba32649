"""`sol-control bench lm`, the figures: rows -> summary.json, README.md (tables) and PNG plots.

Pure parts (tested with given inputs): `first_difference`, `agreement`, `ceiling`. Ratios are only
taken between rows of the same run and thread count. The ultrafast row is the fastest quantized
speculative row (decode tokens/s); when the bundle has no draft, the fastest quantized plain row
stands in and `ultrafast_note` says so.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .common import (bar_panels, ceiling, clean, colour, first_difference, fmt as _f, machine,
                     median as _median, rate, table)
from .lm_rows import SYMMETRIC, say
from .paired import paired_lm

NOMINAL_K = 8  # the ceiling's draft length when no speculative row ran (T = 9, the largest verify measured)


# ---- pure figures -------------------------------------------------------------------------------

def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How far `outputs` follow `reference`, answer by answer: the share of the reference's tokens
    before the first difference, the share of whole answers equal, and each first difference."""
    assert len(outputs) == len(reference), (len(outputs), len(reference))
    firsts = [first_difference(a, b) for a, b in zip(outputs, reference)]
    same = sum(len(b) if f is None else min(f, len(b)) for f, b in zip(firsts, reference))
    diffs = [f for f in firsts if f is not None]
    return {"tokens_equal_share": same / max(sum(len(b) for b in reference), 1),
            "answers_equal_share": sum(f is None for f in firsts) / max(len(reference), 1),
            "first_difference": firsts,
            "first_difference_median": float(np.median(diffs)) if diffs else None}


def draft_length(bundle, rows) -> tuple[int, str]:
    """(k, where it comes from): the heads' count, the draft model's mean proposal, or nominal."""
    heads = bundle.manifest.target.draft_heads
    spec = [r for r in rows if r.mode != "plain"]
    if spec and spec[0].mode == "heads":
        return heads, "draft heads"
    calls = sum(run.target_calls for r in spec for rep in r.prompts for run in rep)
    if spec and calls:
        source = "draft model" if spec[0].mode == "draft" else "prompt lookup"
        return max(1, round(sum(r.proposed for r in spec) / calls)), f"{source}: mean proposal per target call"
    return NOMINAL_K, f"nominal {NOMINAL_K}: no speculative row ran"


# ---- rows -> summary ----------------------------------------------------------------------------

def pooled_rate(runs) -> float | None:
    """Every prompt's decode tokens over every prompt's decode time (tokens/s): a throughput, where
    `decode_tokens_per_s` is the median prompt's rate. They part where the rate varies from prompt to
    prompt, as a speculative row's does (docs/LM.md, "`make bench-lm`")."""
    n, ms = sum(run.decode_tokens for run in runs), sum(run.decode_ms for run in runs)
    return rate(n, ms) if n > 0 and ms > 0 else None


def row_figures(r, meter, rss: dict) -> dict:
    runs = [run for rep in r.prompts for run in rep]
    loop_runs = [run for rep in r.loops for run in rep]
    loops_s = [sum(run.wall_ms for run in rep) / 1e3 for rep in r.loops]
    decode = [run.decode_tokens_per_s for run in runs]
    calls = sum(run.target_calls for run in runs + loop_runs)
    cpu_query = sum(run.cpu_s for run in runs) / len(runs)
    cpu_loop = sum(run.cpu_s for run in loop_runs) / max(len(r.loops), 1)
    return {
        "name": r.name, "precision": r.precision, "mode": r.mode, "speculative": r.mode != "plain",
        "threads": r.threads,
        "decode_tokens_per_s": _median(decode),
        "decode_tokens_per_s_min": min((d for d in decode if math.isfinite(d)), default=None),
        "decode_tokens_per_s_max": max((d for d in decode if math.isfinite(d)), default=None),
        "decode_tokens_per_s_pooled": pooled_rate(runs),
        "ttft_ms": _median(run.ttft_ms for run in runs),
        "tokens_per_s_with_prefill": _median(len(run.tokens) / run.wall_ms * 1e3 for run in runs),
        "mean_accepted": sum(run.decode_tokens for run in runs + loop_runs) / calls if calls else None,
        "answer_tokens_mean": float(np.mean([len(run.tokens) for run in runs])),
        "loop_s": _median(loops_s), "loop_s_min": min(loops_s), "loop_s_max": max(loops_s),
        "loop_tokens": sum(len(run.tokens) for run in r.loops[0]),
        "loop_ttft_ms": _median(run.ttft_ms for run in loop_runs),
        "cpu_s_per_query": cpu_query, "joules_per_query": meter.joules(1e3 * cpu_query),
        "cpu_s_per_loop": cpu_loop, "joules_per_loop": meter.joules(1e3 * cpu_loop),
        **rss.get((r.precision, r.mode), {"rss_mb": None, "rss_delta_mb": None}),
        "outputs": {"prompts": [run.tokens for run in r.prompts[0]], "loop": [run.tokens for run in r.loops[0]]},
    }


def lossless_check(rows) -> tuple[bool | None, list[dict]]:
    """Speculative tokens == plain tokens of the same precision and threads, every prompt and loop
    round of every repetition. None when no speculative row ran."""
    plain = {(r.precision, r.threads): r for r in rows if r.mode == "plain"}
    detail = []
    for r in (r for r in rows if r.mode != "plain"):
        p = plain[r.precision, r.threads]
        prompts = [a.tokens == b.tokens for ra, rb in zip(r.prompts, p.prompts) for a, b in zip(ra, rb)]
        loop = [a.tokens == b.tokens for ra, rb in zip(r.loops, p.loops) for a, b in zip(ra, rb)]
        detail.append({"row": r.name, "threads": r.threads, "equal_to": p.name,
                       "prompts_equal": f"{sum(prompts)}/{len(prompts)}",
                       "loop_rounds_equal": f"{sum(loop)}/{len(loop)}",
                       "lossless": all(prompts) and all(loop)})
    return (all(d["lossless"] for d in detail) if detail else None), detail


def _ultrafast(rows: list[dict]) -> tuple[dict, str]:
    """The fastest speculative row on the bundle's own int8 / int4 graphs (not SYMMETRIC's re-quantized one)."""
    quantized = [r for r in rows if r["precision"] in ("int8", "int4") and r["decode_tokens_per_s"] is not None]
    spec = [r for r in quantized if r["speculative"]]
    if spec:
        return max(spec, key=lambda r: r["decode_tokens_per_s"]), ""
    return (max(quantized, key=lambda r: r["decode_tokens_per_s"]),
            "no speculative row ran (the bundle has no draft): the fastest quantized plain row stands in")


def headline(by_threads: dict, threads: list[int]):
    """The figure at 1 thread (else at the fewest threads): the one the summary leads with."""
    t = 1 if 1 in threads else threads[0]
    return by_threads.get(str(t))


def _head(*, bundle, skipped, verify, meter, workload, reps, threads, gguf, notes, command, load_start,
          seconds) -> dict:
    """What the run was: command, machine, bundle, workload, energy and RSS bases, verify costs."""
    m = bundle.manifest
    return {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": {**machine(), "load_average_start": list(load_start),
                        "load_average_end": list(os.getloadavg())},
            "seconds": seconds, "notes": list(notes),
            "bundle": {"path": str(bundle.root), "name": m.name, "precisions": list(m.target.precisions),
                       "draft": ("draft model" if m.draft is not None else
                                 f"{m.target.draft_heads} draft heads" if m.target.draft_heads else None),
                       "gguf": str(gguf) if gguf else None},
            "workload": {"prompts": len(workload["prompts"]), "prompt_max_new_tokens": workload["max_new_tokens"],
                         "loop_rounds": len(workload["agent_loop"]["tool_results"]),
                         "loop_max_new_tokens": workload["agent_loop"]["max_new_tokens"], "repetitions": reps},
            "threads": threads, "skipped_rows": skipped,
            "energy": {"basis": meter.basis, "assumption": meter.assumption,
                       "watts_per_busy_core": meter.watts_per_busy_core,
                       "cpu_time": "process CPU time (all threads: getrusage user + system) around each answer"},
            "rss_basis": "RSS of a fresh process after opening the row's sessions (1 thread) and answering the "
                         "first prompt; rss_delta_mb: over the same process before opening them",
            "verify_ms": {str(t): {p: {str(T): ms for T, ms in v.items()} for p, v in per.items()}
                          for t, per in verify.items()}}


def _ceiling(std: dict, by: dict, uf: dict, verify_t: dict, k: int, k_source: str) -> dict | None:
    """What a perfect, free draft would give over standard at the ultrafast row's precision."""
    prec = uf["precision"]
    plain = by.get(f"{prec} plain")
    if prec not in verify_t or plain is None:
        return None
    std_ms, plain_ms = 1e3 / std["decode_tokens_per_s"], 1e3 / plain["decode_tokens_per_s"]
    ratio = verify_t[prec][k + 1] / verify_t[prec][1]  # a call with k + 1 tokens over one token
    return {"precision": prec, "k": k, "k_source": k_source, "standard_ms_per_token": std_ms,
            "plain_ms_per_token": plain_ms, "verify_ratio": ratio, "verify_ms": plain_ms * ratio,
            "ceiling_tokens": ceiling(k, std_ms, plain_ms * ratio)}


def _agreements(mine: list[dict], std: dict, base: dict | None, t: int, first_t: int,
                peer_rows: list[dict]) -> dict:
    """Each row's (and each peer row's, in place) agreement with standard at thread count t."""
    parts = ("prompts", "loop")
    agree = {f["name"]: {part: agreement(f["outputs"][part], std["outputs"][part]) for part in parts}
             for f in mine}
    if t != first_t and base is not None:
        agree[f"standard vs standard @{first_t}t"] = {
            part: agreement(std["outputs"][part], base["outputs"][part]) for part in parts}
    for p in (p for p in peer_rows if p.get("threads") == t and p.get("outputs")):
        p["agreement_vs_standard"] = {part: agreement(p["outputs"][part], std["outputs"][part])
                                      for part in parts if part in p["outputs"]
                                      and len(p["outputs"][part]) == len(std["outputs"][part])}
    return agree


def _headline_line(s: dict, t: int) -> str:
    """The ratios at thread count t, in one line above its rows."""
    c = s["ceiling"].get(str(t), {})
    return (f"**{t} thread(s)**: ultrafast = {s['ultrafast_row'][str(t)]}: "
            f"{s['ultrafast_vs_standard_tokens_by_threads'][str(t)]:.2f}x standard's decode tokens/s (pooled "
            f"{_f(s['ultrafast_vs_standard_tokens_pooled_by_threads'].get(str(t)), '.2f')}x), agent loop "
            f"{s['ultrafast_vs_standard_loop_by_threads'][str(t)]:.2f}x; ceiling {_f(c.get('ceiling_tokens'), '.2f')}x "
            f"({c.get('precision')}, k = {c.get('k')}, {c.get('k_source')}); "
            f"vs best peer {_f(s['vs_best_peer_by_threads'].get(str(t)), '.2f')} (ultrafast "
            f"{_f(s['vs_best_peer_ultrafast_by_threads'].get(str(t)), '.2f')})" + _paired_line(s, t))


def _paired_line(s: dict, t: int) -> str:
    """", paired ..." for the headline line: each paired row's median ratio over the alternating rounds."""
    p = s.get("paired", {}).get(str(t))
    if not p:
        return ""

    def by_round(name: str) -> str:
        return ", ".join(f"{r['rows'][name]['tokens_per_s']:.1f} / {r['peer_tokens_per_s']:.1f}" for r in p["rounds"])

    per_row = "; ".join(f"{name} {ratio:.2f} (by round: {by_round(name)})"
                        for name, ratio in p["vs_best_peer_paired"].items())
    return f"; paired with it, ours / peer tok/s: {per_row}"


def _best_peer(mine: list[dict], peer_rows: list[dict], t: int, ultrafast: dict) -> tuple[float, float, dict] | None:
    """(our best decode tokens/s over the best peer row's, the ultrafast row's over it, the rows named)
    at thread count t."""
    peers_t = [p for p in peer_rows if p.get("threads") == t and p.get("decode_tokens_per_s")]
    if not peers_t:
        return None
    best = max(peers_t, key=lambda p: p["decode_tokens_per_s"])
    ours = max((f for f in mine if f["decode_tokens_per_s"]), key=lambda f: f["decode_tokens_per_s"])
    keys = ("engine", "mode", "spec_mode", "precision", "decode_tokens_per_s")
    named = {"peer": {k2: best.get(k2) for k2 in keys},
             "ours": {k2: ours[k2] for k2 in ("name", "decode_tokens_per_s")}}
    return (ours["decode_tokens_per_s"] / best["decode_tokens_per_s"],
            ultrafast["decode_tokens_per_s"] / best["decode_tokens_per_s"], named)


def summarise(*, rows, verify, k, rss, peers, meter, threads, **run) -> dict:
    """What the run was (`_head`, from `run`), every row's figures, and per thread count the
    ultrafast row's ratios over standard, the ceiling, agreement and the best peer row's ratios;
    a headline is the figure at 1 thread (`headline`)."""
    figs = [row_figures(r, meter, rss) for r in rows]
    s = _head(verify=verify, meter=meter, threads=threads, **run)
    s["lossless"], s["lossless_detail"] = lossless_check(rows)
    k, k_source = k
    peer_rows = [dict(p) for p in peers.get("rows", [])]
    base = next((f for f in figs if f["name"] == "standard" and f["threads"] == threads[0]), None)
    by_t = {}  # str(thread count) -> its figures
    for t in threads:
        mine = [f for f in figs if f["threads"] == t]
        by = {f["name"]: f for f in mine}
        std = by.get("standard")
        if std is None or len(mine) < 2:
            continue
        uf, s["ultrafast_note"] = _ultrafast(mine)
        f = by_t[str(t)] = {
            "ultrafast_row": uf["name"],
            "ultrafast_vs_standard_tokens": uf["decode_tokens_per_s"] / std["decode_tokens_per_s"],
            "ultrafast_vs_standard_loop": std["loop_s"] / uf["loop_s"],
            "ceiling": _ceiling(std, by, uf, verify.get(t, {}), k, k_source),
            "agreement": _agreements(mine, std, base, t, threads[0], peer_rows)}
        if uf["decode_tokens_per_s_pooled"] and std["decode_tokens_per_s_pooled"]:
            pooled = uf["decode_tokens_per_s_pooled"] / std["decode_tokens_per_s_pooled"]
            f["ultrafast_vs_standard_tokens_pooled"] = pooled
        peer = _best_peer(mine, peer_rows, t, uf)
        if peer is not None:
            f["vs_best_peer"], f["vs_best_peer_ultrafast"], f["best_peer"] = peer

    def by_threads(key: str) -> dict:
        return {t: f[key] for t, f in by_t.items() if f.get(key) is not None}

    for key in ("ultrafast_vs_standard_tokens", "ultrafast_vs_standard_tokens_pooled",
                "ultrafast_vs_standard_loop", "vs_best_peer", "vs_best_peer_ultrafast"):
        s[key], s[f"{key}_by_threads"] = headline(by_threads(key), threads), by_threads(key)
    for key in ("ultrafast_row", "ceiling", "best_peer", "agreement"):
        s[key] = by_threads(key)
    s["ceiling_tokens"] = (headline(s["ceiling"], threads) or {}).get("ceiling_tokens")
    s["vs_best_peer_note"] = "" if s["vs_best_peer_by_threads"] else (
        peers.get("note") or "no peer row with decode tokens/s")
    s.setdefault("ultrafast_note", "")
    head_t = str(1 if 1 in threads else threads[0])
    for prec in ("int8", "int4", SYMMETRIC):
        a = s["agreement"].get(head_t, {}).get(f"{prec} plain")
        s[f"agreement_{prec.replace('-', '_')}_vs_fp32"] = None if a is None else {
            part: {k2: a[part][k2] for k2 in ("tokens_equal_share", "answers_equal_share", "first_difference_median")}
            for part in a}
    s["peers"] = {"rows": peer_rows, "note": peers.get("note", "")}
    s["rows"] = figs
    return s


def paired_summary(summary: dict, rows: list, tok, workload: dict, gguf: Path | None, rounds: int,
                   open_peer: Callable | None = None) -> dict:
    """`vs_best_peer_paired` (our best row's, at the headline thread count as `vs_best_peer`) and
    `vs_best_peer_paired_ultrafast` (the ultrafast row's), each with `_by_threads`, and the rounds
    under `paired`; null with `vs_best_peer_paired_note` where it did not run. `open_peer(t, peer)`
    gives a context manager with `decode_tokens_per_s(ids, max_new)` (default: `PeerServer.start`)."""
    result = {"vs_best_peer_paired": None, "vs_best_peer_paired_by_threads": {}, "vs_best_peer_paired_ultrafast": None,
              "vs_best_peer_paired_ultrafast_by_threads": {}, "paired": {}, "vs_best_peer_paired_note": ""}
    if not summary.get("best_peer") or gguf is None or rounds < 1:
        result["vs_best_peer_paired_note"] = "not run: " + ("--paired 0" if summary.get("best_peer") else "no peer row")
        return result
    if open_peer is None:
        from .peers.lm import PeerServer

        open_peer = lambda t, peer: PeerServer.start(gguf, workload, t, peer)  # noqa: E731
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"]]
    for t, best in summary["best_peer"].items():
        names = dict.fromkeys([best["ours"]["name"], summary.get("ultrafast_row", {}).get(t, best["ours"]["name"])])
        mine = [next(r for r in rows if r.name == n and r.threads == int(t)) for n in names]
        try:
            with open_peer(int(t), best["peer"]) as server:
                result["paired"][t] = paired_lm(mine, prompts, workload["max_new_tokens"], tok.stop_ids,
                                                server.decode_tokens_per_s, rounds, say)
        except RuntimeError as err:
            result["vs_best_peer_paired_note"] += f"{t} thread(s): {err}; "
            continue
        ratios = result["paired"][t]["vs_best_peer_paired"]
        result["vs_best_peer_paired_by_threads"][t] = ratios[mine[0].name]
        result["vs_best_peer_paired_ultrafast_by_threads"][t] = ratios[mine[-1].name]
    for key in ("vs_best_peer_paired", "vs_best_peer_paired_ultrafast"):
        result[key] = headline(result[f"{key}_by_threads"], summary["threads"])
    return result


# ---- output -------------------------------------------------------------------------------------

def write(summary: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(clean(summary), indent=1) + "\n")
    (out / "README.md").write_text(markdown(summary) + "\n")
    _plot(summary, out / "decode_tokens_per_s.png", "decode_tokens_per_s",
          "decode tokens/s (median over prompts)", "decode")
    _plot(summary, out / "agent_loop.png", "loop_s", "seconds, end to end",
          f"{summary['workload']['loop_rounds']}-round agent loop")


def _rows_table(s: dict, t: int) -> list[str]:
    agree = s["agreement"].get(str(t), {})
    lossless = {(d["row"], d["threads"]): d["lossless"] for d in s["lossless_detail"]}
    head = ["row", "decode tok/s", "min-max", "pooled", "TTFT ms", "tok/s w/ prefill", "mean acc.", "loop s",
            "loop tokens", "CPU s/query", "J/query", "RSS MB", "= fp32 tokens", "= fp32 answers", "lossless"]
    body = []
    for r in (r for r in s["rows"] if r["threads"] == t):
        a = agree.get(r["name"], {}).get("prompts", {})
        body.append([r["name"] + (f" ({r['mode']})" if r["speculative"] else ""), _f(r["decode_tokens_per_s"]),
                     f"{_f(r['decode_tokens_per_s_min'], '.0f')}-{_f(r['decode_tokens_per_s_max'], '.0f')}",
                     _f(r["decode_tokens_per_s_pooled"]),
                     _f(r["ttft_ms"], ".0f"), _f(r["tokens_per_s_with_prefill"]), _f(r["mean_accepted"], ".2f"),
                     _f(r["loop_s"]), str(r["loop_tokens"]), _f(r["cpu_s_per_query"], ".2f"),
                     _f(r["joules_per_query"], ".2f"),
                     _f(r["rss_mb"], ".0f"), _f(a.get("tokens_equal_share"), ".0%"),
                     _f(a.get("answers_equal_share"), ".0%"),
                     {True: "yes", False: "NO", None: "-"}[lossless.get((r["name"], t))]])
    return ["```", table(head, body), "```"]


def markdown(s: dict) -> str:
    m = s["machine"]
    lines = ["# LM benchmark (`sol-control bench lm`)", "",
             f"{s['date']}; {m['cpu']}, {m['cores']} cores, ONNX Runtime {m['onnxruntime']}; load average "
             f"{m['load_average_start'][0]:.2f} at the start, {m['load_average_end'][0]:.2f} at the end; "
             f"{s['seconds'] / 60:.1f} min. Command: `{s['command']}`.", "",
             f"Bundle `{s['bundle']['name']}` ({', '.join(s['bundle']['precisions'])}; draft: "
             f"{s['bundle']['draft'] or 'none'}). Workload: {s['workload']['prompts']} chat prompts (<= "
             f"{s['workload']['prompt_max_new_tokens']} new tokens, cold cache each), a "
             f"{s['workload']['loop_rounds']}-round "
             f"agent loop (<= {s['workload']['loop_max_new_tokens']} tokens a round, KV kept across rounds); "
             f"{s['workload']['repetitions']} repetition(s), rows interleaved prompt by prompt.", ""]
    lines += [f"- note: {n}" for n in s["notes"]] + ([""] if s["notes"] else [])
    if s["lossless"] is False:
        lines += ["**LOSSLESS CHECK FAILED**: speculative tokens differ from plain greedy of the same precision:",
                  "", "```", json.dumps(s["lossless_detail"], indent=1), "```", ""]
    for t in s["threads"]:
        if str(t) in s["ultrafast_vs_standard_tokens_by_threads"]:
            lines += [_headline_line(s, t), ""] + _rows_table(s, t) + [""]
    if s["ultrafast_note"]:
        lines += [f"Ultrafast: {s['ultrafast_note']}.", ""]
    lines += [f"Lossless (speculative == plain, same precision): {s['lossless']}" +
              ("" if s["lossless"] is not None else " (no speculative row ran)")]
    lines += [f"- skipped: {x['name']} @{x['threads']}t: {x['note']}" for x in s["skipped_rows"]] + [""]
    verify = [(f"{prec} @{t}t", v) for t, per in s["verify_ms"].items() for prec, v in per.items()]
    body = [[name] + [f"{ms:.1f} ({ms / v['1']:.2f}x)" for ms in v.values()] for name, v in verify]
    head = ["target"] + [f"T={T}" for T in (verify[0][1] if verify else [])]
    lines += ["Verify cost: ms of one target call with T tokens (after the first prompt), and over "
              "T = 1:", "", "```", table(head, body), "```", "",
              "ceiling_tokens = (k + 1) x standard ms per token / verify ms of k + 1 tokens at the ultrafast "
              "precision: the speed-up over standard a perfect, free draft would give with these kernels. ms per "
              "token are the rows' (1000 / decode tokens/s, medians over the prompts); verify ms = the plain row's "
              "ms per token x the table's T = k + 1 over T = 1 at that precision.", ""]
    lines += [f"Energy: {s['energy']['basis']} ({s['energy']['assumption']}); {s['energy']['cpu_time']}.",
              f"Memory: {s['rss_basis']}.", ""]
    peers = s["peers"]
    if peers["rows"]:
        head = ["engine", "mode", "precision", "threads", "decode tok/s", "TTFT ms", "tok/s w/ prefill", "loop s",
                "CPU s/query", "RSS MB", "= fp32 tokens", "note"]
        body = [[p.get("engine", ""), p.get("mode", ""), p.get("precision", ""), p.get("threads", ""),
                 _f(p.get("decode_tokens_per_s")), _f(p.get("ttft_ms"), ".0f"), _f(p.get("tokens_per_s_with_prefill")),
                 _f(p.get("loop_s")), _f(p.get("cpu_s_per_query"), ".2f"), _f(p.get("rss_mb"), ".0f"),
                 _f(p.get("agreement_vs_standard", {}).get("prompts", {}).get("tokens_equal_share"), ".0%"),
                 p.get("note", "")] for p in peers["rows"]]
        lines += ["Peers (same GGUF, same workload; run after our rows, not interleaved):", "", "```",
                  table(head, body), "```", ""]
    else:
        lines += [f"Peers: none ({peers['note']}).", ""]
    return "\n".join(lines)


def _plot(s: dict, path: Path, key: str, ylabel: str, title: str) -> None:
    """Our rows and the peers' (not skipped) at each thread count, one panel each."""
    bar_panels(path, {f"{title}, {t} thread(s)": [(r["name"], r[key] or 0.0, colour(r)) for r in s["rows"] if r["threads"] == t]
                      + [(f"{p.get('engine')} {p.get('mode', '')} {p.get('precision', '')}", p.get(key) or 0.0, colour(p))
                         for p in s["peers"]["rows"] if p.get("threads") == t and p.get(key) is not None]
                      for t in s["threads"]}, ylabel)
