"""`sol-control soak --minutes N [--rate-x 3] [--json PATH]`: a long run of the co-processor core.

What runs: the ROS-free `Coprocessor` in this process (real bundles, real ONNX Runtime sessions,
the real deadline guard, the shadow auditor if `audit_rate` > 0) behind the node's own worker
loop, one `runner.TaskRunner` per task (watchdog included); frames arrive on a fixed clock at
`rate_x` x the nominal 30 Hz camera rate; each frame's budget starts at its arrival; when a
decision runs long, the frames that arrived meanwhile are superseded and only the newest is decided
(latest-value semantics, `frames_skipped`). Each decision is relabelled right before it is
recorded, as the node does before publishing (`decision.on_time_or_safe`: a late answer becomes
the safe default). Not here: DDS (see `sol-control bench node`), so the figures isolate the core:
memory, misses, latency drift.

Memory: resident set size (VmRSS) once a second; `rss_growth_mb` = median of the last 5 samples
minus the median of the first 5 after warm-up (the first 20 % of the run, 5..60 s). Recording is
allocation-free after warm-up (fixed latency histograms, one reused window buffer).
Misses: every decision carries `deadline_met`; the soak re-measures each decision's latency itself
(arrival -> handed to the publish callback). `unlabelled_misses` = decisions that say `deadline_met=true` although the
soak measured them later than deadline + publish_margin_ms + label_tolerance_ms (5 ms: a loaded
machine may preempt the thread between the runner's label and the record), plus decisions whose
step raised (the runner publishes them as `internal_error` safe defaults and counts them). Reported alongside: `late_after_label` (beyond the publish margin alone),
`label_lag_*` (measured - labelled latency) and `late_not_safe_default` (labelled late, but from the
fast or full-precision planner: its last ONNX Runtime call ran past the deadline).
p99 stability: p99 per window (10 s); `p99_drift_ms` = p99 of the last third of the windows minus
p99 of the first third (after warm-up). Wall-clock p99 also moves with the machine's load, so each
window also records the deciding thread's own CPU time per decision (`Decision.cpu_ms`:
`cpu_ms_per_decision`, `cpu_drift` as a fraction) and the 1-minute load average (`load_1min`): a p99 drift with flat CPU per decision
and a rising load is the machine, not the co-processor.

Pass (exit 0): rss_growth_mb < 5, unlabelled_misses == 0, p99_drift_ms <= max(2, 25 % of the
median window p99) for every task. Otherwise exit 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from sol_control.bench.common import rss_bytes, table
from sol_control.budget import NS_PER_MS, NS_PER_S
from sol_control.sim.scoring import drift  # median of the last third - of the first, per window
from sol_control.telemetry import Frame, Joints, Telemetry

NOMINAL_HZ = 30.0
HIST_BIN_MS = 0.01
HIST_BINS = 200_000  # 0 .. 2 s in 10 us bins; later decisions land in the last bin
POOL = 32  # distinct test-split scenes per task, cycled


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=10.0, help="run time (warm-up included)")
    p.add_argument("--rate-x", type=float, default=3.0, help=f"frame rate as a multiple of {NOMINAL_HZ:.0f} Hz")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--mode", choices=["auto", "qc", "grasp", "both"], default="auto",
                   help="tasks to decide; auto = every task whose bundle is present")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. deadline.qc_ms=8 or qc.bundle=/path (repeatable)")
    p.add_argument("--window-s", type=float, default=10.0, help="window for the p99 series (s)")
    p.add_argument("--label-tolerance-ms", type=float, default=5.0,
                   help="scheduling delay allowed between a decision's deadline_met label and step's return "
                        "(a loaded 2-core machine preempts a thread for a few ms)")


# -- recording (no allocation per decision) ---------------------------------------------------------
class TaskRecord:
    def __init__(self, window_capacity: int, margin_ms: float, tolerance_ms: float):
        self.margin_ms = margin_ms  # publish_margin_ms: the guard's allowance for what follows its label
        self.tolerance_ms = tolerance_ms  # scheduling delay between the label and step's return
        self.hist = np.zeros(HIST_BINS, np.int64)
        self.lag_hist = np.zeros(HIST_BINS, np.int64)  # measured - labelled latency
        self.window = np.zeros(window_capacity, np.float64)
        self.n_window = 0
        self.window_p99_ms: list[float] = []
        self.sources: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.decisions = self.met = self.late_not_safe = self.mislabelled = self.late_after_label = 0
        self.max_ms = 0.0
        self.worst_late_ms = 0.0

    def add(self, latency_ms: float, measured_ms: float, deadline_ms: float, met: bool, source: str,
            reason: str) -> None:
        self.decisions += 1
        self.met += met
        self.sources[source] += 1
        if reason:
            self.reasons[reason] += 1
        if met and measured_ms > deadline_ms + self.margin_ms:
            self.late_after_label += 1
            if measured_ms > deadline_ms + self.margin_ms + self.tolerance_ms:
                self.mislabelled += 1
        self.lag_hist[min(max(int((measured_ms - latency_ms) / HIST_BIN_MS), 0), HIST_BINS - 1)] += 1
        if not met and source != "safe_default":
            self.late_not_safe += 1
            self.worst_late_ms = max(self.worst_late_ms, latency_ms)
        self.max_ms = max(self.max_ms, latency_ms)
        self.hist[min(int(latency_ms / HIST_BIN_MS), HIST_BINS - 1)] += 1
        if self.n_window < len(self.window):
            self.window[self.n_window] = latency_ms
            self.n_window += 1

    def close_window(self) -> None:
        if self.n_window:
            self.window_p99_ms.append(float(np.percentile(self.window[: self.n_window], 99)))
        self.n_window = 0

    def pct(self, q: float, hist: np.ndarray | None = None) -> float:
        hist = self.hist if hist is None else hist
        total = hist.sum()
        if not total:
            return math.nan
        i = int(np.searchsorted(np.cumsum(hist), q / 100.0 * total))
        return (i + 0.5) * HIST_BIN_MS

    def summary(self, deadline_ms: float) -> dict:
        w = self.window_p99_ms
        p99_drift = drift(w)
        median_p99 = float(np.median(w)) if w else math.nan
        return {
            "deadline_ms": deadline_ms, "decisions": self.decisions,
            "p50_ms": self.pct(50), "p99_ms": self.pct(99), "p999_ms": self.pct(99.9), "max_ms": self.max_ms,
            "deadline_hit_rate": self.met / self.decisions if self.decisions else math.nan,
            "sources": dict(self.sources), "reasons": dict(self.reasons.most_common(8)),
            "late_not_safe_default": self.late_not_safe, "worst_late_not_safe_default_ms": self.worst_late_ms,
            "mislabelled": self.mislabelled, "late_after_label": self.late_after_label,
            "label_lag_p99_ms": self.pct(99, self.lag_hist), "label_lag_max_ms": self.pct(100, self.lag_hist),
            "window_p99_ms": [round(x, 3) for x in w], "median_window_p99_ms": median_p99,
            "p99_drift_ms": p99_drift,
            "p99_stable": p99_drift <= max(2.0, 0.25 * median_p99) if w else False,
        }


# -- the run --------------------------------------------------------------------------------------
def _config(args: argparse.Namespace):
    from sol_control.config import NodeConfig, apply_overrides

    cfg = apply_overrides(NodeConfig(), list(args.param))
    mode = args.mode
    if mode == "auto":
        have = [t for t in ("qc", "grasp") if (cfg.bundle_dir(t) / "manifest.json").is_file()]
        if not have:
            raise ValueError("no bundle found for qc or grasp: pass --param qc.bundle=DIR or build models/")
        mode = "both" if len(have) == 2 else have[0]
    return apply_overrides(cfg, [f"mode={mode}"])


class Driver:
    """One task, fed like the node's runner: a camera ticks every `period_ns` and offers each frame
    to the task's TaskRunner (the node's worker loop, watchdog included); its depth-1 slot keeps only
    the newest frame, so frames that arrive while a decision runs are superseded (`frames_skipped`).
    The runner relabels each decision right before it is "published", here: recorded."""

    def __init__(self, cop, task: str, record: TaskRecord, pool: list, period_ns: int, t0: int, warmup_ns: int,
                 window_ns: int, end_ns: int):
        from sol_control.runner import CountingHooks, TaskRunner

        self.task, self.record, self.pool = task, record, pool
        self.period_ns, self.t0, self.warmup_ns, self.window_ns, self.end_ns = period_ns, t0, warmup_ns, window_ns, end_ns
        self.hooks = CountingHooks()
        self.runner = TaskRunner(task, cop, self._on_decision, self.hooks)
        self.ticks = self.decided = 0
        self.cpu_ms_per_decision: list[float] = []  # per window: the runner thread's CPU per decision
        self.load_1min: list[float] = []
        self._lock = threading.Lock()  # the runner and its watchdog both publish
        self._next_window = t0 + warmup_ns + window_ns
        self._window_cpu_ms: list[float] = []
        self.thread = threading.Thread(target=self._feed, name=f"soak-{task}", daemon=True)

    def _feed(self) -> None:
        self.runner.start()
        try:
            next_tick = self.t0
            while (now := time.monotonic_ns()) < self.end_ns:
                if now < next_tick:
                    time.sleep((next_tick - now) / NS_PER_S)
                    continue
                scene = self.pool[self.ticks % POOL]  # a frame arriving now (its budget starts at
                q = getattr(scene, "joints_rad", None)  # the tick), with the scene's joints
                joints = None if q is None else Joints(
                    tuple(f"joint{i + 1}" for i in range(len(q))), q, np.zeros(0), next_tick)
                frame = Frame(scene.image, next_tick, next_tick, "soak_camera")
                self.runner.offer(Telemetry(frame, joints=joints))
                self.ticks += 1
                next_tick += self.period_ns
        finally:
            self.runner.stop()

    def _on_decision(self, d) -> None:
        now = time.monotonic_ns()
        measured_ms = (now - d.start_mono_ns) / NS_PER_MS
        with self._lock:
            self.decided += 1
            if d.start_mono_ns - self.t0 >= self.warmup_ns:  # after the warm-up
                self.record.add(d.latency_ms, measured_ms, d.deadline_ms, d.deadline_met, d.source,
                                d.reason)
                if math.isfinite(d.cpu_ms):
                    self._window_cpu_ms.append(d.cpu_ms)
            if now >= self._next_window:
                self.record.close_window()
                if self._window_cpu_ms:
                    self.cpu_ms_per_decision.append(float(np.mean(self._window_cpu_ms)))
                    self.load_1min.append(os.getloadavg()[0])
                self._window_cpu_ms = []
                self._next_window += self.window_ns


def soak(args: argparse.Namespace) -> dict:
    from sol_control.coprocessor import Coprocessor, share_gil_quickly
    from sol_control.eval import scenes

    share_gil_quickly()  # as the node does
    cfg = _config(args)
    duration_s = args.minutes * 60.0
    if not duration_s > 0 or not args.rate_x > 0:
        raise ValueError(f"--minutes and --rate-x must be positive, got {args.minutes}, {args.rate_x}")
    warmup_s = min(60.0, max(5.0, 0.2 * duration_s))
    rate_hz = NOMINAL_HZ * args.rate_x
    cop = Coprocessor(cfg)
    try:
        cop.warmup()
        pools = {t: scenes(t, "test", POOL) for t in cop.tasks}
        records = {t: TaskRecord(int(rate_hz * args.window_s) + 16, cfg.deadline.publish_margin_ms,
                                 args.label_tolerance_ms) for t in cop.tasks}
        rss_series: list[tuple[float, float]] = []
        t0 = time.monotonic_ns()
        end = t0 + int(duration_s * NS_PER_S)
        drivers = [Driver(cop, t, records[t], pools[t], int(NS_PER_S / rate_hz), t0, int(warmup_s * NS_PER_S),
                          int(args.window_s * NS_PER_S), end) for t in cop.tasks]
        for d in drivers:
            d.thread.start()
        while (now := time.monotonic_ns()) < end:  # this thread only samples memory, once a second
            rss_series.append(((now - t0) / NS_PER_S, rss_bytes() / 2**20))
            time.sleep(max(0.0, min(1.0, (end - now) / NS_PER_S)))
        for d in drivers:
            d.thread.join(timeout=60.0)
        wall_s = (time.monotonic_ns() - t0) / NS_PER_S
    finally:
        cop.close()
    return _report(cfg, args, records, rss_series, warmup_s, wall_s, drivers)


def _report(cfg, args, records, rss_series, warmup_s, wall_s, drivers) -> dict:
    after = [mb for t, mb in rss_series if t >= warmup_s]
    warm = float(np.median(after[:5])) if after else math.nan
    last = float(np.median(after[-5:])) if after else math.nan
    tasks = {t: r.summary(cfg.deadline.for_task(t)) for t, r in records.items()}
    for d in drivers:
        cpu = d.cpu_ms_per_decision
        tasks[d.task].update({
            "frames": d.ticks, "frames_decided": d.decided,
            "frames_skipped": d.runner.frames.superseded,
            "rejected_inputs": sum(d.hooks.rejected.values()), "failed": d.hooks.errors,
            "cpu_ms_per_decision": [round(x, 4) for x in cpu],
            "cpu_drift": drift(cpu) / max(float(np.median(cpu)), 1e-9) if cpu else math.nan})
    unlabelled = sum(s["failed"] + s["mislabelled"] for s in tasks.values())
    growth = last - warm
    criteria = {"rss_growth_under_5mb": bool(growth < 5.0), "zero_unlabelled_misses": unlabelled == 0,
                "p99_stable": all(s["p99_stable"] for s in tasks.values())}
    load = [x for d in drivers for x in d.load_1min]
    drifts = [abs(s["cpu_drift"]) for s in tasks.values() if math.isfinite(s["cpu_drift"])]
    return {
        "what": "Coprocessor core in-process (no DDS): real bundles, ONNX Runtime, deadline guard",
        "minutes": args.minutes, "rate_x": args.rate_x, "rate_hz": NOMINAL_HZ * args.rate_x, "mode": cfg.mode,
        "audit_rate": cfg.audit_rate, "warmup_s": warmup_s, "wall_s": wall_s,
        **{k: sum(s[k] for s in tasks.values())
           for k in ("frames", "frames_decided", "frames_skipped")},
        "decisions_per_s": sum(s["decisions"] for s in tasks.values()) / max(wall_s - warmup_s, 1e-9),
        "cpu_drift": max(drifts) if drifts else math.nan, "load_1min": [round(x, 2) for x in load],
        "unlabelled_misses": unlabelled,
        "rss_mb": {"after_warmup": warm, "end": last, "max": max(after) if after else math.nan,
                   "growth": growth, "series": [(round(t, 1), round(mb, 2)) for t, mb in rss_series]},
        "rss_growth_mb": growth, "tasks": tasks, "criteria": criteria, "pass": all(criteria.values()),
    }


def _print(res: dict) -> None:
    print(f"soak: {res['what']}")
    print(f"{res['wall_s']:.0f} s at {res['rate_hz']:.0f} Hz (mode {res['mode']}, audit_rate {res['audit_rate']}), "
          f"warm-up {res['warmup_s']:.0f} s; frames {res['frames']}, decided {res['frames_decided']}, "
          f"skipped (latest value) {res['frames_skipped']}")
    rows = []
    for t, s in res["tasks"].items():
        src = ", ".join(f"{k} {v}" for k, v in sorted(s["sources"].items()))
        rows.append([t, str(s["decisions"]), f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}", f"{s['max_ms']:.1f}",
                     f"{s['deadline_hit_rate']:.4f}", f"{s['p99_drift_ms']:+.2f}", str(s["late_not_safe_default"]),
                     src])
    print(table(["task", "decisions", "p50 ms", "p99 ms", "max ms", "hit rate", "p99 drift", "late !safe", "sources"],
                rows))
    r = res["rss_mb"]
    print(f"RSS after warm-up {r['after_warmup']:.1f} MB, end {r['end']:.1f} MB, growth {r['growth']:+.2f} MB; "
          f"unlabelled misses {res['unlabelled_misses']}")
    cpu = {t: s["cpu_ms_per_decision"] for t, s in res["tasks"].items() if s["cpu_ms_per_decision"]}
    if cpu:
        print("own CPU per decision: " + ", ".join(f"{t} {np.median(c):.2f} ms (drift {res['tasks'][t]['cpu_drift']:+.1%})"
                                                   for t, c in cpu.items())
              + f"; machine load (1 min) {min(res['load_1min']):.1f}..{max(res['load_1min']):.1f}")
    print("PASS" if res["pass"] else "FAIL: " + ", ".join(k for k, ok in res["criteria"].items() if not ok))


def run(args: argparse.Namespace) -> int:
    res = soak(args)
    _print(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=float) + "\n")
    return 0 if res["pass"] else 1
