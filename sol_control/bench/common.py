"""The benchmarks' kit. The figures: percentiles, medians, rates, elapsed time, CPU time, RSS,
agreement between answers, and the rotation that alternates rows round by round. How they are
reported: tables, a progress line, strict JSON, bar charts, memory
bandwidth. numpy and the standard library only at import: the peer engines' venvs import it too.
"""
from __future__ import annotations

import json
import math
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PLAIN, SPECULATIVE, PEER = "#888888", "#d95f02", "#1b9e77"  # bar colours


# ---- the figures ----------------------------------------------------------------------------------

def pct(values, q: float) -> float:
    """The q-th percentile; NaN for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def finite_pct(values, q: float) -> float:
    """`pct` over the finite values only (a stage that did not run records NaN)."""
    return pct([v for v in values if v is not None and math.isfinite(v)], q)


def median(values) -> float | None:
    """The median of the finite values; None for none."""
    m = finite_pct(values, 50)
    return None if math.isnan(m) else m


def rate(tokens: int, ms: float) -> float:
    """Tokens per second; NaN without time."""
    return tokens / ms * 1e3 if ms > 0 else float("nan")


def ceiling(k: int, standard_ms_per_token: float, verify_ms: float) -> float:
    """The speed-up over standard of a perfect, free draft of length k: every verify call of k + 1
    tokens emits k + 1 tokens, so tokens/s = (k + 1) / verify_ms against 1 / standard_ms_per_token."""
    return (k + 1) * standard_ms_per_token / verify_ms


def ms_since(t0_ns: int) -> float:
    """Milliseconds since `t0_ns` (time.monotonic_ns())."""
    return (time.monotonic_ns() - t0_ns) / 1e6


def cpu_s() -> float:
    """CPU-seconds of the whole process, every thread (ONNX Runtime's pools included). getrusage,
    not time.process_time: with six 2-thread sessions open, process_time took 126 us a call (it
    samples every thread's clock), getrusage 0.9 us."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident set (VmRSS), or its peak (VmHWM: not getrusage's ru_maxrss, which
    Linux carries across fork + exec), from /proc/self/status; 0 where it is not there."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rotated(items: list, turn: int) -> list:
    """`items` starting at `turn` (mod its length): who goes first moves on by one a turn, so a
    noisy neighbour slows every row alike."""
    k = turn % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two answers differ (one ending counts); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def equal_share(outputs: list, reference: list) -> float:
    """Share of answers identical to the reference's."""
    return sum(a == b for a, b in zip(outputs, reference)) / max(len(reference), 1)


def token_share(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """Share of tokens equal to the reference's at the same position."""
    same = [x == y for a, b in zip(outputs, reference) for x, y in zip(a, b)]
    return float(np.mean(same)) if same else 0.0


# ---- reporting ------------------------------------------------------------------------------------


def machine() -> dict:
    """The host: CPU, cores, versions, date, and `isa` (native.isa.describe(): the instruction-set
    flags the kernels use and the kernel variant the native pass runs here)."""
    import onnxruntime

    from ..energy import cpu_model
    from ..native import isa

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "isa": isa.describe()}


def table(head: list[str], rows: list[list[str]]) -> str:
    cells = [head] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def fmt(x, spec: str = ".1f", none: str = "-") -> str:
    """`x` formatted, `none` for None and NaN."""
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


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


def clean(x):
    """NaN and infinities -> null, numpy scalars -> Python (the JSON stays strict)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.generic):
        return clean(x.item())
    return x


def write_json(path: Path, obj, indent: int = 2) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, default=float) + "\n")
    print(f"wrote {path}")


def colour(row: dict) -> str:
    return PEER if "engine" in row else SPECULATIVE if row.get("speculative") else PLAIN


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def bar_panels(path: Path, panels: dict[str, list[tuple]], ylabel: str = "", height: float = 4.2) -> None:
    """Bar charts side by side, one per panel: {title: [(label, value, colour[, (low, high)])]}."""
    fig, axes = pyplot().subplots(1, len(panels), figsize=(6 * len(panels), height), squeeze=False)
    for ax, (title, items) in zip(axes[0], panels.items()):
        values = [i[1] for i in items]
        err = None if not items or len(items[0]) < 4 else [[v - i[3][0] for v, i in zip(values, items)],
                                                           [i[3][1] - v for v, i in zip(values, items)]]
        bars = ax.bar(range(len(items)), values, yerr=err, color=[i[2] for i in items], capsize=4)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(range(len(items)), [i[0] for i in items], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    save(fig, path)


def memory_bandwidth_gbs(mb: int = 256, repeats: int = 5) -> float:
    """Single-thread read bandwidth: best of `repeats` sums over a buffer larger than the caches."""
    buf = np.ones(mb * 1024 * 1024 // 8, np.float64)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9
