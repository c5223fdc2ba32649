"""The deadline guard: which planner's answer is published, and why (policy only).

    budget (from the sensor stamp) ──► fast planner, with the fast budget
        ok, in time, confident, inside limits, not covered by `policy` ─────► source=fast
        raised / over budget / bad tokens / unsure / outside limits / a policy rule (policy.py)
            └► full-precision planner, if its measured latency fits what is left
                   ok and inside limits ─────────────────────────────────────► source=full_precision
                   else ─────────────────────────────────────────────────────► source=safe_default
            └► it would not fit ─────────────────────────────────────────────► source=safe_default

Fast budget = the remaining budget (minus the publish margin) times `fast_share`, shortened further
to leave room for the full-precision planner when the deadline is long enough to hold both. A fast
path whose median recent latency does not fit its budget is not started (`fast_would_miss`), so a
late frame gets its fallback at once instead of after a doomed run. The full-precision planner runs
only if its measured p95 latency x `full_precision_safety` fits what is left.

Probes: a path skipped PROBE_EVERY decisions in a row runs anyway on the next one, within the same
budget as any run (counted in `probes`). A skipped run adds no sample, so without probes a model
that once said "too slow" would say so for good. A probe that finishes in time proves the samples
that skipped it stale: its latency model restarts from that run. Warm-up runs (made while the
nodes and the cell start on the same cores, often many times slower) seed a model only until its
first live run, so a slow start cannot outvote what the planner does now.
Nothing escapes `decide`: every exception becomes a `Failure` and a fallback. A decision says which
path made it, its latency and whether that met the deadline; whether it is still on time when it
leaves is the runner's to say, once, at publish (`decision.on_time_or_safe`).
"""
from __future__ import annotations

import math
import random
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from sol_control.actions import Action, ActionTokenizer, limit_violations, safe_default
from sol_control.budget import NS_PER_MS, Budget
from sol_control.config import NodeConfig
from sol_control.decision import Decision, Failure
from sol_control.planners import FastPlanner, FullPrecisionPlanner, PlanResult
from sol_control.policy import overruled, policy_failure

PROBE_EVERY = 8  # after this many skipped runs of a planner in a row, the next decision runs it (a probe)
MIN_FAST_SAMPLES = 8  # fewer measured fast runs than this: too few to judge, the fast path always runs
RUN, SKIP, PROBE = "run", "skip", "probe"  # what a gate says about one planner for one decision


class LatencyModel:
    """Measured latencies of a planner (ms); `estimate_ms` = a percentile of them times `safety`.

    Live runs (`add`) fill a window of the newest `window`; warm-up runs (`seed`) stand in only
    while there is no live run yet. `add(..., restart=True)` empties the window first (a probe
    finished in time where the window said it would not)."""

    def __init__(self, window: int = 64):
        self._ms: deque[float] = deque(maxlen=window)  # live runs (ms)
        self._seed_ms: deque[float] = deque(maxlen=window)  # warm-up runs (ms), used while _ms is empty
        self._lock = threading.Lock()

    def add(self, latency_ms: float, restart: bool = False) -> None:
        if math.isfinite(latency_ms) and latency_ms >= 0:
            with self._lock:
                if restart:
                    self._ms.clear()
                self._ms.append(latency_ms)

    def seed(self, latency_ms: float) -> None:
        """A warm-up run: counts until the first live run, then no more."""
        if math.isfinite(latency_ms) and latency_ms >= 0:
            with self._lock:
                self._seed_ms.append(latency_ms)

    @property
    def seeded(self) -> bool:
        """True while the estimate rests on warm-up runs only."""
        return not self._ms and bool(self._seed_ms)

    @property
    def count(self) -> int:
        """How many runs the estimate rests on (live ones, or the warm-up's before any)."""
        return len(self._ms) or len(self._seed_ms)

    def estimate_ms(self, safety: float = 1.0, q: float = 95.0) -> float:
        with self._lock:
            samples = self._ms or self._seed_ms
            if not samples:
                return math.inf  # never measured: assume it never fits
            return float(np.percentile(np.fromiter(samples, float), q)) * safety


def fast_budget(budget: Budget, cfg: NodeConfig, full_estimate_ms: float, fast_p95_ms: float = 0.0) -> Budget:
    """The fast path's share of `budget`: all that is left (minus the publish margin) x fast_share,
    minus a reserve for the full-precision planner when what remains still holds the fast path's
    p95 run (and at least min_fast_ms). Otherwise reserving would only starve the fast path: cut
    at its median (measured in the demo, grasp at 25 ms: 7 of 24 decisions), it overruns its
    share by a step, and then the reserve does not hold full precision either."""
    if budget.deadline_ns is None:
        return budget  # unlimited stays unlimited
    d = cfg.deadline
    now = budget.clock.now_ns()
    usable_ms = budget.remaining_ms(now) - d.publish_margin_ms
    fast_ms = usable_ms * d.fast_share
    if d.reserve_full_precision and usable_ms - full_estimate_ms >= max(d.min_fast_ms, fast_p95_ms):
        fast_ms = min(fast_ms, usable_ms - full_estimate_ms)
    return budget.until(now + int(max(fast_ms, 0.0) * NS_PER_MS))


@dataclass(frozen=True)
class Attempt:
    """One planner's try: its action, or why there is none (a failure). A fast answer the policy
    covers keeps its action and gets the rule as its failure."""

    action: Action | None
    failure: Failure | None
    ms: float
    result: PlanResult | None = None

    @property
    def acceptance(self) -> float:
        return self.result.acceptance if self.result is not None else math.nan

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self.result.tokens) if self.result is not None else ()


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
        self._fast_skipped_in_row = 0
        self._full_skipped_in_row = 0
        self.probes = {"fast": 0, "full_precision": 0}  # skipped paths run anyway (PROBE_EVERY)
        self.audit = audit
        self._rng = random.Random(0)

    # -- the decision ----------------------------------------------------------------------------
    def decide(self, prefix: np.ndarray, budget: Budget, stamp_ns: int, frame_id: str = "") -> Decision:
        cfg = self.config()
        self.tokenizer.uncertain_below = cfg.qc.uncertain_below if self.task == "qc" else 0.0

        def done(action: Action, source: str, fast: Attempt | None = None, **kw) -> Decision:
            latency_ms = budget.elapsed_ms()
            if fast is not None:
                kw.update(fast_ms=fast.ms, acceptance=fast.acceptance)
            return Decision(self.task, action, source, latency_ms, budget.total_ms, latency_ms <= budget.total_ms,
                            stamp_ns, frame_id, start_mono_ns=budget.start_ns, **kw)

        if budget.remaining_ms() <= cfg.deadline.publish_margin_ms:
            return done(safe_default(self.task), "safe_default", fast_failure=Failure("no_budget"))
        fast = self._try_fast(prefix, budget, cfg)
        if fast.action is not None:
            rule = policy_failure(fast.action, cfg.policy, cfg.limits)
            if rule is None:
                d = done(fast.action, "fast", fast, tokens=fast.tokens)
                self._maybe_audit(prefix, d, cfg)
                return d
            fast = replace(fast, failure=rule)  # full precision where it matters: same path as a fallback
        full_gate = self._full_gate(budget, cfg)
        if full_gate == SKIP:
            return done(safe_default(self.task), "safe_default", fast, fast_failure=fast.failure,
                        full_failure=Failure("full_precision_would_miss"))
        full = self._try_full(prefix, budget, cfg, probe=full_gate == PROBE)
        if full.action is None:
            return done(safe_default(self.task), "safe_default", fast, fast_failure=fast.failure,
                        full_failure=full.failure, full_ms=full.ms)
        changed = fast.action is not None and overruled(fast.action, full.action)
        return done(full.action, "full_precision", fast, fast_failure=fast.failure, full_ms=full.ms,
                    tokens=full.tokens, policy_overruled=changed)

    def _try_fast(self, prefix: np.ndarray, budget: Budget, cfg: NodeConfig) -> Attempt:
        clock = budget.clock
        t0 = clock.now_ns()
        res = None
        try:
            p95 = self.fast_latency.estimate_ms(q=95.0) if self.fast_latency.count >= MIN_FAST_SAMPLES else 0.0
            fb = fast_budget(budget, cfg, self._full_estimate(cfg), p95)
            if cfg.decoding.standard_only:
                action, failure = None, Failure("standard_only")
            elif fb.expired():
                action, failure = None, Failure("fast_no_budget")
            elif (gate := self._fast_gate(fb)) == SKIP:
                action, failure = None, Failure("fast_would_miss")  # not even its median run fits
            else:
                res = self.fast.plan(prefix, fb, cfg.fault_injection)
                if res.complete:  # finished within fb; a probe that did proves the window stale
                    self.fast_latency.add(res.latency_ms, restart=gate == PROBE)
                action, failure = self._accept(prefix, res, self._min_confidence(cfg), cfg, "fast")
        except Exception as e:  # noqa: BLE001 - the control loop never lets an error escape
            action, failure = None, Failure("fast_error", type(e).__name__)
        return Attempt(action, failure, (clock.now_ns() - t0) / NS_PER_MS, res)

    def _try_full(self, prefix: np.ndarray, budget: Budget, cfg: NodeConfig, probe: bool = False) -> Attempt:
        clock = budget.clock
        t0 = clock.now_ns()
        margin_ns = int(cfg.deadline.publish_margin_ms * NS_PER_MS)
        full_budget = budget if budget.deadline_ns is None else budget.until(budget.deadline_ns - margin_ns)
        res = None
        try:
            res = self.full.plan(prefix, full_budget, cfg.fault_injection)
            if res.complete:  # finished in time; a probe that did proves the window stale
                self.full_latency.add(res.latency_ms, restart=probe)
            action, failure = self._accept(prefix, res, self._full_min_confidence(cfg), cfg, "full_precision")
        except Exception as e:  # noqa: BLE001
            action, failure = None, Failure("full_precision_error", type(e).__name__)
        return Attempt(action, failure, (clock.now_ns() - t0) / NS_PER_MS, res)

    # -- checks ----------------------------------------------------------------------------------
    def _accept(self, prefix: np.ndarray, res: PlanResult, min_confidence: float, cfg: NodeConfig,
                stage: str) -> tuple[Action | None, Failure | None]:
        if not res.complete:
            return None, Failure(f"{stage}_over_budget")
        try:
            action = self.tokenizer.decode(res.tokens, res.probs, prefix)
        except ValueError:
            return None, Failure(f"{stage}_invalid_tokens")
        if action.confidence < min_confidence:
            return None, Failure(f"{stage}_low_confidence")
        if limit_violations(action, cfg.limits):
            return None, Failure(f"{stage}_limits")
        return action, None

    def _min_confidence(self, cfg: NodeConfig) -> float:
        return cfg.qc.min_confidence if self.task == "qc" else cfg.grasp.min_confidence

    def _full_min_confidence(self, cfg: NodeConfig) -> float:
        # QC: an unsure full-precision verdict is published as "uncertain" (manual check) instead;
        # grasp: an unsure full-precision grasp is not executed (hold).
        return 0.0 if self.task == "qc" else cfg.grasp.min_confidence

    def _fast_gate(self, fb: Budget) -> str:
        """SKIP when the fast path's median recent latency does not fit `fb`; every PROBE_EVERY-th
        such decision in a row is a PROBE instead (run within `fb`, so the model keeps learning
        when conditions improve). RUN when it fits, or too few runs are known to judge."""
        if self.fast_latency.count < MIN_FAST_SAMPLES or fb.fits(self.fast_latency.estimate_ms(q=50.0)):
            self._fast_skipped_in_row = 0
            return RUN
        self._fast_skipped_in_row += 1
        if self._fast_skipped_in_row < PROBE_EVERY:
            return SKIP
        self._fast_skipped_in_row = 0
        self.probes["fast"] += 1
        return PROBE

    def _full_gate(self, budget: Budget, cfg: NodeConfig) -> str:
        """SKIP when fp32's estimated latency does not fit what is left; every PROBE_EVERY-th such
        decision in a row is a PROBE instead (within the budget: an unfinished run is cut, labelled
        over budget and not measured), so an estimate inflated once (a slow warm-up under load)
        cannot keep fp32 off for good. RUN when it fits. Never measured: always SKIP."""
        if budget.fits(self._full_estimate(cfg) + cfg.deadline.publish_margin_ms):
            self._full_skipped_in_row = 0
            return RUN
        if self.full_latency.count == 0:
            return SKIP
        self._full_skipped_in_row += 1
        if self._full_skipped_in_row < PROBE_EVERY or budget.remaining_ms() <= cfg.deadline.publish_margin_ms:
            return SKIP
        self._full_skipped_in_row = 0
        self.probes["full_precision"] += 1
        return PROBE

    def _full_estimate(self, cfg: NodeConfig) -> float:
        return self.full_latency.estimate_ms(cfg.deadline.full_precision_safety)

    def _maybe_audit(self, prefix: np.ndarray, d: Decision, cfg: NodeConfig) -> None:
        if (self.audit is not None and d.source == "fast" and d.deadline_met and cfg.audit_rate > 0
                and self._rng.random() < cfg.audit_rate):  # a late one is published as the safe default
            self.audit(prefix, d)

    # -- warm-up ---------------------------------------------------------------------------------
    def measure_full(self, prefix: np.ndarray, budget: Budget | None = None) -> float:
        """One unbudgeted full-precision run (warm-up): seeds the latency model, returns ms."""
        res = self.full.plan(prefix, budget or Budget.unlimited(), self.config().fault_injection)
        self.full_latency.seed(res.latency_ms)
        return res.latency_ms

    def measure_fast(self, prefix: np.ndarray, budget: Budget | None = None) -> float:
        """One unbudgeted fast run (warm-up): seeds the fast path's latency model, returns ms.
        An injected delay applies as in `measure_full`; an injected raise does not (warm-up times)."""
        faults = self.config().fault_injection.model_copy(update={"fast_raise": False})
        res = self.fast.plan(prefix, budget or Budget.unlimited(), faults)
        self.fast_latency.seed(res.latency_ms)
        return res.latency_ms
