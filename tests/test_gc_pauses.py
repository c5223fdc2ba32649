"""The collector's pauses timed per generation, and the start-up heap frozen (sol_control.gc_pauses)."""
from __future__ import annotations

import gc

from sol_control.gc_pauses import GcPauses, freeze_heap


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


def test_a_frozen_heap_is_left_out_of_later_collections():
    alive = [object()]
    assert any(o is alive for o in gc.get_objects())
    try:
        frozen = freeze_heap()
        assert frozen == gc.get_freeze_count() and frozen > 1000  # this interpreter's modules at least
        assert not any(o is alive for o in gc.get_objects())  # the permanent generation is not walked
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0 and any(o is alive for o in gc.get_objects())
