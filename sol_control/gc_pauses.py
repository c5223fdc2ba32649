"""Python's garbage collector in a real-time loop: freeze what start-up made, time every pause.

A full (generation 2) collection walks every object the interpreter tracks. In the node that is
~56,000 objects after the imports alone (rclpy, ONNX Runtime, OpenCV, our modules): one such
collection took 22 ms on the AVX-512 host of docs/BENCHMARKS.md, longer than a QC deadline, and
CPython starts one whenever enough objects have survived two younger collections, at a moment
nobody chooses. `freeze_heap()` collects once and moves everything alive into the permanent
generation (`gc.freeze`), so later collections walk only what the decisions allocate since.

`GcPauses` times every collection through `gc.callbacks` (count, total and longest pause per
generation), so /diagnostics shows what the collector costs while the node decides.
"""
from __future__ import annotations

import gc
import threading
import time
from typing import Callable

GENERATIONS = (0, 1, 2)


def freeze_heap() -> int:
    """Collect everything once, then freeze what is alive; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Collections and their pauses per generation, from `gc.callbacks` while installed."""

    def __init__(self, clock_ns: Callable[[], int] = time.perf_counter_ns):
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._started_ns: int | None = None
        self.count = {g: 0 for g in GENERATIONS}
        self.total_ms = {g: 0.0 for g in GENERATIONS}
        self.max_ms = {g: 0.0 for g in GENERATIONS}

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        """gc calls this before ("start") and after ("stop") each collection, in the collecting thread."""
        if phase == "start":
            self._started_ns = self._clock_ns()
        elif phase == "stop" and self._started_ns is not None:
            self.record(info.get("generation", 2), (self._clock_ns() - self._started_ns) / 1e6)
            self._started_ns = None

    def record(self, generation: int, ms: float) -> None:
        with self._lock:
            self.count[generation] += 1
            self.total_ms[generation] += ms
            self.max_ms[generation] = max(self.max_ms[generation], ms)

    def key_values(self) -> dict[str, str]:
        """For /diagnostics: `gc.gen<g>.collections`, `.pause_total_ms`, `.pause_max_ms`, and the
        frozen object count."""
        with self._lock:
            kv = {"gc.frozen_objects": str(gc.get_freeze_count())}
            for g in GENERATIONS:
                kv[f"gc.gen{g}.collections"] = str(self.count[g])
                kv[f"gc.gen{g}.pause_total_ms"] = f"{self.total_ms[g]:.3f}"
                kv[f"gc.gen{g}.pause_max_ms"] = f"{self.max_ms[g]:.3f}"
            return kv
