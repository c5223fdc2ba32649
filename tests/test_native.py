"""The native backend (sol_control.decoding.native): the int8 graphs' whole pass in C.

Against ONNX Runtime on the same graph files (the shipped grasp and QC targets, and a tiny static
int8 model with heads whose outputs are not a multiple of 16), row exactness, speculation equal to
plain greedy, and every way it declines (other graphs, no library) ending on ONNX Runtime or, when
asked for, in a clear error. The kernel variants against generic C: tests/test_native_isa.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sol_control.bundle import Bundle
from sol_control.config import DecodingConfig
from sol_control.decoding import greedy, open_decoder, speculate_heads
from sol_control.decoding import native
from sol_control.decoding.fused import FusedDecoderSession
from sol_control.decoding.native import NativeDecoderSession, NativeUnsupported
from sol_control.graph.llama import build_decoder
from sol_control.native import build
from sol_control.train.calibrate import static_int8
from tests.test_graph import tiny_heads, tiny_weights

MODELS = Path(__file__).resolve().parents[1] / "models"
LOGIT_ATOL = 1e-4  # the shipped graphs agree bit for bit on this CPU; other CPUs may round exp differently


@pytest.fixture(scope="module", autouse=True)
def built():
    """`make test` builds the library (`make native`), a bare `pytest` here; only a machine without
    a C compiler may lack it."""
    if native.library() is None:
        if build.compiler() is None:
            pytest.skip("no C compiler: the native pass is not built here")
        build.build()
        native.library.cache_clear()
    assert native.library() is not None, f"{native.LIBRARY} does not load"


@pytest.fixture(scope="module")
def tiny_static(tmp_path_factory) -> Path:
    """A tiny int8 graph with static activations and three heads of 40 outputs each (not a multiple
    of 16: the C pass pads the last block of 16)."""
    w = tiny_weights(seed=3)
    w.heads = tiny_heads(w, k=3, offset=40, n_out=40)
    rng = np.random.default_rng(0)
    seqs = [(rng.integers(0, 96, int(rng.integers(6, 20))), int(rng.integers(2, 6))) for _ in range(12)]
    return build_decoder(static_int8(w, seqs), tmp_path_factory.mktemp("native") / "tiny.onnx", "int8",
                         int8_activations="static")


def _both(path: Path) -> tuple[NativeDecoderSession, FusedDecoderSession]:
    nat, ort_sess = NativeDecoderSession(path), FusedDecoderSession(path, min_step_tokens=1)
    for s in (nat, ort_sess):
        s.use_heads(True)
    return nat, ort_sess


def _graphs():
    return [MODELS / "grasp" / "target_fused_int8.onnx", MODELS / "qc" / "target_fused_int8.onnx"]


@pytest.mark.parametrize("which", ["grasp", "qc", "tiny"])
def test_the_native_pass_computes_what_onnxruntime_computes(which, tiny_static):
    """Prefill rows and verify passes: logits, each row's top probability, the accepted count, the
    next token and the heads' guesses, against an ORT session of the same file."""
    path = tiny_static if which == "tiny" else MODELS / which / "target_fused_int8.onnx"
    nat, ref = _both(path)
    rng = np.random.default_rng(7)
    checked_accepts = set()
    for trial in range(12):
        n = int(rng.integers(2, min(24, nat.max_context - 6)))
        ids = rng.integers(0, nat.vocab, n + 5)
        for s in (nat, ref):
            s.reset()
        got = [s.forward(ids[:n], rows=1).copy() for s in (nat, ref)]
        np.testing.assert_allclose(got[0], got[1], atol=LOGIT_ATOL, rtol=0)
        assert np.array_equal(nat.head_ids, ref.head_ids)
        # a verify pass of the next token and 3 guesses, the first one right in every other trial
        best = int(np.argmax(got[1][-1]))
        right = int(np.argmax(ref.forward(np.array([best]), rows=1)[-1]))
        ref.rewind(n)
        guesses = rng.integers(0, nat.vocab, 3)
        if trial % 2:
            guesses[0] = right
        tail = np.concatenate([[best], guesses])
        got = [s.forward(tail, rows=len(tail)).copy() for s in (nat, ref)]
        np.testing.assert_allclose(got[0], got[1], atol=LOGIT_ATOL, rtol=0)
        np.testing.assert_allclose(nat.row_probs, ref.row_probs, rtol=1e-5)
        assert nat.accepted == ref.accepted and np.array_equal(nat.head_ids, ref.head_ids)
        # the target's own token after the accepted guesses: the C pass's argmax, numpy's on ORT's logits
        assert nat.next_token == ref.next_token == int(np.argmax(got[1][ref.accepted]))
        checked_accepts.add(nat.accepted)
    assert {0, 1} <= checked_accepts  # both ends of the acceptance rule compared


@pytest.mark.parametrize("path", _graphs(), ids=["grasp", "qc"])
def test_a_rows_numbers_do_not_depend_on_its_call(path):
    """One token at a time equals the same tokens in one pass, bit for bit: the C pass needs no
    query pad and no pairs (its sessions run min_step_tokens 1)."""
    nat = NativeDecoderSession(path)
    assert nat.min_step_tokens == 1 and nat.exact_rows(probes=5)
    ids = np.random.default_rng(3).integers(0, nat.vocab, 20)
    whole = nat.forward(ids).copy()
    nat.reset()
    singles = np.concatenate([nat.forward(ids[i:i + 1]).copy() for i in range(len(ids))])
    assert np.array_equal(whole, singles)


@pytest.mark.parametrize("path", [MODELS / "qc" / "target_fused_int8.onnx", MODELS / "grasp" / "target_fused_int8.onnx"])
def test_a_pass_returning_its_last_rows_equals_the_same_rows_of_a_whole_pass(path):
    """The final layer runs only the rows a pass returns (a prefill's last row): those rows, and
    the keys and values every row leaves in the cache, are bit for bit a whole pass's."""
    nat = NativeDecoderSession(path)
    ids = np.random.default_rng(4).integers(0, nat.vocab, 24)
    whole = nat.forward(ids[:23]).copy()
    after_whole = nat.forward(ids[23:]).copy()
    for rows in (1, 3):
        nat.reset()
        assert np.array_equal(nat.forward(ids[:23], rows=rows), whole[-rows:])
        assert np.array_equal(nat.forward(ids[23:]), after_whole)


def test_a_pass_that_may_end_the_answer_runs_its_heads_only_after_a_rejected_guess():
    """use_heads(True, last=True): with every guess right the heads' guesses are not made (zeros),
    with one wrong they are ONNX Runtime's (whose graph runs them either way)."""
    nat, ref = _both(MODELS / "grasp" / "target_fused_int8.onnx")
    ids = np.random.default_rng(5).integers(0, nat.vocab, 12)
    for s in (nat, ref):
        s.reset()
        s.forward(ids[:8], rows=1)
    right = greedy(ref, ids[:9], 4).tokens  # what the target itself says after ids[:9]
    ref.rewind(8)
    for s in (nat, ref):
        s.use_heads(True, last=True)
    checked = []
    for guesses in (right[:3], [right[0], (right[1] + 1) % nat.vocab, right[2]]):
        tail = np.array([ids[8], *guesses])
        for s in (nat, ref):
            s.forward(tail, rows=len(tail))
            s.rewind(8)
        assert nat.accepted == ref.accepted and nat.next_token == ref.next_token
        checked.append(nat.accepted)
        if nat.accepted == len(guesses):
            assert not nat.head_ids.any() and ref.head_ids.any()
        else:
            assert np.array_equal(nat.head_ids, ref.head_ids) and nat.head_ids.any()
    assert checked == [3, 1]
    nat.use_heads(True)  # no longer last: the heads run with every guess right too
    nat.forward(np.array([ids[8], *right[:3]]), rows=4)
    assert nat.accepted == 3 and nat.head_ids.any()


def _prefixes(bundle: Bundle, n: int) -> list[np.ndarray]:
    with bundle.load_array("reference.npz") as z:
        prefixes = [np.asarray(z[k], np.int64) for k in sorted(z.files) if k.startswith("prefix")]
    return prefixes[:n] or [np.random.default_rng(0).integers(4, 400, 20) for _ in range(n)]


@pytest.mark.parametrize("task", ["grasp", "qc"])
def test_speculation_on_the_native_pass_equals_plain_greedy_and_onnxruntimes_answers(task):
    """The bundle's own draft heads on the native pass: the tokens of plain greedy on it, which are
    ONNX Runtime's plain greedy tokens on the same int8 graph."""
    bundle = Bundle.load(MODELS / task)
    nat = open_decoder(bundle, "target", "int8", backend="native")
    ref = open_decoder(bundle, "target", "int8", backend="onnxruntime")
    assert isinstance(nat, NativeDecoderSession) and not isinstance(ref, NativeDecoderSession)
    rng = np.random.default_rng(11)
    accepted = 0
    for _ in range(10):
        prefix = np.concatenate([[bundle.manifest.vocab.bos], rng.integers(*bundle.manifest.vocab.observation, 20),
                                 [bundle.manifest.vocab.sep]]).astype(np.int64)
        plain = greedy(nat, prefix, 15).tokens
        r = speculate_heads(nat, prefix, 15)
        assert r.tokens == plain == greedy(ref, prefix, 15).tokens
        accepted += r.stats.accepted
    assert accepted > 0


def test_other_graphs_are_declined_and_run_on_onnxruntime(tmp_path):
    """fp32, int4 and per-row int8 graphs: NativeUnsupported with the reason; open_decoder's "auto"
    then opens ORT, "native" raises."""
    w = tiny_weights(seed=3)
    for precision, extra in (("fp32", {}), ("int4", {}), ("int8", {"int8_activations": "rows"})):
        path = build_decoder(w, tmp_path / f"{precision}_{len(extra)}.onnx", precision, **extra)
        with pytest.raises(NativeUnsupported, match="fused int8|static|4-bit blocks"):
            NativeDecoderSession(path)
    grasp = Bundle.load(MODELS / "grasp")
    assert type(open_decoder(grasp, "target", "fp32")) is FusedDecoderSession
    int4 = open_decoder(grasp, "target", "int4")  # zero points: not a graph the native pass computes
    assert type(int4) is FusedDecoderSession and "zero points" in int4.backend_info["reason"]
    with pytest.raises(NativeUnsupported):
        open_decoder(grasp, "target", "int4", backend="native")
    with pytest.raises(ValueError, match="backend must be one of"):
        open_decoder(grasp, "target", "int8", backend="cuda")


def test_the_backend_comes_from_the_argument_the_environment_or_auto(monkeypatch):
    grasp = Bundle.load(MODELS / "grasp")
    monkeypatch.setenv("SOL_CONTROL_BACKEND", "onnxruntime")
    assert type(open_decoder(grasp, "target", "int8")) is FusedDecoderSession
    # "auto" (the node's config default) yields to the operator's variable; "native" does not
    assert type(open_decoder(grasp, "target", "int8", backend="auto")) is FusedDecoderSession
    assert isinstance(open_decoder(grasp, "target", "int8", backend="native"), NativeDecoderSession)
    monkeypatch.setenv("SOL_CONTROL_BACKEND", "native")  # where the native pass computes the graph
    assert isinstance(open_decoder(grasp, "target", "int8"), NativeDecoderSession)
    assert type(open_decoder(grasp, "target", "fp32")) is FusedDecoderSession
    int4 = open_decoder(grasp, "target", "int4")  # zero points: not a graph the native pass computes
    assert type(int4) is FusedDecoderSession and "zero points" in int4.backend_info["reason"]
    monkeypatch.setenv("SOL_CONTROL_BACKEND", "gpu")
    with pytest.raises(ValueError, match="SOL_CONTROL_BACKEND|backend must be"):
        open_decoder(grasp, "target", "int8")


def test_without_the_library_onnxruntime_runs(monkeypatch, tmp_path):
    grasp = Bundle.load(MODELS / "grasp")
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "missing.so")
    native.library.cache_clear()
    try:
        assert native.library() is None and native.library_variant() is None
        assert type(open_decoder(grasp, "target", "int8")) is FusedDecoderSession
        with pytest.raises(NativeUnsupported, match="make native"):
            open_decoder(grasp, "target", "int8", backend="native")
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
    assert native.library() is not None


def test_bad_calls_are_refused_without_touching_the_cache(tiny_static):
    """Ids out of the vocabulary and a context past the cache: a ValueError from the session, and
    the C pass itself returns -1 for what reaches it (nothing written)."""
    nat = NativeDecoderSession(tiny_static)
    nat.forward(np.array([1, 2, 3]))
    kv = nat._kv.copy()
    with pytest.raises(ValueError, match="token ids"):
        nat.forward(np.array([5, 96]))
    with pytest.raises(ValueError, match="exceeds max_context"):
        nat.forward(np.zeros(nat.max_context, np.int64))
    nat._ids[:2] = (4, -1)
    assert nat._c_run(*nat._c_args, 2, 3, 1, True, *nat._c_buffers) == -1
    assert nat._c_run(*nat._c_args, 1, nat._capacity, 1, True, *nat._c_buffers) == -1
    assert np.array_equal(nat._kv, kv) and nat.length == 3


def test_the_node_config_picks_the_backend():
    from sol_control.planners import FastPlanner

    grasp = Bundle.load(MODELS / "grasp")
    fast = FastPlanner(grasp, 15, DecodingConfig(backend="native"))
    slow = FastPlanner(grasp, 15, DecodingConfig(backend="onnxruntime"))
    auto = FastPlanner(grasp, 15, DecodingConfig(backend="auto"))
    assert isinstance(fast.target, NativeDecoderSession) and not isinstance(slow.target, NativeDecoderSession)
    assert (fast.backend, slow.backend) == ("native", "onnxruntime")  # the node's diagnostics: fast_backend
    assert auto.backend == auto.target.backend_info["backend"]  # measured on this host (test_backend_choice.py)


# ---- an imported LM's int4 graph (the tiny Llama of tests/test_lm_heads.py, chained heads) ---------

@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Bundle:
    from tests.test_lm_heads import _import_with_heads

    return Bundle.load(_import_with_heads(tmp_path_factory.mktemp("native_lm"), chain=True)[2])


def _lm_pair(lm: Bundle, prefill: bool):
    kwargs = {"prefill_precision": "int8"} if prefill else {}
    nat = open_decoder(lm, "target", "int4", backend="native", **kwargs)
    ref = open_decoder(lm, "target", "int4", backend="onnxruntime", **kwargs)
    assert isinstance(nat, NativeDecoderSession) and nat.draft_heads == 3
    return nat, ref


def test_an_imported_lms_int4_graph_runs_natively_close_to_onnxruntime(lm):
    """The 4-bit linears with their mins, the 8-bit embedding, the dual-row lm_head and the chained
    heads: logits within int8-activation rounding of ORT's (relative), the same greedy answers on
    the prompts, the heads' guesses mostly the same."""
    nat, ref = _lm_pair(lm, prefill=False)
    assert nat.agrees_with_onnxruntime(probes=5) < 0.02
    same_heads = 0
    for prompt in ([1, 100, 71, 234, 5], [40, 41, 42], [1, 270, 7, 7, 7, 9, 150, 3]):
        ids = np.asarray(prompt, np.int64)
        assert greedy(nat, ids, 12).tokens == greedy(ref, ids, 12).tokens
        for s in (nat, ref):
            s.use_heads(True)
            s.reset()
            s.forward(ids, rows=1)
        same_heads += int(np.array_equal(nat.head_ids, ref.head_ids))
    assert same_heads >= 2


def test_speculation_on_the_native_int4_pass_equals_its_plain_greedy(lm):
    """Heads and prompt lookup on the C pass, the prefills through ORT's int8 graph (as the bench's
    int4 rows): the tokens of plain greedy on the same session."""
    nat, _ = _lm_pair(lm, prefill=True)
    rng = np.random.default_rng(2)
    for _ in range(6):
        prefix = rng.integers(3, nat.vocab, int(rng.integers(3, 12)))
        plain = greedy(nat, prefix, 16).tokens
        assert speculate_heads(nat, prefix, 16).tokens == plain
        assert speculate_heads(nat, prefix, 16, lookup=4).tokens == plain


def test_keys_written_by_the_prefill_graph_are_taken_over(lm):
    """After a prefill through ORT's int8 graph the C pass's keys (tiles of 16 positions, each
    [head_dim][16]) hold the cache's keys."""
    nat, _ = _lm_pair(lm, prefill=True)
    nat.prefill(np.arange(3, 20, dtype=np.int64))
    L, C, D, kv = nat.length, nat._capacity, nat.head_dim, nat.n_heads
    keys = nat._kv[0].reshape(kv, C, D)[:, :L]
    tiles = nat._keys_t[: kv * D * -(-C // 16) * 16].reshape(kv, -1, D, 16)  # [head][tile][d][16 positions]
    keys_t = tiles.transpose(0, 1, 3, 2).reshape(kv, -1, D)[:, :L]  # [head][position][d]
    assert np.array_equal(keys_t, keys) and np.any(keys != 0)


def test_the_prefill_graph_gets_the_sessions_threads(lm):
    nat = open_decoder(lm, "target", "int4", threads=2, prefill_precision="int8", backend="native")
    assert nat._prefill.session.get_session_options().intra_op_num_threads == 2


def test_threads_split_the_wide_linears_and_change_no_number():
    """Two threads (OpenMP) compute each output as one does: the same logits bit for bit, on the
    grasp graph whose lm_head and gate/up projections are wide enough to be split."""
    path = MODELS / "grasp" / "target_fused_int8.onnx"
    one, two = NativeDecoderSession(path), NativeDecoderSession(path, threads=2)
    assert (one.native.struct.threads, two.native.struct.threads) == (1, 2)
    ids = np.random.default_rng(9).integers(0, one.vocab, 24)
    assert np.array_equal(one.forward(ids), two.forward(ids))
    assert np.array_equal(one.forward(ids[:5]), two.forward(ids[:5]))
