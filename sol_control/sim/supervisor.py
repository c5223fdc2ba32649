"""The demo's process management for its coprocessor nodes: start, respawn, kill, stop, memory.

`launch` is not installable here, so the demo does itself what `respawn=True, respawn_delay=...`
does in launch/ (autostart configures and activates the new process):

    sup = NodeSupervisor({"qc": argv, "grasp": argv}, env, log_dir)
    sup.start()
    sup.poll()          # call often: restarts a node RESPAWN_DELAY_S after it exited, samples RSS
    sup.kill("qc")      # SIGKILL, as a crash would (the chaos run)
    sup.stop()          # SIGINT, SIGKILL after STOP_TIMEOUT_S

Each node logs to log_dir/coprocessor_<task>.log; a respawn appends to the same file after a
marker line. `rss_report` gives each node's resident memory after warm-up and at the end.
"""
from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

RESPAWN_DELAY_S = 0.5    # as launch/*: respawn_delay
MAX_RESPAWNS = 5         # a node that dies more often in one run is given up (the run stops)
RSS_PERIOD_S = 5.0
POLL_PERIOD_S = 0.02
STOP_TIMEOUT_S = 10.0


def stop_processes(procs) -> None:
    """SIGINT every process still running, then wait; SIGKILL one that takes over STOP_TIMEOUT_S."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def rss_mb(pid: int) -> float:
    """Resident set size of a process (VmRSS, MB); NaN when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return math.nan


@dataclass
class Managed:
    task: str
    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started_mono_s: float = 0.0
    died_mono_s: float | None = None
    generation: int = 0                      # 0 = first start, n = n-th respawn
    exits: list[dict] = field(default_factory=list)
    rss: list[tuple[int, float, float]] = field(default_factory=list)   # (generation, age s, MB)


class NodeSupervisor:
    def __init__(self, cmds: dict[str, list[str]], env: dict, log_dir: Path, respawn: bool = True,
                 delay_s: float = RESPAWN_DELAY_S, max_respawns: int = MAX_RESPAWNS):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.nodes = {t: Managed(t, cmd, log_dir / f"coprocessor_{t}.log") for t, cmd in cmds.items()}
        self.env, self.respawn, self.delay_s, self.max_respawns = env, respawn, delay_s, max_respawns
        self.gave_up: dict[str, str] = {}
        self._next_poll = self._next_rss = 0.0

    # -- processes ---------------------------------------------------------------------------------
    def start(self) -> None:
        for m in self.nodes.values():
            self._spawn(m)

    def _spawn(self, m: Managed) -> None:
        with open(m.log_path, "a" if m.generation else "w") as log:
            if m.generation:
                log.write(f"--- respawn {m.generation} by the demo, {m.exits[-1]} ---\n")
                log.flush()
            m.proc = subprocess.Popen(m.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        m.started_mono_s, m.died_mono_s = time.monotonic(), None

    def alive(self) -> bool:
        """Every node is running, or (with respawn) will be restarted: no node was given up."""
        if self.respawn:
            return not self.gave_up
        return all(m.proc is not None and m.proc.poll() is None for m in self.nodes.values())

    def poll(self) -> None:
        """Notice exits, respawn after the delay, sample RSS (rate-limited: cheap to call often)."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_PERIOD_S
        for m in self.nodes.values():
            self._check(m, now)
        if now >= self._next_rss:
            self._next_rss = now + RSS_PERIOD_S
            for m in self.nodes.values():
                if m.proc is not None and m.proc.poll() is None:
                    m.rss.append((m.generation, now - m.started_mono_s, rss_mb(m.proc.pid)))

    def _check(self, m: Managed, now: float) -> None:
        if m.proc is None or m.proc.poll() is None or m.task in self.gave_up:
            return
        if m.died_mono_s is None:
            m.died_mono_s = now
            m.exits.append({"generation": m.generation, "returncode": m.proc.returncode,
                            "after_s": round(now - m.started_mono_s, 3)})
        if not self.respawn or now < m.died_mono_s + self.delay_s:
            return
        if m.generation >= self.max_respawns:
            self.gave_up[m.task] = f"exited {m.generation + 1} times (last code {m.proc.returncode})"
            return
        m.generation += 1
        self._spawn(m)

    def kill(self, task: str, wait: bool = False) -> None:
        """SIGKILL the node (no clean-up, as a crash or the OOM killer would); `wait`: until it is gone."""
        m = self.nodes[task]
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGKILL)
            if wait:
                m.proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        stop_processes([m.proc for m in self.nodes.values() if m.proc is not None])

    # -- reports -----------------------------------------------------------------------------------
    def respawns(self) -> dict[str, list[dict]]:
        return {t: list(m.exits) for t, m in self.nodes.items()}

    def rss_report(self, warmup_s: float) -> dict[str, dict]:
        """Per node (its last process): RSS after warm-up (median of the first 5 samples at least
        warmup_s into its life), at the end (median of the last 5) and the growth between."""
        out = {}
        for t, m in self.nodes.items():
            series = [mb for gen, age, mb in m.rss if gen == m.generation and age >= warmup_s and mb == mb]
            if not series:
                out[t] = {"samples": 0}
                continue
            first, last = statistics.median(series[:5]), statistics.median(series[-5:])
            out[t] = {"samples": len(series), "after_warmup_mb": first, "end_mb": last, "max_mb": max(series),
                      "growth_mb": last - first}
        return out
