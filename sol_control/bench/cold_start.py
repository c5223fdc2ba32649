"""`sol-control bench cold-start`: process start to first decision, as a respawn sees it.

Per start (`sol_control.ros.bench_peers.starts`, the ROS side): spawn `python -m sol_control.ros.node`
(mode = --task, the shipped bundles, default parameters unless --param) while a camera publishes,
time the spawn to the first decision received, SIGKILL the node and start the next. The node reports
where its time went on /diagnostics (`startup.*`, process age per stage, docs/ROS_INTERFACE.md):
imports (interpreter start and module imports), init (rclpy, the node, its parameters), configure
(of which bundle_check = sha256 of every bundle file, sessions = tokenizers, ONNX Runtime sessions,
KV caches), warmup, active (publishers, runner threads), first_decision (active to the first
decision on a frame: discovery of the camera's publisher, the frame's wait and its decision).
Medians over the starts; --json writes every start.
"""
from __future__ import annotations

import argparse
import os

from ..config import NodeConfig, apply_overrides
from .common import pct, write_json
from .node_bench import node_command, ros_env

PHASES = ("imports", "init", "configure", "bundle_check", "sessions", "warmup", "active", "first_decision")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--task", choices=["qc", "grasp"], default="qc")
    p.add_argument("--json", help="write every start here")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="node parameter override, e.g. decoding.warmup_runs=2 (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ..ros.bench_peers import starts

    cmd = node_command(apply_overrides(NodeConfig(), args.param), f"mode={args.task}")
    runs = starts(args.task, cmd, ros_env(int(os.environ.get("ROS_DOMAIN_ID", "77"))), args.starts)
    med = {"spawn_to_decision_s": pct([s["spawn_to_decision_s"] for s in runs], 50)}
    med.update({k: pct([s["startup_s"].get(k, float("nan")) for s in runs], 50) for k in PHASES})
    print(f"cold start to first decision, {args.task}, {len(runs)} starts (median s; load {os.getloadavg()[0]:.1f}):")
    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    for i, s in enumerate(runs):
        phases = ", ".join(f"{k} {s['startup_s'].get(k, float('nan')):.3f}" for k in PHASES)
        print(f"  start {i}: {s['spawn_to_decision_s']:.3f} s ({phases})")
    if args.json:
        write_json(args.json, {"task": args.task, "median_s": med, "starts": runs, "params": args.param,
                               "load_1min": os.getloadavg()[0]})
    return 0
