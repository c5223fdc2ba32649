"""What one decision says: the action, which path made it, why, how long it took, and its deadline.

    Decision(source="fast")            the quantized speculative path answered in time
    Decision(source="full_precision")  the fast path failed (`fast_failure` says why), fp32 answered
    Decision(source="safe_default")    neither could (`full_failure` says why fp32 did not answer),
                                       or the node answered for them (watchdog, sensor timeout, ...)

Failures are structured inside the code (`Failure(key, detail)`, counted by key); the published
`reason` is their readable join, `"<fast failure>><full-precision failure>"`, e.g.
`fast_over_budget>full_precision_would_miss` or `fast_error:ValueError`. A fast answer that the
per-class policy (`sol_control/policy.py`) sent to full precision has a fast failure whose key
starts with `policy_` (`policy_qc_class:crack`): `Decision.policy_rule` reads it back.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from sol_control.actions import Action, safe_default
from sol_control.budget import NS_PER_MS


@dataclass(frozen=True)
class Failure:
    """Why a path gave no answer. `key` is short and countable (`fast_over_budget`, `watchdog`);
    `detail` names what raised, for `*_error` keys."""

    key: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.key}:{self.detail}" if self.detail else self.key

    @classmethod
    def parse(cls, text: str) -> Failure | None:
        if not text:
            return None
        key, _, detail = text.partition(":")
        return cls(key, detail)


POLICY_PREFIX = "policy_"  # fast failures that are policy routes, not failures of the fast path


@dataclass(frozen=True)
class Decision:
    task: str  # "qc" | "grasp"
    action: Action
    source: str  # "fast" | "full_precision" | "safe_default"
    latency_ms: float  # sensor stamp -> decision made
    deadline_ms: float
    deadline_met: bool
    stamp_ns: int  # the sensor header stamp the decision belongs to (ROS time)
    frame_id: str = ""
    fast_failure: Failure | None = None  # why there is no fast answer (also node causes: watchdog, ...)
    full_failure: Failure | None = None  # why there is no full-precision answer (safe defaults)
    fast_ms: float = math.nan
    full_ms: float = math.nan
    acceptance: float = math.nan  # speculative: accepted / proposed draft tokens
    tokens: tuple[int, ...] = ()
    eject_time_ns: int = 0  # QC: when the part reaches the ejector (ROS time); 0 = unknown
    queue_ms: float = math.nan  # sensor stamp -> decision work starts (transport + waiting)
    perception_ms: float = math.nan  # image -> observation tokens
    cpu_ms: float = math.nan  # CPU time of the thread that decided (ONNX Runtime's work included)
    start_mono_ns: int = 0  # the sensor stamp on the monotonic clock (budget start); 0 = unknown
    policy_overruled: bool = False  # the policy routed the fast answer and fp32 answered differently
    bundle_sha256: str = ""  # sha256 of the manifest of the bundle that decided ("" = not yet named)

    @property
    def reason(self) -> str:
        """The published, readable reason: "" for fast decisions."""
        return ">".join(str(f) for f in (self.fast_failure, self.full_failure) if f is not None)

    @property
    def policy_rule(self) -> str:
        """The policy rule that sent the fast answer to full precision ("" when none did)."""
        f = self.fast_failure
        return f.key if f is not None and f.key.startswith(POLICY_PREFIX) else ""


# Where a decision's time went (ms), in order: stamp -> work start (transport, waiting), image ->
# observation tokens, fast path, full-precision planner. NaN when a decision skipped a stage.
STAGE_FIELDS = ("queue_ms", "perception_ms", "fast_ms", "full_ms")


def safe_decision(task: str, why: Failure, stamp_ns: int, frame_id: str, start_mono_ns: int,
                  deadline_ms: float, now_ns: int | None = None) -> Decision:
    """The safe default, answered for a frame by someone other than the guard (watchdog, ...)."""
    now = time.monotonic_ns() if now_ns is None else now_ns
    latency_ms = (now - start_mono_ns) / NS_PER_MS
    return Decision(task, safe_default(task), "safe_default", latency_ms, deadline_ms, latency_ms <= deadline_ms,
                    stamp_ns, frame_id, fast_failure=why, start_mono_ns=start_mono_ns)


def on_time_or_safe(d: Decision, now_ns: int | None = None, margin_ms: float = 0.0) -> Decision:
    """Measure the latency again at `now_ns`; a decision that is late and not a safe default already
    becomes the safe default (`fast_late`, or `full_precision_late` after the fast path's failure),
    so every output is on time or labelled safe_default. Applied once, by the runner right before
    publishing, with `margin_ms` kept for the publish itself."""
    if not d.start_mono_ns:
        return d
    latency_ms = ((time.monotonic_ns() if now_ns is None else now_ns) - d.start_mono_ns) / NS_PER_MS
    met = latency_ms + margin_ms <= d.deadline_ms
    if met or d.source == "safe_default":
        return replace(d, latency_ms=latency_ms, deadline_met=met)
    if d.source == "fast":
        late = {"fast_failure": Failure("fast_late")}
    else:
        late = {"full_failure": Failure("full_precision_late")}
    return replace(d, action=safe_default(d.task), source="safe_default", latency_ms=latency_ms,
                   deadline_met=False, tokens=(), **late)
