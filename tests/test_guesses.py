"""Answer guesses checked by the prefill (sol_control.decoding.guesses): the guesser's own rules, its
file, the guessed prefill on real ONNX Runtime sessions (plain greedy's tokens whatever the guesses),
and the shipped policies' guessers on real scenes (fewer calls, same answers)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sol_control.bundle import Bundle, write_manifest
from sol_control.decoding import greedy, open_decoder, speculate_heads
from sol_control.decoding.fused import FusedDecoderSession
from sol_control.decoding.guesses import AnswerGuesser, fit_guesser
from sol_control.graph.llama import build_decoder
from sol_control.graph.weights import DraftHeads
from tests.conftest import bundle_dir
from tests.test_graph import tiny_weights

V = 96  # tiny_weights' vocabulary


def fixed(tokens: list[int]) -> AnswerGuesser:
    """A guesser that always guesses `tokens` (one id per position, so the argmax is it)."""
    return AnswerGuesser([np.zeros((V, 1), np.float32) for _ in tokens], [np.array([t]) for t in tokens])


def test_each_guess_reads_the_prefix_and_the_guesses_before_it():
    w0 = np.zeros((V, 2), np.float32)
    w0[5, 1] = 1.0  # token 5 in the prefix -> the second id
    w1 = np.zeros((V, 3), np.float32)
    w1[41, 2] = 1.0  # after a guessed 41 -> 12
    g = AnswerGuesser([w0, w1], [np.array([40, 41]), np.array([10, 11, 12])])
    assert g.guess(np.array([1, 5, 3])) == [41, 12]
    assert g.guess(np.array([1, 3])) == [40, 10]  # ties: the first id
    assert g.guess(np.array([5]), 1) == [41] and g.positions == 2


def test_fit_learns_a_mapping_from_prefix_tokens_to_answers():
    """Answers that are a function of the prefix (the first answer token names which of four
    marker tokens the prefix holds, the second follows the first): learnt exactly, held out."""
    rng = np.random.default_rng(0)
    prefixes, answers = [], []
    for _ in range(400):
        marker = int(rng.integers(0, 4))
        prefixes.append(np.concatenate([[1], rng.integers(20, 60, 6), [10 + marker], [3]]))
        answers.append([70 + marker, 80 + (marker * 3) % 4])
    g = fit_guesser(prefixes[:300], np.array(answers[:300]), V, 2, steps=200)
    assert [g.guess(p) for p in prefixes[300:]] == answers[300:]
    with pytest.raises(ValueError, match="positions"):
        fit_guesser(prefixes, np.array(answers), V, 3)


def test_a_guesser_file_round_trips_and_bad_files_are_refused_with_the_name(tmp_path):
    g = fixed([7, 8, 9])
    g.save(tmp_path / "g.npz")
    assert AnswerGuesser.load(tmp_path / "g.npz", V).guess(np.array([1, 2])) == [7, 8, 9]
    bad = {
        "not_npz": b"not a zip",
        "pickled": {"w0": np.array([object()], dtype=object), "ids0": np.array([1])},
        "missing_ids": {"w0": np.zeros((V, 1), np.float32)},
        "wrong_vocab": {"w0": np.zeros((V + 1, 1), np.float32), "ids0": np.array([1])},
        "ids_outside": {"w0": np.zeros((V, 1), np.float32), "ids0": np.array([V])},
        "not_finite": {"w0": np.full((V, 1), np.nan, np.float32), "ids0": np.array([1])},
        "float64": {"w0": np.zeros((V, 1)), "ids0": np.array([1])},
    }
    for name, content in bad.items():
        path = tmp_path / f"{name}.npz"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            with open(path, "wb") as f:
                np.savez(f, **content)
        with pytest.raises(ValueError, match=f"guesses .*{name}.npz"):
            AnswerGuesser.load(path, V)


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_a_guessed_prefill_emits_plain_greedys_tokens_whatever_the_guesses(tmp_path, precision):
    """Guesses all right, right up to a wrong one, all wrong, or running past a stop id: the output
    is plain greedy's token for token, and a right guess saves calls."""
    w = tiny_weights(seed=3)
    head = w.tensors["lm_head.weight"]
    w.heads = DraftHeads(np.zeros((3, 64, 64), np.float32), np.repeat(head[None], 3, 0), 0)
    sess = FusedDecoderSession(build_decoder(w, tmp_path / f"{precision}.onnx", precision))
    rng = np.random.default_rng(1)
    saved = 0
    for _ in range(6):
        prefix = rng.integers(0, V, int(rng.integers(2, 9)))
        plain = greedy(sess, prefix, 10).tokens
        for right in (9, 5, 1, 0):  # the first `right` guesses are plain's, the rest wrong
            sess.guesser = fixed(plain[:right] + [(t + 1) % V for t in plain[right:9]])
            calls = sess.calls
            r = speculate_heads(sess, prefix, 10)
            assert r.tokens == plain and r.complete
            sess.guesser = None
            unguessed = sess.calls
            assert speculate_heads(sess, prefix, 10).tokens == plain
            if right == 9:
                assert unguessed - calls == 1  # all nine guesses right: the prefill is the whole answer
                assert (r.stats.first_call_tokens, r.stats.decode_tokens) == (10, 0)  # emitted in its TTFT
                saved += (sess.calls - unguessed) - 1
        stop = (plain[int(rng.integers(1, 10))],)
        sess.guesser = fixed(plain[:9])  # right guesses running past the stop id
        assert speculate_heads(sess, prefix, 10, stop_ids=stop).tokens == greedy(sess, prefix, 10, stop_ids=stop).tokens
        assert speculate_heads(sess, prefix, 10, prefill_guesses=False).tokens == plain
        sess.guesser = None
    assert saved > 0


def test_a_guessed_prefill_is_refused_where_it_could_not_be_exact(tmp_path):
    w = tiny_weights(seed=3)
    int4, int8 = (build_decoder(w, tmp_path / f"{p}.onnx", p) for p in ("int4", "int8"))
    mixed = FusedDecoderSession(int4, prefill_path=int8)
    assert not mixed.can_guess_prefill
    with pytest.raises(ValueError, match="prefill graph"):
        mixed.prefill_guessed(np.arange(6), 2)
    alone = FusedDecoderSession(int8)
    with pytest.raises(ValueError, match="guesses need a prefix"):
        alone.prefill_guessed(np.arange(3), 3)
    mixed.guesser = fixed([1, 2])  # speculate_heads leaves it out there: still plain greedy
    prefix = np.arange(5)
    assert speculate_heads(mixed, prefix, 6, lookup=4).tokens == greedy(mixed, prefix, 6).tokens


def test_a_manifest_naming_an_unlisted_guesser_is_refused(tmp_path):
    root = tmp_path / "b"
    shutil.copytree(bundle_dir("qc"), root)
    m = json.loads((root / "manifest.json").read_text())
    m["target"]["guesses"] = "other.npz"
    with pytest.raises(ValueError, match="other.npz"):
        write_manifest(root, m)


@pytest.mark.parametrize("task", ["qc", "grasp"])
def test_the_shipped_guessers_save_calls_and_keep_plain_greedys_answers(task):
    """On 40 real test scenes: every fast-path answer equals plain greedy's, and the guessed prefill
    takes fewer target calls than the same decisions without it (QC: 3.0 -> 1.5 on the workload)."""
    from sol_control.bench.decode_bench import decision_prefixes

    b = Bundle.load(bundle_dir(task))
    assert b.manifest.target.guesses is not None
    sess = open_decoder(b, "target", "int8")
    n = len(b.manifest.actions)
    calls = {True: 0, False: 0}
    for p in decision_prefixes(b, 40, seed=100):
        plain = greedy(sess, p, n).tokens
        for on in (True, False):
            before = sess.calls
            assert speculate_heads(sess, p, n, prefill_guesses=on).tokens == plain
            calls[on] += sess.calls - before
    assert calls[True] < 0.85 * calls[False], calls


def test_an_expired_budget_checks_no_guesses():
    """Guesses are steps: after the budget ran out the prefill is the plain one (one token, an
    incomplete answer the guard hands to full precision), with the budget alive all of them."""
    from sol_control.bench.decode_bench import decision_prefixes
    from sol_control.budget import Budget, ManualClock

    b = Bundle.load(bundle_dir("qc"))
    sess = open_decoder(b, "target", "int8")
    n = len(b.manifest.actions)
    alive = lambda: Budget.after_ms(5.0, clock=ManualClock())  # noqa: E731 - never expires
    # a scene whose answer the guesser gets right: its prefill alone would emit the whole answer
    p = next(p for p in decision_prefixes(b, 20, seed=300)
             if speculate_heads(sess, p, n, budget=alive()).stats.target_passes == 1)
    r = speculate_heads(sess, p, n, budget=Budget.after_ms(0.0, clock=ManualClock()))
    assert r.tokens == greedy(sess, p, n).tokens[:1] and not r.complete and r.stats.target_passes == 1


def test_the_fast_planner_guesses_as_configured():
    """`decoding.prefill_guesses` (default on) reaches the fast planner: the same QC answers, fewer
    target calls with it than without."""
    from sol_control.bench.decode_bench import decision_prefixes
    from sol_control.budget import Budget
    from sol_control.config import from_flat
    from sol_control.planners import FastPlanner

    b = Bundle.load(bundle_dir("qc"))
    n = len(b.manifest.actions)
    planners = {on: FastPlanner(b, n, from_flat({"decoding.prefill_guesses": on}).decoding) for on in (True, False)}
    calls = {True: 0, False: 0}
    for p in decision_prefixes(b, 16, seed=200):
        answers = []
        for on, planner in planners.items():
            before = planner.target.calls
            answers.append(planner.plan(p, Budget.unlimited()).tokens)
            calls[on] += planner.target.calls - before
        assert answers[0] == answers[1]
    assert calls[True] < calls[False], calls
