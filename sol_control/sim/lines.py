"""`sol-control lines BAG BAG ...`: several QC lines on one ROS graph, fed from recorded bags.

    bag k (`sol-control demo --record`) ──► the player publishes its QC camera and belt under /line<k>
    one /clock (absolute) for every line ──► one coprocessor per line:
        python -m sol_control.ros.node --ros-args -r __ns:=/line<k> -r camera/image_raw:=qc/camera/image_raw
    /line<k>/qc/verdict ──► counted per line; a decision for another line's frame is cross-talk
    /diagnostics (absolute) ──► statuses named `line<k>/sol_control: ...`, hardware_id `line<k>`

The player prefixes each image's frame_id with its line (`line1/qc_camera`, as tf prefixes do on a
multi-robot graph), so every decision can be traced to the line whose frame it decided, and scores
the verdicts against the bag's ground truth (`sim/truth`). Bags play on a shared timeline from sim
time 0 at `rate` x real time. The nodes run with sim time, as in the demo, and with the demo's
tolerances for a /clock that may lag an image.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from sol_control.sim.line_bag import QC_TOPICS, LineBag

NODE_PARAMS = ["mode:=qc", "use_sim_time:=true", "autostart:=true", "deadline.sensor_timeout_ms:=600000.0",
               "deadline.max_future_ms:=1000.0", "deadline.max_staleness_ms:=10000.0"]
STARTUP_TIMEOUT_S = 180.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bags", nargs="+", help="rosbag2 folders (sol-control demo --record), one per line")
    p.add_argument("--rate", type=float, default=1.0, help="sim seconds per wall second (default 1)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="coprocessor parameter for every line, e.g. deadline.qc_ms=20 (repeatable)")
    p.add_argument("--logs", default="lines_logs", help="folder for the nodes' logs")
    p.add_argument("--json", default="", help="write the result here")


def node_cmd(line: str, params: list[str]) -> list[str]:
    """A coprocessor in namespace /<line>, as `ros2 launch ... namespace:=<line>` starts it."""
    cmd = [sys.executable, "-m", "sol_control.ros.node", "--ros-args", "-r", f"__ns:=/{line}",
           "-r", f"camera/image_raw:={QC_TOPICS[0]}"]
    for p in NODE_PARAMS + params:
        cmd += ["-p", p]
    return cmd


def process_cpu_s(pid: int) -> float:
    """User + system CPU-seconds of a running process (Linux /proc)."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def score_line(line: LineBag, received: list[dict], others: dict[str, set[int]]) -> dict:
    """Decisions received on one line's topic: for its own frames (same frame_id, a stamp it sent),
    for another line's frames (cross-talk), or neither; QC accuracy of its own against the truth."""
    own_stamps, own, cross, unmatched = line.image_stamps, [], 0, 0
    for r in received:
        if r["frame_id"] == line.frame_id and r["stamp"] in own_stamps:
            own.append(r)
        elif r["frame_id"] != line.frame_id and any(r["stamp"] in s for s in others.values()):
            cross += 1
        else:
            unmatched += 1
    judged = [r for r in own if r["verdict"] != "uncertain" and r["stamp"] in line.defective]
    correct = sum((r["verdict"] == "reject") == line.defective[r["stamp"]] for r in judged)
    lat = sorted(r["latency_ms"] for r in own)
    sources: dict[str, int] = {}
    for r in own:
        sources[r["source"]] = sources.get(r["source"], 0) + 1
    return {"frames": len(own_stamps), "decisions": len(received), "own_frames_decided": len({r["stamp"] for r in own}),
            "cross_talk": cross, "unmatched": unmatched, "sources": sources,
            "qc_accuracy": correct / len(judged) if judged else math.nan,
            "latency_p50_ms": lat[len(lat) // 2] if lat else math.nan}


def run_lines(bags: list[str | Path], params: list[str], domain_id: int, rate: float, log_dir: Path,
              env: dict | None = None) -> dict:
    """Start one coprocessor per bag in /line1, /line2, ..., play the bags on one /clock, wait until
    every frame is decided and each node's /diagnostics counts its decisions, stop the nodes."""
    from sol_control.sim.demo import ros_env
    from sol_control.sim.supervisor import stop_processes
    from sol_control.sim.line_player import LinePlayer, load_line

    lines = [load_line(b, f"line{k}") for k, b in enumerate(bags, start=1)]
    env = dict(env or ros_env(), ROS_DOMAIN_ID=str(domain_id))
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = {line.name: subprocess.Popen(node_cmd(line.name, params), env=env, start_new_session=True,
                                         stdout=open(log_dir / f"{line.name}.log", "w"), stderr=subprocess.STDOUT)
             for line in lines}
    alive = lambda: all(p.poll() is None for p in procs.values())  # noqa: E731
    player = LinePlayer(lines, domain_id)
    try:
        states = player.wait_active(STARTUP_TIMEOUT_S, alive)
        if any(v != "active" for v in states.values()):
            raise ValueError(f"line nodes not active: {states} (logs in {log_dir})")
        cpu0, wall0 = {n: process_cpu_s(p.pid) for n, p in procs.items()}, time.monotonic()
        player.play(rate, should_stop=lambda: not alive())
        player.keep_ticking(lambda: _all_decided(lines, player) and _diagnostics_caught_up(lines, player), 30.0)
        cpu = {n: 100.0 * (process_cpu_s(p.pid) - cpu0[n]) / (time.monotonic() - wall0) for n, p in procs.items()}
    finally:
        player.close()
        stop_processes(list(procs.values()))
    stamps = {line.name: line.image_stamps for line in lines}
    return {"rate": rate, "sim_time_s": player.sim_ns / 1e9, "node_cpu_percent": cpu,
            "lines": {line.name: score_line(line, player.received[line.name],
                                            {n: s for n, s in stamps.items() if n != line.name}) for line in lines},
            "diagnostics": {name: {"stamp_s": st / 1e9, "hardware_id": hw, **kv}
                            for name, (st, hw, kv) in sorted(player.diagnostics.items())}}


def _all_decided(lines: list[LineBag], player) -> bool:
    return all({r["stamp"] for r in player.received[line.name]} >= line.image_stamps for line in lines)


def _diagnostics_caught_up(lines: list[LineBag], player) -> bool:
    """Each line's QC status counts as many decisions as the player received from that line."""
    for line in lines:
        st = player.diagnostics.get(f"{line.name}/sol_control: qc")
        if st is None or st[2].get("decisions") != str(len(player.received[line.name])):
            return False
    return True


def table(result: dict) -> str:
    rows = [("line", "frames", "decisions", "cross-talk", "unmatched", "QC accuracy", "p50 ms", "sources",
             "node CPU")]
    for name, s in result["lines"].items():
        rows.append((name, str(s["frames"]), str(s["decisions"]), str(s["cross_talk"]), str(s["unmatched"]),
                     f"{100 * s['qc_accuracy']:.1f}%", f"{s['latency_p50_ms']:.2f}",
                     " ".join(f"{k}={v}" for k, v in sorted(s["sources"].items())),
                     f"{result['node_cpu_percent'][name]:.0f}%"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def run(args: argparse.Namespace) -> int:
    import os

    from sol_control.sim.demo import ros_params

    if not args.rate > 0:
        raise ValueError(f"--rate must be positive, got {args.rate}")
    for b in args.bags:
        if not Path(b).is_dir():
            raise ValueError(f"bag {b!r} is not a rosbag2 folder")
    result = run_lines(args.bags, ros_params(args.param), int(os.environ.get("ROS_DOMAIN_ID", "77")), args.rate,
                       Path(args.logs))
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    return 0
