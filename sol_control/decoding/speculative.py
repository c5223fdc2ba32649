"""Plain and speculative decoding over two DecoderSessions.

Both caches obey one invariant: the committed sequence is `seq`, the target cache holds seq[:-1]
and `seq[-1]` (the newest token, "cur") is fed with the next verification. The draft cache holds
some prefix of `seq` and catches up by feeding what it misses in one multi-token call.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..budget import Budget
from .sampling import distribution, draw, token_prob
from .session import DecoderSession

MAX_K = 16
PROBE_K = 2  # draft length of the steps that re-measure a draft the controller stopped using
OUTLIER_X = 3.0  # a timing enters a running average at most at this multiple of the average


def _average(old: float, new: float) -> float:
    return 0.8 * old + 0.2 * min(new, OUTLIER_X * old)


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_passes: int = 0  # target forward calls, prefill included
    verify_passes: int = 0  # target calls that verified a draft (or decoded one token)
    draft_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    wall_ms: float = 0.0
    ttft_ms: float = 0.0
    prefill_ms: float = 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens emitted per target decoding pass (accepted drafts + the target's own token)."""
        return (self.new_tokens - 1) / self.verify_passes if self.verify_passes else 0.0

    @property
    def acceptance(self) -> float:
        """Fraction of proposed draft tokens the target accepted."""
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class DecodeResult:
    tokens: list[int]
    probs: list[float]  # the target's probability of each emitted token
    complete: bool
    stats: DecodeStats = field(default_factory=DecodeStats)


def _ms_since(t0_ns: int) -> float:
    return (time.monotonic_ns() - t0_ns) / 1e6


def _check_request(sess: DecoderSession, prefix: np.ndarray, max_new_tokens: int) -> np.ndarray:
    prefix = np.asarray(prefix, dtype=np.int64).reshape(-1)
    if len(prefix) == 0:
        raise ValueError("prefix must hold at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if prefix.min() < 0 or prefix.max() >= sess.vocab:
        raise ValueError(f"token ids must lie in [0, {sess.vocab}), got [{prefix.min()}, {prefix.max()}]")
    if len(prefix) + max_new_tokens > sess.max_context:
        raise ValueError(f"prefix {len(prefix)} + {max_new_tokens} new tokens exceed "
                         f"max_context={sess.max_context} of {sess.name}")
    return prefix


class AdaptiveK:
    """Chooses the draft length from a running acceptance estimate and measured costs.

    With per-token acceptance a, k drafts yield (1 - a^(k+1)) / (1 - a) tokens per step and cost
    k * draft_ms + verify_ms(k + 1). Pick the k with the most tokens per ms; k = 0 (plain
    decoding) wins when drafting does not pay. Costs are running averages per pass size, measured
    as the planner runs; sizes not yet seen are interpolated, so the choice explores them.
    Plain steps teach it nothing about the draft, so after `explore_every` plain steps in a row it
    drafts PROBE_K tokens for two steps (the first catches the draft up, the second times it): one
    slow draft measurement (a preemption) cannot switch speculation off for good.
    Keep one controller per planner: it learns across decisions.
    """

    def __init__(self, k_max: int = MAX_K, decay: float = 0.95, explore_every: int = 64):
        self.k_max, self.decay, self.explore_every = k_max, decay, explore_every
        self._plain_run = 0  # plain steps chosen in a row
        self._probes = 0  # probe steps still to run
        self.acc, self.rej = 4.0, 1.0  # prior: acceptance ~0.8
        self.draft_ms: float | None = None  # per draft token
        self.verify = np.full(MAX_K + 2, np.nan)  # ms of one target pass of T tokens, index T
        self._est: list[float] | None = None  # verify_ms(T) for T in 0..MAX_K+1, refreshed by update

    @property
    def alpha(self) -> float:
        return self.acc / (self.acc + self.rej)

    def _estimate(self, tokens: np.ndarray) -> np.ndarray | None:
        seen = np.flatnonzero(~np.isnan(self.verify))  # pass sizes measured so far
        if len(seen) == 0:
            return None
        ms = self.verify[seen]
        if len(seen) == 1:  # one size seen: assume +10 % per extra token (and never below 10 %)
            return ms[0] * np.maximum(1 + 0.1 * (tokens - seen[0]), 0.1)
        slope = max((ms[-1] - ms[0]) / (seen[-1] - seen[0]), 0.05 * ms[0])
        return np.where(tokens <= seen[-1], np.interp(tokens, seen, ms), ms[-1] + (tokens - seen[-1]) * slope)

    def verify_ms(self, tokens: int) -> float | None:
        """Estimated ms of one target pass of `tokens` tokens (None before the first measurement)."""
        if self._est is not None and tokens < len(self._est):
            return self._est[tokens]
        est = self._estimate(np.array([tokens]))
        return None if est is None else float(est[0])

    def choose(self, remaining: int = MAX_K + 1) -> int:
        k_top = max(0, min(self.k_max, remaining - 1))
        est = self._est  # plain floats: this runs once per speculative step, on the decision's clock
        if self.draft_ms is None or est is None:
            return min(4, k_top)  # cold start: measure a moderate k first
        if not k_top:  # no room to draft (the decision's last token): not a choice against it
            return 0
        a, draft_ms = min(self.alpha, 0.999), self.draft_ms
        best_k, best = 0, 1.0 / est[1]
        for k in range(1, k_top + 1):
            rate = (1 - a ** (k + 1)) / (1 - a) / (k * draft_ms + est[k + 1])
            if rate > best:
                best_k, best = k, rate
        if best_k:
            self._plain_run = self._probes = 0
            return best_k
        if self._probes:
            self._probes -= 1
            return min(PROBE_K, k_top)
        self._plain_run += 1
        if self._plain_run >= self.explore_every:
            self._plain_run, self._probes = 0, 1
            return min(PROBE_K, k_top)
        return 0

    def update(self, k: int, accepted: int, draft_ms: float | None, verify_ms: float) -> None:
        """Learn from one step. A timing enters its running average at most at OUTLIER_X times the
        average: a preempted step nudges the costs instead of tripling them."""
        d = self.decay
        if k > 0:
            self.acc = d * self.acc + accepted
            self.rej = d * self.rej + (1 if accepted < k else 0)
            if draft_ms is not None:
                per = draft_ms / k
                self.draft_ms = per if self.draft_ms is None else _average(self.draft_ms, per)
        t = k + 1
        old = self.verify[t]
        self.verify[t] = verify_ms if np.isnan(old) else _average(float(old), verify_ms)
        self._est = self._estimate(np.arange(MAX_K + 2, dtype=np.float64)).tolist()


def greedy(target: DecoderSession, prefix, max_new_tokens: int, budget: Budget | None = None) -> DecodeResult:
    """Plain greedy decoding with the target alone: the reference every fast path must match."""
    return _plain(target, prefix, max_new_tokens, budget, 0.0, 1.0, None)


def sample(target: DecoderSession, prefix, max_new_tokens: int, budget: Budget | None = None,
           temperature: float = 1.0, top_p: float = 1.0, rng: np.random.Generator | None = None) -> DecodeResult:
    """Plain ancestral sampling with the target alone."""
    return _plain(target, prefix, max_new_tokens, budget, temperature, top_p, rng or np.random.default_rng())


def _pick(logits: np.ndarray, temperature: float, top_p: float, rng) -> int:
    if temperature <= 0.0:
        return int(np.argmax(logits))
    return draw(distribution(logits, temperature, top_p), rng)


def _plain(target, prefix, max_new_tokens, budget, temperature, top_p, rng) -> DecodeResult:
    t0 = time.monotonic_ns()
    budget = budget or Budget.unlimited()
    prefix = _check_request(target, prefix, max_new_tokens)
    stats = DecodeStats()
    logits = target.prefill(prefix)
    stats.target_passes += 1
    stats.prefill_ms = stats.ttft_ms = _ms_since(t0)
    tokens = [_pick(logits, temperature, top_p, rng)]
    probs = [token_prob(logits, tokens[0])]
    while len(tokens) < max_new_tokens and not budget.expired():
        logits = target.forward(np.array(tokens[-1:], np.int64))[0]
        stats.target_passes += 1
        stats.verify_passes += 1
        tokens.append(_pick(logits, temperature, top_p, rng))
        probs.append(token_prob(logits, tokens[-1]))
    stats.new_tokens = len(tokens)
    stats.wall_ms = _ms_since(t0)
    return DecodeResult(tokens, probs, len(tokens) == max_new_tokens, stats)


def speculate(draft: DecoderSession, target: DecoderSession, prefix, max_new_tokens: int,
              budget: Budget | None = None, k: int | None = None, temperature: float = 0.0,
              top_p: float = 1.0, rng: np.random.Generator | None = None, relax_delta: int = 0,
              relax_range: tuple[int, int] | None = None, controller: AdaptiveK | None = None) -> DecodeResult:
    """Speculative decoding: the draft proposes k tokens, the target verifies them in one pass.

    Greedy (temperature 0): accept draft token i while it equals the target's argmax at i; the
    first mismatch is replaced by the target's argmax, so the output is exactly plain greedy.
    Optional relaxed acceptance: inside `relax_range` (action bins) a draft token within
    `relax_delta` of the target's choice is accepted as is (lossy; off by default).
    Sampling: accept draft token x ~ q with probability min(1, p(x) / q(x)); on rejection draw
    from normalise(max(p - q, 0)); after k acceptances draw a bonus token from p. The output then
    follows the target's distribution p exactly (Leviathan et al., Chen et al. 2023).
    `k=None` adapts the draft length (1..16, or 0 = plain decoding when speculation does not pay).
    """
    if draft.vocab != target.vocab:
        raise ValueError(f"draft vocabulary {draft.vocab} differs from target vocabulary {target.vocab}")
    if k is not None and not 0 <= k <= MAX_K:
        raise ValueError(f"k must be in 0..{MAX_K} or None (adaptive), got {k}")
    t0 = time.monotonic_ns()
    budget = budget or Budget.unlimited()
    prefix = _check_request(target, prefix, max_new_tokens)
    _check_request(draft, prefix, max_new_tokens)
    ctl = controller or AdaptiveK()
    sampling = temperature > 0.0
    rng = rng or (np.random.default_rng() if sampling else None)
    lo, hi = relax_range or (0, 0)
    stats = DecodeStats()

    logits = target.prefill(prefix)
    stats.target_passes += 1
    stats.prefill_ms = stats.ttft_ms = _ms_since(t0)
    seq = list(prefix)
    out = [_pick(logits, temperature, top_p, rng)]
    probs = [token_prob(logits, out[0])]

    while len(out) < max_new_tokens and not budget.expired():
        seq_len = len(prefix) + len(out)  # committed tokens; target holds seq_len - 1 of them
        kk = min(ctl.choose(max_new_tokens - len(out)) if k is None else k, max_new_tokens - len(out) - 1)
        # 1. draft proposes kk tokens (q: the draft's distributions, for rejection sampling)
        t1 = time.monotonic_ns()
        proposal, q = [], []
        catch_up = seq_len - draft.length  # tokens the draft has not seen (the whole prefix at first)
        if kk > 0:
            d_logits = draft.prefill(np.array(seq + out, np.int64))  # catch up, reusing its cache
            for i in range(kk):
                stats.draft_passes += 1
                if sampling:
                    q.append(distribution(d_logits, temperature, top_p))
                    proposal.append(draw(q[-1], rng))
                else:
                    proposal.append(int(np.argmax(d_logits)))
                if i + 1 < kk:
                    d_logits = draft.forward(np.array(proposal[-1:], np.int64))[0]
        t2 = time.monotonic_ns()
        # 2. target scores cur + proposal in one pass: row i predicts the token after position i
        t_logits = target.forward(np.array([out[-1]] + proposal, np.int64))  # [kk+1, V]
        stats.target_passes += 1
        stats.verify_passes += 1
        # 3. accept a prefix of the proposal, then one token of the target's own
        n = 0
        while n < kk:
            x = proposal[n]
            if sampling:
                p = distribution(t_logits[n], temperature, top_p)
                if rng.random() * q[n][x] >= p[x]:  # reject with probability 1 - min(1, p/q)
                    residual = np.maximum(p - q[n], 0.0)
                    bonus = draw(residual / residual.sum(), rng) if residual.sum() > 0 else draw(p, rng)
                    break
            else:
                best = int(np.argmax(t_logits[n]))
                if x != best and not (relax_delta and lo <= x < hi and lo <= best < hi
                                      and abs(x - best) <= relax_delta):
                    bonus = best
                    break
            n += 1
        else:
            bonus = _pick(t_logits[kk], temperature, top_p, rng)
        emitted = proposal[:n] + [bonus]
        for i, tok in enumerate(emitted):
            probs.append(token_prob(t_logits[i], tok))
        out.extend(emitted)
        stats.proposed += kk
        stats.accepted += n
        # 4. rewind both caches to what is committed (target keeps all but the newest token)
        target.rewind(seq_len + n)
        draft.rewind(min(draft.length, seq_len + n))
        # a long catch-up (the prefix, after plain steps) is not what a draft token costs
        ctl.update(kk, n, (t2 - t1) / 1e6 if catch_up <= 2 else None, (time.monotonic_ns() - t2) / 1e6)

    del out[max_new_tokens:], probs[max_new_tokens:]
    stats.new_tokens = len(out)
    stats.wall_ms = _ms_since(t0)
    return DecodeResult(out, probs, len(out) == max_new_tokens, stats)


def tokens_per_s(result: DecodeResult) -> float:
    return result.stats.new_tokens / result.stats.wall_ms * 1e3 if result.stats.wall_ms > 0 else math.nan
