"""The soak in lock step: both shipped bundles behind the node's worker loop (`runner.TaskRunner`),
one frame at a time on a ManualClock, a few hundred frames per task, with stalls, late answers and
stale frames mixed in. What the minute-long soak showed is checked frame by frame here: every frame
gets exactly one answer (or one counted rejection), every answer is on time or labelled a safe
default, and memory in use does not grow with the decisions. The timed run (load, p99 drift,
resident memory) is a benchmark: `sol-control soak --minutes 10`.

Memory in use, not resident size: glibc keeps freed pages, so a leak can reuse what an earlier
test freed and leave RSS flat. The heap's bytes in use (mallinfo2, every arena) and Python's
allocated blocks grow with a leak whatever was freed before.
"""
from __future__ import annotations

import ctypes
import gc
import sys
from collections import Counter

import numpy as np
import pytest

from sol_control.budget import ManualClock
from sol_control.config import from_flat
from sol_control.coprocessor import Coprocessor
from sol_control.runner import CountingHooks, TaskRunner
from sol_control.telemetry import Frame, Joints, Telemetry
from tests.conftest import bundle_dir

NS_PER_MS = 1_000_000
DEADLINE_MS = 20.0
WARMUP = 30  # decisions per task before the first memory sample
FRAMES = 160  # frames per task after warm-up
POOL = 16  # distinct test-split scenes per task, cycled
LEAK_KB_PER_DECISION = 4.0  # heap growth the check tolerates: under 2 MB over a run
LEAK_BLOCKS_PER_DECISION = 4.0  # Python objects: the test's own per-frame counter takes one
STALE_EVERY, LATE_EVERY, STALL_EVERY = 11, 7, 13  # frame i is stale / answered late / stalled when i % k == k - 1


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _Mallinfo2


def in_use() -> tuple[float, int]:
    """(kB of heap in use: malloc'd chunks of every arena + mmapped chunks, Python's allocated blocks)."""
    gc.collect()
    info = _libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 1024, sys.getallocatedblocks()


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def cop(clock):
    cfg = from_flat({"mode": "both", "qc.bundle": str(bundle_dir("qc")), "grasp.bundle": str(bundle_dir("grasp")),
                     "audit_rate": 0.0, "qc.min_confidence": 0.0, "decoding.warmup_runs": 2,
                     "deadline.qc_ms": DEADLINE_MS, "deadline.grasp_ms": DEADLINE_MS,
                     "deadline.max_staleness_ms": 100.0, "deadline.sensor_timeout_ms": 60000.0})
    c = Coprocessor(cfg, clock=clock)
    c.warmup()
    yield c
    c.close()


def scenes(task: str) -> list[tuple[np.ndarray, np.ndarray | None]]:
    if task == "qc":
        from sol_control.tasks.qc import make_sample

        return [(make_sample("test", i).image, None) for i in range(POOL)]
    from sol_control.tasks.grasp import make_sample

    return [(s.image, s.joints_rad) for s in (make_sample("test", i) for i in range(POOL))]


class LockStep:
    """One task's runner fed one frame at a time. Frame i's stamp is i. A frame is stale (older than
    max_staleness_ms when its turn comes), stalled (still running at its deadline: the watchdog
    answers), answered late (the planner returns past the deadline) or plain."""

    def __init__(self, cop, clock: ManualClock, task: str, keep_kb_per_decision: int = 0, keep=None):
        self.cop, self.clock, self.task = cop, clock, task
        self.scenes = scenes(task)
        self.gate = cop.gate
        self.hooks = CountingHooks()
        self.runner = TaskRunner(task, self, self.on_decision, self.hooks, clock)
        self.runner.arm(watchdog_thread=False)  # fired by the clock, in `step`
        self.answers: Counter[int] = Counter()  # stamp -> answers published
        self.sources: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.mislabelled: list[tuple] = []
        self.kept: list[bytes] = []  # the leak check's own check: kept alive on purpose
        self.keep_kb = keep_kb_per_decision
        self.keep = keep  # called with every decision (the object check's own check)
        self.offered = 0
        self._kind = "plain"

    # the coprocessor as the runner sees it, with the clock moved inside the step
    def config(self):
        return self.cop.config()

    def step(self, telemetry, task=None):
        if self._kind == "stalled":
            self.clock.advance_ms(DEADLINE_MS)
            assert self.runner.watchdog.fire_due() == 1
        d = self.cop.step(telemetry, task=task)
        if self._kind == "late":
            self.clock.advance_ms(DEADLINE_MS)
        return d

    def on_decision(self, d) -> None:
        self.answers[d.stamp_ns] += 1
        self.sources[d.source] += 1
        self.reasons[d.reason.split(":")[0]] += 1
        margin_ms = self.cop.config().deadline.publish_margin_ms
        on_time = d.latency_ms + margin_ms <= d.deadline_ms
        if d.deadline_met != on_time or not (d.deadline_met or d.source == "safe_default"):
            self.mislabelled.append((d.stamp_ns, d.source, d.reason, d.latency_ms, d.deadline_met))
        if self.keep_kb:
            self.kept.append(b"\x01" * (self.keep_kb * 1024))
        if self.keep is not None:
            self.keep(d)

    def kind(self, i: int) -> str:
        for k, every in (("stale", STALE_EVERY), ("late", LATE_EVERY), ("stalled", STALL_EVERY)):
            if i % every == every - 1:
                return k
        return "plain"

    def feed(self, i: int) -> None:
        self._kind = self.kind(i)
        image, joints_rad = self.scenes[i % POOL]
        age_ms = 150.0 if self._kind == "stale" else 2.0
        start = self.clock.now_ns() - int(age_ms * NS_PER_MS)
        joints = None
        if joints_rad is not None:
            names = tuple(f"joint{k + 1}" for k in range(len(joints_rad)))
            joints = Joints(names, joints_rad, np.zeros(0), start)
        self.runner.decide(Telemetry(Frame(image, i, start, f"{self.task}_camera"), joints=joints))
        self.offered += 1
        self.clock.advance_ms(1.0)

    def run(self, first: int, n: int) -> None:
        for i in range(first, first + n):
            self.feed(i)


def soak(cop, clock, keep_kb_per_decision: int = 0, keep=None, frames: int = FRAMES
         ) -> tuple[list[LockStep], float, float]:
    """Warm-up, then `frames` frames per task, alternating tasks. Growth per decision after warm-up:
    (kB of heap, Python blocks)."""
    loops = [LockStep(cop, clock, t, keep_kb_per_decision, keep) for t in ("qc", "grasp")]
    for loop in loops:
        loop.run(0, WARMUP)
    decided0, (kb0, blocks0) = sum(sum(loop.answers.values()) for loop in loops), in_use()
    for i in range(WARMUP, WARMUP + frames):
        for loop in loops:
            loop.feed(i)
    kb1, blocks1 = in_use()
    decided = sum(sum(loop.answers.values()) for loop in loops) - decided0
    return loops, (kb1 - kb0) / decided, (blocks1 - blocks0) / decided


def test_soak_in_lock_step_loses_no_decision_and_keeps_its_memory(cop, clock):
    loops, growth_kb, growth_blocks = soak(cop, clock)
    for loop in loops:
        n = WARMUP + FRAMES
        stale = [i for i in range(n) if loop.kind(i) == "stale"]
        assert loop.offered == n and loop.hooks.errors == 0
        assert loop.hooks.rejected == {"stale": len(stale)}, loop.hooks.rejected
        # exactly one answer per decided frame, none for a rejected one
        assert loop.answers == Counter({i: 1 for i in range(n) if i not in stale}), loop.task
        assert not loop.mislabelled, loop.mislabelled[:5]
        n_late = sum(loop.kind(i) == "late" for i in range(n))
        n_stalled = sum(loop.kind(i) == "stalled" for i in range(n))
        assert loop.reasons["watchdog"] == n_stalled and loop.runner.watchdog.fired == n_stalled
        assert loop.runner.watchdog.discarded == n_stalled  # each stalled planner's own answer was dropped
        assert loop.sources["safe_default"] >= n_late + n_stalled  # a late answer goes out as a safe default
        assert loop.sources["fast"] > 0  # the fast path itself ran (draft, verification, KV rewinds)
        assert sum(loop.sources.values()) == n - len(stale)
    print(f"lock-step soak: {growth_kb:.3f} kB of heap and {growth_blocks:.2f} Python blocks per decision;",
          {loop.task: dict(loop.sources) for loop in loops})
    assert growth_kb < LEAK_KB_PER_DECISION, f"{growth_kb:.2f} kB of heap per decision"
    assert growth_blocks < LEAK_BLOCKS_PER_DECISION, f"{growth_blocks:.1f} Python objects per decision"


def test_the_heap_check_sees_a_leak(cop, clock):
    """16 kB kept alive per decision: the heap check fails."""
    _, growth_kb, _ = soak(cop, clock, keep_kb_per_decision=16, frames=FRAMES // 4)
    print(f"leaking 16 kB a decision: {growth_kb:.2f} kB")
    assert growth_kb >= LEAK_KB_PER_DECISION, growth_kb


def test_the_object_check_sees_a_leak(cop, clock):
    """Every decision kept alive (as a history that is never trimmed would): the object check fails."""
    kept = []
    _, _, growth_blocks = soak(cop, clock, keep=kept.append, frames=FRAMES // 4)
    print(f"keeping every decision: {growth_blocks:.1f} blocks")
    assert growth_blocks >= LEAK_BLOCKS_PER_DECISION, growth_blocks


@pytest.mark.process
def test_the_timed_soak_refuses_bad_arguments(tmp_path):
    import subprocess

    from tests.conftest import REPO

    r = subprocess.run([sys.executable, "-m", "sol_control.cli", "soak", "--minutes", "0", "--json",
                        str(tmp_path / "soak.json")], cwd=REPO, capture_output=True, text=True, timeout=60)
    log = r.stdout + r.stderr
    assert r.returncode == 2 and "--minutes and --rate-x must be positive" in log and "Traceback" not in log, log
