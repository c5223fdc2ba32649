"""ONNX Runtime session settings for a 2-core machine, measured in isolation on one decoder.

Each setting runs in a process of its own (an ORT thread pool that spins would otherwise burn a
core under the other settings' decisions): one FusedDecoderSession on the same graph, decisions of
prefill + greedy steps from a cold cache. Rounds alternate the settings (A B C A B C ...), so a noisy
neighbour slows all of them alike. The whole set runs twice: on a quiet machine, then next to one busy process (a
Python loop burning a core, started and stopped here), as a node shares the machine with the
simulator, the DDS threads and other work.

    python -m sol_control.bench.session_settings [--graph PATH] [--rounds 9] [--json out.json]
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


def worker(graph: Path, setting: str, decisions: int) -> dict:
    """In a process of its own (a spinning pool would otherwise burn CPU under the other settings'
    decisions): median wall and process-CPU ms per decision over `decisions` decisions."""
    from ..bundle import Bundle
    from ..decoding import greedy
    from ..decoding.fused import FusedDecoderSession
    from .decode_bench import decision_prefixes

    bundle = Bundle.load(default_bundle())
    prefixes, new_tokens = decision_prefixes(bundle, decisions), len(bundle.manifest.actions)
    sess = FusedDecoderSession(graph, options=options(*SETTINGS[setting]), name=setting)
    for prefix in prefixes[:3]:  # warm-up
        greedy(sess, prefix, new_tokens)
    wall, cpu = [], []
    for prefix in prefixes:
        sess.reset()
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        greedy(sess, prefix, new_tokens)
        wall.append((time.perf_counter_ns() - t0) / 1e6)
        cpu.append((time.process_time_ns() - c0) / 1e6)
    return {"wall_ms": float(np.median(wall)), "cpu_ms": float(np.median(cpu))}


def measure(graph: Path, decisions: int, rounds: int, busy: bool) -> tuple[dict, dict]:
    """({setting: per-round median wall ms per decision}, the same in process CPU ms: all threads,
    so a spinning worker's burnt core shows). Rounds alternate the settings A B C A B C ..."""
    proc = busy_process() if busy else None
    try:
        wall, cpu = {name: [] for name in SETTINGS}, {name: [] for name in SETTINGS}
        for _ in range(rounds):
            for name in SETTINGS:
                out = subprocess.run([sys.executable, "-m", "sol_control.bench.session_settings", "--worker", name, "--graph", str(graph),
                                      "--decisions", str(decisions)], check=True, capture_output=True, text=True)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                wall[name].append(res["wall_ms"])
                cpu[name].append(res["cpu_ms"])
        return wall, cpu
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def print_report(rep: dict) -> None:
    print(f"\ngraph {rep['graph']}: {rep['rounds']} rounds x {rep['decisions']} decisions, load at start {rep['load']}")
    base = "1 thread (default)"
    ratio = lambda d, name: f"{np.median(np.array(d[base]) / np.array(d[name])):.2f}x"
    rows = []
    for name in SETTINGS:
        q, b = rep["quiet"][name], rep["busy"][name]
        rows.append([name, f"{np.median(q):.2f}", ratio(rep["quiet"], name), f"{np.median(rep['quiet_cpu'][name]):.2f}",
                     f"{np.median(b):.2f}", ratio(rep["busy"], name), f"{np.median(rep['busy_cpu'][name]):.2f}"])
    print(table(["setting", "quiet wall ms", "vs default", "CPU ms", "1 core busy wall ms", "vs default", "CPU ms"],
                rows))


def main(argv: list[str] | None = None) -> int:
    import os

    from ..bundle import Bundle
    from .engine_v2 import WORK, build_graphs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", type=Path, default=None, help="a fused graph (default: the grasp fused int4)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--decisions", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", choices=list(SETTINGS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.graph, args.worker, args.decisions)))
        return 0
    bundle = Bundle.load(default_bundle())
    graph = args.graph or WORK / bundle.manifest.name / "fused_int4.onnx"
    if not graph.is_file():
        build_graphs(bundle)
    rep = {"graph": str(graph), "rounds": args.rounds, "decisions": args.decisions, "load": os.getloadavg()[0],
           **dict(zip(("quiet", "quiet_cpu"), measure(graph, args.decisions, args.rounds, busy=False))),
           **dict(zip(("busy", "busy_cpu"), measure(graph, args.decisions, args.rounds, busy=True)))}
    print_report(rep)
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
