"""The per-task worker loop (sol_control.runner) on the shipped QC bundle, with real perception and
ONNX Runtime, timed by a ManualClock: exactly one answer per frame, stale frames rejected, the
watchdog answering a stalled decision at its deadline, errors becoming labelled safe defaults, and
the sensor timeout - all without a wall-clock window."""
from __future__ import annotations

import pytest

from sol_control.audit import DecidingGate
from sol_control.budget import ManualClock
from sol_control.config import from_flat
from sol_control.coprocessor import Coprocessor
from sol_control.decision import Failure
from sol_control.runner import CountingHooks, TaskRunner, Watchdog
from sol_control.tasks.qc import make_sample
from sol_control.telemetry import Frame, Telemetry
from tests.conftest import bundle_dir

NS_PER_MS = 1_000_000


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def cop(clock):
    cfg = from_flat({"mode": "qc", "qc.bundle": str(bundle_dir("qc")), "audit_rate": 0.0, "qc.min_confidence": 0.0,
                     "deadline.qc_ms": 20.0, "deadline.sensor_timeout_ms": 1000.0, "decoding.warmup_runs": 2})
    c = Coprocessor(cfg, clock=clock)
    c.warmup()
    yield c
    c.close()


class Hooks(CountingHooks):
    """Counts like the soak does, and records the sensor-timeout state."""

    def __init__(self):
        super().__init__()
        self.timeouts: list[bool] = []

    def sensor_timeout(self, active: bool) -> None:
        self.timeouts.append(active)


def make_runner(cop, clock) -> tuple[TaskRunner, list, Hooks]:
    published, hooks = [], Hooks()
    runner = TaskRunner("qc", cop, published.append, hooks, clock)
    runner.arm(watchdog_thread=False)  # the test fires the watchdog itself
    return runner, published, hooks


def frame(clock: ManualClock, age_ms: float = 0.0, i: int = 0) -> Telemetry:
    start = clock.now_ns() - int(age_ms * NS_PER_MS)
    return Telemetry(Frame(make_sample("test", i).image, 1000 + i, start, "qc_camera"))


class Slowed:
    """The real coprocessor, but `before_step` runs first inside each step (the test moves the clock
    there, as a slow decision would)."""

    def __init__(self, cop, before_step):
        self.cop, self.before_step = cop, before_step
        self.gate = cop.gate

    def config(self):
        return self.cop.config()

    def step(self, telemetry, task=None):
        self.before_step()
        return self.cop.step(telemetry, task=task)


def test_one_frame_one_labelled_answer(cop, clock):
    runner, published, hooks = make_runner(cop, clock)
    runner.decide(frame(clock, age_ms=3.0))
    assert len(published) == 1 and not hooks.rejected and hooks.errors == 0
    d = published[0]
    assert d.source == "fast" and d.deadline_met and d.latency_ms == 3.0 and d.stamp_ns == 1000
    assert d.cpu_ms > 0 and d.perception_ms == 0.0  # the clock stood still; the thread's CPU did not
    assert runner.watchdog.fired == 0 and runner.watchdog.discarded == 0


def test_stale_frames_are_rejected_not_decided(cop, clock):
    runner, published, hooks = make_runner(cop, clock)
    runner.decide(frame(clock, age_ms=100.5))  # max_staleness_ms is 100
    assert published == [] and hooks.rejected == {"stale": 1}


def test_watchdog_answers_a_stalled_decision_once(cop, clock):
    published, hooks = [], Hooks()

    def stall():  # the decision is still running when its deadline (20 ms - 1 ms margin) passes
        clock.advance_ms(19.0)
        assert runner.watchdog.fire_due() == 1

    runner = TaskRunner("qc", Slowed(cop, stall), published.append, hooks, clock)
    runner.arm(watchdog_thread=False)
    runner.decide(frame(clock))
    assert len(published) == 1, published  # the watchdog's answer; the worker's late one is dropped
    d = published[0]
    assert d.source == "safe_default" and d.fast_failure == Failure("watchdog") and d.reason == "watchdog"
    assert d.latency_ms == 19.0 and d.deadline_met  # 19 ms + the 1 ms publish margin: on time
    assert runner.watchdog.fired == 1 and runner.watchdog.discarded == 1


def test_watchdog_stays_quiet_for_a_finished_job(clock):
    fired = []
    w = Watchdog(fired.append, clock, thread=False)
    t0 = clock.now_ns()
    stalled = w.begin("qc", t0 + 50 * NS_PER_MS, payload="frame-1")
    quick = w.begin("grasp", t0 + 50 * NS_PER_MS, payload="frame-2")
    assert w.finish(quick)  # done in time: the worker publishes
    clock.advance_ms(49.9)
    assert w.fire_due() == 0 and fired == []
    clock.advance_ms(0.1)
    assert w.fire_due() == 1 and [j.payload for j in fired] == ["frame-1"]
    assert not w.finish(stalled)  # the stalled planner's late answer is dropped
    assert w.fired == 1 and w.discarded == 1 and w.fire_due() == 0


def test_a_watchdog_answer_that_fails_is_counted(clock):
    def broken(job):
        raise RuntimeError("publisher gone")

    w = Watchdog(broken, clock, thread=False)
    w.begin("qc", clock.now_ns())
    assert w.fire_due() == 1 and w.errors == 1


def test_a_failing_step_becomes_a_labelled_safe_default(cop, clock):
    class Broken:  # the collaborator fails; the runner under test must answer anyway
        gate = DecidingGate()

        def config(self):
            return cop.config()

        def step(self, telemetry, task=None):
            raise RuntimeError("session lost")

    published, hooks = [], Hooks()
    runner = TaskRunner("qc", Broken(), published.append, hooks, clock)
    runner.decide(frame(clock))
    assert len(published) == 1 and hooks.errors == 1
    assert published[0].source == "safe_default" and published[0].reason == "internal_error:RuntimeError"


def test_sensor_timeout_publishes_safe_defaults_until_frames_return(cop, clock):
    runner, published, hooks = make_runner(cop, clock)
    clock.advance_ms(999.0)
    runner.check_sensor_timeout()
    assert published == []
    clock.advance_ms(1.0)
    runner.check_sensor_timeout()
    runner.check_sensor_timeout()  # once per timeout, not per check
    assert [d.reason for d in published] == ["sensor_timeout"] and hooks.timeouts == [True]
    clock.advance_ms(1000.0)
    runner.check_sensor_timeout()
    assert len(published) == 2 and hooks.timeouts == [True]
    runner.decide(frame(clock))
    assert published[-1].source == "fast" and hooks.timeouts == [True, False]


def test_a_decision_is_in_progress_from_its_frame_to_its_answer(cop, clock):
    """The runner marks each decision on its coprocessor's gate (the shadow audit waits for it) until
    the answer is published, and clears it even when the step fails."""
    gate, seen = cop.gate, []
    runner = TaskRunner("qc", Slowed(cop, lambda: seen.append(("step", gate.busy))),
                        lambda d: seen.append(("publish", gate.busy)), Hooks(), clock)
    assert runner.gate is gate
    runner.decide(frame(clock))
    assert seen == [("step", True), ("publish", True)] and not gate.busy
    assert gate.wait_idle(timeout_s=0.0)

    def fail():
        raise RuntimeError("session lost")

    TaskRunner("qc", Slowed(cop, fail), seen.append, Hooks(), clock).decide(frame(clock))
    assert seen[-1].source == "safe_default" and not gate.busy
