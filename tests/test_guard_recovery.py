"""The guard recovers from a slow start: latency models seeded 10x too slow by a warm-up on a loaded
host (both nodes and the cell starting on the same cores) give the path back within RECOVERY_FRAMES
frames, and keep it.

The real coprocessor (shipped QC bundle, real perception and ONNX Runtime), its deadline guard and
the per-task runner that relabels and publishes, on a ManualClock: the clock stands still while the
models run and moves only by the delays injected inside the planners (fault_injection), so a planner
"taking 3 ms" takes exactly 3 ms of budget, on any machine.
"""
from __future__ import annotations

import pytest

from sol_control.budget import ManualClock
from sol_control.config import from_flat
from sol_control.coprocessor import Coprocessor
from sol_control.guard import PROBE_EVERY
from sol_control.runner import TaskRunner
from sol_control.tasks.qc import make_sample
from sol_control.telemetry import Frame, Telemetry
from tests.conftest import bundle_dir

# The skipped path runs as a probe on the PROBE_EVERY-th frame in a row; finished in time, it answers
# that frame and restarts its latency model, so it answers every frame from then on.
RECOVERY_FRAMES = PROBE_EVERY
FRAMES = 3 * PROBE_EVERY
DEADLINE_MS = 20.0  # the QC deadline; 1 ms of it is the publish margin
FAST_MS, FULL_MS = 3.0, 12.0  # what the planners take now (fp32: 12 x 1.2 safety + 1 fits 20)
SLOW_START = 10.0  # the warm-up ran this many times slower


def start(clock: ManualClock, fast_ms: float, full_ms: float) -> Coprocessor:
    """A QC coprocessor warmed up (8 runs a planner) with the planners taking fast_ms / full_ms."""
    cfg = from_flat({"mode": "qc", "qc.bundle": str(bundle_dir("qc")), "audit_rate": 0.0, "qc.min_confidence": 0.0,
                     "deadline.qc_ms": DEADLINE_MS, "decoding.backend": "onnxruntime",  # timing is the clock's
                     "fault_injection.fast_delay_ms": fast_ms,
                     "fault_injection.full_delay_ms": full_ms})
    cop = Coprocessor(cfg, clock=clock)
    cop.warmup()
    return cop


def run_frames(cop: Coprocessor, clock: ManualClock, n: int, **faults) -> list:
    """Set the planners' live timing (`faults`), then decide `n` fresh frames through the runner."""
    cop.set_config(from_flat({f"fault_injection.{k}": v for k, v in faults.items()}, base=cop.config()))
    published = []
    runner = TaskRunner("qc", cop, published.append, clock=clock)
    runner.arm(watchdog_thread=False)
    for i in range(n):
        clock.advance_ms(50.0)  # the next part; each frame is decided as it arrives
        runner.decide(Telemetry(Frame(make_sample("test", i).image, 1000 + i, clock.now_ns(), "qc_camera")))
    assert len(published) == n
    return published


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()


def test_fast_path_seeded_10x_slow_returns_within_recovery_frames(clock):
    """Warm-up: fast 30 ms, fp32 120 ms, neither fits 20 ms. Now the fast path takes 3 ms: the first
    RECOVERY_FRAMES - 1 frames go out as labelled safe defaults, frame RECOVERY_FRAMES (the probe)
    and every later one from the fast path, all on time."""
    cop = start(clock, SLOW_START * FAST_MS, SLOW_START * FULL_MS)
    try:
        out = run_frames(cop, clock, FRAMES, fast_delay_ms=FAST_MS, full_delay_ms=FULL_MS)
        skipped, recovered = out[:RECOVERY_FRAMES - 1], out[RECOVERY_FRAMES - 1:]
        assert {d.reason for d in skipped} == {"fast_would_miss>full_precision_would_miss"}
        assert [d.source for d in recovered] == ["fast"] * len(recovered), [d.reason for d in out]
        assert all(d.deadline_met for d in out) and {d.fast_ms for d in recovered} == {FAST_MS}
        stats = cop.stats()["qc"]
        assert stats["fast_probes"] == 1 and stats["fast_p50_ms"] == FAST_MS
        assert stats["latency_models_from_warmup"] == 1  # fp32 was never needed again: still its warm-up
    finally:
        cop.close()


def test_full_precision_seeded_10x_slow_returns_within_recovery_frames(clock):
    """Warm-up: fp32 120 ms. Now the fast path fails every frame and fp32 takes 12 ms: after
    RECOVERY_FRAMES - 1 labelled safe defaults, fp32 answers the probe frame and every later one."""
    cop = start(clock, FAST_MS, SLOW_START * FULL_MS)
    try:
        out = run_frames(cop, clock, FRAMES, fast_raise=True, fast_delay_ms=0.0, full_delay_ms=FULL_MS)
        skipped, recovered = out[:RECOVERY_FRAMES - 1], out[RECOVERY_FRAMES - 1:]
        assert {d.reason for d in skipped} == {"fast_error:InjectedFault>full_precision_would_miss"}
        assert [d.source for d in recovered] == ["full_precision"] * len(recovered), [d.reason for d in out]
        assert all(d.deadline_met for d in out) and {d.full_ms for d in recovered} == {FULL_MS}
        assert cop.stats()["qc"]["full_precision_probes"] == 1
    finally:
        cop.close()


def test_a_probe_that_overruns_goes_out_labelled_and_teaches_nothing(clock):
    """Still too slow (fast 25 ms for a 20 ms deadline): the probe runs within its budget, overruns,
    and its frame is published as the labelled safe default, late; the warm-up estimate stays."""
    cop = start(clock, SLOW_START * FAST_MS, SLOW_START * FULL_MS)
    try:
        out = run_frames(cop, clock, RECOVERY_FRAMES, fast_delay_ms=25.0, full_delay_ms=FULL_MS)
        probe = out[-1]
        assert [d.source for d in out] == ["safe_default"] * RECOVERY_FRAMES
        assert probe.reason == "fast_over_budget>full_precision_would_miss" and not probe.deadline_met
        assert probe.latency_ms == 25.0 and probe.fast_ms == 25.0
        guard = cop.pipelines["qc"].guard
        assert guard.probes["fast"] == 1 and guard.fast_latency.seeded
    finally:
        cop.close()
