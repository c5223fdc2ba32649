"""Shadow audit: sampled fast decisions recomputed at full precision, off the critical path.

The guard hands a sampled fast decision (and its prefix) to `Auditor.submit`; a background thread
at the lowest CPU priority decodes the same prefix with its own fp32 session and counts agreement
(same QC class and verdict; grasps within 1 cm, 0.1 rad, 5 mm) and token identity. It decodes only
while no decision is in progress (`DecidingGate`): it starts after the sampled decision is
published, and a decision that starts meanwhile stops it at its next step (it starts over once
that decision is out, up to AUDIT_TRIES times).
"""
from __future__ import annotations

import logging
import math
import os
import queue
import threading
from dataclasses import dataclass, field, replace

import numpy as np

from sol_control.actions import Action, ActionTokenizer, GraspDecision, QCVerdict
from sol_control.budget import MONOTONIC, Budget
from sol_control.decision import Decision
from sol_control.planners import FullPrecisionPlanner

log = logging.getLogger(__name__)
AUDIT_TRIES = 3  # starts of one audit before it is given up (counted as skipped)


class DecidingGate:
    """How many decisions are in progress in this process, from taking a frame to publishing its
    answer. Background work that shares the process's cores and GIL (the shadow audit) runs only
    while none is, so it never holds the GIL against a decision."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._deciding = 0

    @property
    def busy(self) -> bool:
        return self._deciding > 0

    def enter(self) -> None:
        with self._cv:
            self._deciding += 1

    def leave(self) -> None:
        with self._cv:
            self._deciding -= 1
            if not self._deciding:
                self._cv.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """True as soon as no decision is in progress; False after `timeout_s` of decisions."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._deciding, timeout_s)


@dataclass(frozen=True)
class WhileIdle(Budget):
    """An unlimited budget that runs out as soon as a decision is in progress."""

    gate: DecidingGate = field(default_factory=DecidingGate, compare=False, repr=False)

    def expired(self, now_ns: int | None = None) -> bool:
        return self.gate.busy


def agrees(a: Action, b: Action) -> bool:
    """Audit agreement: same QC verdict and defect class; grasps within one bin on every field is too
    strict to ask of int8, so grasps agree when position is within 1 cm, yaw 0.1 rad, width 5 mm."""
    if isinstance(a, QCVerdict) and isinstance(b, QCVerdict):
        return a.defect == b.defect and a.verdict == b.verdict
    if isinstance(a, GraspDecision) and isinstance(b, GraspDecision):
        dp = math.dist((a.x_m, a.y_m, a.z_m), (b.x_m, b.y_m, b.z_m))
        return dp <= 0.01 and abs(a.yaw_rad - b.yaw_rad) <= 0.1 and abs(a.width_m - b.width_m) <= 0.005
    return False


class Auditor:
    """Recomputes sampled fast decisions at full precision on its own session, in a background
    thread at the lowest CPU priority, while `gate` says no decision is in progress. Its queue holds
    one job: when busy, new samples are skipped."""

    def __init__(self, full: FullPrecisionPlanner, tokenizer: ActionTokenizer, gate: DecidingGate | None = None):
        self.full = full
        self.gate = gate or DecidingGate()
        self.tokenizer = replace(tokenizer, uncertain_below=0.0)  # audit the class, not the routing
        self._jobs: queue.Queue = queue.Queue(maxsize=1)
        self.audited = self.agreed = self.token_identical = self.skipped = self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sol_control-audit", daemon=True)
        self._thread.start()

    def submit(self, prefix: np.ndarray, decision: Decision) -> None:
        try:
            self._jobs.put_nowait((prefix.copy(), decision))
        except queue.Full:
            self.skipped += 1

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    @property
    def agreement(self) -> float:
        return self.agreed / self.audited if self.audited else math.nan

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError as e:
            log.warning("audit thread keeps its priority: %s", e)
        while not self._stop.is_set():
            try:
                prefix, decision = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._audit_when_idle(prefix, decision)
            except Exception as e:  # noqa: BLE001 - a broken audit must not touch live decisions
                self.errors += 1
                log.warning("audit failed: %s: %s", type(e).__name__, e)

    def _audit_when_idle(self, prefix: np.ndarray, decision: Decision) -> None:
        for _ in range(AUDIT_TRIES):
            while not self.gate.wait_idle(timeout_s=0.2):
                if self._stop.is_set():
                    return
            if self._audit(prefix, decision):
                return
        self.skipped += 1  # decisions kept interrupting it

    def _audit(self, prefix: np.ndarray, decision: Decision) -> bool:
        """Audit one sample; False when a decision started before it was done (nothing counted)."""
        res = self.full.plan(prefix, WhileIdle(None, MONOTONIC.now_ns(), gate=self.gate))
        if not res.complete:
            return False
        ref = self.tokenizer.decode(res.tokens, res.probs, prefix)
        fast = self.tokenizer.decode(decision.tokens, prefix=prefix)
        self.audited += 1
        self.agreed += agrees(fast, ref)
        self.token_identical += tuple(res.tokens) == decision.tokens
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
