"""The deadline as a value: every stage reads the same Budget and stops when it is spent.

Time comes from a `Clock` (monotonic ns). The process uses `MONOTONIC`; tests inject a
`ManualClock`, which moves only when told to (a planner's injected delay advances it), so deadline
logic is tested without wall-clock windows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


class Clock:
    """Monotonic time in ns, and sleeping on the same clock."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def sleep_ms(self, ms: float) -> None:
        if ms > 0:
            time.sleep(ms / 1000.0)


class ManualClock(Clock):
    """A clock that stands still until `advance_ms` (or a `sleep_ms` on it) moves it."""

    def __init__(self, start_ns: int = 1_000_000_000):
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def advance_ms(self, ms: float) -> None:
        assert ms >= 0, ms
        self._now_ns += int(ms * NS_PER_MS)

    def sleep_ms(self, ms: float) -> None:
        self.advance_ms(max(ms, 0.0))


MONOTONIC = Clock()


@dataclass(frozen=True)
class Budget:
    """A deadline on `clock`. `deadline_ns=None` means unlimited."""

    deadline_ns: int | None
    start_ns: int
    clock: Clock = field(default=MONOTONIC, compare=False, repr=False)

    @classmethod
    def after_ms(cls, ms: float, start_ns: int | None = None, clock: Clock = MONOTONIC) -> Budget:
        start = clock.now_ns() if start_ns is None else start_ns
        return cls(start + int(ms * NS_PER_MS), start, clock)

    @classmethod
    def unlimited(cls, clock: Clock = MONOTONIC) -> Budget:
        return cls(None, clock.now_ns(), clock)

    def until(self, deadline_ns: int) -> Budget:
        """The same start and clock, another deadline."""
        return Budget(deadline_ns, self.start_ns, self.clock)

    @property
    def total_ms(self) -> float:
        return float("inf") if self.deadline_ns is None else (self.deadline_ns - self.start_ns) / NS_PER_MS

    def remaining_ms(self, now_ns: int | None = None) -> float:
        if self.deadline_ns is None:
            return float("inf")
        now = self.clock.now_ns() if now_ns is None else now_ns
        return (self.deadline_ns - now) / NS_PER_MS

    def elapsed_ms(self, now_ns: int | None = None) -> float:
        now = self.clock.now_ns() if now_ns is None else now_ns
        return (now - self.start_ns) / NS_PER_MS

    def expired(self, now_ns: int | None = None) -> bool:
        return self.remaining_ms(now_ns) <= 0.0

    def fits(self, cost_ms: float, now_ns: int | None = None) -> bool:
        """True when a step that costs `cost_ms` would finish before the deadline."""
        return self.remaining_ms(now_ns) >= cost_ms
