"""`sol-control demo --chaos`: a coprocessor node SIGKILLed mid-production, respawn brings it back.

One run per killed node (QC, then grasp), each with both nodes and the cell running. The moment is
seeded: a sim time drawn uniformly from KILL_WINDOW of the run. In real time the node dies at that
moment, whatever it is doing; in lock-step right before the first image of its task at or after
it goes out, so exactly that frame's decision is lost and the run is reproducible.

The monitor (a listener on the cell's events, ticked by the cell's loop) records in wall seconds
after the kill: when the cell saw the node's liveliness lost (`detected_s`), when a live decision
publisher was back (`back_s`: the respawned node is active), and when the first decision on a
frame taken after the kill arrived (`recovery_s`). What the line did meanwhile comes from the cell:
`unverified_passes` (parts that left without a pass verdict: must be 0), `outage_diverted`,
`decisions_lost` (frames sent that were never answered), `grasp_outage_holds`.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from sol_control.budget import NS_PER_S
from sol_control.sim.clocking import TimedAction

KILL_WINDOW = (0.3, 0.6)    # fraction of the run's sim time in which the kill falls
TASKS = ("qc", "grasp")


@dataclass(frozen=True)
class ChaosPlan:
    task: str          # whose node dies: qc | grasp
    kill_at_s: float   # sim time

    @classmethod
    def seeded(cls, task: str, seed: int, duration_s: float) -> "ChaosPlan":
        if task not in TASKS:
            raise ValueError(f"chaos task must be one of {TASKS}, got {task!r}")
        u = random.Random(f"sol_control-chaos/{seed}/{task}").uniform(*KILL_WINDOW)
        return cls(task, round(u * duration_s, 3))


class ChaosMonitor(TimedAction):
    def __init__(self, plan: ChaosPlan, supervisor, lockstep: bool):
        super().__init__(lockstep)
        self.plan, self.supervisor = plan, supervisor
        self.kill_mono_s: float | None = None
        self.kill_t_s: float | None = None
        self.after_kill_s: dict[str, float] = {}
        self.first_decision_t_s: float | None = None

    def on_tick(self) -> None:
        """Real time: kill once the moment has come."""
        self._kill_if_due()

    def before_image(self, task: str) -> None:
        if task == self.plan.task:
            self._kill_if_due(wait=True)

    def _kill_if_due(self, wait: bool = False) -> None:
        if self.kill_mono_s is not None or self.bridge.cell.time_s < self.plan.kill_at_s:
            return
        self.supervisor.kill(self.plan.task, wait=wait)
        self.kill_mono_s, self.kill_t_s = time.monotonic(), self.bridge.cell.time_s

    def on_event(self, event: dict) -> None:
        if self.kill_mono_s is None or event.get("task") != self.plan.task:
            return
        after_s = time.monotonic() - self.kill_mono_s
        if event["type"] == "liveliness":
            self.after_kill_s.setdefault("back_s" if event["alive"] else "detected_s", after_s)
        elif event["type"] == "decision" and event["stamp_ns"] > self.kill_t_s * NS_PER_S:
            if "recovery_s" not in self.after_kill_s:
                self.after_kill_s["recovery_s"] = after_s
                self.first_decision_t_s = event["t_s"]

    def report(self) -> dict:
        nan = float("nan")
        first = self.first_decision_t_s
        return {"killed_task": self.plan.task, "kill_at_s": self.plan.kill_at_s,
                "killed": self.kill_t_s is not None, "killed_t_s": self.kill_t_s,
                **{k: self.after_kill_s.get(k, nan) for k in ("detected_s", "back_s", "recovery_s")},
                "recovery_sim_s": (first - self.kill_t_s) if first is not None else nan}


def combine(runs: dict[str, dict]) -> dict:
    """The top of demo_report/report.json for a chaos run: the issue's four figures over both kills,
    then each run's own report."""
    return {
        "chaos": True,
        "unverified_passes": sum(r["unverified_passes"] for r in runs.values()),
        "outage_diverted": sum(r["outage_diverted"] for r in runs.values()),
        "decisions_lost": sum(r["decisions_lost"] for r in runs.values()),
        "recovery_s": {task: r["chaos"][task]["recovery_s"] for task, r in runs.items()},
        "runs": runs,
    }
