"""`sol-control demo` (= `make demo`): the simulated cell and the coprocessor, end to end.

Starts two coprocessor nodes (QC on the belt camera, grasp on the pick camera; the same
`sol_control.ros.node` a user runs, with use_sim_time), waits until both are active, runs the cell
in-process as the `cell_sim` node for `--duration` sim seconds with a live progress line, then
prints the summary table and writes demo_report/ (report.json, events.jsonl, PNG plots, node logs).
`--oracle` replaces the nodes by the ground-truth controller (a cell check without models).
A node that exits is restarted after RESPAWN_DELAY_S (as launch/ does with respawn), and
`--chaos` SIGKILLs one on purpose (sim/chaos.py): one run per node, reports in demo_report/chaos_*.
`--qc-families` puts other part families on the belt; `--swap-qc DIR@SECONDS` swaps the running QC
node to the bundle in DIR at that sim time (sim/swap.py; the report's `swap` section splits the QC
figures by the bundle that made each verdict).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sol_control.sim.supervisor import NodeSupervisor
from sol_control.tasks.common import NOVEL_FAMILIES, QC_PART_FAMILIES

REPO = Path(__file__).resolve().parents[2]
CAMERA_OF_TASK = {"qc": "qc", "grasp": "pick"}
# `--policy`: full precision where it matters, as a line might set it (docs/SIMULATION.md has its figures)
DEMO_POLICY = ["policy.full_precision_qc_classes=crack,missing_hole", "policy.full_precision_qc_min_severity=0.8",
               "policy.full_precision_grasp_min_force_n=22.0", "policy.full_precision_workspace_margin_m=0.05"]
STARTUP_TIMEOUT_S = 180.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=60.0, help="sim seconds of production (default 60)")
    p.add_argument("--seed", type=int, default=0, help="cell seed (parts, scenes)")
    p.add_argument("--standard-only", action="store_true",
                   help="full precision only, no speculation (the baseline to compare against)")
    p.add_argument("--rate", type=float, default=1.0,
                   help="sim seconds per wall second in real time (e.g. 3 for a long run; decisions still "
                        "run on the wall clock)")
    p.add_argument("--lockstep", action="store_true", help="wait for every decision (reproducible, not real time)")
    p.add_argument("--oracle", action="store_true", help="ground-truth controller instead of the coprocessor")
    p.add_argument("--out", default="demo_report", help="report folder (default demo_report/)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="extra coprocessor parameter, e.g. deadline.qc_ms=8 (repeatable)")
    p.add_argument("--policy", action="store_true",
                   help="turn on the example per-class policy (DEMO_POLICY: full precision for crack and "
                        "missing_hole verdicts, rejects of severity >= 0.8, grasps of >= 22 N or within "
                        "5 cm of the workspace's x/y limits); --param policy.* sets your own")
    p.add_argument("--record", default="", metavar="BAG",
                   help="record telemetry, ground truth and decisions as rosbag2 MCAP (new folder)")
    p.add_argument("--only", choices=("qc", "grasp"), help="run one station only")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--chaos", nargs="?", const="both", choices=("qc", "grasp", "both"),
                   help="SIGKILL the QC node at a seeded moment, then in a second run the grasp node; respawn "
                        "brings it back (reports in OUT/chaos_<task>/, the four figures in OUT/report.json)")
    p.add_argument("--no-respawn", action="store_true",
                   help="a node that exits ends the run (default: restart it, as launch/ does)")
    p.add_argument("--node-nice", type=int, default=-10, choices=range(-20, 20), metavar="-20..19",
                   help="CPU priority of the coprocessor nodes (their `nice` parameter, default -10, as a "
                        "control process on a robot computer would run); below 0 only when this user may "
                        "(root or CAP_SYS_NICE), else 0")
    p.add_argument("--sim-nice", type=int, default=10, choices=range(0, 20), metavar="0..19",
                   help="niceness of the simulated world once the nodes are started (default 10): the "
                        "renderer and physics stand in for the real world, which costs the cell's "
                        "computer no CPU; 0 lets them compete with the co-processor as equals")
    p.add_argument("--qc-families", default=None, metavar="FAMILY[,FAMILY...]",
                   help=f"the part families on the belt (default: the shipped bundles' own, "
                        f"{','.join(QC_PART_FAMILIES)}); {','.join(NOVEL_FAMILIES)} are families no shipped "
                        f"bundle was trained on")
    p.add_argument("--swap-qc", default=None, metavar="DIR@SECONDS",
                   help="at SECONDS of sim time, swap the running QC node to the bundle in DIR (its qc.bundle "
                        "parameter, as `bench node --swap-at`; with --lockstep right before the first QC image "
                        "from then on, time standing still until the node answers). A refused bundle leaves "
                        "the old one deciding and the run goes on. The report's `swap` section: the answer "
                        "and, per bundle sha256, verdicts, right and wrong, manual, deadline hit rate")


def ros_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("ROS_DOMAIN_ID", "77")
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    env.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(REPO / "config" / "fastdds_localhost.xml"))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MUJOCO_GL", "egl")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def may_raise_priority() -> bool:
    """True when this process may lower a nice value (CAP_SYS_NICE in its effective set)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 23 & 1)  # bit 23 = CAP_SYS_NICE
    except (OSError, ValueError):
        pass
    return False


def ros_params(pairs: list[str]) -> list[str]:
    """CLI KEY=VALUE pairs → `KEY:=VALUE` node parameters, validated and typed by the node's config
    (unknown keys and bad values fail here, before any process starts)."""
    from sol_control import params
    from sol_control.config import NodeConfig

    cfg = params.apply_overrides(NodeConfig(), pairs)
    return params.ros_assignments(cfg, list(params.parse_overrides(NodeConfig, pairs)))


def standard_only_params() -> list[str]:
    """Node parameters for the baseline: every decision from the fp32 planner, no speculation."""
    return ["decoding.standard_only:=true"]


def coprocessor_cmd(task: str, params: list[str], lockstep: bool, camera_to_ejector_m: float) -> list[str]:
    """The coprocessor for one camera: its own node name, camera remapped, sim time."""
    cam = CAMERA_OF_TASK[task]
    base = [f"mode:={task}", "use_sim_time:=true", "autostart:=true",
            "deadline.sensor_timeout_ms:=600000.0",          # cameras are triggered: gaps are normal
            f"qc.camera_to_ejector_m:={float(camera_to_ejector_m)}"]
    if lockstep:   # sim time stands still while a decision is computed; /clock may lag an image
        base += ["deadline.max_future_ms:=1000.0", "deadline.max_staleness_ms:=10000.0"]
    cmd = [sys.executable, "-m", "sol_control.ros.node", "--ros-args",
           "-r", f"__node:=sol_control_{task}", "-r", f"camera/image_raw:={cam}/camera/image_raw"]
    for p in base + params:
        cmd += ["-p", p]
    return cmd


def _first_error(log_dir: Path) -> str:
    for log in sorted(log_dir.glob("coprocessor_*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "[ERROR]" in line or "Traceback" in line:
                return f"{log.stem}: {line.split(']: ', 1)[-1]}"
    return "no error logged"


class Progress:
    def __init__(self, duration_s: float, quiet: bool):
        self.duration_s, self.quiet = duration_s, quiet
        self.last_print = 0.0

    def line(self, bridge) -> str:
        s = bridge.cell.tally
        d = bridge.decisions
        lat = sorted(x["latency_ms"] for x in d[-200:])
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        fast = sum(x["source"] == "fast" for x in d) / len(d) if d else float("nan")
        acc = s.qc_accuracy()
        return (f"t={bridge.cell.time_s:6.1f}/{self.duration_s:.0f}s  parts {s.parts:4d} "
                f"(acc {100 * acc:5.1f}%, rej {s.qc['correct_reject'] + s.qc['false_reject']}, "
                f"manual {s.qc['manual']})  grasps {s.grasp['success']}/{s.grasp['success'] + s.grasp['failure']}"
                f" (held {s.grasp['held']})  p99 {p99:5.1f} ms  fast {100 * fast:5.1f}%  "
                f"unlabelled misses {sum(x['unlabelled_miss'] for x in d)}")

    def tick(self, bridge) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last_print < 1.0:
            return
        self.last_print = now
        print("\r" + self.line(bridge), end="", flush=True)


def qc_families(text: str | None) -> tuple[str, ...]:
    """`--qc-families a,b` → the conveyor's families, validated by its config (None: the default)."""
    from pydantic import ValidationError

    from sol_control.sim.config import ConveyorConfig

    if text is None:
        return ConveyorConfig().families
    try:
        return ConveyorConfig(families=tuple(f.strip() for f in text.split(",") if f.strip())).families
    except ValidationError as e:
        raise ValueError(f"--qc-families {text!r}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def swap_plan(args: argparse.Namespace):
    """`--swap-qc DIR@SECONDS` → sim.swap.SwapPlan (None without it), checked before anything starts."""
    from sol_control.sim.swap import SwapPlan

    if args.swap_qc is None:
        return None
    plan = SwapPlan.parse(args.swap_qc, args.duration)
    if args.oracle or args.only == "grasp" or args.chaos:
        raise ValueError("--swap-qc swaps the running QC node's bundle: not with --oracle, --only grasp or --chaos")
    return plan


def run(args: argparse.Namespace) -> int:
    families, swap = qc_families(args.qc_families), swap_plan(args)
    _export(ros_env())
    out = Path(args.out)
    if not args.chaos:
        report = run_once(args, out, families=families, swap=swap)
        return 0 if report["unverified_passes"] == 0 else 1
    from sol_control.sim import chaos

    which = chaos.TASKS if args.chaos == "both" else (args.chaos,)
    if args.oracle or (args.only and args.only not in which):
        raise ValueError("--chaos kills coprocessor nodes: not with --oracle, and --only must keep the killed node")
    runs = {task: run_once(args, out / f"chaos_{task}", [chaos.ChaosPlan.seeded(task, args.seed, args.duration)],
                           families=families)
            for task in which}
    top = chaos.combine(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(top, indent=1, default=float, allow_nan=True))
    print("\nchaos: " + "; ".join(
        f"{t} killed at {r['chaos'][t]['killed_t_s']} s: back {r['chaos'][t]['back_s']:.2f} s, first decision "
        f"{r['chaos'][t]['recovery_s']:.2f} s after the kill" for t, r in runs.items()))
    print(f"chaos: unverified passes {top['unverified_passes']}, outage diverted {top['outage_diverted']}, "
          f"decisions lost {top['decisions_lost']}; wrote {out / 'report.json'}")
    return 0 if top["unverified_passes"] == 0 else 1


def run_once(args: argparse.Namespace, out: Path, chaos_plans=(), families: tuple[str, ...] = QC_PART_FAMILIES,
             swap=None) -> dict:
    """One demo run into `out` (parts of `families`, `swap`: a sim.swap.SwapPlan); returns its report."""
    from sol_control.sim.config import BridgeConfig

    tasks = (args.only,) if args.only else ("qc", "grasp")
    node_nice = args.node_nice if args.node_nice >= 0 or may_raise_priority() else 0
    if node_nice != args.node_nice and not args.quiet:
        print(f"note: nodes run at nice 0, not {args.node_nice} (needs root or CAP_SYS_NICE)")
    pairs = args.param + (DEMO_POLICY if args.policy else [])
    params = ros_params(pairs)
    if node_nice and not any(p.startswith("nice:=") for p in params):
        params.append(f"nice:={node_nice}")
    if args.standard_only:
        params += standard_only_params()
    if swap is not None and not args.lockstep and not any(p.startswith("deadline.max_future_ms:=") for p in params):
        from sol_control.sim.swap import SWAP_MAX_FUTURE_MS

        params.append(f"deadline.max_future_ms:={SWAP_MAX_FUTURE_MS}")
    if not args.oracle:
        check_bundles(tasks, params)
    cfg = BridgeConfig(mode="lockstep" if args.lockstep else "realtime", duration_s=args.duration,
                       rate=args.rate, record_path=args.record and args.record + (f"_{out.name}" if chaos_plans else ""),
                       cell={"seed": args.seed, "qc": "qc" in tasks, "grasp": "grasp" in tasks,
                             "conveyor": {"families": families}})
    progress = Progress(cfg.duration_s, args.quiet)
    meter = energy_meter(pairs)
    sim_nice = args.sim_nice
    summary, events = closed_loop(cfg, tasks, params, out / "logs", oracle=args.oracle, progress=progress,
                                  snapshot=out / "cell_overview.png", sim_nice=sim_nice,
                                  chaos=chaos_plans, respawn=not args.no_respawn, swap=swap)
    args.sim_nice = 0   # os.nice is applied once; this process keeps it for a second (chaos) run
    from sol_control.sim import report as rep
    from sol_control.sim.scoring import energy_table

    meter.update()  # with RAPL: the rate over the run; else the stated assumption
    meta = {"seed": args.seed, "duration_s": args.duration, "mode": cfg.mode, "rate": cfg.rate,
            "controller": "oracle" if args.oracle else "coprocessor",
            "standard_only": bool(args.standard_only), "policy_preset": bool(args.policy),
            "node_params": params, "sim_nice": sim_nice, "load_1min": os.getloadavg()[0],
            **({"qc_families": list(families)} if families != QC_PART_FAMILIES else {})}
    if swap is not None:
        from sol_control.sim.swap import section

        summary["swap"] = section(summary["swap"], events, summary)
    r = rep.build_report(summary, meta, energy_table([e for e in events if e["type"] == "decision"], meter))
    files = rep.write(out, r, events) + [out / "cell_overview.png"]
    print("\n" + rep.table(r))
    if r["energy"]:
        print(f"energy: {r['energy']['energy_assumption']}")
    if swap is not None and not r["swap"]["successful"]:
        print(f"swap refused: {r['swap']['reason']}")
    print("wrote " + ", ".join(str(f) for f in files))
    return r


def energy_meter(pairs: list[str]):
    """Joules per decision for the report, with the nodes' `energy.watts_per_busy_core`."""
    from sol_control.config import NodeConfig, apply_overrides
    from sol_control.energy import EnergyMeter

    return EnergyMeter(apply_overrides(NodeConfig(), pairs).energy.watts_per_busy_core)


def _export(env: dict) -> None:
    for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION",
              "FASTDDS_DEFAULT_PROFILES_FILE", "OMP_NUM_THREADS", "MUJOCO_GL"):
        os.environ[k] = env[k]


def check_bundles(tasks: tuple[str, ...], params: list[str]) -> None:
    from sol_control.config import shipped_bundle

    missing = [t for t in tasks if not (shipped_bundle(t) / "manifest.json").is_file()
               and not any(p.startswith(f"{t}.bundle:=") for p in params)]
    if missing:
        raise ValueError(f"no shipped bundle for {', '.join(missing)} (models/<task>/manifest.json); "
                         f"build them (make models) or pass --param {missing[0]}.bundle=DIR, or use --oracle")


def closed_loop(cfg, tasks: tuple[str, ...], params: list[str], log_dir: Path, oracle: bool = False,
                progress: Progress | None = None, snapshot: Path | None = None,
                sim_nice: int = 0, chaos=(), respawn: bool = True, swap=None) -> tuple[dict, list[dict]]:
    """Start the coprocessor nodes (unless oracle), run the cell as `cell_sim`, stop the nodes.
    A node that exits during the run is restarted (unless `respawn` is False: the run ends);
    `chaos` (sim.chaos.ChaosPlan, one per node to kill) kills them on purpose. `sim_nice` > 0 lowers this process's CPU
    priority once the nodes are forked (they keep theirs); it cannot be undone, so only the `demo`
    command, whose process ends with the run, passes it. Returns the bridge summary (with the
    nodes' respawns, memory and the chaos figures) and every event (decisions, outcomes, liveliness).
    `swap` (sim.swap.SwapPlan) swaps the QC node's bundle during the run: `summary["swap"]` says how it went."""
    from sol_control.sim.bridge import Session
    from sol_control.sim.chaos import ChaosMonitor
    from sol_control.sim.swap import SwapMonitor

    env = ros_env()                     # the nodes and this process share one domain, whatever the caller set
    lockstep = cfg.mode == "lockstep"
    cmds = {} if oracle else {t: coprocessor_cmd(t, params, lockstep, cfg.cell.conveyor.camera_to_ejector_m)
                              for t in tasks}
    sup = NodeSupervisor(cmds, env, log_dir, respawn=respawn)
    sup.start()
    swapper = None
    try:
        if swap is not None:  # with the nodes: its start-up and discovery are over by the swap
            assert "qc" in cmds, "a swap needs the QC node"
            swapper = SwapMonitor(swap, env, "/sol_control_qc", lockstep, STARTUP_TIMEOUT_S)
        if sim_nice > 0:
            os.nice(sim_nice)  # threads started from here on (renderer, DDS) inherit it
        monitors = [ChaosMonitor(plan, sup, lockstep) for plan in chaos]
        watchers = monitors + ([swapper] if swapper is not None else [])
        listeners = [m.on_event for m in monitors]
        t0 = time.monotonic()
        with Session(cfg, int(env["ROS_DOMAIN_ID"]), oracle=oracle, listeners=listeners) as session:
            if cmds:
                _wait_for_nodes(session, sup, env, log_dir, progress)
            bridge = session.bridge
            for m in watchers:
                m.attach(bridge)

            def tick() -> bool:         # the cell's loop calls this between steps and while it waits
                sup.poll()
                for m in watchers:
                    m.tick()
                if progress is not None:
                    progress.tick(bridge)
                return not sup.alive()

            summary = session.run(should_stop=tick)
            if progress is not None and not progress.quiet:
                print("\r" + progress.line(bridge), flush=True)
            if snapshot is not None:
                _save_overview(bridge, snapshot)
            if not sup.alive():
                why = sup.gave_up or {t: e[-1] for t, e in sup.respawns().items() if e}
                raise ValueError(f"coprocessor exited during the run: {why} (logs in {log_dir})")
            return _with_run_figures(summary, sup, time.monotonic() - t0, monitors, swapper), session.events
    finally:
        if swapper is not None:
            swapper.stop()
        sup.stop()


def _save_overview(bridge, path: Path) -> None:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), bridge.cell.render_overview()[..., ::-1])


def _with_run_figures(summary: dict, sup: NodeSupervisor, run_s: float, monitors: list, swapper) -> dict:
    """The bridge summary plus the nodes' respawns and memory, and the chaos and swap reports."""
    warmup_s = min(60.0, max(5.0, 0.2 * run_s))
    summary.update(respawns=sup.respawns(), node_rss=sup.rss_report(warmup_s), rss_warmup_s=warmup_s)
    if monitors:
        summary["chaos"] = {m.plan.task: m.report() for m in monitors}
    if swapper is not None:
        summary["swap"] = swapper.report()
    return summary


def _wait_for_nodes(session, sup: NodeSupervisor, env: dict, log_dir: Path, progress) -> None:
    """Until every node reports active (a node that dies while starting is not respawned: its log says why)."""
    names = [f"sol_control_{t}" for t in sup.nodes]
    alive = lambda: all(m.proc.poll() is None for m in sup.nodes.values())  # noqa: E731
    say = progress is None or not progress.quiet
    if say:
        print(f"starting coprocessor nodes {', '.join(names)} (ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}) ...",
              flush=True)
    t0 = time.monotonic()
    states = session.wait_active(names, STARTUP_TIMEOUT_S, alive)
    if any(v != "active" for v in states.values()):
        raise ValueError(f"coprocessor nodes not active after {time.monotonic() - t0:.0f} s: {states}; "
                         f"{_first_error(log_dir)} (logs in {log_dir})")
    if say:
        print(f"nodes active after {time.monotonic() - t0:.1f} s; running the cell", flush=True)
