"""The collector's pauses, timed per generation (sol_control.gc_pauses)."""
from __future__ import annotations

import gc

from sol_control.gc_pauses import GcPauses


class StepClock:
    """Each read is `step_ns` after the previous one: every collection lasts exactly one step."""

    def __init__(self, step_ns: int):
        self.now, self.step = 0, step_ns

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def test_every_collection_is_counted_with_its_pause_per_generation():
    pauses = GcPauses(StepClock(5_000_000))  # 5 ms a collection
    pauses.install()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.uninstall()
    gc.collect(2)  # after uninstall: not counted
    assert pauses.count[2] == 1 and pauses.count[0] >= 1
    assert pauses.total_ms[2] == 5.0 and pauses.max_ms[2] == 5.0
    kv = pauses.key_values()
    assert kv["gc.gen2.collections"] == "1" and kv["gc.gen2.pause_max_ms"] == "5.000"
    assert pauses._callback not in gc.callbacks


def test_the_longest_pause_is_kept():
    pauses = GcPauses()
    for ms in (0.5, 22.0, 1.0):
        pauses.record(2, ms)
    assert pauses.count[2] == 3 and pauses.max_ms[2] == 22.0 and pauses.total_ms[2] == 23.5
