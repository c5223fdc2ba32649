"""The deadline guard: which planner's answer is published, and why.

    budget (from the sensor stamp) ──► fast planner, with the fast budget
        ok, in time, confident, inside limits ──────────────────────────────► source=fast
        raised / over budget / bad tokens / unsure / outside limits
            └► full-precision planner, if its measured latency fits what is left
                   ok and inside limits ─────────────────────────────────────► source=full_precision
                   else ─────────────────────────────────────────────────────► source=safe_default
            └► it would not fit ─────────────────────────────────────────────► source=safe_default

Fast budget = the remaining budget (minus the publish margin) times `fast_share`, shortened further
to leave room for the full-precision planner when the deadline is long enough to hold both. A fast
path whose median recent latency does not fit its budget is not started (`fast_would_miss`), so a
late frame gets its fallback at once instead of after a doomed run. The full-precision planner runs
only if its measured p95 latency x `full_precision_safety` fits what is left.
Nothing escapes `decide`: every exception becomes a reason and a fallback.
`reason` is "" for fast decisions, the fast path's failure for full_precision, and
"<fast failure>><why not full precision>" for safe defaults.
"""
from __future__ import annotations

import math
import os
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from sol_control.actions import Action, ActionTokenizer, GraspDecision, QCVerdict, limit_violations, safe_default
from sol_control.budget import Budget
from sol_control.config import NodeConfig
from sol_control.planners import FastPlanner, FullPrecisionPlanner, PlanResult

NS_PER_MS = 1_000_000
PROBE_EVERY = 8  # after this many skipped fast paths in a row, run one to refresh its latency model


@dataclass(frozen=True)
class Decision:
    task: str  # "qc" | "grasp"
    action: Action
    source: str  # "fast" | "full_precision" | "safe_default"
    reason: str
    latency_ms: float  # sensor stamp -> decision made
    deadline_ms: float
    deadline_met: bool
    stamp_ns: int  # the sensor header stamp the decision belongs to (ROS time)
    frame_id: str = ""
    fast_ms: float = math.nan
    full_ms: float = math.nan
    acceptance: float = math.nan  # speculative: accepted / proposed draft tokens
    tokens: tuple[int, ...] = ()
    eject_time_ns: int = 0  # QC: when the part reaches the ejector (ROS time); 0 = unknown
    queue_ms: float = math.nan  # sensor stamp -> decision work starts (transport + waiting)
    perception_ms: float = math.nan  # image -> observation tokens
    start_mono_ns: int = 0  # the sensor stamp on the monotonic clock (budget start); 0 = unknown


# Where a decision's time went (ms), in order: stamp -> work start (transport, waiting), image ->
# observation tokens, fast path, full-precision planner. NaN when a decision skipped a stage.
STAGE_FIELDS = ("queue_ms", "perception_ms", "fast_ms", "full_ms")


def on_time_or_safe(d: Decision, now_ns: int | None = None, margin_ms: float = 0.0) -> Decision:
    """Measure the latency again now; a decision that is late and not a safe default already becomes
    the safe default (reason `<source>_late`), so every output is on time or labelled safe_default.
    The guard applies it when it decides, the node again right before publishing, with `margin_ms`
    kept for the publish itself (a decision that would leave after its deadline is not on time)."""
    if not d.start_mono_ns:
        return d
    latency_ms = ((time.monotonic_ns() if now_ns is None else now_ns) - d.start_mono_ns) / NS_PER_MS
    met = latency_ms + margin_ms <= d.deadline_ms
    if met or d.source == "safe_default":
        return replace(d, latency_ms=latency_ms, deadline_met=met)
    late = "fast_late" if d.source == "fast" else f"{d.reason}>full_precision_late"
    return replace(d, action=safe_default(d.task), source="safe_default", reason=late, latency_ms=latency_ms,
                   deadline_met=False, tokens=())


class LatencyModel:
    """Recent measured latencies of a planner; `estimate_ms` = p95 of the window times `safety`."""

    def __init__(self, window: int = 64):
        self._ms: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()

    def add(self, latency_ms: float) -> None:
        if math.isfinite(latency_ms) and latency_ms >= 0:
            with self._lock:
                self._ms.append(latency_ms)

    @property
    def count(self) -> int:
        return len(self._ms)

    def estimate_ms(self, safety: float = 1.0, q: float = 95.0) -> float:
        with self._lock:
            if not self._ms:
                return math.inf  # never measured: assume it never fits
            return float(np.percentile(np.fromiter(self._ms, float), q)) * safety


def fast_budget(budget: Budget, cfg: NodeConfig, full_estimate_ms: float, fast_p95_ms: float = 0.0) -> Budget:
    """The fast path's share of `budget`: all that is left (minus the publish margin) x fast_share,
    minus a reserve for the full-precision planner when what remains still holds the fast path's
    p95 run (and at least min_fast_ms). Otherwise reserving would only starve the fast path: cut
    at its median, as it was before (demo, grasp at 25 ms: 7 of 24 decisions), it overran its
    share by a step, and then the reserve no longer held full precision either."""
    if budget.deadline_ns is None:
        return budget  # unlimited stays unlimited
    d = cfg.deadline
    now = time.monotonic_ns()
    usable_ms = budget.remaining_ms(now) - d.publish_margin_ms
    fast_ms = usable_ms * d.fast_share
    if d.reserve_full_precision and usable_ms - full_estimate_ms >= max(d.min_fast_ms, fast_p95_ms):
        fast_ms = min(fast_ms, usable_ms - full_estimate_ms)
    return Budget(now + int(max(fast_ms, 0.0) * NS_PER_MS), budget.start_ns)


class DeadlineGuard:
    def __init__(self, task: str, fast: FastPlanner, full: FullPrecisionPlanner, tokenizer: ActionTokenizer,
                 config: Callable[[], NodeConfig], audit: Callable[[np.ndarray, Decision], None] | None = None):
        self.task = task
        self.fast = fast
        self.full = full
        self.tokenizer = tokenizer
        self.config = config  # returns the live config (runtime parameter changes apply at once)
        self.full_latency = LatencyModel()
        self.fast_latency = LatencyModel()
        self._hopeless_in_row = 0
        self.audit = audit
        self._rng = random.Random(0)

    # -- checks ----------------------------------------------------------------------------------
    def _accept(self, res: PlanResult, min_confidence: float, cfg: NodeConfig, stage: str) -> tuple[Action | None, str]:
        if not res.complete:
            return None, f"{stage}_over_budget"
        try:
            action = self.tokenizer.decode(res.tokens, res.probs)
        except ValueError:
            return None, f"{stage}_invalid_tokens"
        if action.confidence < min_confidence:
            return None, f"{stage}_low_confidence"
        if limit_violations(action, cfg.limits):
            return None, f"{stage}_limits"
        return action, ""

    def _min_confidence(self, cfg: NodeConfig) -> float:
        return cfg.qc.min_confidence if self.task == "qc" else cfg.grasp.min_confidence

    # -- the decision ----------------------------------------------------------------------------
    def decide(self, prefix: np.ndarray, budget: Budget, stamp_ns: int, frame_id: str = "") -> Decision:
        cfg = self.config()
        deadline_ms = (math.inf if budget.deadline_ns is None  # unlimited: never late
                       else (budget.deadline_ns - budget.start_ns) / NS_PER_MS)
        self.tokenizer.uncertain_below = cfg.qc.uncertain_below if self.task == "qc" else 0.0

        def done(action: Action, source: str, reason: str, **kw) -> Decision:
            latency_ms = budget.elapsed_ms()
            return on_time_or_safe(Decision(self.task, action, source, reason, latency_ms, deadline_ms,
                                            latency_ms <= deadline_ms, stamp_ns, frame_id,
                                            start_mono_ns=budget.start_ns, **kw))

        if budget.remaining_ms() <= cfg.deadline.publish_margin_ms:
            return done(safe_default(self.task), "safe_default", "no_budget")

        # 1. fast path
        fast_res = None
        t0 = time.monotonic_ns()
        try:
            p95 = self.fast_latency.estimate_ms(q=95.0) if self.fast_latency.count >= 8 else 0.0
            fb = fast_budget(budget, cfg, self._full_estimate(cfg), p95)
            if cfg.decoding.standard_only:
                action, reason = None, "standard_only"
            elif fb.expired():
                action, reason = None, "fast_no_budget"
            elif self._fast_hopeless(fb):
                action, reason = None, "fast_would_miss"  # not even its median run fits: answer now
            else:
                fast_res = self.fast.plan(prefix, fb, cfg.fault_injection)
                if fast_res.complete:
                    self.fast_latency.add(fast_res.latency_ms)
                action, reason = self._accept(fast_res, self._min_confidence(cfg), cfg, "fast")
        except Exception as e:  # noqa: BLE001 - the control loop never lets an error escape
            action, reason = None, f"fast_error:{type(e).__name__}"
        fast_ms = (time.monotonic_ns() - t0) / NS_PER_MS
        acceptance = fast_res.acceptance if fast_res is not None else math.nan
        if action is not None:
            d = done(action, "fast", "", fast_ms=fast_ms, acceptance=acceptance, tokens=tuple(fast_res.tokens))
            if (self.audit is not None and d.source == "fast" and cfg.audit_rate > 0
                    and self._rng.random() < cfg.audit_rate):
                self.audit(prefix, d)
            return d

        # 2. full precision, if its measured latency fits what is left
        margin = cfg.deadline.publish_margin_ms
        if not budget.fits(self._full_estimate(cfg) + margin):
            return done(safe_default(self.task), "safe_default", f"{reason}>full_precision_would_miss",
                        fast_ms=fast_ms, acceptance=acceptance)
        t1 = time.monotonic_ns()
        full_budget = (budget if budget.deadline_ns is None
                       else Budget(budget.deadline_ns - int(margin * NS_PER_MS), budget.start_ns))
        try:
            res = self.full.plan(prefix, full_budget, cfg.fault_injection)
            if res.complete:
                self.full_latency.add(res.latency_ms)
            action, why = self._accept(res, self._full_min_confidence(cfg), cfg, "full_precision")
        except Exception as e:  # noqa: BLE001
            action, why, res = None, f"full_precision_error:{type(e).__name__}", None
        full_ms = (time.monotonic_ns() - t1) / NS_PER_MS
        if action is None:
            return done(safe_default(self.task), "safe_default", f"{reason}>{why}", fast_ms=fast_ms,
                        full_ms=full_ms, acceptance=acceptance)
        return done(action, "full_precision", reason, fast_ms=fast_ms, full_ms=full_ms,
                    acceptance=acceptance, tokens=tuple(res.tokens))

    def _fast_hopeless(self, fb: Budget) -> bool:
        """True when the fast path's median recent latency does not fit `fb`. Every PROBE_EVERY-th
        such decision runs anyway, so the latency model keeps learning when conditions improve."""
        if self.fast_latency.count < 8 or fb.fits(self.fast_latency.estimate_ms(q=50.0)):
            self._hopeless_in_row = 0
            return False
        self._hopeless_in_row += 1
        if self._hopeless_in_row >= PROBE_EVERY:
            self._hopeless_in_row = 0
            return False
        return True

    def _full_min_confidence(self, cfg: NodeConfig) -> float:
        # QC: an unsure full-precision verdict is published as "uncertain" (manual check) instead;
        # grasp: an unsure full-precision grasp is not executed (hold).
        return 0.0 if self.task == "qc" else cfg.grasp.min_confidence

    def _full_estimate(self, cfg: NodeConfig) -> float:
        return self.full_latency.estimate_ms(cfg.deadline.full_precision_safety)

    def measure_full(self, prefix: np.ndarray) -> float:
        """One unbudgeted full-precision run (warm-up): feeds the latency model, returns ms."""
        res = self.full.plan(prefix, Budget.unlimited(), self.config().fault_injection)
        self.full_latency.add(res.latency_ms)
        return res.latency_ms

    def measure_fast(self, prefix: np.ndarray) -> float:
        """One unbudgeted fast run (warm-up): feeds the fast path's latency model, returns ms."""
        res = self.fast.plan(prefix, Budget.unlimited())
        self.fast_latency.add(res.latency_ms)
        return res.latency_ms


def agrees(a: Action, b: Action) -> bool:
    """Audit agreement: same QC verdict and defect class; grasps within one bin on every field is too
    strict to ask of int8, so grasps agree when position is within 1 cm, yaw 0.1 rad, width 5 mm."""
    if isinstance(a, QCVerdict) and isinstance(b, QCVerdict):
        return a.defect == b.defect and a.verdict == b.verdict
    if isinstance(a, GraspDecision) and isinstance(b, GraspDecision):
        dp = math.dist((a.x_m, a.y_m, a.z_m), (b.x_m, b.y_m, b.z_m))
        return dp <= 0.01 and abs(a.yaw_rad - b.yaw_rad) <= 0.1 and abs(a.width_m - b.width_m) <= 0.005
    return False


class Auditor:
    """Recomputes sampled fast decisions at full precision on its own session, in a background
    thread at the lowest CPU priority. Its queue holds one job: when busy, new samples are skipped."""

    def __init__(self, full: FullPrecisionPlanner, tokenizer: ActionTokenizer):
        self.full = full
        self.tokenizer = tokenizer
        self._jobs: queue.Queue = queue.Queue(maxsize=1)
        self.audited = self.agreed = self.token_identical = self.skipped = self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sol_control-audit", daemon=True)
        self._thread.start()

    def submit(self, prefix: np.ndarray, decision: Decision) -> None:
        try:
            self._jobs.put_nowait((prefix.copy(), decision))
        except queue.Full:
            self.skipped += 1

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        while not self._stop.is_set():
            try:
                prefix, decision = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                res = self.full.plan(prefix, Budget.unlimited())
                ref = replace(self.tokenizer, uncertain_below=0.0).decode(res.tokens, res.probs)
                fast = replace(self.tokenizer, uncertain_below=0.0).decode(decision.tokens)
                self.audited += 1
                self.agreed += agrees(fast, ref)
                self.token_identical += tuple(res.tokens) == decision.tokens
            except Exception:  # noqa: BLE001 - a broken audit must not touch live decisions
                self.errors += 1

    @property
    def agreement(self) -> float:
        return self.agreed / self.audited if self.audited else math.nan

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


class WatchJob:
    __slots__ = ("task", "fire_at_ns", "payload", "fired", "finished")

    def __init__(self, task: str, fire_at_ns: int, payload):
        self.task, self.fire_at_ns, self.payload = task, fire_at_ns, payload
        self.fired = self.finished = False


class Watchdog:
    """Answers for a decision still running at its deadline: an ONNX Runtime call cannot be
    interrupted, but it is no longer waited for. At `fire_at_ns` (the deadline minus the publish
    margin) `on_expire(job)` publishes the safe default; exactly one answer per job goes out -
    whichever of the worker (`finish` returns True) and the watchdog comes first; the late one is
    dropped and counted (`discarded`)."""

    def __init__(self, on_expire: Callable[[WatchJob], None]):
        self._on_expire = on_expire
        self._cv = threading.Condition()
        self._jobs: list[WatchJob] = []
        self._stop = False
        self.fired = self.discarded = 0
        self._thread = threading.Thread(target=self._run, name="sol_control-watchdog", daemon=True)
        self._thread.start()

    def begin(self, task: str, fire_at_ns: int, payload=None) -> WatchJob:
        job = WatchJob(task, fire_at_ns, payload)
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()
        return job

    def finish(self, job: WatchJob) -> bool:
        """True: the caller publishes its answer. False: the watchdog already answered."""
        with self._cv:
            if job in self._jobs:
                self._jobs.remove(job)
            job.finished = True
            if job.fired:
                self.discarded += 1
                return False
            return True

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._stop:
                    return
                now = time.monotonic_ns()
                due = [j for j in self._jobs if j.fire_at_ns <= now]
                for j in due:
                    self._jobs.remove(j)
                    j.fired = True
                    self.fired += 1
                if not due:
                    wait_s = min((j.fire_at_ns - now for j in self._jobs), default=100 * NS_PER_MS) / 1e9
                    self._cv.wait(timeout=wait_s)
                    continue
            for j in due:  # outside the lock: publishing must not block begin/finish
                try:
                    self._on_expire(j)
                except Exception:  # noqa: BLE001 - the watchdog itself must never die
                    pass

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=2.0)
