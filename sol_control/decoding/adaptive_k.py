"""How many tokens the draft proposes per step: chosen from measured costs and acceptance.

With per-token acceptance a, k drafts yield (1 - a^(k+1)) / (1 - a) tokens per step and cost
k * draft_ms + verify_ms(k + 1); `AdaptiveK.choose` picks the k with the most tokens per ms (0 =
plain decoding when drafting does not pay). Keep one controller per planner: it learns across
decisions.
"""
from __future__ import annotations

import math

import numpy as np

MAX_K = 16
PROBE_K = 2  # draft length of the steps that re-measure a draft the controller stopped using
EXPLORE_EVERY = 8  # GuessLength.prefer: a source that looks slower is still tried this often
RETIME_EVERY = 16  # GuessLength.choose: every so many passes of a source check a count next to its best
OUTLIER_X = 3.0  # a timing enters a running average at most at this multiple of the average


def _average(old: float, new: float) -> float:
    return 0.8 * old + 0.2 * min(new, OUTLIER_X * old)


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


class GuessLength:
    """How many of the guesses on offer (draft heads' or prompt lookup's) one verify pass checks.

    Guesses cost no draft time (the heads run inside the target's call), only a wider pass; where
    that pass is compute-bound (int4 / int8 verify on CPUs without VNNI: 5 rows ~1.9x one row), a
    late head whose guess is rarely right costs more than it brings. Per source it keeps the
    chance that guess j is accepted once guesses 1..j-1 were, and picks the count c with the most
    expected tokens, 1 + sum_j prod_{i<=j} p_i, per ms of a pass of c + 1 rows (AdaptiveK's cost
    estimate, learnt from the passes it times; each count is timed once first). At least one guess:
    a plain step in exact mode runs two rows anyway. Every RETIME_EVERY-th pass of a source checks a
    count next to its best instead, so that a count's cost keeps up: its first timing may have been
    a cold pass (the first after a prefill through another graph), and a count never chosen again
    would keep that price for good. Keep one per decoder: it learns across answers.
    """

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.costs = AdaptiveK()  # only its per-size verify cost estimate is used
        self._tried: dict[str, np.ndarray] = {}
        self._passed: dict[str, np.ndarray] = {}
        self._lost: dict[str, int] = {}  # per source: how often `prefer` found it slower
        self._chosen: dict[str, int] = {}  # per source: passes counted for RETIME_EVERY

    def _counts(self, source: str) -> tuple[np.ndarray, np.ndarray]:
        if source not in self._tried:
            self._tried[source], self._passed[source] = np.zeros(MAX_K + 1), np.zeros(MAX_K + 1)
        return self._tried[source], self._passed[source]

    def acceptance(self, source: str) -> list[float]:
        """p_j for j = 1..MAX_K: the chance guess j is accepted when 1..j-1 were. Each position's
        prior (weight one try) is the position before it (the first's: 1/2), so a position seldom
        reached is taken to do as well as the one before, not worse."""
        tried, passed = self._counts(source)
        p, prior = [], 0.5
        for j in range(1, MAX_K + 1):
            prior = (passed[j] + prior) / (tried[j] + 1.0)
            p.append(prior)
        return p

    def expected_tokens(self, source: str, count: int) -> np.ndarray:
        """[count]: the tokens one pass checking c = 1..count guesses of `source` is expected to emit
        (its own included)."""
        return 1.0 + np.cumsum(np.cumprod(self.acceptance(source)[:count]))

    def choose(self, source: str, offered: int) -> int:
        """The number of guesses to check, 1..offered (0 when none are offered): the best count,
        or every RETIME_EVERY-th pass of `source` a count next to it (below and above in turn)."""
        offered = min(offered, MAX_K)
        if offered <= 1:
            return offered
        untimed = np.flatnonzero(np.isnan(self.costs.verify[2:offered + 2]))  # counts c - 1 never timed
        if len(untimed):
            return int(untimed[0]) + 1  # each count is timed once, smallest first (no extrapolating below)
        best = self.best(source, offered)
        n = self._chosen[source] = self._chosen.get(source, 0) + 1
        if n % RETIME_EVERY:
            return best
        nearby = [c for c in (best - 1, best + 1) if 1 <= c <= offered]
        return nearby[(n // RETIME_EVERY) % len(nearby)]

    def best(self, source: str, offered: int) -> int:
        """The count of `source`'s guesses with the most expected tokens a ms, 1..offered (all of
        them timed)."""
        return 1 + int(np.argmax(self._rates(source, min(offered, MAX_K))))

    def _rates(self, source: str, offered: int) -> list[float]:
        """Expected tokens per ms of a pass checking c = 1..offered of `source`'s guesses."""
        tokens = self.expected_tokens(source, offered)
        return [tokens[c - 1] / self.costs.verify_ms(c + 1) for c in range(1, offered + 1)]

    def rate(self, source: str, offered: int) -> float:
        """Expected tokens per ms of a pass checking the best count of `source`'s `offered`
        guesses; nan before a pass was timed."""
        offered = min(offered, MAX_K)
        if offered < 1 or self.costs.verify_ms(2) is None:
            return math.nan
        return max(self._rates(source, offered))

    def prefer(self, source: str, offered: int, other: str, other_offered: int) -> bool:
        """Should a pass check `source`'s guesses rather than `other`'s? Yes unless `source` is
        expected to emit fewer tokens a ms; every EXPLORE_EVERY-th time it loses, yes all the
        same, so that what it learnt about `source` keeps up with the text."""
        if not self.rate(source, offered) < self.rate(other, other_offered):
            return True
        self._lost[source] = self._lost.get(source, 0) + 1
        return self._lost[source] % EXPLORE_EVERY == 0

    def update(self, source: str, checked: int, accepted: int, verify_ms: float) -> None:
        """Learn from one pass that checked `checked` guesses of `source` and accepted `accepted`."""
        if checked <= 0:
            return
        tried, passed = self._counts(source)
        tried *= self.decay
        passed *= self.decay
        tried[1:min(accepted + 1, checked) + 1] += 1  # guesses 1..accepted+1 were looked at
        passed[1:accepted + 1] += 1
        self.costs.update(checked, accepted, None, verify_ms)
