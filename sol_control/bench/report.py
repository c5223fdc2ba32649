"""`sol-control bench all` (`make bench`): every benchmark into bench_report/ — JSON, PNG, Markdown.

1. decode: standard vs quantized vs speculative on each shipped bundle's test-split decisions;
2. e2e: image stamp -> decision received over DDS, standard vs ultrafast (node bench);
3. peers: the same weights and token workloads in peer engines (if `make bench-peers` ran);
4. paired: ours against the best peer row, decision by decision;
5. scaling: tokens/s against decision length and prefix length, within the graphs' KV length;
6. memory: resident memory per decoder.
Ratios are always taken between rows measured in the same run. A stage that fails is named in
summary.json (`failed`) and the report; the stages after it still run, and the command exits 1.
The machine block records the CPU, its instruction-set flags and the native kernel variant.
"""
from __future__ import annotations

import argparse
import math
import sys
import traceback
from itertools import product
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..config import shipped_bundle
from ..decoding import AdaptiveK, greedy, open_decoder, speculate
from . import decode_bench, paired, row
from .common import bar_panels, colour, machine, pct, progress, pyplot, save, table, write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("bench_report"), help="output folder")
    p.add_argument("--quick", action="store_true", help="fewer decisions, rounds and lengths")
    p.add_argument("--rounds", type=int, default=5, help="rounds per measurement (medians over rounds)")
    p.add_argument("--skip", nargs="*", default=[], choices=list(STAGES),
                   help="stages to leave out (peers: also paired, which needs the best peer row)")


# ---- scaling: decision length and prefix length ------------------------------------------------

def scaling(bundle: Bundle, lengths=(8, 16, 32), prefix_lens=(8, 16, 32), rounds: int = 5) -> list[dict]:
    """Decode tokens/s and ms per decision for standard and ultrafast as lengths grow. A row needs
    a KV cache of prefix + tokens positions. Decoders in the Optimum layout take any length: past
    the bundle's `max_context` they run with larger KV buffers (the rotary positions work at any
    length, so the cost is real, but the model never saw such sequences, so the draft's acceptance
    there is not the trained one: `beyond_trained_context`). A fused graph's KV length is fixed when
    it is built (the shipped bundles': 64), so a row longer than it is left out, with the reason
    (`skipped`)."""
    m = bundle.manifest
    fp32, fast, draft = _scaling_sessions(bundle, max(prefix_lens) + max(lengths))
    limit = min(s.max_context for s in (fp32, fast, draft))
    base = decode_bench.decision_prefixes(bundle, 4)
    rows = []
    for plen in prefix_lens:
        for n_new in lengths:
            if plen + n_new > limit:
                short = min((fp32, fast, draft), key=lambda s: s.max_context)
                rows.append({"prefix_len": plen, "new_tokens": n_new,
                             "skipped": f"needs {plen + n_new} KV positions; {short.name}'s graph holds {limit} "
                                        "(a fused graph's KV length is fixed when it is built)"})
                continue
            # prefixes of exactly plen tokens: BOS, observation tokens (repeated as needed), SEP
            fit = [np.concatenate([[m.vocab.bos], np.resize(p[1:-1], max(plen - 2, 1)),
                                   [m.vocab.sep]]).astype(np.int64) for p in base]
            row = _scaling_row(fp32, fast, draft, fit, n_new, rounds)
            rows.append({"prefix_len": plen, "new_tokens": n_new,
                         "beyond_trained_context": plen + n_new > m.max_context, **row})
            progress(f"scaling {m.name}: prefix {plen}, {n_new} tokens: {row['ratio_tokens']:.1f}x")
    progress("", end="\n")
    for r in rows:
        if "skipped" in r:
            print(f"scaling {m.name}: prefix {r['prefix_len']}, {r['new_tokens']} tokens left out: {r['skipped']}")
    return rows


def _scaling_sessions(bundle: Bundle, want: int) -> tuple:
    """The standard (fp32), ultrafast (int4, else int8) and draft decoders: Optimum-layout ones with
    `want` KV positions, fused ones with the KV length their graph was built for."""
    m = bundle.manifest

    def session(role: str, precision: str):
        optimum = bundle.decoder_layout(role, precision) == "optimum"
        return open_decoder(bundle, role, precision, max_context=max(want, m.max_context) if optimum else None)

    fast = session("target", "int4" if "int4" in m.target.precisions else "int8")
    return session("target", "fp32"), fast, session("draft", row.draft_precision(m))


def _scaling_row(fp32, fast, draft, prefixes: list, n_new: int, rounds: int) -> dict:
    """Standard (greedy on fp32) and ultrafast (draft-model speculation) over `prefixes`, `rounds` times."""
    ctl = AdaptiveK()
    res = {"std": [], "fast": []}
    for _ in range(rounds):
        for p in prefixes:
            res["std"].append(greedy(fp32, p, n_new).stats)
            res["fast"].append(speculate(draft, fast, p, n_new, controller=ctl).stats)
    row = {}
    for key, stats in res.items():
        row[f"{key}_decision_ms"] = pct([s.wall_ms for s in stats], 50)
        row[f"{key}_tokens_per_s"] = sum(s.new_tokens for s in stats) / sum(s.wall_ms for s in stats) * 1e3
        row[f"{key}_ttft_ms"] = pct([s.ttft_ms for s in stats], 50)
    row["ratio_tokens"] = row["fast_tokens_per_s"] / row["std_tokens_per_s"]
    spec = res["fast"]
    row["fast_acceptance"] = sum(x.accepted for x in spec) / max(sum(x.proposed for x in spec), 1)
    row["fast_mean_accepted"] = float(np.mean([x.mean_accepted for x in spec]))
    return row


# ---- resident memory per precision (each in a fresh process) -----------------------------------

def memory(bundle: Bundle) -> list[dict]:
    """Resident memory per decoder: a fresh process opens it and decides once (`row.probe_rss`)."""
    m, specs, sizes = bundle.manifest, {}, {}
    for role, spec in (("target", m.target), ("draft", m.draft)):
        for prec in spec.precisions:
            label = f"{role} {prec}"
            file = (spec.fused if prec in spec.fused else spec.files)[prec]
            sizes[label] = bundle.path(file).stat().st_size
            specs[label] = {"bundle": str(bundle.root), "role": role, "precision": prec, "modes": ["plain"],
                            "ids": [m.vocab.bos] * 8, "max_new": 8}
    return [{"decoder": label, "file_mb": sizes[label] / 1e6, "rss_mb": (got["after"]["plain"] - got["before"]) / 1e6}
            for label, got in row.probe_rss(specs).items()]


# ---- plots ---------------------------------------------------------------------------------------

def plot_scaling(rows: dict, path: Path) -> None:
    fig, axes = pyplot().subplots(1, len(rows), figsize=(6 * len(rows), 4), squeeze=False)
    for ax, (name, rs) in zip(axes[0], rows.items()):
        for plen in sorted({r["prefix_len"] for r in rs}):
            sel = [r for r in rs if r["prefix_len"] == plen and "skipped" not in r]
            n = [r["new_tokens"] for r in sel]
            ax.plot(n, [r["std_decision_ms"] for r in sel], "o--", label=f"standard, prefix {plen}")
            ax.plot(n, [r["fast_decision_ms"] for r in sel], "o-", label=f"ultrafast, prefix {plen}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="tokens per decision", ylabel="ms per decision (median)", title=name)
        ax.legend(fontsize=7)
    save(fig, path)


# ---- the whole report ----------------------------------------------------------------------------

def _decode_stage(args, bundles: dict, summary: dict) -> None:
    decode = summary["decode"] = {}
    for name, b in bundles.items():
        decode[name] = decode_bench.run_bench(b, 12 if args.quick else 40, args.rounds,
                                              len(b.manifest.actions), 1, None)
        print("\n".join(decode_bench.report_lines(decode[name])))
    panels = {f"{name}: decode tokens/s (median, min-max)": [
        (r["name"], r["decode_tokens_per_s"], colour(r),
         (r["decode_tokens_per_s_min"], r["decode_tokens_per_s_max"])) for r in rep["rows"]]
        for name, rep in decode.items()}
    bar_panels(args.out / "decode_tokens_per_s.png", panels, height=4)
    g = decode["grasp"]
    summary["ultrafast_vs_standard_tokens"] = g["ratios"]["ultrafast_vs_standard"]
    summary["ultrafast_vs_standard_decision"] = g["ratios"]["ultrafast_vs_standard_decision"]
    summary["ultrafast_vs_standard_decision_interleaved"] = g["ratios_interleaved"]["ultrafast_vs_standard_decision"]
    summary["ultrafast_ceiling_tokens"] = g["ceiling_tokens"]


def _e2e_stage(args, bundles: dict, summary: dict) -> None:
    from . import node_bench

    summary["e2e"] = node_bench.compare_standard_ultrafast(quick=args.quick)
    if summary["e2e"]:
        summary["ultrafast_vs_standard_e2e"] = summary["e2e"].get("ratio_p50")
    if summary.get("decode") and summary["e2e"]:
        summary["node_fast_path"] = node_fast_path(summary["decode"], summary["e2e"])


def _peers_stage(args, bundles: dict, summary: dict) -> None:
    from . import peers

    summary["peers"] = {name: peers.run_all(b, quick=args.quick) for name, b in bundles.items()}
    for name, suffix in SUFFIXES.items():
        summary.update(vs_best_peer(summary.get("decode", {}).get(name), summary["peers"][name].get("rows", []),
                                    suffix))


def _paired_stage(args, bundles: dict, summary: dict) -> None:
    """The same ratio as vs_best_peer again, the two sides in alternating rounds (after the peers)."""
    for name, suffix in SUFFIXES.items():
        if f"best_peer{suffix}" in summary:
            summary.update(paired.paired(bundles[name], summary[f"best_peer{suffix}"], 2 if args.quick else 4,
                                         suffix, progress))


def _scaling_stage(args, bundles: dict, summary: dict) -> None:
    lengths = (8, 32) if args.quick else (8, 16, 32)
    summary["scaling"] = {name: scaling(b, lengths=lengths, rounds=2 if args.quick else args.rounds)
                          for name, b in bundles.items()}
    plot_scaling(summary["scaling"], args.out / "scaling.png")


def _memory_stage(args, bundles: dict, summary: dict) -> None:
    summary["memory"] = {name: memory(b) for name, b in bundles.items()}


SUFFIXES = {"grasp": "", "qc": "_qc"}  # bundle -> the suffix of its keys in summary.json
# in this order; `--skip peers` leaves out the paired stage too (it needs the best peer row)
STAGES = {"decode": _decode_stage, "e2e": _e2e_stage, "peers": _peers_stage, "paired": _paired_stage,
          "scaling": _scaling_stage, "memory": _memory_stage}


def run_stages(args, bundles: dict, summary: dict, stages: dict = STAGES) -> None:
    """Every stage not skipped, in order. A stage that fails is recorded in `summary["failed"]`
    (stage -> the error) with its traceback on stderr, and the next one runs."""
    skip = set(args.skip) | ({"paired"} if "peers" in args.skip else set())
    for name, stage in stages.items():
        if name in skip:
            continue
        try:
            stage(args, bundles, summary)
        except Exception as e:  # noqa: BLE001 - any stage's error: report it, keep the others
            traceback.print_exc()
            summary.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"
            print(f"bench all: stage {name} failed ({type(e).__name__}: {e}); the others still run", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    bundles = {name: Bundle.load(shipped_bundle(name)) for name in SUFFIXES}
    summary: dict = {"machine": machine(), "command": "sol-control bench all" + (" --quick" if args.quick else "")}
    run_stages(args, bundles, summary)
    (out / "README.md").write_text(markdown(summary))
    print(markdown(summary))
    write_json(out / "summary.json", summary)
    if summary.get("failed"):
        print(f"bench all: failed stages: {', '.join(summary['failed'])} (summary.json, \"failed\")", file=sys.stderr)
        return 1
    return 0


def vs_best_peer(decode: dict | None, peer_rows: list[dict], suffix: str = "") -> dict:
    """The best peer row's ms per decision over our best speculative row's, on the same weights and
    prefixes (`vs_best_peer{suffix}`; > 1: we are faster). Ours is timed as the node runs a
    decision (decode bench, warm: a static-first prefix is kept) and alone, as each peer row is;
    the peers without cross-frame caches, as their own loop runs it. Whole decisions, first token
    included: a peer's decode-only rate leaves out its first step, which for a speculative peer
    already emits several tokens."""
    if not decode or not peer_rows:
        return {}

    ours = min((r for r in decode["rows"] if r["speculative"]), key=lambda r: r["decision_ms_p50"])
    best = min(peer_rows, key=lambda r: r["decision_ms_p50"])
    keys = ("decision_ms_p50", "cold_decision_ms_p50")
    return {f"vs_best_peer{suffix}": best["decision_ms_p50"] / ours[keys[0]],
            f"vs_best_peer{suffix}_cold": best["decision_ms_p50"] / ours[keys[1]],
            f"best_peer{suffix}": {k: best[k] for k in ("engine", "mode", "precision", "decision_ms_p50")},
            f"ours_vs_peer{suffix}": {"name": ours["name"], **{k: ours[k] for k in keys}}}


def node_fast_path(decode: dict, e2e: dict) -> dict:
    """Per task: the node's fast path (p50 over the ultrafast rounds of `bench node`) over the same
    configuration's decode-bench decision alone, back to back (`vs_solo`) and paced at the camera
    rate with the thread asleep between frames (`vs_paced`, the decode bench's docstring says why).
    The node runs int8 + heads by default (`decoding.fast_precision`)."""
    out = {}
    for task, rep in decode.items():
        row = next((r for r in rep["rows"] if r["name"] == paired.OURS), None)
        in_node = e2e.get(task, {}).get("ultrafast", {}).get("fast_path_p50_ms")
        if row is None or not row.get("paced_decision_ms_p50") or in_node is None or not math.isfinite(in_node):
            continue
        solo, paced = row["decision_ms_p50"], row["paced_decision_ms_p50"]
        out[task] = {"row": row["name"], "in_node_ms": in_node, "solo_ms": solo, "paced_ms": paced,
                     "vs_solo": in_node / solo, "vs_paced": in_node / paced}
    return out


def _md_e2e(s: dict) -> list[str]:
    """End to end over DDS: standard vs ultrafast per task; the node's fast path against its
    decision alone."""
    lines: list[str] = []
    if e := s.get("e2e"):
        lines.append(f"End to end (stamp → decision over DDS, mean of the two tasks' medians over "
                     f"{e['rounds']} paired rounds): {e['standard_p50_ms']:.2f} ms → "
                     f"{e['ultrafast_p50_ms']:.2f} ms = {e['ratio_p50']:.2f}x (p50)")
        head = ["task", "mode", "p50 ms", "p50 min-max", "p99 ms", "hit rate", "sources", "ratio (min-max)"]
        body = []
        for task, name in product(("qc", "grasp"), ("standard", "ultrafast")):
            t, m = e[task], e[task][name]
            ratio = f"{t['ratio_p50']:.2f}x ({t['ratio_p50_min']:.2f}-{t['ratio_p50_max']:.2f})"
            body.append([task, name, f"{m['p50_ms']:.2f}",
                         f"{m['p50_ms_min']:.2f}-{m['p50_ms_max']:.2f}", f"{m['p99_ms']:.2f}",
                         f"{100 * m['hit_rate']:.1f}%",
                         " ".join(f"{k}={v}" for k, v in sorted(m["sources"].items())),
                         ratio if name == "ultrafast" else ""])
        lines += ["", "```", table(head, body), "```", ""]
    lines += [f"- {task} fast path ({f['row']}) in the node {f['in_node_ms']:.2f} ms p50: "
              f"{f['vs_solo']:.2f}x its decision alone back to back ({f['solo_ms']:.2f} ms), "
              f"{f['vs_paced']:.2f}x alone at 30 Hz, asleep between frames ({f['paced_ms']:.2f} ms)"
              for task, f in s.get("node_fast_path", {}).items()]
    return lines + [""] * bool(s.get("node_fast_path"))


def _md_peers(s: dict) -> list[str]:
    """The peer engines' rows per bundle and our ratio to the best."""
    from .peers import rows_table

    lines: list[str] = []
    for name, peers in s.get("peers", {}).items():
        suffix = "" if name == "grasp" else f"_{name}"
        if not peers.get("rows"):
            lines += [f"Peers ({name}): {peers.get('note', 'none ran')}", ""]
            continue
        lines += [f"Peers, {name} bundle weights and prefixes:", "```", rows_table(peers["rows"]), "```"]
        if f"vs_best_peer{suffix}" in s:
            bp, ours = s[f"best_peer{suffix}"], s[f"ours_vs_peer{suffix}"]
            lines.append(f"Best peer row ({bp['engine']} {bp['mode']} {bp['precision']}): {bp['decision_ms_p50']:.2f} ms "
                         f"per decision; ours ({ours['name']}, alone): "
                         f"{ours['decision_ms_p50']:.2f} ms as the node runs it "
                         f"(static prefix kept), {ours['cold_decision_ms_p50']:.2f} ms cold -> vs_best_peer{suffix} "
                         f"{s[f'vs_best_peer{suffix}']:.2f}x ({s[f'vs_best_peer{suffix}_cold']:.2f}x cold)")
        if f"vs_best_peer{suffix}_paired" in s:
            rounds = s[f"paired{suffix}"]["rounds"]
            lines.append(f"Paired, {len(rounds)} rounds of that peer row's decisions alternating with our "
                         f"{s[f'paired{suffix}']['ours']}'s on the peers' prefixes (`bench/paired.py`): "
                         f"vs_best_peer{suffix}_paired {s[f'vs_best_peer{suffix}_paired']:.2f}x "
                         f"({s[f'vs_best_peer{suffix}_paired_cold']:.2f}x cold); peer "
                         + ", ".join(f"{r['peer_ms']:.2f}" for r in rounds) + " ms, ours "
                         + ", ".join(f"{r['ours_warm_ms']:.2f}" for r in rounds) + " ms")
        lines.append("")
    return lines


def _md_scaling_memory(s: dict) -> list[str]:
    """Scaling with the prefix length, and resident memory per decoder."""
    lines: list[str] = []
    for name, rs in s.get("scaling", {}).items():
        head = ["prefix", "tokens", "std ms", "ultrafast ms", "std tok/s", "ultrafast tok/s", "ratio", "accept"]
        body = [[r["prefix_len"], f"{r['new_tokens']}{'*' if r.get('beyond_trained_context') else ''}",
                 f"{r['std_decision_ms']:.2f}", f"{r['fast_decision_ms']:.2f}",
                 f"{r['std_tokens_per_s']:.0f}", f"{r['fast_tokens_per_s']:.0f}", f"{r['ratio_tokens']:.2f}x",
                 f"{r.get('fast_acceptance', float('nan')):.2f}"] for r in rs if "skipped" not in r]
        lines += [f"Scaling, {name} (* = longer than the trained context: real cost, untrained acceptance):",
                  "```", table(head, body), "```"]
        lines += [f"- prefix {r['prefix_len']}, {r['new_tokens']} tokens left out: {r['skipped']}"
                  for r in rs if "skipped" in r] + [""]
    for name, rs in s.get("memory", {}).items():
        body = [[r["decoder"], f"{r['file_mb']:.1f}", f"{r['rss_mb']:.1f}"] for r in rs]
        lines += [f"Resident memory, {name}:", "```", table(["decoder", "file MB", "RSS MB"], body), "```", ""]
    return lines


def markdown(s: dict) -> str:
    m = s["machine"]
    kernels = f", native kernels {m['isa']['variant']}" if m.get("isa") else ""
    lines = ["# sol_control benchmark report", "",
             f"Machine: {m['cpu']}, {m['cores']} cores{kernels}, ONNX Runtime "
             f"{m['onnxruntime']}, {m['date']}. Command: `{s['command']}`.", ""]
    lines += [f"**Stage {name} failed**: {error}" for name, error in s.get("failed", {}).items()]
    lines += [""] if s.get("failed") else []
    for rep in s.get("decode", {}).values():
        lines += decode_bench.report_lines(rep)
    for section in (_md_e2e, _md_peers, _md_scaling_memory):
        lines += section(s)
    return "\n".join(lines)
