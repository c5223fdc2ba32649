"""`sol-control replay BAG`: feed recorded telemetry through the coprocessor offline (no ROS).

Reads a rosbag2 (MCAP or sqlite3, e.g. one `sol-control demo --record BAG` wrote), rebuilds each
camera frame's telemetry (image + newest joints and conveyor state before it), runs the same
`Coprocessor.step` the node runs, and reports decisions, latency by source and accuracy against
the recorded ground truth (`sim/truth`) and agreement with the decisions recorded live.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

CAMERAS = {"qc/camera/image_raw": "qc", "pick/camera/image_raw": "grasp"}
GRASP_TOLERANCE = {"x": 0.01, "y": 0.01, "yaw": math.radians(15.0)}   # a grasp the cell still lifts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bag", help="rosbag2 folder (MCAP or sqlite3)")
    p.add_argument("--only", choices=("qc", "grasp"), help="replay one camera only")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="coprocessor parameter, e.g. deadline.qc_ms=8 (repeatable)")
    p.add_argument("--json", default="", help="write the report here")


def read_bag(path: str | Path, tasks: tuple[str, ...]):
    """Yield (kind, topic, stamp_ns, msg) in time order; kind: image | joints | conveyor | truth | live."""
    from rosbags.rosbag2 import Reader
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.LATEST)
    kinds = {"joint_states": "joints", "conveyor/joint_states": "conveyor", "sim/truth": "truth",
             "qc/verdict": "live", "grasp/decision": "live"}
    kinds.update({t: "image" for t, task in CAMERAS.items() if task in tasks})
    with Reader(path) as reader:
        conns = [c for c in reader.connections if c.topic in kinds]
        for conn, stamp_ns, raw in reader.messages(connections=conns):
            yield kinds[conn.topic], conn.topic, stamp_ns, deserialize_cdr(store, raw, conn.msgtype)


def deserialize_cdr(store, raw: bytes, msgtype: str):
    """rosbags wants the exact CDR length; rclpy's payloads carry up to 3 bytes of alignment
    padding (not always zeroed). Drop them."""
    from rosbags.serde import SerdeError

    for cut in range(4):
        try:
            return store.deserialize_cdr(raw[:len(raw) - cut] if cut else raw, msgtype)
        except SerdeError:
            continue
    return store.deserialize_cdr(raw, msgtype)   # raise the original error


def _stamp(header) -> int:
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def image_rgb(msg) -> np.ndarray:
    if msg.encoding != "rgb8":
        raise ValueError(f"replay expects rgb8 images, got {msg.encoding!r}")
    return np.asarray(msg.data, np.uint8).reshape(msg.height, msg.step)[:, : msg.width * 3].reshape(
        msg.height, msg.width, 3)


def replay(path: str | Path, cfg, tasks: tuple[str, ...]) -> dict:
    """Decide every recorded camera frame through the node's worker loop (`runner.TaskRunner`,
    synchronously: one frame after another, none skipped) with the joints and conveyor state that
    came before it in the recording."""
    from sol_control.coprocessor import Coprocessor
    from sol_control.runner import CountingHooks, TaskRunner
    from sol_control.telemetry import Conveyor, Joints, Telemetry

    truth: dict[tuple[str, int], dict] = {}
    live: dict[tuple[str, int], dict] = {}
    frames, joints, conveyor = [], None, None
    for kind, topic, _, msg in read_bag(path, tasks):
        if kind == "joints":
            joints = Joints(tuple(msg.name), np.asarray(msg.position, float), np.asarray(msg.velocity, float),
                            _stamp(msg.header))
        elif kind == "conveyor":
            conveyor = Conveyor(float(msg.position[0]), float(msg.velocity[0]), _stamp(msg.header))
        elif kind in ("truth", "live"):
            kv = {v.key: v.value for v in msg.values}
            (truth if kind == "truth" else live)[(msg.name.rsplit("/", 1)[-1], int(kv["stamp"]))] = kv
        elif kind == "image":
            frames.append((CAMERAS[topic], msg, joints, conveyor))
    cop = Coprocessor(cfg)
    cop.warmup()
    decisions, hooks = [], CountingHooks()
    runners = {t: TaskRunner(t, cop, lambda d: decisions.append((d.task, d.stamp_ns, d)), hooks) for t in cop.tasks}
    for task, msg, j, c in frames:          # decide after reading, so timing is the model's alone
        runners[task].decide(Telemetry(_frame(msg), joints=j, conveyor=c))
    cop.close()
    return score(decisions, truth, live, sum(hooks.rejected.values()))


def _frame(msg):
    from sol_control.telemetry import Frame

    return Frame(image_rgb(msg), _stamp(msg.header), time.monotonic_ns(), msg.header.frame_id)


def score(decisions, truth: dict, live: dict, rejected: int) -> dict:
    lat: dict[str, dict[str, list]] = {}
    qc = {"correct": 0, "wrong": 0, "manual": 0}
    grasp = {"within_tolerance": 0, "outside": 0, "hold": 0}
    agree = total_live = 0
    for task, stamp, d in decisions:
        lat.setdefault(task, {}).setdefault(d.source, []).append(d.latency_ms)
        t = truth.get((task, stamp))
        a = d.action
        if task == "qc":
            if a.verdict == "uncertain":
                qc["manual"] += 1
            elif t is not None:
                qc["correct" if (a.verdict == "reject") == (t["defective"] == "true") else "wrong"] += 1
        else:
            if a.hold:
                grasp["hold"] += 1
            elif t is not None:
                dyaw = (a.yaw_rad - float(t["yaw"]) + math.pi / 2) % math.pi - math.pi / 2
                ok = (abs(a.x_m - float(t["x"])) <= GRASP_TOLERANCE["x"]
                      and abs(a.y_m - float(t["y"])) <= GRASP_TOLERANCE["y"]
                      and abs(dyaw) <= GRASP_TOLERANCE["yaw"])
                grasp["within_tolerance" if ok else "outside"] += 1
        rec = live.get((task, stamp))
        if rec is not None:
            total_live += 1
            if task == "qc":
                same = rec.get("verdict") == a.verdict
            else:
                same = rec.get("hold") == ("true" if a.hold else "false")
            agree += bool(same)
    decided = qc["correct"] + qc["wrong"]
    attempted = grasp["within_tolerance"] + grasp["outside"]
    return {"decisions": len(decisions), "rejected_inputs": rejected,
            "qc": qc, "qc_accuracy": qc["correct"] / decided if decided else math.nan,
            "grasp": grasp, "grasp_within_tolerance": grasp["within_tolerance"] / attempted if attempted else math.nan,
            "live_agreement": agree / total_live if total_live else math.nan,
            "latency_by_source": {task: {src: {"n": len(v), "p50_ms": float(np.percentile(v, 50)),
                                               "p99_ms": float(np.percentile(v, 99))} for src, v in by.items()}
                                  for task, by in lat.items()}}


def run(args: argparse.Namespace) -> int:
    from sol_control.config import NodeConfig, apply_overrides

    if not Path(args.bag).is_dir():
        raise ValueError(f"bag {args.bag!r} is not a rosbag2 folder")
    tasks = (args.only,) if args.only else ("qc", "grasp")
    mode = args.only or "both"
    cfg = apply_overrides(NodeConfig(), [f"mode={mode}", *args.param])
    report = replay(args.bag, cfg, tasks)
    text = json.dumps(report, indent=1, default=float)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0
