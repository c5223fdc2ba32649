"""Small helpers shared by the benchmarks: percentiles, tables, a progress line, memory bandwidth."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def default_bundle(name: str = "grasp") -> Path:
    """The shipped bundle: from the source tree, or from the ament share folder when installed."""
    for root in (REPO / "models", Path(sys.prefix) / "share" / "sol_control" / "models"):
        if (root / name / "manifest.json").is_file():
            return root / name
    raise ValueError(f"no shipped bundle {name!r} found under {REPO / 'models'}")


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def table(head: list[str], rows: list[list[str]]) -> str:
    cells = [head] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


_last = [0.0]


def progress(msg: str, end: str = "") -> None:
    """A self-overwriting status line on a terminal (10 Hz); a plain line every 5 s in a log."""
    now = time.monotonic()
    tty = sys.stderr.isatty()
    if tty and (end or now - _last[0] > 0.1):
        sys.stderr.write("\r\033[K" + msg + end)
    elif not tty and msg and now - _last[0] > 5.0:
        sys.stderr.write(msg + "\n")
    else:
        return
    _last[0] = now
    sys.stderr.flush()


def memory_bandwidth_gbs(mb: int = 256, repeats: int = 5) -> float:
    """Single-thread read bandwidth: best of `repeats` sums over a buffer larger than the caches."""
    buf = np.ones(mb * 1024 * 1024 // 8, np.float64)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9
