"""`sol-control doctor`: what this PC runs, how fast, and whether the deadlines hold here.

Per shipped bundle and target precision it times the planner the node would build (int8 and int4:
the fast path, speculative with the target's draft heads; fp32: the full-precision planner, plain
greedy) on the bundle's test-split decisions, warm, one after another: ms per decision, p50 and p99.
A deadline holds when p99 x SAFETY + the publish margin fits it. Where it does not, the doctor
times the alternatives (the other backend, two threads) and says what to change, from those figures.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from .bench.common import pct, progress, table
from .config import DecodingConfig, NodeConfig, apply_overrides, shipped_bundle

# p99 x SAFETY + deadline.publish_margin_ms must fit the deadline: the deadline counts from the image
# stamp, so the rest is left for the image's trip, perception and a busier host than this short run.
SAFETY = 2.0
CLOSER = 0.9  # an option that does not make the deadline hold is named only if its p99 is this much lower
PATHS = {"int8": "fast", "int4": "fast", "fp32": "full_precision"}
BACKEND_HINT = {"onnxruntime": "decoding.backend: onnxruntime (SOL_CONTROL_BACKEND=onnxruntime outside the node)",
                "native": "decoding.backend: native (SOL_CONTROL_BACKEND=native outside the node)"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", default=None, help="only this bundle: qc, grasp or a bundle folder (default: both)")
    p.add_argument("--decisions", type=int, default=20, help="timed decisions per precision, after the warm-up")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a node parameter to check instead of its default, e.g. deadline.qc_ms=8.0")
    p.add_argument("--json", type=Path, default=None, help="write the findings here as JSON")


# ---- verdicts and advice: pure functions of the measurements ------------------------------------

def needed_ms(p99_ms: float, margin_ms: float, safety: float = SAFETY) -> float:
    """The deadline a configuration with this p99 needs: p99 x safety + the publish margin."""
    return p99_ms * safety + margin_ms


def holds(p99_ms: float, deadline_ms: float, margin_ms: float, safety: float = SAFETY) -> bool:
    return needed_ms(p99_ms, margin_ms, safety) <= deadline_ms


def recommend(task: str, rows: list[dict], fast_precision: str, deadline_ms: float, margin_ms: float,
              safety: float = SAFETY) -> list[str]:
    """What to change so that `task`'s deadline holds, one sentence per change. `rows`: per precision
    measured, {precision, path, p99_ms, alternatives: {setting: p99_ms}}; the node runs
    `fast_precision` as its fast path and fp32 as its full-precision planner."""
    by = {r["precision"]: r for r in rows}
    advice = []
    if fast_precision in by:
        fast = by[fast_precision]
        others = {f"decoding.fast_precision: {r['precision']}": r["p99_ms"] for r in rows
                  if r["path"] == "fast" and r["precision"] != fast_precision}
        advice += _fixes(f"{task} fast path ({fast_precision})", fast["p99_ms"],
                         {**others, **fast.get("alternatives", {})}, task, deadline_ms, margin_ms, safety)
    if "fp32" in by:
        full = by["fp32"]
        advice += _fixes(f"{task} full-precision planner (the fallback; without it a fast-path failure gets "
                         "the safe default)", full["p99_ms"], full.get("alternatives", {}), task, deadline_ms,
                         margin_ms, safety)
    return advice


def _fixes(what: str, p99_ms: float, options: dict[str, float], task: str, deadline_ms: float,
           margin_ms: float, safety: float) -> list[str]:
    """[] when `p99_ms` holds; else the measured `options` ({setting: p99_ms}) that make it hold,
    and the deadline it needs as it is (or with the option that comes closest)."""
    if holds(p99_ms, deadline_ms, margin_ms, safety):
        return []
    key = f"deadline.{task}_ms"
    miss = f"{what}, p99 {p99_ms:.2f} ms, misses {key} {deadline_ms:g}"
    fits = sorted((ms, name) for name, ms in options.items() if holds(ms, deadline_ms, margin_ms, safety))
    lines = [f"{miss}: set {name} (p99 {ms:.2f} ms)" for ms, name in fits]
    raise_to = f"raise {key} to {math.ceil(needed_ms(p99_ms, margin_ms, safety))} ms"
    closer = {name: ms for name, ms in options.items() if ms < CLOSER * p99_ms}
    if not fits and closer:
        name, ms = min(closer.items(), key=lambda kv: kv[1])
        raise_to += f", or to {math.ceil(needed_ms(ms, margin_ms, safety))} ms with {name}"
    return lines + [f"{miss}: {'or ' if fits else ''}{raise_to}"]


# ---- measurement ----------------------------------------------------------------------------------

def _planner(bundle, precision: str, dec: DecodingConfig):
    from .planners import FastPlanner, FullPrecisionPlanner

    n_tokens = len(bundle.manifest.actions)
    if precision == "fp32":
        return FullPrecisionPlanner(bundle, n_tokens, dec)
    return FastPlanner(bundle, n_tokens, DecodingConfig(**{**dec.model_dump(), "fast_precision": precision}))


def _backend(sess) -> tuple[dict | None, str]:
    """The session's `backend_info` (None where the engine has none) and the backend that runs it."""
    from .decoding.native import NativeDecoderSession

    info = sess.backend_info
    if isinstance(info, dict) and info.get("backend"):
        return info, info["backend"]
    return None, "native" if isinstance(sess, NativeDecoderSession) else "onnxruntime"


def time_planner(planner, prefixes: list, decisions: int, warmup: int, label: str) -> list[float]:
    """ms per decision of `decisions` warm decisions, after `warmup` untimed ones."""
    from .budget import Budget

    for i in range(warmup):
        planner.plan(prefixes[i % len(prefixes)], Budget.unlimited())
    ms = []
    for i in range(decisions):
        ms.append(planner.plan(prefixes[i % len(prefixes)], Budget.unlimited()).latency_ms)
        progress(f"{label}: decision {i + 1}/{decisions}")
    return ms


def measure(bundle, precision: str, prefixes: list, decisions: int, dec: DecodingConfig, cpu: dict) -> dict:
    """One row: the planner for `precision` as the node builds it, timed."""
    label = f"{bundle.manifest.name} {precision}"
    planner = _planner(bundle, precision, dec)
    info, backend = _backend(planner.target)
    ms = time_planner(planner, prefixes, decisions, dec.warmup_runs, label)
    variant = ((info or {}).get("variant") or cpu["variant"]) if backend == "native" else None
    return {"bundle": bundle.manifest.name, "task": bundle.manifest.task, "precision": precision,
            "path": PATHS[precision], "backend": backend, "variant": variant,
            "step_ms": (info or {}).get("step_ms"), "reason": (info or {}).get("reason"), "backend_info": info,
            "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "decisions": decisions, "alternatives": {}}


def native_status() -> tuple[str, str]:
    """Whether the native pass's library loads here ("loaded", "not built", "broken") and a line on it."""
    from .decoding import native

    try:
        lib = native.library()
    except (OSError, AttributeError) as e:  # built for another CPU, or from other sources (a missing symbol)
        return "broken", f"{native.LIBRARY} does not load ({e}): rebuild it with `make native`"
    if lib is None:
        return "not built", "not built (`make native`): ONNX Runtime runs every graph"
    return "loaded", str(native.LIBRARY)


def alternatives(bundle, row: dict, prefixes: list, decisions: int, dec: DecodingConfig,
                 native: str) -> dict[str, float]:
    """p99 ms of `row`'s planner with the other backend (fast path; `native`: native_status()) and
    with two threads, where this host has them: the changes `recommend` may suggest."""
    from .decoding.native import NativeUnsupported

    settings = {}
    if row["path"] == "fast" and (row["backend"] == "native" or native == "loaded"):
        other = "onnxruntime" if row["backend"] == "native" else "native"
        settings[BACKEND_HINT[other]] = {"backend": other}
    if dec.threads == 1 and (os.cpu_count() or 1) >= 2:
        settings["decoding.threads: 2"] = {"threads": 2}
    out = {}
    for name, change in settings.items():
        try:
            planner = _planner(bundle, row["precision"], DecodingConfig(**{**dec.model_dump(), **change}))
        except NativeUnsupported as e:
            print(f"  {name}: not possible here ({e})")
            continue
        label = f"{row['bundle']} {row['precision']} with {name.split(' (')[0]}"
        out[name] = pct(time_planner(planner, prefixes, decisions, dec.warmup_runs, label), 99)
    return out


def check_bundle(bundle_dir: Path, cfg: NodeConfig, decisions: int, cpu: dict) -> dict:
    """Every target precision of one bundle, its verdicts and the advice for its task."""
    from .bench.decode_bench import decision_prefixes
    from .bundle import Bundle

    bundle = Bundle.load(bundle_dir)
    task = bundle.manifest.task
    if task not in ("qc", "grasp"):
        raise ValueError(f"doctor checks qc and grasp bundles; {bundle_dir} is a {task!r} bundle")
    deadline, margin = cfg.deadline.for_task(task), cfg.deadline.publish_margin_ms
    prefixes = decision_prefixes(bundle, min(decisions, 20))
    rows = []
    for precision in (p for p in PATHS if p in bundle.manifest.target.precisions):
        row = measure(bundle, precision, prefixes, decisions, cfg.decoding, cpu)
        row.update(deadline_ms=deadline, needed_ms=needed_ms(row["p99_ms"], margin),
                   holds=holds(row["p99_ms"], deadline, margin))
        if not row["holds"] and precision in (cfg.decoding.fast_precision, "fp32"):  # what the node runs
            row["alternatives"] = alternatives(bundle, row, prefixes, decisions, cfg.decoding, cpu["native"])
        rows.append(row)
    progress("", end="\n")
    return {"bundle": bundle.manifest.name, "task": task, "root": str(bundle.root), "deadline_ms": deadline,
            "rows": rows, "advice": recommend(task, rows, cfg.decoding.fast_precision, deadline, margin)}


# ---- output ---------------------------------------------------------------------------------------

def _bundle_dirs(which: str | None, cfg: NodeConfig) -> list[Path]:
    configured = {"qc": cfg.qc.bundle, "grasp": cfg.grasp.bundle}
    if which and which not in configured:
        return [Path(which)]
    return [Path(configured[t]) if configured[t] else shipped_bundle(t) for t in ([which] if which else configured)]


def _step(row: dict) -> str:
    """The engine's own ms per one-row step, native / ONNX Runtime (backend_info), where it timed them."""
    got = [(row.get("step_ms") or {}).get(b) for b in ("native", "onnxruntime")]
    if not any(isinstance(v, (int, float)) for v in got):
        return "not measured"
    return "/".join(f"{v:.3f}" if isinstance(v, (int, float)) else "-" for v in got)


def summary_table(report: dict) -> str:
    head = ["bundle", "precision", "path", "backend", "variant", "step ms native/ort", "p50 ms", "p99 ms",
            f"p99x{SAFETY:g}+margin", "deadline ms", "holds"]
    body = [[r["bundle"], r["precision"], r["path"], r["backend"], r["variant"] or "-", _step(r),
             f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['needed_ms']:.2f}", f"{r['deadline_ms']:g}",
             "yes" if r["holds"] else "NO"] for b in report["bundles"] for r in b["rows"]]
    return table(head, body)


def print_cpu(cpu: dict) -> None:
    forced = " (forced by SOL_CONTROL_ISA)" if cpu.get("forced") else ""
    print(f"CPU: {cpu['cpu']} ({cpu['arch']}, {os.cpu_count()} cores)")
    print(f"instruction sets: {', '.join(cpu['flags']) or 'none of those the kernels use'}")
    print(f"native kernels: {cpu['variant']}{forced}; this CPU runs {', '.join(cpu['runnable'])}")
    print(f"native pass: {cpu['native_library']}" + (f"\n  {cpu['error']}" if cpu.get("error") else ""), flush=True)


def run(args: argparse.Namespace) -> int:
    from .native import isa

    if args.decisions < 1:
        raise ValueError(f"--decisions must be positive, got {args.decisions}")
    cfg = apply_overrides(NodeConfig(), args.param)
    native, line = native_status()
    cpu = {**isa.describe(), "native": native, "native_library": line}
    print_cpu(cpu)
    if native == "broken" and cfg.decoding.backend != "onnxruntime":
        raise ValueError(f"the native pass: {line}; or time ONNX Runtime alone: --param decoding.backend=onnxruntime")
    bundles = [check_bundle(d, cfg, args.decisions, cpu) for d in _bundle_dirs(args.bundle, cfg)]
    report = {"machine": {**cpu, "cores": os.cpu_count()}, "safety": SAFETY,
              "publish_margin_ms": cfg.deadline.publish_margin_ms, "fast_precision": cfg.decoding.fast_precision,
              "decisions": args.decisions, "bundles": bundles}
    print(f"\nms per decision, warm, {args.decisions} decisions after {cfg.decoding.warmup_runs} warm-up; "
          f"holds = p99 x {SAFETY:g} + {cfg.deadline.publish_margin_ms:g} ms publish margin fits the deadline")
    print(summary_table(report))
    for r in (r for b in bundles for r in b["rows"] if r["reason"]):
        print(f"  {r['bundle']} {r['precision']}: {r['backend']}, {r['reason']}")
    advice = [a for b in bundles for a in b["advice"]]
    print("\n" + ("\n".join(f"- {a}" for a in advice) if advice else "The deadlines hold on this host: nothing to change."))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0
