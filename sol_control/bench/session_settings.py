"""ONNX Runtime session settings for a 2-core machine, measured in isolation on one decoder.

Each setting opens its own FusedDecoderSession on the same graph; decisions (prefill + greedy
steps, cold cache) alternate between the settings decision by decision, so a noisy neighbour slows
all of them alike. The whole set runs twice: on a quiet machine, then next to one busy process (a
Python loop burning a core, started and stopped here), as a node shares the machine with the
simulator, the DDS threads and other work.

    python -m sol_control.bench.session_settings [--graph PATH] [--rounds 7] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .common import default_bundle, table

LEVELS = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
# name -> (intra-op threads, allow_spinning, cpu memory arena, optimization level)
SETTINGS = {
    "1 thread (default)": (1, 0, True, "all"),
    "1 thread, spinning on": (1, 1, True, "all"),
    "1 thread, arena off": (1, 0, False, "all"),
    "1 thread, opt basic": (1, 0, True, "basic"),
    "1 thread, opt extended": (1, 0, True, "extended"),
    "2 threads, spinning on": (2, 1, True, "all"),
    "2 threads, spinning off": (2, 0, True, "all"),
}


def options(threads: int, spinning: int, arena: bool, level: str) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = LEVELS[level]
    opts.enable_cpu_mem_arena = arena
    opts.add_session_config_entry("session.intra_op.allow_spinning", str(spinning))
    return opts


def busy_process() -> subprocess.Popen:
    """A Python loop burning one core (the caller stops it)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(graph: Path, prefixes: list, new_tokens: int, rounds: int, busy: bool) -> dict[str, list[float]]:
    """{setting: per-round median ms per decision}."""
    from ..decoding import greedy
    from ..decoding.fused import FusedDecoderSession

    sessions = {name: FusedDecoderSession(graph, options=options(*s), name=name) for name, s in SETTINGS.items()}
    proc = busy_process() if busy else None
    try:
        time.sleep(0.2 if busy else 0.0)
        for s in sessions.values():  # warm-up
            greedy(s, prefixes[0], new_tokens)
        out = {name: [] for name in sessions}
        for _ in range(rounds):
            this = {name: [] for name in sessions}
            for prefix in prefixes:
                for name, s in sessions.items():
                    s.reset()
                    t0 = time.perf_counter_ns()
                    greedy(s, prefix, new_tokens)
                    this[name].append((time.perf_counter_ns() - t0) / 1e6)
            for name in sessions:
                out[name].append(float(np.median(this[name])))
        return out
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def print_report(rep: dict) -> None:
    print(f"\ngraph {rep['graph']}: {rep['rounds']} rounds x {rep['decisions']} decisions, load at start {rep['load']}")
    base = "1 thread (default)"
    rows = []
    for name in SETTINGS:
        q, b = rep["quiet"][name], rep["busy"][name]
        rows.append([name, f"{np.median(q):.2f}", f"{np.median(np.array(rep['quiet'][base]) / np.array(q)):.2f}x",
                     f"{np.median(b):.2f}", f"{np.median(np.array(rep['busy'][base]) / np.array(b)):.2f}x"])
    print(table(["setting", "quiet ms/decision", "vs default", "1 core busy ms/decision", "vs default"], rows))


def main(argv: list[str] | None = None) -> int:
    import os

    from ..bundle import Bundle
    from .decode_bench import decision_prefixes
    from .engine_v2 import WORK, build_graphs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", type=Path, default=None, help="a fused graph (default: the grasp fused int4)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--decisions", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    bundle = Bundle.load(default_bundle())
    graph = args.graph or WORK / bundle.manifest.name / "fused_int4.onnx"
    if not graph.is_file():
        build_graphs(bundle)
    prefixes = decision_prefixes(bundle, args.decisions)
    new_tokens = len(bundle.manifest.actions)
    rep = {"graph": str(graph), "rounds": args.rounds, "decisions": len(prefixes), "load": os.getloadavg()[0],
           "quiet": measure(graph, prefixes, new_tokens, args.rounds, busy=False),
           "busy": measure(graph, prefixes, new_tokens, args.rounds, busy=True)}
    print_report(rep)
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
