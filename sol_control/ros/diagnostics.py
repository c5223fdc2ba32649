"""Counters the node keeps and the /diagnostics message built from them (1 Hz).

Per task: decisions/s, latency p50/p99 (sensor stamp -> decision), deadline hit rate, decisions by
source, fallbacks by the fast path's failure, safe defaults by final reason, speculative
acceptance, audit agreement, the per-class policy's routes, CPU ms and joules per decision by
source, the fast path's backend (its kernel variant and the times that chose it), the bundle
deciding (`bundle`, `bundle_sha256` of its manifest) and its swaps; a configured task has its
status from configure on, before its first decision. Node-wide:
rejected inputs by reason, superseded frames, offered deadline misses, sensor timeout, lifecycle
state and configure errors, how joules are obtained (measured or estimated).
Statuses are named `<line>/sol_control: <task>` with hardware_id `<line>` for a node in namespace
`/<line>` (several lines on one /diagnostics), `sol_control: <task>` in the root namespace.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from sol_control.decision import Decision
from sol_control.energy import EnergyMeter, labels

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
        self.policy_routed = self.policy_safe_defaults = self.policy_overruled = 0
        self.cpu_ms_sum: Counter[str] = Counter()  # by source, decisions with a measured CPU time
        self.cpu_n: Counter[str] = Counter()

    def record(self, d: Decision) -> None:
        self.total += 1
        self.latency_ms.append(d.latency_ms)
        self.met.append(d.deadline_met)
        self.times_ns.append(time.monotonic_ns())
        self.missed += not d.deadline_met
        self.sources[d.source] += 1
        if math.isfinite(d.acceptance):
            self.acceptance.append(d.acceptance)
        if d.source != "fast" and d.fast_failure is not None:
            self.fallbacks[d.fast_failure.key] += 1
            if d.source == "safe_default":
                self.safe_defaults[(d.full_failure or d.fast_failure).key] += 1
        if d.policy_rule:
            self.policy_routed += 1
            self.policy_safe_defaults += d.source == "safe_default"
            self.policy_overruled += d.policy_overruled
        if math.isfinite(d.cpu_ms):
            self.cpu_ms_sum[d.source] += d.cpu_ms
            self.cpu_n[d.source] += 1

    def policy_and_energy(self, energy: EnergyMeter | None) -> list[tuple[str, object]]:
        share = self.policy_routed / self.total if self.total else math.nan
        kv: list[tuple[str, object]] = [
            ("policy_routed", self.policy_routed), ("policy_routed_share", f"{share:.4f}"),
            ("policy_safe_defaults", self.policy_safe_defaults), ("policy_overruled", self.policy_overruled)]
        for source in sorted(self.cpu_n):
            cpu_ms = self.cpu_ms_sum[source] / self.cpu_n[source]
            kv.append((f"cpu_ms_per_decision.{source}", f"{cpu_ms:.3f}"))
            if energy is not None:
                kv.append((f"joules_per_decision.{source}", f"{energy.joules(cpu_ms):.5f}"))
        if energy is not None:
            kv.append(("joules_per_decision_basis", energy.basis))
        return kv


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
            self.tasks.setdefault(d.task, TaskStats()).record(d)

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
               superseded: int, energy: EnergyMeter | None = None, line: str = "",
               node_extra: dict[str, str] | None = None) -> DiagnosticArray:
        """`line`: the node's namespace without its leading slash ("" in the root namespace);
        `node_extra`: more key-values for the node's status (its start-up phases)."""
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
            if energy is not None:
                kv += [("watts_per_busy_core", f"{energy.watts_per_busy_core:.3f}"), *labels(energy).items()]
            kv += list((node_extra or {}).items())
            name, hardware_id = (f"{line}/sol_control", line) if line else ("sol_control", "sol_control")
            out.status.append(_status(node_level, f"{name}: node", msg, kv, hardware_id))
            for task in sorted(set(self.tasks) | set(extra)):
                t = self.tasks.get(task) or TaskStats()
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
                kv += t.policy_and_energy(energy)
                kv += _extra_kv(extra.get(task, {}))
                level = DiagnosticStatus.OK
                if t.met and hit < 0.999:
                    level = DiagnosticStatus.WARN
                out.status.append(_status(level, f"{name}: {task}", f"hit rate {hit:.4f}", kv, hardware_id))
        return out


def task_extra(core: dict[str, dict], runners: dict, swaps) -> dict[str, dict]:
    """Per task, the values /diagnostics shows beside its counters: the core's (Coprocessor.stats:
    the bundle deciding, the fast path's backend, the latency models, the audit), the runner's
    watchdog, the bundle swaps (ros.bundle_swap.BundleSwaps)."""
    for task, values in core.items():
        watchdog = runners[task].watchdog if task in runners else None
        if watchdog is not None:
            values.update(watchdog_fired=watchdog.fired, late_results_discarded=watchdog.discarded)
        values.update(swaps.key_values(task))
    return core


def backend_kv(info: dict | None) -> list[tuple[str, object]]:
    """The fast path's backend choice (its session's `backend_info`) as key-values: the native
    kernel variant, why, whether the host's cache answered, where prefills run, and the ms per call
    measured on each backend (`fast_step_ms.native`, `fast_step_ms.onnxruntime`, ...)."""
    if not info:
        return []
    kv: list[tuple[str, object]] = [
        ("fast_backend_variant", info.get("variant") or "none"), ("fast_backend_reason", info.get("reason", "")),
        ("fast_backend_cached", bool(info.get("cached"))), ("fast_prefill_backend", info.get("prefill") or "none")]
    for what in ("step_ms", "verify_ms", "prefill_ms"):
        kv += [(f"fast_{what}.{backend}", f"{ms:.4f}") for backend, ms in sorted((info.get(what) or {}).items())]
    return kv


def _extra_kv(extra: dict) -> list[tuple[str, object]]:
    """A task's values from the core (Coprocessor.stats): floats to 4 decimals, the fast path's
    `fast_backend_info` spelled out (`backend_kv`)."""
    kv: list[tuple[str, object]] = []
    for k, v in extra.items():
        if k == "fast_backend_info":
            kv += backend_kv(v)
        else:
            kv.append((k, f"{v:.4f}" if isinstance(v, float) else v))
    return kv


def _status(level: bytes, name: str, message: str, kv: list[tuple[str, object]],
            hardware_id: str) -> DiagnosticStatus:
    values = [KeyValue(key=k, value=str(v).lower() if isinstance(v, bool) else str(v)) for k, v in kv]
    return DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id, values=values)
