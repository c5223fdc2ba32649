"""Synchronisation by condition: tests wait for what they need, never for a fixed time."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(pred: Callable[[], Any], timeout_s: float = 10.0, period_s: float = 0.01) -> Any:
    """`pred()`'s first truthy value, polled every `period_s`; its last value after `timeout_s`.
    The timeout only bounds a failing test: a passing one returns as soon as the condition holds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(period_s)
    return pred()
