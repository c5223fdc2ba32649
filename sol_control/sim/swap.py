"""`sol-control demo --swap-qc DIR@SECONDS`: a new QC bundle swapped into the running demo.

The client (`python -m sol_control.ros.bundle_swap --wait-stdin`, as `bench node --swap-at` drives
it) starts with the nodes, so its start-up and discovery are over by the swap; it says "ready"
once the QC node's set_parameters service is there, sends `qc.bundle := DIR` on "go" and prints
the node's answer as one JSON line. In real time the demo says "go" once sim time reaches SECONDS
and the line runs on while the node loads, verifies and warms the bundle beside the running one.
In lock-step the swap happens right before the first QC image at or after SECONDS goes out and sim
time stands still until the node answers (as it does while a decision is computed): every frame
before it is decided by the old bundle, that frame and every later one by the new (reproducible).

A refused swap (verification, warm-up) leaves the old bundle deciding; the demo carries on and the
report says why. `split` counts the QC figures per `bundle_sha256` the verdicts carry.
"""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sol_control.bundle import MANIFEST, sha256_file
from sol_control.sim.clocking import TimedAction

# Real time: the QC node loads the new bundle on its executor thread. Its images come in on their
# own thread (ros/image_pump.py) and the old bundle goes on deciding them, but its /clock callbacks
# wait behind the load, so its sim clock stands still meanwhile: a frame sent then was refused as
# from the future (`deadline.max_future_ms`, 20 ms) and never answered (seen: 152 ms ahead after a
# 0.36 s load). Swap runs give the node this margin (lock-step runs already have 1000 ms); the
# frame's budget still starts when it was sent (its DDS source timestamp), so nothing is flattered.
SWAP_MAX_FUTURE_MS = 5000.0
RIGHT = ("correct_accept", "correct_reject")   # the demo's QC accuracy: verdict vs the part's truth
WRONG = ("false_reject", "missed_defect")


@dataclass(frozen=True)
class SwapPlan:
    bundle: Path       # the bundle folder to swap in
    at_s: float        # sim time

    @classmethod
    def parse(cls, text: str, duration_s: float) -> "SwapPlan":
        """`DIR@SECONDS` → a plan; ValueError names what is wrong with the value given."""
        folder, at, seconds = text.rpartition("@")
        if not at or not folder:
            raise ValueError(f"--swap-qc must be DIR@SECONDS (e.g. /tmp/qc_hexnut@20), got {text!r}")
        try:
            at_s = float(seconds)
        except ValueError:
            raise ValueError(f"--swap-qc: SECONDS must be a number, got {seconds!r} in {text!r}") from None
        if not 0.0 < at_s < duration_s:
            raise ValueError(f"--swap-qc: SECONDS must lie inside the run (0, {duration_s:g}) s, got {at_s:g}")
        bundle = Path(folder).expanduser()
        if not bundle.is_dir():
            raise ValueError(f"--swap-qc: no bundle folder {folder!r} (not a directory)")
        return cls(bundle.resolve(), at_s)


class SwapMonitor(TimedAction):
    """Drives the swap client from the cell's loop (`tick`) or right before a QC image (lock-step)."""

    def __init__(self, plan: SwapPlan, env: dict, node: str, lockstep: bool, timeout_s: float):
        super().__init__(lockstep)
        self.plan, self.timeout_s = plan, timeout_s
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sol_control.ros.bundle_swap", "--param", "qc.bundle", "--node", node,
             "--value", str(plan.bundle), "--timeout-s", str(timeout_s), "--wait-stdin"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = False
        self.sent_t_s: float | None = None     # sim time of the request
        self.sent_mono_s = 0.0
        self.answer: dict | None = None
        self.done_t_s: float | None = None     # sim time of the answer
        self.window_ms = float("nan")          # wall time from the request to the answer

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")                     # EOF: the client is gone

    def on_tick(self) -> None:
        """Real time: ask once the moment has come (and the client is ready); take the answer."""
        self._poll(wait_s=0.0)
        if self.sent_t_s is None and self.ready and self.bridge.cell.time_s >= self.plan.at_s:
            self._send()

    def before_image(self, task: str) -> None:
        if task != "qc" or self.sent_t_s is not None or self.bridge.cell.time_s < self.plan.at_s:
            return
        t_end = time.monotonic() + self.timeout_s
        while not self.ready and self.answer is None and time.monotonic() < t_end:
            self._poll(wait_s=0.1)
        if self.ready:
            self._send()
        while self.answer is None and time.monotonic() < t_end + 5.0:
            self._poll(wait_s=0.1)

    def _send(self) -> None:
        self.sent_t_s, self.sent_mono_s = self.bridge.cell.time_s, time.monotonic()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def _poll(self, wait_s: float) -> None:
        """Take every line the client printed (waiting up to `wait_s` for the first)."""
        try:
            line = self.lines.get(timeout=wait_s) if wait_s > 0 else self.lines.get_nowait()
        except queue.Empty:
            return
        self._take(line)
        while not self.lines.empty():
            self._take(self.lines.get_nowait())

    def _take(self, line: str) -> None:
        if line == "ready":
            self.ready = True
        elif not line:
            if self.answer is None:
                self.answer = {"successful": False, "reason": f"the swap client exited ({self.proc.poll()}) "
                                                              "without an answer"}
        else:
            answer = json.loads(line)
            self.answer = {"successful": bool(answer["successful"]), "reason": answer["reason"]}
            self.done_t_s = self.bridge.cell.time_s if self.bridge is not None else None
            self.window_ms = 1000.0 * (time.monotonic() - self.sent_mono_s)

    def report(self) -> dict:
        """What the swap did: asked when (sim s), answered when, successful, and why not."""
        self._poll(wait_s=0.0)
        manifest = self.plan.bundle / MANIFEST
        return {"bundle": str(self.plan.bundle), "to_sha256": sha256_file(manifest) if manifest.is_file() else "",
                "at_s": self.plan.at_s, **(self.answer or {"successful": False, "reason": self._why_no_answer()}),
                "sent_t_s": self.sent_t_s, "done_t_s": self.done_t_s, "request_to_answer_ms": self.window_ms}

    def _why_no_answer(self) -> str:
        if self.sent_t_s is not None:
            return "the node gave no answer by the end of the run"
        if not self.ready:
            return "never sent: the swap client did not reach the QC node's set_parameters service"
        return f"never sent: no QC image at or after {self.plan.at_s:g} s"

    def stop(self) -> None:
        """The client ends itself after its answer; one never told to go is stopped (its stdin is
        left open: EOF would send the request)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def split(events: list[dict]) -> dict[str, dict]:
    """QC figures per bundle_sha256 the verdicts carry: verdicts, right / wrong (verdict vs the
    part's truth, as the demo's QC accuracy), manual inspection, deadline hit rate; `no_outcome`:
    verdicts whose part was still on the belt at the end, or that matched no part (late, unmatched)."""
    outcome = {e["part_id"]: e["outcome"] for e in events if e["type"] == "qc_outcome"}
    out: dict[str, dict] = {}
    for d in (e for e in events if e["type"] == "decision" and e["task"] == "qc"):
        s = out.setdefault(d.get("bundle_sha256", ""), {"verdicts": 0, "right": 0, "wrong": 0, "manual": 0,
                                                         "no_outcome": 0, "deadline_met": 0,
                                                         "first_t_s": d["t_s"], "last_t_s": d["t_s"]})
        s["verdicts"] += 1
        s["deadline_met"] += bool(d["deadline_met"])
        s["last_t_s"] = d["t_s"]
        o = outcome.get(d.get("part_id"))
        if o is None:
            s["no_outcome"] += 1          # still on the belt at the end, late or unmatched
        elif o in RIGHT or o in WRONG:
            s["right" if o in RIGHT else "wrong"] += 1
        elif o == "manual":
            s["manual"] += 1
    for s in out.values():
        decided = s["right"] + s["wrong"]
        s["accuracy"] = s["right"] / decided if decided else float("nan")
        s["deadline_hit_rate"] = s.pop("deadline_met") / s["verdicts"]
    return out


def section(monitor_report: dict, events: list[dict], summary: dict) -> dict:
    """The report's `swap` section: the swap, the QC figures per bundle, and the decision count."""
    by_bundle = split(events)
    qc_decisions = sum(1 for e in events if e["type"] == "decision" and e["task"] == "qc")
    parts = [e for e in events if e["type"] == "qc_outcome"]
    return {**monitor_report, "by_bundle": by_bundle, "qc_decisions": qc_decisions,
            "parts": len(parts), "parts_without_verdict": sum(e["verdict"] is None for e in parts),
            "decisions_lost": summary.get("decisions_lost", 0),
            "decision_timeouts": summary.get("decision_timeouts", 0)}
