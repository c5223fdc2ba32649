"""Where a process's start-up time went: its age at named marks (cold start, respawn).

    startup = Startup()
    startup.mark("imports")        # process age now: interpreter start + imports
    ...
    startup.phases_s()             # {"imports": 0.61, "init": 0.07, ...}: time since the previous mark
    startup.detail["sessions"] = 0.2   # a part of a phase, measured inside it

The age comes from the kernel (process start time in /proc/self/stat), so the interpreter's own
start and the imports before the first line of `main` are counted too.
"""
from __future__ import annotations

import math
import os
import threading
import time


def process_age_s() -> float:
    """Seconds since this process started (Linux; NaN where /proc is missing)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # after "pid (comm)": state is field 3
        start_ticks = int(fields[22 - 3])                  # field 22: starttime, clock ticks after boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


class Startup:
    """Process age (s) at each named mark, in the order marked (thread-safe: a decision thread
    marks the first decision while the executor reads the phases)."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.detail: dict[str, float] = {}   # parts of a phase measured inside it (s)
        self._lock = threading.Lock()

    def mark(self, name: str, once: bool = False) -> None:
        if once and name in self.marks:
            return
        age = process_age_s()
        with self._lock:
            self.marks.pop(name, None)   # marked again (a second configure): it moves to the end
            self.marks[name] = age

    def phases_s(self) -> dict[str, float]:
        """Each mark's time since the previous one (the first: since the process started)."""
        with self._lock:
            marks = list(self.marks.items())
        out, prev = {}, 0.0
        for name, age in marks:
            out[name] = age - prev
            prev = age
        return out

    def key_values(self) -> dict[str, str]:
        """For /diagnostics: startup.<phase>_s for every phase and detail."""
        return {f"startup.{k}_s": f"{v:.3f}" for k, v in {**self.phases_s(), **self.detail}.items()}

    def summary(self, final: str) -> str:
        """One log line: the process age at mark `final`, and where the time went."""
        parts = [f"{k} {v:.2f}" for k, v in {**self.phases_s(), **self.detail}.items()]
        return f"{final} {self.marks[final]:.2f} s after the process started ({', '.join(parts)} s)"

