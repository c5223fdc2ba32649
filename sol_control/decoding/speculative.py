"""Plain and speculative decoding over decoders (`decoder.Decoder`).

Both caches obey one invariant: the committed sequence is `seq` (prefix + out), the target cache
holds seq[:-1] and `seq[-1]` (the newest token, "cur") is fed with the next verification. The draft
cache holds some prefix of `seq` and catches up by feeding what it misses in one multi-token call.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..budget import Budget
from .adaptive_k import MAX_K, AdaptiveK, GuessLength
from .sampling import argmax_probs, distribution, draw, token_prob
from .decoder import Decoder


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
    first_call_tokens: int = 1  # emitted by the prefill call (more with a guessed prefill)

    @property
    def decode_tokens(self) -> int:
        """Tokens emitted after the prefill call, in `decode_ms`: a decode rate's numerator."""
        return max(self.new_tokens - self.first_call_tokens, 0)

    @property
    def decode_ms(self) -> float:
        return self.wall_ms - self.ttft_ms

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


def _check_request(sess: Decoder, prefix, max_new_tokens: int) -> np.ndarray:
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


@dataclass
class Rule:
    """How tokens are picked and draft tokens accepted: greedy (temperature 0), optionally relaxed
    inside `relax_range`, or sampling with temperature and top-p."""

    temperature: float = 0.0
    top_p: float = 1.0
    rng: np.random.Generator | None = None
    relax_delta: int = 0
    relax_range: tuple[int, int] = (0, 0)

    @property
    def sampling(self) -> bool:
        return self.temperature > 0.0

    def pick(self, logits: np.ndarray) -> int:
        if not self.sampling:
            return int(np.argmax(logits))
        return draw(distribution(logits, self.temperature, self.top_p), self.rng)

    def propose(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        """A draft token and the draft's distribution q (None when greedy)."""
        if not self.sampling:
            return int(np.argmax(logits)), None
        q = distribution(logits, self.temperature, self.top_p)
        return draw(q, self.rng), q

    def accept(self, proposal: list[int], q: list, t_logits: np.ndarray) -> tuple[int, int]:
        """(accepted n, the target's token after them) for `proposal` verified by `t_logits` [k+1, V].

        Greedy: accept draft token i while it equals the target's argmax at i; the first mismatch is
        replaced by that argmax, so the output is exactly plain greedy. Relaxed (lossy, off by
        default): inside relax_range a draft token within relax_delta of the argmax is accepted.
        Sampling: accept x ~ q with probability min(1, p(x) / q(x)); on rejection draw from
        normalise(max(p - q, 0)); after k acceptances draw a bonus token from p. The output then
        follows p exactly (Leviathan et al., Chen et al. 2023)."""
        lo, hi = self.relax_range
        for n, x in enumerate(proposal):
            if self.sampling:
                p = distribution(t_logits[n], self.temperature, self.top_p)
                if self.rng.random() * q[n][x] >= p[x]:  # reject with probability 1 - min(1, p/q)
                    residual = np.maximum(p - q[n], 0.0)
                    return n, draw(residual / residual.sum(), self.rng) if residual.sum() > 0 else draw(p, self.rng)
            else:
                best = int(np.argmax(t_logits[n]))
                if x != best and not (self.relax_delta and lo <= x < hi and lo <= best < hi
                                      and abs(x - best) <= self.relax_delta):
                    return n, best
        return len(proposal), self.pick(t_logits[len(proposal)])


def greedy(target: Decoder, prefix, max_new_tokens: int, budget: Budget | None = None,
           stop_ids: tuple[int, ...] = ()) -> DecodeResult:
    """Plain greedy decoding with the target alone: the reference every fast path must match.
    Generation ends after a token in `stop_ids` (kept) or `max_new_tokens`."""
    return _plain(target, prefix, max_new_tokens, budget, Rule(), stop_ids)


def sample(target: Decoder, prefix, max_new_tokens: int, budget: Budget | None = None,
           temperature: float = 1.0, top_p: float = 1.0, rng: np.random.Generator | None = None) -> DecodeResult:
    """Plain ancestral sampling with the target alone."""
    return _plain(target, prefix, max_new_tokens, budget, Rule(temperature, top_p, rng or np.random.default_rng()))


def _prefill(target: Decoder, prefix: np.ndarray, rule: Rule, stats: DecodeStats, t0: int):
    logits = target.prefill(prefix)
    stats.target_passes += 1
    stats.prefill_ms = stats.ttft_ms = _ms_since(t0)
    first = rule.pick(logits)
    return [first], [_last_prob(target, rule, logits, first)]


def _last_prob(target: Decoder, rule: Rule, logits: np.ndarray, token: int) -> float:
    """The probability of `token`, picked from the last call's last row (`logits`): the graph's own
    `probs` where it has them and the token is greedy, else a softmax here."""
    probs = None if rule.sampling else target.row_probs
    return float(probs[-1]) if probs is not None else token_prob(logits, token)


def _greedy_probs(target: Decoder, t_logits: np.ndarray, n: int) -> list[float]:
    """The probabilities of the first n rows' argmaxes: from the graph where it has them (`probs`)."""
    probs = target.row_probs
    return probs[:n].tolist() if probs is not None else argmax_probs(t_logits[:n])


def _plain(target: Decoder, prefix, max_new_tokens, budget, rule: Rule, stop_ids: tuple[int, ...] = ()) -> DecodeResult:
    t0 = time.monotonic_ns()
    budget = budget or Budget.unlimited()
    prefix = _check_request(target, prefix, max_new_tokens)
    target.use_heads(False)  # plain decoding reads no guesses
    stats = DecodeStats()
    tokens, probs = _prefill(target, prefix, rule, stats, t0)
    while len(tokens) < max_new_tokens and tokens[-1] not in stop_ids and not budget.expired():
        logits = target.forward(np.array(tokens[-1:], np.int64))[0]
        stats.target_passes += 1
        stats.verify_passes += 1
        tokens.append(rule.pick(logits))
        probs.append(_last_prob(target, rule, logits, tokens[-1]))
    return _finish(tokens, probs, max_new_tokens, stats, t0, stop_ids)


def _stop_at(emitted: list[int], stop_ids: tuple[int, ...]) -> int:
    """How many of `emitted` to keep: up to and including the first stop id (all when none)."""
    if not stop_ids:
        return len(emitted)
    return next((i + 1 for i, t in enumerate(emitted) if t in stop_ids), len(emitted))


def _finish(tokens, probs, max_new_tokens, stats, t0, stop_ids: tuple[int, ...] = ()) -> DecodeResult:
    """The result, cut after max_new_tokens and after the first stop id."""
    n = min(max_new_tokens, _stop_at(tokens, stop_ids))
    del tokens[n:], probs[n:]
    stats.new_tokens = len(tokens)
    stats.wall_ms = _ms_since(t0)
    return DecodeResult(tokens, probs, len(tokens) == max_new_tokens, stats)


def _propose(draft: Decoder, seq: list[int], k: int, rule: Rule, stats: DecodeStats):
    """k draft tokens after `seq` (the draft first catches up on what it has not seen, reusing its
    cache), with the draft's distributions q for rejection sampling."""
    proposal, q = [], []
    if k == 0:
        return proposal, q
    logits = draft.prefill(np.array(seq, np.int64))
    for i in range(k):
        stats.draft_passes += 1
        token, dist = rule.propose(logits)
        proposal.append(token)
        q.append(dist)
        if i + 1 < k:
            logits = draft.forward(np.array([token], np.int64))[0]
    return proposal, q


def speculate(draft: Decoder, target: Decoder, prefix, max_new_tokens: int,
              budget: Budget | None = None, k: int | None = None, temperature: float = 0.0,
              top_p: float = 1.0, rng: np.random.Generator | None = None, relax_delta: int = 0,
              relax_range: tuple[int, int] | None = None, controller: AdaptiveK | None = None,
              stop_ids: tuple[int, ...] = ()) -> DecodeResult:
    """Speculative decoding: the draft proposes k tokens, the target verifies them in one pass and
    adds one of its own (`Rule.accept` says how). `k=None` adapts the draft length (1..16, or 0 =
    plain decoding when speculation does not pay). Ends after a token in `stop_ids` (kept)."""
    if draft.vocab != target.vocab:
        raise ValueError(f"draft vocabulary {draft.vocab} differs from target vocabulary {target.vocab}")
    if k is not None and not 0 <= k <= MAX_K:
        raise ValueError(f"k must be in 0..{MAX_K} or None (adaptive), got {k}")
    t0 = time.monotonic_ns()
    budget, ctl = budget or Budget.unlimited(), controller or AdaptiveK()
    rng = rng or (np.random.default_rng() if temperature > 0.0 else None)
    rule = Rule(temperature, top_p, rng, relax_delta, relax_range or (0, 0))
    prefix = _check_request(target, prefix, max_new_tokens)
    _check_request(draft, prefix, max_new_tokens)
    target.use_heads(False)  # the draft model guesses here, not the heads
    stats, seq = DecodeStats(), prefix.tolist()
    out, probs = _prefill(target, prefix, rule, stats, t0)
    while len(out) < max_new_tokens and out[-1] not in stop_ids and not budget.expired():
        seq_len = len(prefix) + len(out)  # committed tokens; the target holds seq_len - 1 of them
        kk = min(ctl.choose(max_new_tokens - len(out)) if k is None else k, max_new_tokens - len(out) - 1)
        catch_up, t1 = seq_len - draft.length, time.monotonic_ns()
        proposal, q = _propose(draft, seq + out, kk, rule, stats)
        t2 = time.monotonic_ns()
        t_logits = target.forward(np.array([out[-1]] + proposal, np.int64))  # [kk+1, V]: row i predicts i+1
        n, bonus = rule.accept(proposal, q, t_logits)
        emitted = proposal[:n] + [bonus]
        emitted = emitted[:_stop_at(emitted, stop_ids)]
        if rule.sampling or rule.relax_delta:  # an emitted token need not be its row's argmax
            probs += [token_prob(t_logits[i], tok) for i, tok in enumerate(emitted)]
        else:
            probs += _greedy_probs(target, t_logits, len(emitted))
        out += emitted
        stats.target_passes, stats.verify_passes = stats.target_passes + 1, stats.verify_passes + 1
        stats.proposed, stats.accepted = stats.proposed + kk, stats.accepted + n
        target.rewind(seq_len + len(emitted) - 1)  # keep all that is committed but the newest token
        draft.rewind(min(draft.length, seq_len + len(emitted) - 1))
        # a long catch-up (the prefix, after plain steps) is not what a draft token costs
        ctl.update(kk, n, (t2 - t1) / 1e6 if catch_up <= 2 else None, _ms_since(t2))
    return _finish(out, probs, max_new_tokens, stats, t0, stop_ids)


def lookup_match(seq: np.ndarray, k: int, n_max: int = 3, n_min: int = 2) -> tuple[list[int], int]:
    """Prompt lookup: the (up to) k tokens that followed the latest earlier occurrence of the
    sequence's last n tokens, n from n_max down to n_min, and n; ([], 0) when there is none.
    seq [L] int64."""
    L = len(seq)
    for n in range(n_max, n_min - 1, -1):
        if L <= n:
            continue
        hits = np.ones(L - n, bool)  # window i = seq[i:i+n], followed by at least one token
        for j in range(n):
            hits &= seq[j:L - n + j] == seq[L - n + j]
        found = np.flatnonzero(hits)
        if len(found):
            start = int(found[-1]) + n
            return seq[start:start + k].tolist(), n
    return [], 0


def speculate_heads(target: Decoder, prefix, max_new_tokens: int, budget: Budget | None = None,
                    stop_ids: tuple[int, ...] = (), lookup: int = 0,
                    length: GuessLength | None = None, prefill_guesses: bool = True) -> DecodeResult:
    """Self-speculative greedy decoding with the target's own draft heads (a fused graph built with
    heads: it checks the guesses itself and guesses on from the row it stopped at). One call
    verifies the previous guesses and makes the next ones:

        prefill ─► token 1 (argmax of the last row), guesses 2..K+1 (the heads at that row)
        forward([cur, g_1..g_k], rows=k+1) ─► accepted n: g_1..g_n each equal the argmax of the row
            before them; row n's argmax is the target's own next token, its heads guess on

    Output == plain greedy of the same target (greedy acceptance; the graph's rows do not depend on
    how many tokens share a pass), ending after a token in `stop_ids` (kept) as greedy does.

    `lookup` > 0: where the text so far repeats itself (`lookup_match`: its last 2-3 tokens seen
    before), up to `lookup` tokens that followed them there are the guesses instead of the heads'
    (an agent loop copying ids and keys from its tool results); the graph verifies either alike.
    A target without draft heads (draft_heads = 0) decodes with lookup's guesses alone (prompt
    lookup decoding), checked here against its rows' argmaxes, and a plain step where none match.

    `length` (a GuessLength, kept across answers) checks only as many guesses as pay for their
    wider pass, and takes lookup's guesses only where they are expected to emit more tokens a ms
    than the heads' (`GuessLength.prefer`, learnt per repeat length: in prose a repeat of two
    tokens is a weak hint); None checks all of them, lookup's wherever there are some.

    `prefill_guesses` with an answer guesser (`target.guesser`, the bundle's `target.guesses`): the
    prefill also checks its guesses of the answer's first tokens (a short answer guessed right takes
    one call); not once the budget ran out: then the plain prefill gives one token, as greedy's."""
    t0 = time.monotonic_ns()
    budget = budget or Budget.unlimited()
    prefix = _check_request(target, prefix, max_new_tokens)
    stats, heads = DecodeStats(), _heads_on(target, lookup)
    out, probs = _first_tokens(target, prefix, max_new_tokens, budget, prefill_guesses, stats, t0, stop_ids)
    seq = np.concatenate([prefix, np.zeros(max_new_tokens, np.int64)]) if lookup else None  # the text, for lookups
    guesses, last = target.head_ids.tolist() if heads else [], False
    while len(out) < max_new_tokens and out[-1] not in stop_ids and not budget.expired():
        seq_len = len(prefix) + len(out)  # committed tokens; the target holds seq_len - 1 of them
        source = "heads"
        if lookup:
            seq[len(prefix):seq_len] = out
            guesses, source = _lookup_or(guesses, seq[:seq_len], lookup, length)
        kk = min(len(guesses), max_new_tokens - len(out) - 1)
        kk = length.choose(source, kk) if length is not None else kk
        if heads and (kk + 1 >= max_new_tokens - len(out)) != last:  # this pass may end the answer, or not
            last = not last
            target.use_heads(True, last)  # then its heads matter only where a guess is rejected
        t1 = time.monotonic_ns()
        t_logits = target.forward(np.array([out[-1]] + guesses[:kk], np.int64))  # [kk+1, V]
        n, emitted = _checked(target, guesses[:kk], t_logits, stats, stop_ids)
        if length is not None:
            length.update(source, kk, n, _ms_since(t1))
        probs += _greedy_probs(target, t_logits, len(emitted))  # every emitted token is its row's argmax
        out += emitted
        guesses = target.head_ids.tolist() if heads else []  # the heads at row n: what follows the emitted token
        target.rewind(seq_len + len(emitted) - 1)
    return _finish(out, probs, max_new_tokens, stats, t0, stop_ids)


def _first_tokens(target: Decoder, prefix, max_new_tokens: int, budget: Budget, prefill_guesses: bool,
                  stats: DecodeStats, t0: int, stop_ids: tuple[int, ...]) -> tuple[list[int], list[float]]:
    """speculate_heads's prefill: with the answer guesser's guesses checked in it where the target
    can (and time is left), else the plain prefill's one token."""
    if prefill_guesses and target.can_guess_prefill and target.guesser is not None \
            and max_new_tokens > 1 and not budget.expired():
        guesses = target.guesser.guess(prefix, max_new_tokens - 1)
        return _prefill_guessed(target, prefix, guesses, stats, t0, stop_ids)
    return _prefill(target, prefix, Rule(), stats, t0)


def _heads_on(target: Decoder, lookup: int) -> bool:
    """Does `target` have draft heads (then switched on for the calls to come)? ValueError when it
    has none and there is no prompt lookup either."""
    heads = target.draft_heads > 0
    if not heads and not lookup:
        raise ValueError(f"{target.name}: no draft heads; speculate_heads needs them or lookup > 0")
    target.use_heads(heads)
    return heads


def _checked(target: Decoder, guesses: list[int], t_logits: np.ndarray, stats: DecodeStats,
             stop_ids: tuple[int, ...]) -> tuple[int, list[int]]:
    """(accepted n, emitted tokens) of a pass that checked `guesses` (logits [len + 1, V]): the
    accepted guesses and the target's own next token, cut after a stop id; counted in `stats`."""
    if target.draft_heads:  # the graph checked the guesses and knows its own next token
        n = target.accepted
        emitted = guesses[:n] + [target.next_token]
    else:
        n = _agreed(guesses, t_logits)
        emitted = guesses[:n] + [int(np.argmax(t_logits[n]))]
    stats.target_passes, stats.verify_passes = stats.target_passes + 1, stats.verify_passes + 1
    stats.proposed, stats.accepted = stats.proposed + len(guesses), stats.accepted + n
    return n, emitted[:_stop_at(emitted, stop_ids)]


def _lookup_or(heads: list[int], seq: np.ndarray, lookup: int, length: GuessLength | None) -> tuple[list[int], str]:
    """(guesses, their source): prompt lookup's where the committed text `seq` repeats itself and
    `length` expects them to pay better than the heads' (always, without `length`), else the heads'."""
    found, n_seen = lookup_match(seq, lookup)
    key = f"lookup{n_seen}"  # a repeat of 3 tokens predicts better than one of 2: learnt apart
    if found and (length is None or length.prefer(key, len(found), "heads", len(heads))):
        return found, key
    return heads, "heads"


def _prefill_guessed(target: Decoder, prefix: np.ndarray, guesses: list[int], stats: DecodeStats, t0: int,
                     stop_ids: tuple[int, ...]):
    """The prefill with the guesser's guesses after the prefix, checked like a verify pass: the
    accepted guesses and the target's own next token, as plain greedy would emit them."""
    t_logits = target.prefill_guessed(np.concatenate([prefix, np.asarray(guesses, np.int64)]), len(guesses))
    n, emitted = _checked(target, guesses, t_logits, stats, stop_ids)
    stats.prefill_ms = stats.ttft_ms = _ms_since(t0)
    stats.first_call_tokens = len(emitted)
    target.rewind(len(prefix) + n)
    return emitted, _greedy_probs(target, t_logits, len(emitted))


def _agreed(guesses: list[int], logits: np.ndarray) -> int:
    """How many leading guesses equal the argmax of the row before them (logits [len + 1, V])."""
    same = np.argmax(logits[:len(guesses)], axis=-1) == np.asarray(guesses, np.int64)
    return int(np.argmin(np.append(same, False)))


def tokens_per_s(result: DecodeResult) -> float:
    return result.stats.new_tokens / result.stats.wall_ms * 1e3 if result.stats.wall_ms > 0 else math.nan
