"""The engine's specification: speculative output == plain greedy for any draft, rejection sampling
reproduces the target's distribution, KV rewind is exact, budgets stop a call, signatures are checked."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from sol_control.budget import Budget, ManualClock
from sol_control.bundle import Bundle
from sol_control.decoding import AdaptiveK, DecoderSession, GuessLength, greedy, open_decoder, sample, speculate
from sol_control.decoding.adaptive_k import MAX_K
from sol_control.decoding.sampling import distribution

from .conftest import FIXTURES, MODELS

TINY = FIXTURES / "tiny"


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return Bundle.load(TINY)


@pytest.fixture(scope="module")
def target(bundle) -> DecoderSession:
    return DecoderSession(bundle.decoder_path("target", "fp32"), bundle.manifest.max_context)


@pytest.fixture(scope="module")
def drafts(bundle) -> dict[str, DecoderSession]:
    names = bundle.manifest.metrics["drafts"]
    return {kind: DecoderSession(bundle.path(fname), bundle.manifest.max_context, name=f"draft_{kind}")
            for kind, fname in names.items()}


def test_fp32_matches_torch_reference(bundle, target):
    ref = np.load(bundle.path("reference.npz"), allow_pickle=False)
    assert len(ref["prefix_len"]) >= 3
    for i, n in enumerate(ref["prefix_len"]):
        prefix, want = ref["prefix_ids"][i, :n], ref["greedy_ids"][i]
        got = greedy(target, prefix, len(want))
        assert got.tokens == want.tolist(), f"greedy continuation of prefix {i} differs from torch"
        seq = np.concatenate([prefix, want])[: ref["seq_len"][i]]
        target.reset()
        logits = np.concatenate([target.forward(seq[j:j + 16]).copy() for j in range(0, len(seq), 16)])
        np.testing.assert_allclose(logits, ref["logits"][i, : len(seq)], atol=1e-4)


PREFIX = st.lists(st.integers(4, 47), min_size=1, max_size=40)


@pytest.mark.parametrize("kind", ["close", "never", "same"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=PREFIX, n_new=st.integers(1, 40), k=st.one_of(st.none(), st.integers(0, 16)))
def test_speculative_equals_greedy(target, drafts, kind, prefix, n_new, k):
    prefix = np.array(prefix, np.int64)
    want = greedy(target, prefix, n_new)
    got = speculate(drafts[kind], target, prefix, n_new, k=k)
    assert got.tokens == want.tokens
    assert got.complete and got.stats.new_tokens == n_new
    np.testing.assert_allclose(got.probs, want.probs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["close", "same"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=PREFIX, k=st.one_of(st.none(), st.integers(1, 8)), stop_at=st.integers(0, 11))
def test_stop_ids_end_greedy_and_speculative_alike_and_the_cache_continues(target, drafts, kind, prefix, k, stop_at):
    """A stop id ends the answer right after it in greedy and speculative decoding alike (accepted
    guesses past it are dropped), and the caches are left holding the answer, so the next turn
    (the answer + new tokens, as an agent loop sends it) decodes as from an empty cache."""
    prefix = np.array(prefix, np.int64)
    free = greedy(target, prefix, 12).tokens
    stop = (free[stop_at],)
    want = greedy(target, prefix, 12, stop_ids=stop)
    assert want.tokens == free[:free.index(stop[0]) + 1]
    got = speculate(drafts[kind], target, prefix, 12, k=k, stop_ids=stop)
    assert got.tokens == want.tokens
    turn = np.concatenate([prefix, got.tokens, [5, 6, 7]])
    after = speculate(drafts[kind], target, turn, 6, k=k).tokens
    target.reset()
    drafts[kind].reset()
    assert after == greedy(target, turn, 6).tokens


def test_acceptance_reflects_draft_quality(target, drafts):
    rng = np.random.default_rng(0)
    rates = {}
    for kind in ("close", "never", "same"):
        acc = prop = 0
        for _ in range(10):
            r = speculate(drafts[kind], target, rng.integers(4, 48, 12), 30, k=4)
            acc, prop = acc + r.stats.accepted, prop + r.stats.proposed
        rates[kind] = acc / prop
    assert rates["same"] == 1.0
    assert rates["never"] == 0.0
    assert 0.1 < rates["close"] < 1.0, rates
    r = speculate(drafts["same"], target, rng.integers(4, 48, 12), 37, k=8)  # 1 + 4 x 9
    assert r.stats.mean_accepted == 8 + 1  # every pass: 8 drafts + a bonus


def test_relaxed_acceptance_only_moves_bins_within_delta(target, drafts):
    """'never' proposes the target's argmax + 1: exact acceptance takes none of it; relaxed with
    delta 1 inside a bin range takes it there (and the output moves by at most one bin), and
    nowhere else."""
    rng = np.random.default_rng(1)
    moved = 0
    for _ in range(10):
        prefix = rng.integers(4, 48, 10)
        exact = greedy(target, prefix, 20).tokens
        bins = (min(exact), max(exact) + 2)  # a bin range the plain output lies in
        relaxed = speculate(drafts["never"], target, prefix, 20, k=4, relax_delta=1, relax_range=bins)
        assert relaxed.stats.accepted > 0
        first = next((i for i, (a, b) in enumerate(zip(exact, relaxed.tokens)) if a != b), None)
        assert first is not None and abs(exact[first] - relaxed.tokens[first]) == 1
        assert bins[0] <= relaxed.tokens[first] < bins[1]
        moved += 1
        outside = (max(exact) + 2, 48)  # neither the output nor a proposal (argmax + 1) enters it
        strict = speculate(drafts["never"], target, prefix, 20, k=4, relax_delta=1, relax_range=outside)
        assert strict.tokens == exact and strict.stats.accepted == 0
    assert moved == 10


def _next_token_marginal(target: DecoderSession, prefix: np.ndarray, temperature: float) -> np.ndarray:
    """Exact distribution of the second sampled token: sum over t1 of p(t1) p(t2 | t1)."""
    p1 = distribution(target.prefill(prefix), temperature, 1.0)
    marginal = np.zeros_like(p1)
    for t1 in range(len(p1)):
        marginal += p1[t1] * distribution(target.prefill(np.append(prefix, t1)), temperature, 1.0)
    return marginal


@pytest.mark.parametrize("kind", ["close", "never"])
def test_rejection_sampling_follows_target_distribution(target, drafts, kind):
    prefix = np.array([1, 7, 19, 33, 5], np.int64)
    temperature, n = 1.5, 3000
    want = _next_token_marginal(target, prefix, temperature)
    rng = np.random.default_rng(42)
    counts = np.zeros(target.vocab)
    accepted = 0
    for _ in range(n):
        r = speculate(drafts[kind], target, prefix, 3, k=1, temperature=temperature, rng=rng)
        counts[r.tokens[1]] += 1
        accepted += r.stats.accepted
    expected = want * n
    big = expected >= 5  # pool rare tokens into one cell
    obs, exp = counts[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
    chi2, pvalue = sps.chisquare(obs, exp)
    assert pvalue > 1e-3, f"{kind}: chi2={chi2:.1f} p={pvalue:.2g}"
    if kind == "close":
        assert accepted > n * 0.3  # the acceptance branch was exercised, not only resampling


def test_plain_sampling_is_seeded(target):
    prefix = np.array([1, 9, 9, 9], np.int64)
    a = sample(target, prefix, 12, temperature=1.0, top_p=0.9, rng=np.random.default_rng(5))
    b = sample(target, prefix, 12, temperature=1.0, top_p=0.9, rng=np.random.default_rng(5))
    assert a.tokens == b.tokens


def test_kv_rewind_is_exact(target):
    rng = np.random.default_rng(3)
    ids = rng.integers(4, 48, 30)
    target.reset()
    full = target.forward(ids[:20]).copy()  # [20, V]
    target.forward(ids[20:30])
    target.rewind(12)  # drop 18 positions, recompute 8 of them
    again = target.forward(ids[12:20]).copy()
    np.testing.assert_allclose(again, full[12:20], atol=1e-5)
    buffers = target._kv.ctypes.data
    for _ in range(50):  # many rewinds: never a new cache
        target.rewind(int(rng.integers(0, target.length + 1)))
        target.forward(rng.integers(4, 48, 3))
    assert target._kv.ctypes.data == buffers


def test_prefix_reuse_skips_shared_tokens(target):
    prefix = np.arange(4, 36, dtype=np.int64)
    target.reset()
    greedy(target, prefix, 4)
    calls = target.calls
    want = greedy(target, prefix, 4)
    assert target.calls - calls == 4  # only the last prefix token + 3 decode steps
    changed = prefix.copy()
    changed[-3] = 40
    assert greedy(target, changed, 4).tokens != [] and want.complete


class TickingClock(ManualClock):
    """Advances 1 ms every time it is read: a budget of n ms allows about n reads."""

    def now_ns(self) -> int:
        self.advance_ms(1.0)
        return super().now_ns()


def test_budget_expiry_returns_incomplete(target, drafts):
    prefix = np.array([1, 4, 5, 6], np.int64)
    r = greedy(target, prefix, 100, budget=Budget.after_ms(0.0, clock=ManualClock()))
    assert not r.complete and len(r.tokens) == 1  # the prefill's token; no step started after expiry
    r = speculate(drafts["close"], target, prefix, 100, budget=Budget.after_ms(0.0, clock=ManualClock()), k=4)
    assert not r.complete and len(r.tokens) == 1
    calls = target.calls
    r = speculate(drafts["close"], target, prefix, 120, budget=Budget.after_ms(4.0, clock=TickingClock()), k=2)
    assert not r.complete and target.calls - calls <= 5  # stopped at the budget, not after 120 tokens


def test_bad_requests_fail_clearly(target, drafts):
    with pytest.raises(ValueError, match="token ids"):
        greedy(target, np.array([1, 48]), 4)
    with pytest.raises(ValueError, match="max_context"):
        greedy(target, np.ones(100, np.int64), 40)
    with pytest.raises(ValueError, match="prefix"):
        greedy(target, np.array([], np.int64), 4)
    with pytest.raises(ValueError, match="k must be"):
        speculate(drafts["close"], target, np.array([1, 2]), 4, k=17)


def test_quantized_targets_load_and_mostly_agree(bundle, target):
    rng = np.random.default_rng(9)
    for prec in ("int8", "int4"):
        q = DecoderSession(bundle.decoder_path("target", prec), bundle.manifest.max_context)
        agree = total = 0
        for _ in range(5):
            prefix = rng.integers(4, 48, 10)
            a, b = greedy(target, prefix, 10).tokens, greedy(q, prefix, 10).tokens
            agree += sum(x == y for x, y in zip(a, b))
            total += 10
        assert agree / total > 0.3, (prec, agree / total)


def _rewrite(src, dst, edit) -> str:
    model = onnx.load(str(src))
    edit(model.graph)
    onnx.save(model, str(dst))
    return str(dst)


def test_signature_errors_name_the_input(bundle, tmp_path):
    src = bundle.decoder_path("target", "fp32")

    def drop_mask(g):
        g.input.remove(next(i for i in g.input if i.name == "attention_mask"))
        g.input.append(onnx.helper.make_tensor_value_info("attention_mask_x", onnx.TensorProto.INT64, [1, "S"]))
        for n in g.node:
            n.input[:] = ["attention_mask_x" if x == "attention_mask" else x for x in n.input]

    with pytest.raises(ValueError, match="'attention_mask'"):
        DecoderSession(_rewrite(src, tmp_path / "a.onnx", drop_mask), 64)

    def rename_present(g):
        out = next(o for o in g.output if o.name == "present.1.value")
        for n in g.node:
            n.output[:] = ["kv_out" if x == "present.1.value" else x for x in n.output]
            n.input[:] = ["kv_out" if x == "present.1.value" else x for x in n.input]
        out.name = "kv_out"

    with pytest.raises(ValueError, match="present.1.value"):
        DecoderSession(_rewrite(src, tmp_path / "b.onnx", rename_present), 64)


def test_adaptive_k_switches_off_when_drafting_does_not_pay():
    ctl = AdaptiveK()
    for _ in range(50):  # a draft as slow as the target that is never right
        ctl.update(2, 0, draft_ms=2.0, verify_ms=1.2)
        ctl.update(0, 0, draft_ms=None, verify_ms=1.0)
    assert ctl.choose() == 0
    fast = AdaptiveK()
    for _ in range(50):  # a cheap draft that is usually right; verifying 9 tokens costs 1.3x one
        fast.update(8, 8, draft_ms=0.4, verify_ms=1.3)
        fast.update(0, 0, draft_ms=None, verify_ms=1.0)
    assert fast.choose() >= 8
    assert fast.choose(remaining=3) == 2  # never drafts past the end of the decision


def test_adaptive_k_picks_the_best_modelled_rate():
    """choose() reads a cost table refreshed by update(): it must still pick the k that maximises
    expected tokens per ms under the measured pass costs (interpolated, extrapolated past the
    largest pass seen)."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        ctl = AdaptiveK()
        for step in range(int(rng.integers(2, 12))):
            k = int(rng.integers(1 if step == 0 else 0, 9))
            ctl.update(k, int(rng.integers(0, k + 1)), float(rng.uniform(0.05, 0.6)) if k else None,
                       float(rng.uniform(0.3, 2.0)))
        seen = np.flatnonzero(~np.isnan(ctl.verify))
        ms = ctl.verify[seen]
        slope = max((ms[-1] - ms[0]) / (seen[-1] - seen[0]), 0.05 * ms[0]) if len(seen) > 1 else None

        def cost(t):
            if slope is None:
                return ms[0] * max(1 + 0.1 * (t - seen[0]), 0.1)
            return float(np.interp(t, seen, ms)) if t <= seen[-1] else ms[-1] + (t - seen[-1]) * slope

        if ctl.draft_ms is None:
            continue
        a = min(ctl.alpha, 0.999)
        rates = [1.0 / cost(1)] + [(1 - a ** (k + 1)) / (1 - a) / (k * ctl.draft_ms + cost(k + 1))
                                   for k in range(1, MAX_K + 1)]
        assert ctl.choose(MAX_K + 1) == int(np.argmax(rates))
        assert ctl.verify_ms(5) == pytest.approx(cost(5), rel=1e-9)


def test_guess_length_checks_only_the_guesses_that_pay_for_their_pass():
    """Passes cost 10 ms + 2 ms a guess. Heads whose first guess is right 60 % of the time and
    later ones rarely: one guess pays best; a source right 98 % of the time (lookup on a text that
    repeats): all of them. Learnt per source, from the passes it times."""
    length = GuessLength()
    assert length.choose("heads", 4) == 1  # no pass timed yet: each count once, smallest first
    rng = np.random.default_rng(0)
    for _ in range(300):
        for source, p in (("heads", [0.6, 0.2, 0.2, 0.2]), ("lookup", [0.98] * 8)):
            offered = len(p)
            c = length.choose(source, offered)
            assert 1 <= c <= offered
            right = rng.random(c) < p[:c]
            accepted = int(np.argmin(np.append(right, False)))  # leading right guesses
            length.update(source, c, accepted, 10.0 + 2.0 * c)
    assert length.best("heads", 4) == 1
    assert length.best("lookup", 8) == 8
    assert length.expected_tokens("heads", 1)[0] == pytest.approx(1.6, abs=0.1)
    assert length.choose("heads", 0) == 0 and length.choose("heads", 1) == 1


def test_guess_length_times_the_counts_next_to_its_best_again():
    """One guess pays (passes 10 ms + 2 ms a guess, the second guess right 20 % of the time), but
    its first pass was timed cold at 40 ms, so two guesses look better. Every RETIME_EVERY-th pass
    checks a count next to the best, and the one-guess pass's true cost brings the choice back."""
    from sol_control.decoding.adaptive_k import RETIME_EVERY

    length = GuessLength()
    rng = np.random.default_rng(2)
    chosen = []
    for i in range(40 * RETIME_EVERY):
        c = length.choose("heads", 2)
        chosen.append(c)
        right = rng.random(c) < [0.6, 0.2][:c]
        cold = i == 0  # the first pass after a prefill through another graph
        length.update("heads", c, int(np.argmin(np.append(right, False))), 40.0 if cold else 10.0 + 2.0 * c)
    assert chosen[:2] == [1, 2]  # each count timed once, smallest first
    assert chosen[2:2 + RETIME_EVERY - 1] == [2] * (RETIME_EVERY - 1)  # the cold timing misled it
    assert length.best("heads", 2) == 1
    twos = np.flatnonzero(np.array(chosen[-4 * RETIME_EVERY:]) == 2)
    assert len(twos) == 4 and set(np.diff(twos)) == {RETIME_EVERY}  # two guesses now only to re-time them


def test_guess_length_prefers_the_source_with_more_tokens_a_ms_and_still_tries_the_other():
    """Lookup is taken while nothing is timed; once it has been right 10 % of the time and the heads
    60 %, the heads' guesses win, except every EXPLORE_EVERY-th time (lookup keeps learning)."""
    from sol_control.decoding.adaptive_k import EXPLORE_EVERY

    length = GuessLength()
    assert length.prefer("lookup2", 4, "heads", 3)  # nothing timed: rates are nan
    rng = np.random.default_rng(1)
    for _ in range(200):
        for source, p in (("heads", 0.6), ("lookup2", 0.1)):
            accepted = int(rng.random() < p)
            length.update(source, 1, accepted, 10.0)
    assert length.rate("heads", 3) > length.rate("lookup2", 4)
    picks = [length.prefer("lookup2", 4, "heads", 3) for _ in range(3 * EXPLORE_EVERY)]
    assert sum(picks) == 3 and picks[EXPLORE_EVERY - 1]
    assert length.prefer("heads", 3, "lookup2", 4)  # the faster source is always taken
    assert np.isnan(length.rate("heads", 0))


def test_adaptive_k_shrugs_off_one_slow_step_and_probes_a_draft_it_stopped_using():
    good = AdaptiveK()
    for _ in range(30):  # a cheap, usually right draft: drafting pays
        good.update(4, 4, draft_ms=0.4, verify_ms=0.5)
        good.update(0, 0, draft_ms=None, verify_ms=0.4)
    assert good.choose() > 0
    good.update(4, 4, draft_ms=400.0, verify_ms=0.5)  # one preempted draft step (100 ms a token)
    assert good.choose() > 0 and good.draft_ms < 0.2

    ctl = AdaptiveK(explore_every=4)
    for _ in range(30):  # the draft was expensive: plain decoding wins
        ctl.update(2, 2, draft_ms=4.0, verify_ms=0.5)
        ctl.update(0, 0, draft_ms=None, verify_ms=0.4)
    chosen = []
    for _ in range(300):  # ...then it got cheap; only probes can notice
        k = ctl.choose()
        chosen.append(k)
        ctl.update(k, k, draft_ms=0.05 * k if k else None, verify_ms=0.4 + 0.02 * k)
    assert chosen[0] == 0 and chosen[-1] > 2, chosen
    first_probe = chosen.index(2)
    assert chosen[first_probe - 3:first_probe] == [0, 0, 0]  # probes only after explore_every plain steps


def test_quantized_target_opened_directly_keeps_speculative_equal_to_plain(bundle, drafts):
    """The exactness rule lives in the session: a quantized graph opened without open_decoder also
    runs single tokens as 2-token steps, so speculative == plain on it, as open_decoder's."""
    rng = np.random.default_rng(3)
    for prec in ("int8", "int4"):
        direct = DecoderSession(bundle.decoder_path("target", prec), bundle.manifest.max_context)
        assert direct.min_step_tokens == 2 and open_decoder(bundle, "target", prec).min_step_tokens == 2
        for n in (1, *rng.integers(3, 12, 5)):  # one token: run twice, the second dropped
            prefix = rng.integers(4, 48, int(n))
            plain = greedy(direct, prefix, 16).tokens
            for k in (1, 3, 6):
                assert speculate(drafts["close"], direct, prefix, 16, k=k).tokens == plain, (prec, k)
    assert DecoderSession(bundle.decoder_path("target", "fp32"), 64).min_step_tokens == 1


@pytest.mark.parametrize("threads, spinning", [(1, "0"), (2, "1")])
def test_worker_threads_spin_within_a_run_only(bundle, threads, spinning):
    """With worker threads, a session's pool spins between nodes but stops when the run returns,
    so that it does not take a core from the next session's run (session_options' docstring)."""
    sess = open_decoder(bundle, "target", "fp32", threads=threads).session
    opts = sess.get_session_options()
    assert opts.intra_op_num_threads == threads
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == spinning
    assert opts.get_session_config_entry("session.force_spinning_stop") == spinning


def decoder_members() -> set[str]:
    """The members of `decoding.Decoder`: its attributes, methods and properties."""
    from sol_control.decoding import Decoder

    return set(Decoder.__annotations__) | {n for n in vars(Decoder) if not n.startswith("_")}


def test_every_session_has_the_whole_decoder_interface(target):
    """speculate and the planners read a decoder through `decoding.Decoder` only, never probing for
    a member: each session kind has all of it (DecoderSession: no heads, no `probs`, and says so)."""
    import inspect

    from sol_control.decoding import native
    from sol_control.decoding.fused import FusedDecoderSession

    members = decoder_members()
    assert {"forward", "prefill", "rewind", "row_probs", "accepted", "head_ids", "guesser", "backend_info"} <= members
    graph = MODELS / "qc" / "target_fused_int8.onnx"
    sessions = [target, FusedDecoderSession(graph)]
    if native.library() is not None:
        sessions.append(native.NativeDecoderSession(graph))
    for sess in sessions:
        for m in members:  # a static lookup: a property is found, not run
            inspect.getattr_static(sess, m)
    assert target.row_probs is None and target.draft_heads == 0 and not target.can_guess_prefill
    for m in ("accepted", "next_token", "head_ids"):
        with pytest.raises(ValueError, match="no draft heads"):
            getattr(target, m)
