"""The benchmarks' stats and timing kit: percentiles, medians, rates, elapsed time, CPU time, RSS,
agreement between answers, and the rotation that alternates rows round by round.

numpy and the standard library only: the peer engines' venvs import it too.
"""
from __future__ import annotations

import math
import resource
import time

import numpy as np


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
