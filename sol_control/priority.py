"""CPU priority of a decision process: every thread to one nice value, and its session's too.

Linux only (reads /proc). The shadow audit keeps its own nice (19): it is skipped here.
"""
from __future__ import annotations

import os

AUTOGROUP = "/proc/self/autogroup"


def autogroup_in_effect(path: str = AUTOGROUP) -> bool:
    """sched_autogroup gives this process's session a group of its own only when the file names one:
    it reads empty for a session left in the kernel's default group (a container's init session, whose
    nice cannot be set), and it is missing on kernels without autogroup."""
    try:
        with open(path) as f:
            return bool(f.read().strip())
    except OSError:
        return False


def renice_threads(nice: int, skip: set[int]) -> tuple[int, str]:
    """Every thread of this process (executor, workers, DDS) to `nice`, except the ids in `skip`.
    Returns (threads changed, the last error or "")."""
    done, failed = 0, ""
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in skip:
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            done += 1
        except OSError as e:
            failed = f"{e} (needs CAP_SYS_NICE below 0)"
    return done, failed


def renice_session(nice: int) -> str:
    """With sched_autogroup (most desktop and many server kernels) the scheduler shares the CPU
    between sessions first and applies thread nice values only inside a session, so a node in its
    own session (`setsid`, as the demo starts it) also sets its session's nice. A node sharing a
    session with others (a terminal, `ros2 launch`) leaves it alone: that would move them too.
    Returns what was done, for the log ("" when nothing)."""
    if os.getsid(0) != os.getpid() or not autogroup_in_effect():
        return ""
    try:
        with open(AUTOGROUP, "w") as f:
            f.write(f"{nice}\n")
    except OSError as e:
        return f"; session (autogroup) nice unchanged: {e}"
    return " and on its session (autogroup)"


def renice_process(nice: int, skip: set[int]) -> tuple[bool, str]:
    """Every thread but `skip` to `nice`, and the session where that is ours to set (renice_threads,
    renice_session): (all threads changed, what was done, for the log)."""
    done, failed = renice_threads(nice, skip)
    if failed:
        return False, f"nice {nice}: {failed}; {done} threads changed"
    return True, f"nice {nice} on {done} threads{renice_session(nice)}"

