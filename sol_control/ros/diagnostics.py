"""Counters the node keeps and the /diagnostics message built from them (1 Hz).

Per task: decisions/s, latency p50/p99 (sensor stamp -> decision), deadline hit rate, decisions by
source, fallbacks by the fast path's failure, safe defaults by final reason, speculative
acceptance, audit agreement. Node-wide: rejected inputs by reason, superseded frames, offered
deadline misses, sensor timeout, lifecycle state and configure errors.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from sol_control.decision import Decision

WINDOW = 2000  # decisions kept per task for percentiles


class TaskStats:
    def __init__(self) -> None:
        self.latency_ms: deque[float] = deque(maxlen=WINDOW)
        self.met: deque[bool] = deque(maxlen=WINDOW)
        self.acceptance: deque[float] = deque(maxlen=WINDOW)
        self.times_ns: deque[int] = deque(maxlen=WINDOW)
        self.total = 0
        self.sources: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self.safe_defaults: Counter[str] = Counter()
        self.missed = 0


class NodeStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tasks: dict[str, TaskStats] = {}
        self.rejected: Counter[str] = Counter()
        self.offered_deadline_missed = 0
        self.sensor_timeout = False
        self.errors = 0

    def record(self, d: Decision) -> None:
        with self._lock:
            t = self.tasks.setdefault(d.task, TaskStats())
            t.total += 1
            t.latency_ms.append(d.latency_ms)
            t.met.append(d.deadline_met)
            t.times_ns.append(time.monotonic_ns())
            t.missed += not d.deadline_met
            t.sources[d.source] += 1
            if math.isfinite(d.acceptance):
                t.acceptance.append(d.acceptance)
            if d.source != "fast" and d.fast_failure is not None:
                t.fallbacks[d.fast_failure.key] += 1
                if d.source == "safe_default":
                    t.safe_defaults[(d.full_failure or d.fast_failure).key] += 1

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def rejected_count(self, reason: str | None = None) -> int:
        with self._lock:
            return sum(self.rejected.values()) if reason is None else self.rejected[reason]

    def total(self, task: str | None = None) -> int:
        with self._lock:
            if task is None:
                return sum(t.total for t in self.tasks.values())
            return self.tasks[task].total if task in self.tasks else 0

    # -- message ---------------------------------------------------------------------------------
    def to_msg(self, stamp, state: str, config_error: str, extra: dict[str, dict[str, float]],
               superseded: int, node_extra: dict[str, str] | None = None) -> DiagnosticArray:
        now = time.monotonic_ns()
        out = DiagnosticArray()
        out.header.stamp = stamp
        with self._lock:
            node_level = DiagnosticStatus.OK
            msg = state
            if config_error:
                node_level, msg = DiagnosticStatus.ERROR, f"{state}: {config_error}"
            elif self.sensor_timeout:
                node_level, msg = DiagnosticStatus.ERROR, "sensor timeout: publishing safe defaults"
            kv = [("state", state), ("rejected_inputs", sum(self.rejected.values())),
                  ("superseded_frames", superseded), ("offered_deadline_missed", self.offered_deadline_missed),
                  ("sensor_timeout", self.sensor_timeout), ("errors", self.errors)]
            kv += [(f"rejected.{k}", v) for k, v in sorted(self.rejected.items())]
            kv += list((node_extra or {}).items())
            out.status.append(_status(node_level, "sol_control: node", msg, kv))
            for task, t in sorted(self.tasks.items()):
                lat = np.fromiter(t.latency_ms, float) if t.latency_ms else np.array([math.nan])
                recent = sum(1 for x in t.times_ns if now - x <= 1_000_000_000)
                hit = (sum(t.met) / len(t.met)) if t.met else math.nan
                acc = float(np.mean(t.acceptance)) if t.acceptance else math.nan
                kv = [("decisions_per_s", recent), ("decisions", t.total),
                      ("latency_p50_ms", f"{np.percentile(lat, 50):.3f}"),
                      ("latency_p99_ms", f"{np.percentile(lat, 99):.3f}"),
                      ("deadline_hit_rate", f"{hit:.5f}"), ("deadline_missed", t.missed),
                      ("speculative_acceptance", f"{acc:.3f}")]
                kv += [(f"source.{k}", v) for k, v in sorted(t.sources.items())]
                kv += [(f"fallback.{k}", v) for k, v in sorted(t.fallbacks.items())]
                kv += [(f"safe_default.{k}", v) for k, v in sorted(t.safe_defaults.items())]
                kv += [(k, f"{v:.4f}" if isinstance(v, float) else v) for k, v in extra.get(task, {}).items()]
                level = DiagnosticStatus.OK
                if t.met and hit < 0.999:
                    level = DiagnosticStatus.WARN
                out.status.append(_status(level, f"sol_control: {task}", f"hit rate {hit:.4f}", kv))
        return out


def _status(level: bytes, name: str, message: str, kv: list[tuple[str, object]]) -> DiagnosticStatus:
    values = [KeyValue(key=k, value=str(v).lower() if isinstance(v, bool) else str(v)) for k, v in kv]
    return DiagnosticStatus(level=level, name=name, message=message, hardware_id="sol_control", values=values)
