"""What Python's garbage collector costs while the node decides: every pause, timed.

A full (generation 2) collection walks every object the interpreter tracks: ~56,000 in the node
after its imports (rclpy, ONNX Runtime, OpenCV, our modules), 22 ms for one forced collection on
the AVX-512 host of docs/BENCHMARKS.md, longer than a QC deadline. CPython starts one when enough
objects have survived younger collections; the decision loop allocates few that survive (1,500 QC
decisions with perception: 6 generation-0 collections, 1 of generation 1, none of generation 2), so
the node does not freeze or tune the collector, but it shows what it costs: `GcPauses` times every
collection through `gc.callbacks` (count, total and longest pause per generation) for /diagnostics.
"""
from __future__ import annotations

import gc
import threading
import time
from typing import Callable

GENERATIONS = (0, 1, 2)


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
        """For /diagnostics: `gc.gen<g>.collections`, `.pause_total_ms`, `.pause_max_ms`."""
        with self._lock:
            kv = {}
            for g in GENERATIONS:
                kv[f"gc.gen{g}.collections"] = str(self.count[g])
                kv[f"gc.gen{g}.pause_total_ms"] = f"{self.total_ms[g]:.3f}"
                kv[f"gc.gen{g}.pause_max_ms"] = f"{self.max_ms[g]:.3f}"
            return kv
