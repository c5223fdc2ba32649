"""Deadline guard on real ONNX Runtime sessions (tests/fixtures/tiny): which planner's answer is
published, and why. Time comes from a ManualClock: it stands still while ONNX Runtime runs and
moves only by the delays injected inside a planner (fault_injection), so every budget outcome is
exact and independent of the machine. The planners' outputs are always real, never faked."""
import math
from dataclasses import replace

import numpy as np
import pytest

from sol_control.actions import ActionTokenizer
from sol_control.audit import Auditor
from sol_control.budget import Budget, ManualClock
from sol_control.bundle import ActionField, Bundle
from sol_control.config import NodeConfig, from_flat
from sol_control.decision import Decision, Failure, on_time_or_safe
from sol_control.decoding import greedy
from sol_control.guard import PROBE_EVERY, DeadlineGuard, LatencyModel, fast_budget
from sol_control.planners import FastPlanner, FullPrecisionPlanner
from tests.conftest import FIXTURES
from tests.waiting import wait_for

VOCAB = 48
QC_LABELS = ("ok", "scratch", "crack", "missing_hole", "discoloration", "deformed")


def _fields(task: str) -> tuple[ActionField, ...]:
    """Fields spanning the fixture's whole vocabulary so the random model's tokens decode."""
    if task == "qc":
        labels = QC_LABELS + tuple(f"other{i}" for i in range(VOCAB - len(QC_LABELS)))
        out = [ActionField(name="defect", kind="categorical", token_offset=0, size=VOCAB, labels=labels)]
        names, lo, hi = ("u", "v", "severity"), 0.0, 1.0
    else:
        out = []
        names = ("x", "y", "z", "yaw", "width", "force") + tuple(f"a{i}_{c}" for i in (1, 2, 3) for c in "xyz")
        lo, hi = 0.0, 0.04
    out += [ActionField(name=n, kind="bins", token_offset=0, size=VOCAB, low=lo, high=hi) for n in names]
    return tuple(out)


PREFIX = np.array([1, 5, 9, 17, 23, 31, 3], np.int64)


class Cfg:
    """The live config the guard reads, swappable like the node's."""

    def __init__(self, **flat):
        self.value = from_flat(flat)

    def __call__(self) -> NodeConfig:
        return self.value


@pytest.fixture(scope="module")
def bundle():
    return Bundle.load(FIXTURES / "tiny")


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()


def budget(clock: ManualClock, ms: float | None) -> Budget:
    return Budget.unlimited(clock) if ms is None else Budget.after_ms(ms, clock=clock)


def make_guard(bundle, task: str, cfg: Cfg, clock: ManualClock, measure: bool = True) -> DeadlineGuard:
    tok = ActionTokenizer(task, _fields(task))
    dec = cfg().decoding
    g = DeadlineGuard(task, FastPlanner(bundle, tok.n_tokens, dec), FullPrecisionPlanner(bundle, tok.n_tokens, dec),
                      tok, cfg)
    if measure:
        for _ in range(5):
            g.measure_full(PREFIX, budget(clock, None))
    return g


def test_fast_path_answers_and_matches_plain_greedy(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 5000.0})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=123, frame_id="cam")
    assert d.source == "fast" and d.reason == "" and d.fast_failure is None and d.deadline_met
    assert d.stamp_ns == 123 and d.frame_id == "cam" and d.latency_ms == 0.0 and d.deadline_ms == 5000.0
    # the int8 target with a draft is lossless w.r.t. plain greedy on the same int8 target
    ref = greedy(g.fast.target, PREFIX, 4)
    assert list(d.tokens) == ref.tokens
    # exact mode: the same numeric path, so the same probabilities
    assert d.action.confidence == pytest.approx(ref.probs[0], abs=1e-6)  # QC: the defect token


def test_slow_fast_path_falls_back_to_full_precision(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 600.0, "deadline.fast_share": 0.5,
                 "fault_injection.fast_delay_ms": 400.0})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 600.0), stamp_ns=1)
    # the fast path had (600 - 1 margin) x 0.5 = 299.5 ms and slept 400: over budget
    assert d.source == "full_precision" and d.reason == "fast_over_budget"
    assert d.fast_failure == Failure("fast_over_budget") and d.full_failure is None
    assert d.fast_ms == 400.0 and d.latency_ms == 400.0 and d.deadline_met
    assert list(d.tokens) == greedy(g.full.target, PREFIX, 4).tokens


def test_impossible_deadline_gives_safe_default(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 0.05})
    g = make_guard(bundle, "qc", cfg, clock)
    calls = g.fast.target.calls + g.full.target.calls
    d = g.decide(PREFIX, budget(clock, 0.05), stamp_ns=1)
    assert d.source == "safe_default" and d.action.verdict == "uncertain" and d.action.defect == "unknown"
    assert d.reason == "no_budget"  # 0.05 ms left is less than the 1 ms publish margin
    assert g.fast.target.calls + g.full.target.calls == calls  # no model ran


def test_fast_path_exception_is_a_reason_not_a_crash(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 5000.0, "fault_injection.fast_raise": True})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert d.source == "full_precision" and d.reason == "fast_error:InjectedFault"
    assert d.fast_failure == Failure("fast_error", "InjectedFault")


def test_unmeasured_or_slow_full_precision_gives_safe_default(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 150.0, "fault_injection.fast_raise": True})
    g = make_guard(bundle, "qc", cfg, clock, measure=False)  # no measurement yet: assume it never fits
    d = g.decide(PREFIX, budget(clock, 150.0), stamp_ns=1)
    assert d.source == "safe_default" and d.reason == "fast_error:InjectedFault>full_precision_would_miss"
    assert d.full_failure == Failure("full_precision_would_miss")
    cfg.value = from_flat({"fault_injection.full_delay_ms": 200.0}, base=cfg.value)
    assert g.measure_full(PREFIX, budget(clock, None)) == 200.0  # the latency model now holds a 200 ms run
    cfg.value = from_flat({"fault_injection.full_delay_ms": 0.0}, base=cfg.value)
    assert g.full_latency.estimate_ms() == 200.0
    d = g.decide(PREFIX, budget(clock, 150.0), stamp_ns=1)
    assert d.source == "safe_default" and d.reason.endswith("full_precision_would_miss")
    assert d.deadline_met and d.latency_ms == 0.0  # the safe default itself is published at once


def test_low_confidence_goes_to_full_precision_and_qc_becomes_uncertain(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 1.0, "qc.uncertain_below": 1.0, "deadline.qc_ms": 5000.0})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert d.source == "full_precision" and d.reason == "fast_low_confidence"
    assert d.action.verdict == "uncertain"  # unsure at full precision too: manual inspection


def test_grasp_outside_limits_is_never_published(bundle, clock):
    # every decoded value lies in [0, 0.04]; a workspace of x <= -0.05 m excludes all of them
    cfg = Cfg(**{"grasp.min_confidence": 0.0, "deadline.grasp_ms": 5000.0, "limits.x_min_m": -0.1,
                 "limits.x_max_m": -0.05})
    g = make_guard(bundle, "grasp", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert d.source == "safe_default" and d.reason == "fast_limits>full_precision_limits"
    assert d.action.hold
    cfg.value = from_flat({"limits.x_min_m": -0.1, "limits.x_max_m": 0.1}, base=cfg.value)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert d.source == "fast" and not d.action.hold


def test_fast_budget_reserves_room_for_full_precision(clock):
    cfg = from_flat({"deadline.publish_margin_ms": 0.0, "deadline.min_fast_ms": 2.0})
    b = budget(clock, 100.0)
    assert fast_budget(b, cfg, 30.0).remaining_ms() == 70.0
    assert fast_budget(b, cfg, 99.5).remaining_ms() == 100.0  # no room for both: all of it
    # a reserve that would leave less than the fast path's p95 run is not taken
    assert fast_budget(b, cfg, 30.0, fast_p95_ms=80.0).remaining_ms() == 100.0
    half = from_flat({"deadline.fast_share": 0.5, "deadline.publish_margin_ms": 0.0})
    assert fast_budget(b, half, math.inf).remaining_ms() == 50.0
    clock.advance_ms(40.0)  # the share is of what is left
    assert fast_budget(b, half, math.inf).remaining_ms() == 30.0


def test_latency_model():
    m = LatencyModel(window=10)
    assert m.estimate_ms() == math.inf
    for x in range(1, 11):
        m.add(float(x))
    m.add(math.nan)
    assert m.count == 10 and 9.0 <= m.estimate_ms() <= 10.0 and m.estimate_ms(2.0) >= 18.0


def test_warm_up_runs_stand_in_only_until_the_first_live_run():
    """Warm-up runs (seed) made on a loaded start may be 10x slow: they give the estimate while
    nothing live is known, and none of it once one live run is (they would outvote it for 56 runs)."""
    m = LatencyModel(window=64)
    for _ in range(8):
        m.seed(30.0)
    assert m.seeded and m.count == 8 and m.estimate_ms(q=50.0) == 30.0
    m.add(3.0)
    assert not m.seeded and m.count == 1 and m.estimate_ms(q=50.0) == m.estimate_ms() == 3.0
    m.seed(30.0)  # a later warm-up does not outvote live runs either
    assert m.count == 1 and m.estimate_ms() == 3.0


def test_a_restart_keeps_only_the_run_that_proved_the_window_stale():
    m = LatencyModel(window=64)
    for _ in range(64):
        m.add(1000.0)  # a live window full of slow runs (a load burst)
    m.add(3.0, restart=True)  # a probe finished in 3 ms where the window said 1000
    assert m.count == 1 and m.estimate_ms() == 3.0


def test_shadow_audit_runs_in_background_and_agrees(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 5000.0, "audit_rate": 1.0,
                 "decoding.fast_precision": "int8"})
    tok = ActionTokenizer("qc", _fields("qc"))
    auditor = Auditor(FullPrecisionPlanner(bundle, 4, cfg().decoding, tag="-audit"), ActionTokenizer("qc", _fields("qc")))
    try:
        g = DeadlineGuard("qc", FastPlanner(bundle, 4, cfg().decoding), FullPrecisionPlanner(bundle, 4, cfg().decoding),
                          tok, cfg, audit=auditor.submit)
        g.measure_full(PREFIX, budget(clock, None))
        d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
        assert d.source == "fast"
        assert wait_for(lambda: auditor.audited, 30.0)  # the audit thread's answer
        assert auditor.audited == 1 and auditor.errors == 0
        fp32 = greedy(g.full.target, PREFIX, 4).tokens
        assert auditor.token_identical == int(list(d.tokens) == fp32)
    finally:
        auditor.close()


def test_fast_path_that_cannot_fit_is_not_started(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 100.0})
    g = make_guard(bundle, "qc", cfg, clock, measure=False)
    for _ in range(8):
        g.fast_latency.add(1000.0)  # as if every recent fast run took a second
    calls = g.fast.target.calls
    d = g.decide(PREFIX, budget(clock, 100.0), stamp_ns=1)
    assert d.source == "safe_default" and d.reason == "fast_would_miss>full_precision_would_miss"
    assert d.deadline_met and g.fast.target.calls == calls  # answered without running the fast path
    # it keeps probing: the PROBE_EVERY-th decision in a row runs the fast path (a probe, counted)
    reasons = [g.decide(PREFIX, budget(clock, 100.0), stamp_ns=1).reason for _ in range(PROBE_EVERY - 1)]
    assert all(r.startswith("fast_would_miss") for r in reasons[:-1]) and reasons[-1] == "", reasons
    assert g.probes == {"fast": 1, "full_precision": 0} and g.fast.target.calls > calls
    # it finished in time (0 ms here): the slow window was stale and restarts from the probe's run
    assert g.fast_latency.count == 1 and g.fast_latency.estimate_ms() == 0.0
    assert g.decide(PREFIX, budget(clock, 100.0), stamp_ns=1).source == "fast"


def test_late_answers_become_labelled_safe_defaults():
    from sol_control.actions import QCVerdict

    start = 1_000_000_000
    d = Decision("qc", QCVerdict("crack", "reject", 0.2, 0.3, 0.4, 0.9), "fast", 5.0, 10.0, True, 1,
                 tokens=(1, 2, 3, 4), start_mono_ns=start)
    on_time = on_time_or_safe(d, now_ns=start + 8_000_000)
    assert on_time.source == "fast" and on_time.deadline_met and on_time.latency_ms == 8.0
    late = on_time_or_safe(d, now_ns=start + 12_000_000)
    assert late.source == "safe_default" and late.reason == "fast_late" and not late.deadline_met
    assert late.action.verdict == "uncertain" and late.latency_ms == 12.0 and late.tokens == ()
    assert not on_time_or_safe(d, now_ns=start + 9_500_000, margin_ms=1.0).deadline_met  # 9.5 + 1 > 10
    full = replace(d, source="full_precision", fast_failure=Failure("fast_over_budget"))
    assert on_time_or_safe(full, now_ns=start + 12_000_000).reason == "fast_over_budget>full_precision_late"
    safe = replace(d, source="safe_default", fast_failure=Failure("no_budget"))
    assert on_time_or_safe(safe, now_ns=start + 12_000_000).reason == "no_budget"  # already safe: kept


def test_planner_finishing_after_the_deadline_is_not_published_as_its_answer(bundle, clock):
    # the fast path gets all of a 150 ms budget but sleeps 200 ms first, then decodes with the
    # budget gone; whatever it returns comes after the deadline: safe default, labelled late
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 150.0, "fault_injection.fast_delay_ms": 200.0})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 150.0), stamp_ns=1)
    assert d.source == "safe_default" and not d.deadline_met and d.latency_ms == 200.0


def test_unlimited_budget_runs_the_fallback_chain(bundle, clock):
    cfg = Cfg(**{"qc.min_confidence": 0.0, "fault_injection.fast_raise": True})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, None), stamp_ns=1)
    assert d.source == "full_precision" and d.reason == "fast_error:InjectedFault" and d.deadline_met


def test_an_inflated_full_precision_estimate_is_probed_within_the_budget(bundle, clock):
    # one slow warm-up run (500 ms) keeps fp32 "too slow" for a 100 ms deadline; without a probe it
    # would never run again, so its estimate could never come down
    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 100.0, "fault_injection.fast_raise": True})
    g = make_guard(bundle, "qc", cfg, clock, measure=False)
    cfg.value = from_flat({"fault_injection.full_delay_ms": 500.0}, base=cfg.value)
    g.measure_full(PREFIX, budget(clock, None))
    cfg.value = from_flat({"fault_injection.full_delay_ms": 0.0}, base=cfg.value)
    sources = [g.decide(PREFIX, budget(clock, 100.0), stamp_ns=1).source for _ in range(PROBE_EVERY)]
    assert sources == ["safe_default"] * (PROBE_EVERY - 1) + ["full_precision"]
    assert g.probes == {"fast": 0, "full_precision": 1}
    # the probe finished within its budget and was measured; the warm-up run no longer counts
    assert g.full_latency.count == 1 and not g.full_latency.seeded and g.full_latency.estimate_ms() == 0.0
    # a run that cannot finish in its budget gives the labelled safe default and is not measured
    cfg.value = from_flat({"fault_injection.full_delay_ms": 150.0}, base=cfg.value)
    last = g.decide(PREFIX, budget(clock, 100.0), stamp_ns=1)
    assert last.source == "safe_default" and last.reason == "fast_error:InjectedFault>full_precision_over_budget"
    assert g.full_latency.count == 1


class DecisionsKeepStarting:
    """A DecidingGate whose waits end at once, but a decision is always in progress by then."""

    busy = True

    def wait_idle(self, timeout_s: float) -> bool:
        return True


def test_the_shadow_audit_runs_only_while_no_decision_is_in_progress(bundle, clock):
    """A decision in progress (the runner's gate) stops the audit's decoding: nothing is counted and
    it starts over later; given up after AUDIT_TRIES starts (skipped). Idle, it audits."""
    from sol_control.audit import AUDIT_TRIES, DecidingGate

    cfg = Cfg(**{"qc.min_confidence": 0.0, "deadline.qc_ms": 5000.0, "decoding.fast_precision": "int8"})
    tok = ActionTokenizer("qc", _fields("qc"))
    g = DeadlineGuard("qc", FastPlanner(bundle, 4, cfg().decoding), FullPrecisionPlanner(bundle, 4, cfg().decoding),
                      tok, cfg)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    gate = DecidingGate()
    auditor = Auditor(FullPrecisionPlanner(bundle, 4, cfg().decoding, tag="-audit"), tok, gate)
    try:
        calls = auditor.full.target.calls
        gate.enter()
        assert not auditor._audit(PREFIX, d) and auditor.audited == 0  # its prefill, then no step
        assert auditor.full.target.calls - calls == 1
        gate.leave()
        assert auditor._audit(PREFIX, d) and auditor.audited == 1 and auditor.skipped == 0
        auditor.gate = DecisionsKeepStarting()
        auditor._audit_when_idle(PREFIX, d)
        assert auditor.audited == 1 and auditor.skipped == 1
        assert auditor.full.target.calls - calls == 1 + 4 + AUDIT_TRIES  # 4 tokens: a prefill and 3 steps
        auditor.gate = gate  # the thread: a sample taken during a decision is audited after it
        gate.enter()
        auditor.submit(PREFIX, d)
        gate.leave()
        assert wait_for(lambda: auditor.audited > 1, 30.0)  # the audit thread's answer
        assert auditor.audited == 2 and auditor.errors == 0
    finally:
        auditor.close()
