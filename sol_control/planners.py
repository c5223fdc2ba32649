"""The two planners the deadline guard chooses between (the third answer, the safe default, needs
no model: `actions.safe_default`).

- fast: the quantized target (int8 or int4), speculative: it verifies what its own draft heads
  guessed in the previous call, or what a small draft model proposes, under the budget the guard
  hands it; plain greedy on the quantized target when there is neither;
- full precision: the same target in fp32, plain greedy decoding: slower, the reference.

A planner turns prefix ids into action tokens; it knows nothing about deadlines beyond the budget
it is given, and nothing about ROS. Sessions and KV caches are created once, here, at configure time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sol_control.budget import NS_PER_MS, Budget
from sol_control.bundle import Bundle
from sol_control.config import DecodingConfig, FaultInjection

if TYPE_CHECKING:  # the engine itself is imported at configure time
    from sol_control.decoding import Decoder, DecodeStats


class InjectedFault(RuntimeError):
    """Raised by a planner when fault_injection asks for it (tests only)."""


@dataclass
class PlanResult:
    tokens: list[int]
    probs: list[float]
    complete: bool  # False: the budget ran out before all action tokens were decoded
    latency_ms: float  # on the budget's clock
    stats: DecodeStats | None = None

    @property
    def acceptance(self) -> float:
        """Accepted / proposed guesses; NaN when none were proposed."""
        s = self.stats
        return s.accepted / s.proposed if s is not None and s.proposed else float("nan")


def _session(bundle: Bundle, role: str, precision: str, dec: DecodingConfig, tag: str) -> Decoder:
    from sol_control.decoding import open_decoder  # engine; imported at configure time

    return open_decoder(bundle, role, precision, threads=dec.threads,
                        name=f"{bundle.manifest.name}/{role}-{precision}{tag}", backend=dec.backend)


def _draft_precision(bundle: Bundle, wanted: str) -> str:
    if wanted != "auto":
        return wanted
    files = bundle.manifest.draft.files
    return min(files, key=lambda prec: bundle.manifest.files[files[prec]].size_bytes)


def _result(r, n_tokens: int, budget: Budget, t0_ns: int) -> PlanResult:
    complete = bool(r.complete) and len(r.tokens) == n_tokens
    return PlanResult(list(r.tokens), list(r.probs), complete, (budget.clock.now_ns() - t0_ns) / NS_PER_MS, r.stats)


def speculation_mode(bundle: Bundle, wanted: str) -> str:
    """"heads" (the target's own draft heads), "draft" (the draft model) or "none", as configured
    (`decoding.speculation`); auto takes the first the bundle has. ValueError if it has not that one."""
    m = bundle.manifest
    have = {"heads": m.target.draft_heads > 0, "draft": m.draft is not None, "none": True}
    if wanted == "auto":
        return next(mode for mode in ("heads", "draft", "none") if have[mode])
    if not have[wanted]:
        raise ValueError(f"decoding.speculation: {wanted!r}, but bundle {bundle.root} has no "
                         f"{'draft heads' if wanted == 'heads' else 'draft decoder'}")
    return wanted


class FastPlanner:
    """The quantized target, speculative with its own draft heads or with the draft model
    (`decoding.speculation`), or plain greedy."""

    def __init__(self, bundle: Bundle, n_tokens: int, dec: DecodingConfig,
                 bin_range: tuple[int, int] | None = None):
        from sol_control.decoding import AdaptiveK

        self.n_tokens = n_tokens
        self.k = dec.k or None
        self.relax_delta = dec.relax_delta
        self.prefill_guesses = dec.prefill_guesses
        self.bin_range = bin_range  # action bins, where relaxed acceptance may apply
        self.mode = speculation_mode(bundle, dec.speculation)
        self.target = _session(bundle, "target", dec.fast_precision, dec, "")
        self.draft: Decoder | None = None
        if self.mode == "draft":
            self.draft = _session(bundle, "draft", _draft_precision(bundle, dec.draft_precision), dec, "")
        self.controller = AdaptiveK()  # k adapts across decisions, not only within one

    @property
    def backend(self) -> str:
        """What runs the target's calls: "native" (the C pass) or "onnxruntime"."""
        from sol_control.decoding.native import NativeDecoderSession

        return "native" if isinstance(self.target, NativeDecoderSession) else "onnxruntime"

    def plan(self, prefix: np.ndarray, budget: Budget, faults: FaultInjection | None = None) -> PlanResult:
        from sol_control.decoding import greedy, speculate, speculate_heads

        t0 = budget.clock.now_ns()
        if faults is not None:
            budget.clock.sleep_ms(faults.fast_delay_ms)
            if faults.fast_raise:
                raise InjectedFault("fault_injection.fast_raise")
        if self.mode == "heads":
            r = speculate_heads(self.target, prefix, self.n_tokens, budget=budget, prefill_guesses=self.prefill_guesses)
        elif self.mode == "none":
            r = greedy(self.target, prefix, self.n_tokens, budget=budget)
        else:
            relax = self.relax_delta if self.bin_range is not None else 0
            r = speculate(self.draft, self.target, prefix, self.n_tokens, budget=budget, k=self.k,
                          controller=self.controller, relax_delta=relax, relax_range=self.bin_range)
        return _result(r, self.n_tokens, budget, t0)


class FullPrecisionPlanner:
    """fp32 target, plain greedy decoding."""

    def __init__(self, bundle: Bundle, n_tokens: int, dec: DecodingConfig, tag: str = ""):
        self.n_tokens = n_tokens
        self.target = _session(bundle, "target", "fp32", dec, tag)

    def plan(self, prefix: np.ndarray, budget: Budget, faults: FaultInjection | None = None) -> PlanResult:
        from sol_control.decoding import greedy

        t0 = budget.clock.now_ns()
        if faults is not None:
            budget.clock.sleep_ms(faults.full_delay_ms)
        r = greedy(self.target, prefix, self.n_tokens, budget=budget)
        return _result(r, self.n_tokens, budget, t0)
