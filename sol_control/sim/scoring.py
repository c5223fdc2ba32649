"""Outcome tallies of the cell: QC outcomes per part, grasp outcomes per object."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from sol_control.decision import STAGE_FIELDS


@dataclass
class Tally:
    qc: Counter = field(default_factory=Counter)        # outcome → count
    grasp: Counter = field(default_factory=Counter)     # success | failure | held | no_decision
    qc_events: list = field(default_factory=list)
    grasp_events: list = field(default_factory=list)
    unmatched_verdicts: int = 0
    late_verdicts: int = 0          # arrived after their part's divert cutoff (the part was diverted)
    ignored_grasps: int = 0
    grasp_outage_holds: int = 0     # a scene's decision waited for when the grasp node was lost

    def add(self, event: dict) -> None:
        if event["type"] == "qc_outcome":
            self.qc[event["outcome"]] += 1
            self.qc[f"verdict_{event['verdict']}"] += 1
            self.qc_events.append(event)
        elif event["type"] == "grasp_outcome":
            self.grasp[event["outcome"]] += 1
            self.grasp_events.append(event)
        elif event["type"] == "grasp_outage_hold":
            self.grasp_outage_holds += 1

    @property
    def parts(self) -> int:
        return len(self.qc_events)

    def qc_accuracy(self) -> float:
        """Correct accept/reject over parts that got a pass/reject verdict (manual excluded)."""
        decided = sum(self.qc[k] for k in ("correct_accept", "correct_reject", "false_reject", "missed_defect"))
        return (self.qc["correct_accept"] + self.qc["correct_reject"]) / decided if decided else float("nan")

    def qc_accuracy_all(self) -> float:
        """Correct accept/reject over every part that left the line (manual, no verdict = wrong),
        except the parts diverted because the QC node was gone (counted apart: `outage_diverted`)."""
        correct = self.qc["correct_accept"] + self.qc["correct_reject"]
        parts = self.parts - self.qc["outage_diverted"]
        return correct / parts if parts else float("nan")

    def grasp_success(self) -> float:
        """Successes over executed grasp attempts (held / no_decision are not attempts)."""
        attempts = self.grasp["success"] + self.grasp["failure"]
        return self.grasp["success"] / attempts if attempts else float("nan")

    def summary(self) -> dict:
        return {"parts": self.parts, "qc": dict(self.qc), "qc_accuracy": self.qc_accuracy(),
                "qc_accuracy_all": self.qc_accuracy_all(),
                "grasp": dict(self.grasp), "grasp_success": self.grasp_success(),
                "unverified_passes": self.qc["unverified_pass"], "outage_diverted": self.qc["outage_diverted"],
                "unmatched_verdicts": self.unmatched_verdicts, "late_verdicts": self.late_verdicts,
                "ignored_grasps": self.ignored_grasps, "grasp_outage_holds": self.grasp_outage_holds}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def latency_table(decisions: list[dict], key: str = "latency_ms") -> dict:
    """{task: {source: {n, p50_ms, p99_ms}}} over decision records."""
    out: dict = {}
    for d in decisions:
        out.setdefault(d["task"], {}).setdefault(d["source"], []).append(d[key])
    return {task: {src: {"n": len(v), "p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)} for src, v in by.items()}
            for task, by in out.items()}


def stage_table(decisions: list[dict]) -> dict:
    """{task: {stage: p50 ms}}: where the node's time went (stages a decision skipped are left out)."""
    out: dict = {}
    for d in decisions:
        for k in STAGE_FIELDS:
            v = d.get(k, float("nan"))
            if v == v:  # not NaN
                out.setdefault(d["task"], {}).setdefault(k, []).append(v)
    return {task: {k: _pct(v, 50) for k, v in by.items()} for task, by in out.items()}


def policy_stats(decisions: list[dict]) -> dict:
    """What the per-class policy did: decisions it sent to full precision (share of all, by rule),
    how many of those became safe defaults, how often fp32 overruled the fast answer, and the
    latency of the routed decisions."""
    routed = [d for d in decisions if d.get("policy")]
    lat = [d["latency_ms"] for d in routed]
    return {"routed": len(routed), "routed_share": len(routed) / len(decisions) if decisions else float("nan"),
            "by_rule": dict(Counter(d["policy"] for d in routed)),
            "by_task": dict(Counter(d["task"] for d in routed)),
            "safe_defaults": sum(d["source"] == "safe_default" for d in routed),
            "overruled": sum(bool(d.get("policy_overruled")) for d in routed),
            "latency_p50_ms": _pct(lat, 50), "latency_p99_ms": _pct(lat, 99)}


def energy_table(decisions: list[dict], meter) -> dict:
    """{task: {source: {decisions, cpu_ms_per_decision, joules_per_decision}}} and how the joules
    were obtained (sol_control.energy: measured with RAPL, else estimated)."""
    from sol_control.energy import labels, per_source

    tasks = sorted({d["task"] for d in decisions})
    out: dict = {t: per_source(((d["source"], d.get("cpu_ms", float("nan"))) for d in decisions if d["task"] == t),
                               meter) for t in tasks}
    return {"by_task": out, "watts_per_busy_core": meter.watts_per_busy_core, **labels(meter)}


P99_WINDOW_S = 60.0   # sim seconds per window of the p99 series (a long run's drift)


def p99_windows(decisions: list[dict], end_s: float, window_s: float = P99_WINDOW_S) -> dict:
    """{task: [p99 of the node's latency_ms per window of sim time]}, full windows before `end_s` only."""
    by: dict = {}
    for d in decisions:
        k = int(d["t_s"] // window_s)
        if (k + 1) * window_s <= end_s + 1e-6:
            by.setdefault(d["task"], {}).setdefault(k, []).append(d["latency_ms"])
    return {task: [_pct(windows[k], 99) for k in sorted(windows)] for task, windows in by.items()}


def drift(series: list[float]) -> float:
    """Median of the last third minus median of the first third of a per-window series (as the soak)."""
    if len(series) < 2:
        return 0.0
    third = max(1, len(series) // 3)
    return float(np.median(series[-third:])) - float(np.median(series[:third]))


def decision_stats(decisions: list[dict], end_s: float = 0.0) -> dict:
    """Latency, deadline and fallback figures over the decision records the bridge logged (`end_s`:
    the run's sim time, for the p99 windows)."""
    lat = [d["latency_ms"] for d in decisions]
    measured = [d["measured_ms"] for d in decisions]
    e2e = [d["e2e_ms"] for d in decisions]
    n = len(decisions)
    windows = p99_windows(decisions, end_s)
    return {
        "decisions": n,
        "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99),
        "measured_p50_ms": _pct(measured, 50), "measured_p99_ms": _pct(measured, 99),
        "e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99),
        "deadline_hit_rate": sum(d["deadline_met"] for d in decisions) / n if n else float("nan"),
        "unlabelled_misses": sum(d["unlabelled_miss"] for d in decisions),
        "fallback_rate": sum(d["source"] != "fast" for d in decisions) / n if n else float("nan"),
        "sources": dict(Counter(d["source"] for d in decisions)),
        "latency_by_source": latency_table(decisions),
        "stage_p50_ms": stage_table(decisions),
        "policy": policy_stats(decisions),
        "window_p99_ms": windows, "p99_drift_ms": {task: drift(w) for task, w in windows.items()},
    }
