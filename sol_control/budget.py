"""The deadline as a value: every stage reads the same Budget and stops when it is spent."""
from __future__ import annotations

import time
from dataclasses import dataclass

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class Budget:
    """A monotonic-clock deadline. `deadline_ns=None` means unlimited."""

    deadline_ns: int | None
    start_ns: int

    @classmethod
    def after_ms(cls, ms: float, start_ns: int | None = None) -> "Budget":
        start = time.monotonic_ns() if start_ns is None else start_ns
        return cls(start + int(ms * NS_PER_MS), start)

    @classmethod
    def unlimited(cls) -> "Budget":
        return cls(None, time.monotonic_ns())

    def remaining_ms(self, now_ns: int | None = None) -> float:
        if self.deadline_ns is None:
            return float("inf")
        now = time.monotonic_ns() if now_ns is None else now_ns
        return (self.deadline_ns - now) / NS_PER_MS

    def elapsed_ms(self, now_ns: int | None = None) -> float:
        now = time.monotonic_ns() if now_ns is None else now_ns
        return (now - self.start_ns) / NS_PER_MS

    def expired(self, now_ns: int | None = None) -> bool:
        return self.remaining_ms(now_ns) <= 0.0

    def fits(self, cost_ms: float, now_ns: int | None = None) -> bool:
        """True when a step that costs `cost_ms` would finish before the deadline."""
        return self.remaining_ms(now_ns) >= cost_ms
