"""How the simulated cell's time moves against the wall clock and the decisions (a mixin of
sim.bridge.CellBridge; no ROS import: it is handed the executor).

- realtime: step while sim time is behind the wall clock, serve ROS every control tick; a sim more
  than MAX_LAG_S behind drops the backlog (counted).
- lockstep: after every camera trigger wait for the decision (decision_timeout_s wall seconds), but
  not for one whose node's liveliness is lost; while a task's node is gone, time stands still
  until it is back (controller_wait_s), publishing /clock so a node that restarts on sim time has
  it; a frame still unanswered after RESEND_S is sent again (the same message).
- at the end: decisions to frames sent in the last DRAIN_S are collected; frames never answered
  are `decisions_lost`.
"""
from __future__ import annotations

import time

from sol_control.budget import NS_PER_S

MAX_LAG_S = 0.5          # realtime: a sim further behind than this drops the backlog (counted)
DRAIN_S = 1.0            # at the end, wait this long (wall) for decisions to images just sent
WAIT_CLOCK_S = 0.05      # lock-step, waiting for a node: /clock this often (wall), so a node that
                         # (re)starts on sim time has the time before the next image reaches it
RESEND_S = 0.5           # lock-step: a frame unanswered this long (wall) is sent again. A node's
                         # publishers can be matched here before its reader has matched ours, and
                         # a best-effort reader drops what comes earlier (seen at start and after a
                         # SIGKILL + respawn); a copy that arrives twice is refused as out of order


class ClockingMixin:
    """Needs from the host: cfg, cell, pending, watch, awaiting, last_image, counters,
    sent_wall_ns, state_steps, clock_steps, steps_per_tick, publish_image, publish_state,
    publish_clock, republish_image, ros_ok, _emit."""

    def _step(self) -> list[str]:
        """One sim step; returns the cameras that triggered."""
        triggered = []
        for e in self.cell.step():
            if e["type"] == "qc_trigger":
                triggered.append("qc")
            elif e["type"] == "pick_trigger":
                triggered.append("pick")
            else:
                self._emit(e)
        if self.cell.n_steps % self.state_steps == 0:
            self.publish_state()
        elif self.cell.n_steps % self.clock_steps == 0:
            self.publish_clock()
        return triggered

    def _done(self, should_stop) -> bool:
        d = self.cfg.duration_s
        return (d > 0 and self.cell.time_s >= d) or should_stop() or not self.ros_ok()

    def run(self, executor, should_stop=lambda: False) -> dict:
        if self.cfg.mode == "lockstep":
            self._run_lockstep(executor, should_stop)
        else:
            self._run_realtime(executor, should_stop)
        self._drain(executor)
        return self.summary()

    def _run_lockstep(self, executor, should_stop) -> None:
        while not self._done(should_stop):
            self._await_controllers(executor, should_stop)
            for cam in self._step():
                self.publish_image(cam)
            if self.pending:
                self._await_decisions(executor, should_stop)

    def _await_decisions(self, executor, should_stop) -> None:
        """Lock-step: wait for the pending decisions, but not for one whose node is gone."""
        deadline = time.monotonic() + self.cfg.decision_timeout_s
        while self.pending and time.monotonic() < deadline and not should_stop():
            executor.spin_once(timeout_sec=0.005)
            for task in [t for t in self.pending if not self.watch[t].alive]:
                del self.pending[task]            # it will not come (counted in decisions_lost)
            for task in list(self.pending):
                if time.monotonic() - self.last_image[task][0] > RESEND_S:
                    self.republish_image(task)
        for task in list(self.pending):       # no answer: the frame goes undecided
            self.counters["decision_timeouts"] += 1
            del self.pending[task]

    def _await_controllers(self, executor, should_stop) -> None:
        """Lock-step: while a task's node is gone, time stands still until it is back (at most
        controller_wait_s wall seconds per outage; then the world goes on and the cell fails safe)."""
        gone = lambda: any(not self.watch[t].alive for t in self.awaiting)  # noqa: E731
        deadline = time.monotonic() + self.cfg.controller_wait_s
        next_clock = 0.0
        while gone() and time.monotonic() < deadline and not should_stop():
            if time.monotonic() >= next_clock:
                self.publish_clock()
                next_clock = time.monotonic() + WAIT_CLOCK_S
            executor.spin_once(timeout_sec=0.01)
        self.awaiting.clear()

    def _drain(self, executor) -> None:
        """Collect decisions to images sent in the last DRAIN_S; the rest are lost (`decisions_lost`)."""
        t_end = time.monotonic() + DRAIN_S
        recent_ns = time.time_ns() - int(DRAIN_S * NS_PER_S)
        while time.monotonic() < t_end and any(sent > recent_ns for sent in self.sent_wall_ns.values()):
            executor.spin_once(timeout_sec=0.01)
        self.counters["decisions_lost"] = len(self.sent_wall_ns)

    def _run_realtime(self, executor, should_stop) -> None:
        """Step while behind the wall clock, one physics step at a time, so sim time (and /clock)
        never runs ahead of the wall by more than a step; serve ROS every control tick."""
        wall0, sim0 = time.monotonic(), self.cell.time_s
        tick_s = self.cfg.cell.control_period_s
        while not self._done(should_stop):
            ahead_s = self.cell.time_s - (sim0 + (time.monotonic() - wall0) * self.cfg.rate)
            if ahead_s > 0:
                executor.spin_once(timeout_sec=min(ahead_s / self.cfg.rate, tick_s))
                continue
            if -ahead_s > MAX_LAG_S:                  # too slow: drop the backlog, count it
                self.counters["realtime_lag_s"] += -ahead_s
                wall0, sim0 = time.monotonic(), self.cell.time_s
            for cam in self._step():
                t0 = time.monotonic()
                self.publish_image(cam)
                wall0 += time.monotonic() - t0        # sim time stands still while the camera renders:
            if self.cell.n_steps % self.steps_per_tick == 0:   # the image is published at its stamp
                executor.spin_once(timeout_sec=0.0)


class TimedAction:
    """Something the demo does at a sim time (a node killed, a bundle swapped): from the cell's loop
    in real time (`tick` -> `on_tick`), right before an image in lock-step (`before_image`), so
    there the moment is the same in every run. Subclasses implement both."""

    def __init__(self, lockstep: bool):
        self.lockstep, self.bridge = lockstep, None

    def attach(self, bridge) -> None:
        self.bridge = bridge
        if self.lockstep:
            bridge.before_image.append(self.before_image)

    def tick(self) -> None:
        if not self.lockstep:
            self.on_tick()

    def on_tick(self) -> None:
        raise NotImplementedError

    def before_image(self, task: str) -> None:
        raise NotImplementedError
