"""`sol-control bench node`: the real node between a publisher process and a subscriber process.

Per mode (qc, then grasp): start `python -m sol_control.ros.node` (mode=<task>, the shipped
bundles, default deadlines unless --param), a subscriber on the decision topic and a publisher of
camera images (30 Hz, test-split scenes stamped at send) plus joint states (500 Hz). Latency is the
image header stamp to the decision's receipt in the subscriber (same machine, same clock): it holds
both DDS hops, perception, decoding and the guard. `hit_rate` = frames published whose decision
arrived within the mode's deadline / frames published (a frame without a decision is a miss);
`node_deadline_met_rate` = the node's own `deadline_met` over decisions. CPU = the node process's
user+system time over wall time while publishing (100 % = one core).

Energy (sol_control.energy): `cpu_ms_per_decision` / `joules_per_decision` = the deciding thread's
CPU time (each record's `cpu_ms`), by source under `energy_by_source`; `process_cpu_ms_per_decision`
/ `process_joules_per_decision` = the node process's CPU over the run / decisions (executor, DDS,
audit included); `joules_per_decision_basis` says measured (RAPL) or estimated, `energy_assumption` how.

--swap-at SECONDS: that far into publishing, a client process (`python -m sol_control.ros.bundle_swap`,
connected beforehand) sets `<task>.bundle` to a copy of the task's bundle whose manifest differs
only in its description (a new manifest sha256, the same models); `swap` in the results holds the
answer, the window from request to answer (verify, sessions, warm-up, install) and the hit rate of
the frames stamped inside that window (`hit_rate_in_window`) and outside it (`hit_rate_outside`).

JSON (--json PATH): {"modes": {"qc": {"p50_ms", "p99_ms", "p999_ms", "hit_rate", "sources": {...},
"cpu_ms_per_decision", "joules_per_decision", ..., "swap": {...}}, "grasp": {...}}, "config": {...}}
and the same per-mode dicts at the top level under "qc"/"grasp".
No rclpy here: the peer processes live in sol_control/ros/bench_peers.py and sol_control/ros/bundle_swap.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from sol_control.bench.common import REPO, finite_pct, pct, rotated, table, write_json
from sol_control.budget import NS_PER_MS
from sol_control.config import NodeConfig, apply_overrides
from sol_control.energy import EnergyMeter, labels, per_source
from sol_control.params import ros_assignments
from sol_control.sim.lines import process_cpu_s
from sol_control.sim.supervisor import stop_processes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write results here")
    p.add_argument("--seconds", type=float, default=20.0, help="publishing time per mode")
    p.add_argument("--modes", default="qc,grasp", help="comma-separated: qc, grasp")
    p.add_argument("--image-hz", type=float, default=30.0)
    p.add_argument("--joint-hz", type=float, default=500.0)
    p.add_argument("--domain-id", type=int, default=int(os.environ.get("SOL_CONTROL_BENCH_DOMAIN", "27")))
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="node parameter override, e.g. deadline.qc_ms=8 (repeatable)")
    p.add_argument("--swap-at", type=float, default=None, metavar="SECONDS",
                   help="swap the task's bundle (to a copy of it) this far into publishing; the hit rate "
                        "during the swap is reported separately")


def ros_env(domain_id: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"ROS_DOMAIN_ID": str(domain_id), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp", "OMP_NUM_THREADS": "1",
                "FASTDDS_DEFAULT_PROFILES_FILE": env.get("FASTDDS_DEFAULT_PROFILES_FILE")
                or str(REPO / "config" / "fastdds_localhost.xml"),
                "MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "134217728",
                "PYTHONUNBUFFERED": "1"})
    return env


def node_command(cfg: NodeConfig, *overrides: str) -> list[str]:
    """`python -m sol_control.ros.node` with every parameter of `cfg` (after `overrides`) given."""
    assignments = ros_assignments(apply_overrides(cfg, list(overrides)))
    return [sys.executable, "-m", "sol_control.ros.node", "--ros-args",
            *[a for p in assignments for a in ("-p", p)]]


def run_mode(task: str, cfg: NodeConfig, args: argparse.Namespace, work: Path) -> dict:
    env = ros_env(args.domain_id)
    swap_at = args.swap_at
    py = sys.executable
    log = open(work / f"{task}_node.log", "w")
    node = subprocess.Popen(node_command(cfg, f"mode={task}", "autostart=true"), env=env, cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    sub_out, pub_out = work / f"{task}_sub.json", work / f"{task}_pub.json"
    sub = subprocess.Popen([py, "-m", "sol_control.ros.bench_peers", "subscribe",
                            json.dumps({"task": task, "out": str(sub_out)})], env=env, cwd=REPO)
    swapper = _start_swapper(task, cfg, work, env) if swap_at else None
    try:
        spec = {"task": task, "out": str(pub_out), "seconds": args.seconds,
                "image_hz": args.image_hz, "joint_hz": args.joint_hz}
        cmd = [py, "-m", "sol_control.ros.bench_peers", "publish", json.dumps(spec)]
        pub = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
        line = pub.stdout.readline()  # "publishing" once the node is active: start the CPU clock
        if node.poll() is not None or not line.startswith("publishing"):
            pub.kill()
            raise RuntimeError(f"the node did not become active; its log:\n{_tail(work / f'{task}_node.log')}")
        meter = EnergyMeter(cfg.energy.watts_per_busy_core)  # RAPL over the run where readable
        cpu0, wall0 = process_cpu_s(node.pid), time.monotonic()
        if swapper is not None:
            _swap_at(swapper, wall0 + swap_at)
        pub.wait()
        cpu1, wall1 = process_cpu_s(node.pid), time.monotonic()
        meter.update()
        if pub.returncode != 0:
            raise RuntimeError(f"publisher failed (exit {pub.returncode}); node log:\n{_tail(work / f'{task}_node.log')}")
        time.sleep(1.0)  # let the last decisions arrive
        swap = _swap_result(swapper) if swapper is not None else None
    finally:
        stop_processes([p for p in (swapper, sub, node) if p is not None])  # SIGINT, SIGKILL after 10 s
        log.close()
    if not sub_out.exists():
        raise RuntimeError(f"the subscriber wrote no results (exit {sub.returncode}); its output, if any, is above")
    published = json.loads(pub_out.read_text())
    rows = json.loads(sub_out.read_text())["rows"]
    out = summarize(task, cfg.deadline.for_task(task), published, rows,
                    cpu_percent=100.0 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9))
    out.update(energy_summary(rows, set(published["stamps"]), cpu1 - cpu0, meter))
    if swap is not None:
        out["swap"] = {**swap, "at_s": swap_at, **swap_window(cfg.deadline.for_task(task), published, rows, swap)}
    return out


# -- --swap-at -------------------------------------------------------------------------------------
def swap_copy(src: Path, dst: Path) -> Path:
    """A copy of the bundle in `src` whose manifest differs only in its description: the same models
    under a new manifest sha256, so decisions show which bundle made them."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["description"] = manifest.get("description", "") + " (a copy, swapped in at run time)"
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dst


def _start_swapper(task: str, cfg: NodeConfig, work: Path, env: dict) -> subprocess.Popen:
    """The swap client, started early so that its start-up and discovery are over by the swap."""
    bundle = swap_copy(cfg.bundle_dir(task), work / f"{task}_swap_bundle")
    return subprocess.Popen([sys.executable, "-m", "sol_control.ros.bundle_swap", "--param", f"{task}.bundle",
                             "--value", str(bundle), "--wait-stdin"], env=env, cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _swap_at(swapper: subprocess.Popen, at_mono_s: float) -> None:
    line = swapper.stdout.readline()  # "ready": connected to the node's set_parameters service
    if not line.startswith("ready"):
        raise RuntimeError(f"the swap client is not ready: {line!r}")
    time.sleep(max(0.0, at_mono_s - time.monotonic()))
    swapper.stdin.write("go\n")
    swapper.stdin.flush()


def _swap_result(swapper: subprocess.Popen) -> dict:
    line = swapper.stdout.readline()  # its one JSON line, once the node answered
    if not line.strip():
        raise RuntimeError(f"the swap client gave no answer (exit {swapper.poll()})")
    return json.loads(line)


def swap_window(deadline_ms: float, published: dict, rows: list, swap: dict) -> dict:
    """Hit rate of the frames stamped between the swap's request and its answer (stamps and those
    times are both the system clock), and of all the others."""
    got = {r[0]: r for r in rows}

    def hit_rate(stamps: list[int]) -> float:
        in_time = sum(1 for s in stamps if s in got and (got[s][1] - s) / NS_PER_MS <= deadline_ms)
        return in_time / len(stamps) if stamps else float("nan")
    inside = [s for s in published["stamps"] if swap["sent_ns"] <= s <= swap["done_ns"]]
    outside = [s for s in published["stamps"] if not swap["sent_ns"] <= s <= swap["done_ns"]]
    return {"window_ms": (swap["done_ns"] - swap["sent_ns"]) / NS_PER_MS, "frames_in_window": len(inside),
            "decided_in_window": sum(1 for s in inside if s in got), "hit_rate_in_window": hit_rate(inside),
            "hit_rate_outside": hit_rate(outside)}


def energy_summary(rows: list, sent: set[int], node_cpu_s: float, meter: EnergyMeter) -> dict:
    """CPU ms and joules per decision: of the deciding thread (`cpu_ms` of each record, by source and
    overall) and of the whole node process (its CPU over the run / decisions: executor, DDS, audit)."""
    got = {r[0]: r for r in rows if r[0] in sent}
    cpu = [(r[2], r[10] if len(r) > 10 else float("nan")) for r in got.values()]
    by_source = per_source(cpu, meter)
    finite = [c for _, c in cpu if c == c]
    cpu_ms = sum(finite) / len(finite) if finite else float("nan")
    process_ms = 1000.0 * node_cpu_s / len(got) if got else float("nan")
    return {"cpu_ms_per_decision": cpu_ms, "joules_per_decision": meter.joules(cpu_ms),
            "process_cpu_ms_per_decision": process_ms, "process_joules_per_decision": meter.joules(process_ms),
            "energy_by_source": by_source, **labels(meter)}


def _tail(path: Path, n_chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-n_chars:] if path.exists() else ""


# the subscriber's decision rows (ros/bench_peers.py): where each stage's ms and the thread's CPU ms sit
STAGE_COLUMNS = (("queue", 6), ("perception", 7), ("fast", 8), ("full_precision", 9))
QUEUE_COLUMN, CPU_COLUMN = 6, 10


def summarize(task: str, deadline_ms: float, published: dict, rows: list, cpu_percent: float) -> dict:
    sent = set(published["stamps"])
    got = {r[0]: r for r in rows if r[0] in sent}  # one decision per frame (first wins)
    latency_ms = [(r[1] - r[0]) / NS_PER_MS for r in got.values()]
    in_time = sum(1 for ms in latency_ms if ms <= deadline_ms)
    sources = Counter(r[2] for r in got.values())
    reasons = Counter(r[5] for r in got.values() if r[5])
    return {
        "task": task, "deadline_ms": deadline_ms, "frames_published": len(sent), "decisions_received": len(got),
        "p50_ms": pct(latency_ms, 50), "p99_ms": pct(latency_ms, 99), "p999_ms": pct(latency_ms, 99.9),
        "max_ms": max(latency_ms) if latency_ms else float("nan"),
        "node_latency_p50_ms": pct([r[4] for r in got.values()], 50),
        "node_latency_p99_ms": pct([r[4] for r in got.values()], 99),
        # where the time goes, p50 / p99 over decisions (ms)
        "breakdown_ms": {name: {"p50": finite_pct([r[i] for r in got.values()], 50),
                                "p99": finite_pct([r[i] for r in got.values()], 99)} for name, i in STAGE_COLUMNS},
        "tail_ms": _tail_breakdown(list(got.values()), latency_ms),
        "hit_rate": in_time / len(sent) if sent else float("nan"),
        "node_deadline_met_rate": (sum(r[3] for r in got.values()) / len(got)) if got else float("nan"),
        "sources": dict(sources), "reasons": dict(reasons.most_common(8)),
        "cpu_percent": cpu_percent, "image_hz": len(sent) / max(published["seconds"], 1e-9),
    }


def _tail_breakdown(rows: list, latency_ms: list[float]) -> dict:
    """Where the slowest 1 % of decisions (end-to-end latency >= its p99) spend their time: the
    median of each stage over them, the node's CPU time, and the rest of the end-to-end time
    (DDS out, descheduled, the GIL), ms."""
    if not rows:
        return {}
    p99 = pct(latency_ms, 99)
    slow = [(r, ms) for r, ms in zip(rows, latency_ms) if ms >= p99]
    med = lambda vals: finite_pct(vals, 50)  # noqa: E731
    out = {name: med([r[i] for r, _ in slow]) for name, i in STAGE_COLUMNS + (("cpu", CPU_COLUMN),)}
    out.update(decisions=len(slow), e2e=med([ms for _, ms in slow]),
               off_cpu=med([ms - r[QUEUE_COLUMN] - r[CPU_COLUMN] for r, ms in slow]))  # after the queue, off the CPU
    return out


def run(args: argparse.Namespace) -> int:
    cfg = apply_overrides(NodeConfig(), args.param)
    if args.swap_at is not None and not 0 < args.swap_at < args.seconds:
        raise ValueError(f"--swap-at must lie inside the run (0, {args.seconds}) s, got {args.swap_at}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(modes) - {"qc", "grasp"}:
        raise ValueError(f"--modes: expected qc and/or grasp, got {args.modes!r}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="sol_control_bench_node_") as tmp:
        for m in modes:
            print(f"bench node: {m} for {args.seconds:.0f} s at {args.image_hz:.0f} Hz ...", file=sys.stderr)
            results[m] = run_mode(m, cfg, args, Path(tmp))
    rows = [[m, f"{r['deadline_ms']:.1f}", r["frames_published"], r["decisions_received"], f"{r['p50_ms']:.2f}",
             f"{r['p99_ms']:.2f}", f"{r['p999_ms']:.2f}", f"{100 * r['hit_rate']:.2f}%",
             " ".join(f"{k}={v}" for k, v in sorted(r["sources"].items())), f"{r['cpu_percent']:.0f}%",
             f"{r['cpu_ms_per_decision']:.2f} / {r['process_cpu_ms_per_decision']:.2f}",
             f"{1000 * r['joules_per_decision']:.1f} / {1000 * r['process_joules_per_decision']:.1f}"]
            for m, r in results.items()]
    print(table(["mode", "deadline ms", "frames", "decided", "p50 ms", "p99 ms", "p99.9 ms", "hit rate", "sources",
                 "cpu", "cpu ms/decision (thread / node)", "mJ/decision"], rows))
    for m, r in results.items():
        t = r["tail_ms"]
        if t:
            print(f"{m}, the slowest 1 % ({t['decisions']} decisions, e2e {t['e2e']:.2f} ms), medians: queue "
                  f"{t['queue']:.2f}, perception {t['perception']:.2f}, fast {t['fast']:.2f} ms; the deciding "
                  f"thread's CPU {t['cpu']:.2f} ms, off the CPU after the queue {t['off_cpu']:.2f} ms")
    for m, r in results.items():
        if s := r.get("swap"):
            answer = "swapped" if s["successful"] else f"refused ({s['reason']})"
            print(f"{m}, bundle swap at {s['at_s']:.1f} s: {answer} in {s['window_ms']:.0f} ms "
                  f"(request to answer); hit rate {100 * s['hit_rate_in_window']:.2f}% of "
                  f"{s['frames_in_window']} frames in that window, "
                  f"{100 * s['hit_rate_outside']:.2f}% outside it")
    if results:
        print(f"joules: {next(iter(results.values()))['energy_assumption']}")
    out = {"modes": results, **results, "config": {"seconds": args.seconds, "image_hz": args.image_hz,
                                                   "joint_hz": args.joint_hz, "params": args.param,
                                                   "swap_at": args.swap_at, "cpus": os.cpu_count()}}
    if args.json:
        write_json(args.json, out)
    return 0


def compare_standard_ultrafast(quick: bool = False) -> dict:
    """End to end, standard (fp32 target, plain greedy: `decoding.standard_only`) against ultrafast
    (int8 target + draft, speculative), both with a 1 s deadline so neither falls back and the
    figures are pure speed. Each task runs `rounds` rounds (5; 2 with quick); a round runs both
    modes back to back (a fresh node each, order alternating between rounds, so a drift of the
    machine's load hits both) and gives one p50 per mode and their ratio. Reported: the median over
    rounds with min-max, per task and, at the top level, the mean of the two tasks' medians."""
    rounds = 2 if quick else 5
    args = argparse.Namespace(seconds=2.0 if quick else 4.0, image_hz=30.0, joint_hz=500.0, swap_at=None,
                              domain_id=int(os.environ.get("SOL_CONTROL_BENCH_DOMAIN", "27")))
    generous = ["deadline.qc_ms=1000", "deadline.grasp_ms=1000", "deadline.max_staleness_ms=2000"]
    modes = {"standard": ["decoding.standard_only=true"], "ultrafast": []}
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="sol_control_bench_e2e_") as tmp:
        for task in ("qc", "grasp"):
            runs: dict[str, list[dict]] = {name: [] for name in modes}
            for r in range(rounds):
                for name in rotated(list(modes), r):
                    cfg = apply_overrides(NodeConfig(), generous + modes[name])
                    print(f"bench node: {task} {name}, round {r + 1}/{rounds}, {args.seconds:.0f} s ...",
                          file=sys.stderr)
                    runs[name].append(run_mode(task, cfg, args, Path(tmp)))
            ratios = [s["p50_ms"] / u["p50_ms"] for s, u in zip(runs["standard"], runs["ultrafast"])]
            out[task] = {name: {**_median_run(rs), "rounds": rs} for name, rs in runs.items()}
            out[task].update(ratio_p50=pct(ratios, 50), ratio_p50_min=min(ratios), ratio_p50_max=max(ratios))
    std = sum(out[t]["standard"]["p50_ms"] for t in ("qc", "grasp")) / 2
    fast = sum(out[t]["ultrafast"]["p50_ms"] for t in ("qc", "grasp")) / 2
    out.update({"standard_p50_ms": std, "ultrafast_p50_ms": fast, "ratio_p50": std / fast, "rounds": rounds})
    return out


def _median_run(runs: list[dict]) -> dict:
    """Median over rounds of each run's p50/p99 (with min-max) and the summed sources."""
    p50, p99 = [r["p50_ms"] for r in runs], [r["p99_ms"] for r in runs]
    sources: Counter[str] = Counter()
    for r in runs:
        sources.update(r["sources"])
    fast = [r["breakdown_ms"]["fast"]["p50"] for r in runs if "breakdown_ms" in r]
    return {"p50_ms": pct(p50, 50), "p50_ms_min": min(p50), "p50_ms_max": max(p50),
            "fast_path_p50_ms": finite_pct(fast, 50),
            "p99_ms": pct(p99, 50), "p99_ms_min": min(p99), "p99_ms_max": max(p99),
            "hit_rate": pct([r["hit_rate"] for r in runs], 50), "sources": dict(sources),
            "decisions": sum(r["decisions_received"] for r in runs)}
