"""The fused decoder graph (sol_control.graph.llama) and its session (decoding/fused.py).

Against the shipped grasp export: same logits within the fp32 parity tolerance and the same greedy
tokens on the stored reference prefixes. On tiny random models: Int4Blocks with float zero points
are written as given, a tied head is quantized (no fp32 [vocab, hidden] table left), our block
quantizer is byte-identical to ONNX Runtime's. The session: rewind and prefix reuse give exactly
what a fresh session computes for the same calls; speculative equals plain greedy in exact mode.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from sol_control.bundle import Bundle
from sol_control.decoding import DecoderSession, GuessLength, greedy, speculate
from sol_control.decoding.fused import FusedDecoderSession
from sol_control.graph import quant
from sol_control.graph.from_onnx import read_decoder
from sol_control.graph.llama import LAYOUT, ROW_LEVELS, build_decoder
from sol_control.graph.weights import Int4Blocks, LlamaConfig, LlamaWeights

MODELS = Path(__file__).resolve().parents[1] / "models"
FP32_ATOL, FP32_RTOL = 1e-4, 1e-5  # as tests/test_models.py: |ours - torch| <= 1e-4 + 1e-5 * |logit|


@pytest.fixture(scope="module")
def grasp() -> Bundle:
    return Bundle.load(MODELS / "grasp")


@pytest.fixture(scope="module")
def ref(grasp) -> dict[str, np.ndarray]:
    with grasp.load_array("reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def grasp_weights(grasp) -> LlamaWeights:
    m = grasp.manifest
    return read_decoder(grasp.verify(m.target.files["fp32"]), m.max_context)


@pytest.fixture(scope="module")
def fused(grasp_weights, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("fused")
    return {p: build_decoder(grasp_weights, out / f"target_{p}.onnx", p) for p in ("fp32", "int4", "int8")}


def tiny_weights(tied: bool = False, seed: int = 0) -> LlamaWeights:
    c = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, n_layers=2, n_heads=4, n_kv_heads=2,
                    head_dim=16, max_context=32, tie_embeddings=tied)
    rng = np.random.default_rng(seed)
    w = LlamaWeights(c, {})
    for name, shape in w.expected_shapes().items():
        scale = 0.2 if len(shape) == 2 else 0.1
        w.tensors[name] = (1.0 if len(shape) == 1 else 0.0) + scale * rng.standard_normal(shape).astype(np.float32)
    return w


def random_int4(rng, n: int, k: int, block: int = 32) -> Int4Blocks:
    """Q4_1-like blocks: any scale, a float zero point that no integer could hold."""
    return Int4Blocks(packed=rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8),
                      scales=rng.uniform(0.002, 0.02, (n, k // block)).astype(np.float32),
                      zero_points=rng.uniform(3.0, 12.0, (n, k // block)).astype(np.float32), block_size=block)


def all_logits(path: Path, ids: np.ndarray, chunks: list[int]) -> np.ndarray:
    """Logits [len(ids), V] of `ids` fed to a fresh fused session in chunks of the given sizes."""
    sess, out, start = FusedDecoderSession(path), [], 0
    for n in chunks:
        out.append(sess.forward(ids[start:start + n]).copy())
        start += n
    return np.concatenate(out)


# ---- against the shipped export -------------------------------------------------------------------

def test_read_decoder_matches_the_manifest(grasp, grasp_weights):
    c, spec = grasp_weights.config, grasp.manifest.target
    assert (c.n_layers, c.n_kv_heads, c.head_dim, c.hidden_size) == (spec.n_layers, spec.n_kv_heads, spec.head_dim,
                                                                      spec.hidden_size)
    assert c.vocab_size == grasp.manifest.vocab.size and not c.tie_embeddings
    assert sum(t.size for t in grasp_weights.tensors.values()) == spec.params


def test_fused_fp32_matches_the_export_on_reference_prefixes(fused, ref):
    p = int(ref["prefix_len"])
    sess = FusedDecoderSession(fused["fp32"])
    for ids, want in zip(ref["ids"], ref["target_logits"]):
        sess.reset()
        np.testing.assert_allclose(sess.forward(ids), want, rtol=FP32_RTOL, atol=FP32_ATOL)  # one pass
        sess.reset()
        res = greedy(sess, ids[:p], len(ids) - p)
        assert res.tokens == list(ids[p:])  # torch's greedy continuation, token for token
        sess.reset()
        steps = [sess.forward(ids[:p])[-1].copy()] + [sess.forward(ids[i:i + 1])[-1].copy()
                                                       for i in range(p, len(ids) - 1)]
        np.testing.assert_allclose(np.stack(steps), want[p - 1:-1], rtol=FP32_RTOL, atol=FP32_ATOL)


@pytest.mark.parametrize("task,role", [("qc", "target"), ("qc", "draft"), ("grasp", "draft")])
def test_every_shipped_decoder_rebuilds(task, role, tmp_path):
    """The other shipped fp32 decoders (1 and 2 KV heads, hidden 128 and 256) read back and rebuilt:
    one pass over each stored reference sequence within the fp32 parity tolerance."""
    bundle = Bundle.load(MODELS / task)
    with bundle.load_array("reference.npz") as z:
        ids_all, want_all = z["ids"], z[f"{role}_logits"]
    weights = read_decoder(bundle.verify(getattr(bundle.manifest, role).files["fp32"]), bundle.manifest.max_context)
    sess = FusedDecoderSession(build_decoder(weights, tmp_path / "fp32.onnx", "fp32"))
    for ids, want in zip(ids_all, want_all):
        sess.reset()
        np.testing.assert_allclose(sess.forward(ids), want, rtol=FP32_RTOL, atol=FP32_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["qc", "grasp"])
def test_the_shipped_fused_graphs_are_what_the_builder_writes(task, tmp_path):
    """Each shipped fused graph rebuilds byte for byte from the bundle's own files (the Optimum fp32
    target and the heads read back from the fused fp32 graph; int8 calibrated again, on the CPU the
    test runs on): the bundles are current with the builder (after a builder change:
    tools/make_models.py --refresh-graphs)."""
    from sol_control.bundle import sha256_file
    from sol_control.train.calibrate import bundle_static_int8
    from sol_control.graph.from_onnx import read_heads

    bundle = Bundle.load(MODELS / task)
    m = bundle.manifest
    weights = read_decoder(bundle.verify(m.target.files["fp32"]), m.max_context)
    weights.heads = read_heads(bundle.path(m.target.fused["fp32"]))
    assert weights.heads is not None and weights.heads.k == m.target.draft_heads
    static, record = bundle_static_int8(bundle)  # int8: static activations, calibrated on training scenes
    assert m.metrics["export"]["int8"] == record
    for precision, name in m.target.fused.items():
        opts = {"int8_activations": "static"} if precision == "int8" else {}
        rebuilt = build_decoder(static if precision == "int8" else weights, tmp_path / name, precision, **opts)
        assert sha256_file(rebuilt) == m.files[name].sha256, f"{task} {precision}: run make_models --refresh-graphs"


def test_fused_graph_layout(fused, grasp_weights):
    model = onnx.load(str(fused["int4"]))
    props = {p.key: p.value for p in model.metadata_props}
    assert props == {"layout": LAYOUT, "precision": "int4", "max_context": "64", "query_pad": "1", "draft_heads": "0"}
    ops = [n.op_type for n in model.graph.node]
    L = grasp_weights.config.n_layers
    assert ops.count("GroupQueryAttention") == L and ops.count("MatMulNBits") == 4 * L  # gate and up: one
    # + 3: the pad's rows from its input and T (Shape, Slice); + 4: the last G+1 rows for the lm_head;
    # + 6: its rows quantized (5 nodes) and scaled (1)
    assert "MatMul" not in ops and len(ops) == 12 * L + 3 + 3 + 4 + 6
    kv = next(i for i in model.graph.input if i.name == "past_key_values.0.key")
    assert [d.dim_value for d in kv.type.tensor_type.shape.dim] == [1, 2, 65, 64]  # 64 positions + the pad row
    bits = {n.output[0]: next(a.i for a in n.attribute if a.name == "bits") for n in model.graph.node
            if n.op_type == "MatMulNBits"}
    assert set(bits.values()) == {4}  # 4-bit body; the 8-bit head is an integer GEMM:
    head = [n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert [n.output[0] for n in head] == ["logits.unscaled"]


def test_int8_integer_graph(fused, grasp_weights):
    """int8 = per-channel int8 weights x per-row int8 activations in MatMulIntegerToFloat: the
    weights are the round-to-nearest of w / (|row max| / 127), and no MatMulNBits is left."""
    model = onnx.load(str(fused["int8"]))
    ops = [n.op_type for n in model.graph.node]
    L = grasp_weights.config.n_layers
    assert "MatMulNBits" not in ops and ops.count("MatMulIntegerToFloat") == 4 * L + 1  # qkv, o, gate and up, down; the head
    assert ops.count("QuantizeLinear") == 4 * L + 1  # per layer: qkv, o, gate|up (shared), down inputs
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    w = grasp_weights.linear("model.layers.1.mlp.down_proj.weight")  # [out, in]
    q, scales = init["model.layers.1.mlp.down_proj.weight.s8.T"].T, init["model.layers.1.mlp.down_proj.weight.channel_scales"]
    # a weight step of |row max| / 127, times the activations' 1 / ROW_LEVELS (their rows are scaled by |max| only)
    np.testing.assert_allclose(scales, np.abs(w).max(1) / 127 / ROW_LEVELS, rtol=1e-6)
    assert q.dtype == np.int8 and np.abs(q.astype(np.float32) - w / (ROW_LEVELS * scales[:, None])).max() <= 0.5 + 1e-4


def test_the_integer_gemm_is_exact_at_the_graphs_ranges():
    """uint8 rows in [0, 2 ROW_LEVELS] times int8 weights in [-127, 127], the worst case (every pair
    at its largest product): MatMulIntegerToFloat gives the exact integer sums on this CPU. (u8 up
    to 255 does not on AVX2: MLAS's vpmaddubsw saturates a pair's sum at 32767.)"""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    k, n = 576, 64
    w = np.where(rng.random((k, n)) < 0.5, -127, 127).astype(np.int8)
    w[:, :2] = [127, -127]  # columns 0 and 1: every pair at the largest product of one sign with row 0
    a = np.concatenate([np.full((1, k), 2 * ROW_LEVELS), rng.integers(0, 2 * ROW_LEVELS + 1, (4, k))]).astype(np.uint8)
    consts = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(1, np.float32), "one"),
              numpy_helper.from_array(np.ones(n, np.float32), "ws"),
              numpy_helper.from_array(np.array(ROW_LEVELS, np.uint8), "zp")]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "w", "one", "ws", "zp"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("a", TensorProto.UINT8, [5, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, n])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    want = (a.astype(np.int64) - ROW_LEVELS) @ w.astype(np.int64)
    assert np.array_equal(y, want.astype(np.float32))


# ---- quantization --------------------------------------------------------------------------------

@pytest.mark.parametrize("bits,symmetric", [(4, False), (4, True), (8, True), (8, False)])
def test_block_quantizer_is_byte_identical_to_onnxruntime(grasp_weights, bits, symmetric):
    import onnxruntime.capi._pybind_state as ort_c

    fn = getattr(ort_c, f"quantize_matmul_{bits}bits", None)
    assert fn is not None, f"the pinned onnxruntime has quantize_matmul_{bits}bits; this one does not"
    rng = np.random.default_rng(1)
    for w in (grasp_weights.tensors["model.layers.0.mlp.down_proj.weight"], grasp_weights.tensors["lm_head.weight"],
              rng.standard_normal((16, 96)).astype(np.float32)):  # 3 blocks: an odd zero-point nibble
        n, k = w.shape
        kb = k // 32
        packed, scales = np.zeros((n, kb, 32 * bits // 8), np.uint8), np.zeros((n, kb), np.float32)
        zp = np.zeros((n, (kb * bits + 7) // 8), np.uint8)
        fn(packed, np.ascontiguousarray(w.T), scales, zp, 32, n, k, symmetric)
        ours = quant.quantize(w, bits, 32, symmetric)
        assert np.array_equal(ours.packed, packed) and np.array_equal(ours.scales, scales)
        assert symmetric or np.array_equal(ours.zero_points, zp)
        assert np.abs(ours.dequantize() - w).max() <= np.abs(scales).max() * (0.5 if not symmetric else 1.0) + 1e-6


def test_int4_blocks_with_float_zero_points_are_written_as_given(tmp_path):
    """Every linear given as Int4Blocks: with fp32 activations (accuracy_level 0) the int4 graph must
    equal an fp32 graph of the dequantized weights within fp32 rounding."""
    w = tiny_weights()
    rng = np.random.default_rng(2)
    given = {n: random_int4(rng, *s) for n, s in w.expected_shapes().items() if len(s) == 2 and "embed" not in n}
    q = LlamaWeights(w.config, {n: t for n, t in w.tensors.items() if n not in given}, given)
    assert np.array_equal(quant.from_int4(given["lm_head.weight"]).dequantize(), given["lm_head.weight"].dequantize())
    plain = LlamaWeights(w.config, {**q.tensors, **{n: b.dequantize() for n, b in given.items()}})
    int4 = build_decoder(q, tmp_path / "int4.onnx", "int4", accuracy_level=0)
    fp32 = build_decoder(plain, tmp_path / "fp32.onnx", "fp32")
    graph = onnx.load(str(int4)).graph
    zps = [i for i in graph.initializer if i.name.endswith("zero_points")]
    assert len(zps) == 4 * 2 + 1 and all(z.data_type == onnx.TensorProto.FLOAT for z in zps)
    ids = rng.integers(0, 96, 20)
    got, want = all_logits(int4, ids, [12, 1, 7]), all_logits(fp32, ids, [12, 1, 7])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_a_tied_head_is_quantized_and_shared_with_the_embedding(tmp_path):
    w = tiny_weights(tied=True)
    V, H = w.config.vocab_size, w.config.hidden_size
    path = build_decoder(w, tmp_path / "tied_int4.onnx", "int4", accuracy_level=0)
    graph = onnx.load(str(path)).graph
    fp32_tables = [i.name for i in graph.initializer
                   if i.data_type == onnx.TensorProto.FLOAT and sorted(i.dims) == sorted([V, H])]
    assert fp32_tables == []
    ops = [n.op_type for n in graph.node]
    assert "GatherBlockQuantized" in ops and "Gather" not in ops and "MatMul" not in ops
    # reference: an fp32 graph whose body and table hold exactly what the int4 graph dequantizes
    ref = LlamaWeights(w.config, dict(w.tensors))
    for name, shape in w.expected_shapes().items():
        if len(shape) == 2:
            bits = 8 if "embed" in name else 4
            ref.tensors[name] = quant.quantize(w.tensors[name], bits, 32, symmetric=bits == 8).dequantize()
    fp32 = build_decoder(ref, tmp_path / "ref.onnx", "fp32")
    ids = np.random.default_rng(3).integers(0, V, 16)
    got, want = all_logits(path, ids, [16]), all_logits(fp32, ids, [16])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


# ---- the session -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_rewind_and_prefix_reuse_equal_a_fresh_session(fused, precision):
    """Stale rows past the length are never read: after a rewind or a reused prefix, every call
    returns exactly what a fresh session returns for the same calls on the same tokens."""
    rng = np.random.default_rng(4)
    a, b = rng.integers(4, 1290, 18), rng.integers(1290, 1546, 6)
    sess = FusedDecoderSession(fused[precision])
    sess.prefill(a)
    sess.forward(b[:4])
    sess.forward(rng.integers(1290, 1546, 3))  # a rejected draft...
    sess.rewind(len(a) + 4)  # ...dropped without a copy
    got = sess.forward(b[4:]).copy()
    fresh = FusedDecoderSession(fused[precision])
    fresh.forward(a)
    fresh.forward(b[:4])
    assert np.array_equal(got, fresh.forward(b[4:]))
    # a new frame sharing the first 10 tokens: only the rest is computed
    c = np.concatenate([a[:10], rng.integers(4, 1290, 8)])
    calls = sess.calls
    got = sess.prefill(c).copy()
    assert sess.calls == calls + 1 and sess.length == len(c) and np.array_equal(sess.tokens[:len(c)], c)
    fresh.reset()
    fresh.forward(c[:10])
    assert np.array_equal(got, fresh.forward(c[10:])[-1])
    with pytest.raises(ValueError, match="max_context"):
        sess.forward(np.ones(sess.max_context, np.int64))


def test_each_call_shape_keeps_its_binding_and_reads_the_current_ids(fused, monkeypatch):
    """Shapes that come back (a prefill, verify passes of 5, 3, 5 rows) reuse the binding made for
    them, and it reads this call's ids and cache, not the ones of the call it was made for; past
    MAX_SHAPES the least recently used binding is dropped and made anew when its shape returns."""
    from sol_control.decoding.fused import _Binding

    monkeypatch.setattr(_Binding, "MAX_SHAPES", 3)
    rng = np.random.default_rng(9)
    prefix = rng.integers(4, 1290, 12)
    sess, fresh = FusedDecoderSession(fused["int8"]), FusedDecoderSession(fused["int8"])
    sess.prefill(prefix)
    for i, T in enumerate([5, 3, 5, 1, 5, 2, 3]):
        ids = rng.integers(1290, 1546, T)
        got = sess.forward(ids).copy()
        fresh.reset()
        fresh.forward(sess.tokens[:sess.length - T])
        assert np.array_equal(got, fresh.forward(ids)), f"call {i}: {T} ids"
        assert len(sess._main._shapes) <= 3 and sess._main.bound == (T, T)
    assert list(sess._main._shapes) == [(5, 5), (2, 2), (3, 3)]  # the three most recently used, oldest first


def row_identity(sess, prefixes: list, k: int = 4) -> dict:
    """Are the logits rows of a T=k+1 pass bit-identical to the same positions decoded one token at a
    time? Share of identical rows and the largest difference."""
    same, worst = [], 0.0
    for prefix in prefixes:
        sess.reset()
        toks, singles = [int(sess.prefill(prefix).argmax())], []
        for _ in range(k):
            singles.append(sess.forward(np.array(toks[-1:], np.int64))[0].copy())
            toks.append(int(singles[-1].argmax()))
        sess.rewind(len(prefix))
        multi = sess.forward(np.array(toks, np.int64))  # [k+1, V]; rows 0..k-1 are the singles' positions
        same += [np.array_equal(multi[i], singles[i]) for i in range(k)]
        worst = max(worst, float(np.abs(multi[:k] - np.stack(singles)).max()))
    return {"identical": float(np.mean(same)), "max_abs_diff": worst}


ROW_EXACT_ON_EVERY_CPU = ("fp32", "int8")  # int4's MatMulNBits rows: on AVX-512, not on AVX2 (fused.py)
IDENTICAL = {"identical": 1.0, "max_abs_diff": 0.0}


@pytest.mark.parametrize("precision", ["fp32", "int4", "int8"])
def test_one_token_passes_equal_verify_passes_bit_for_bit(grasp, fused, precision):
    """The query pad keeps attention off ONNX Runtime's one-row kernel (llama.py docstring): fp32 and
    int8 rows are exact on every CPU. A session never claims exact rows that are not (its probe),
    and what it returns is exact either way (exact mode where the kernels differ)."""
    from sol_control.bench.decode_bench import decision_prefixes

    prefixes = decision_prefixes(grasp, 6)
    raw = row_identity(FusedDecoderSession(fused[precision], min_step_tokens=1), prefixes)
    probed = FusedDecoderSession(fused[precision])
    assert raw == IDENTICAL or not probed.exact_rows(), raw
    assert probed.min_step_tokens == (1 if probed.exact_rows() else 2)
    assert row_identity(probed, prefixes) == IDENTICAL
    assert (raw == IDENTICAL) >= (precision in ROW_EXACT_ON_EVERY_CPU), raw


def test_the_session_finds_out_whether_its_rows_are_exact(grasp_weights, fused, tmp_path):
    """The probe agrees with the full check: true with the query pad (blocks of 32) for fp32 and
    int8, false without it, and false with 4-bit blocks of 128, whose one-row MatMulNBits kernel
    differs too."""
    for precision in ROW_EXACT_ON_EVERY_CPU:
        assert FusedDecoderSession(fused[precision]).exact_rows()
    no_pad = build_decoder(grasp_weights, tmp_path / "nopad.onnx", "int4", query_pad=False)
    b128 = build_decoder(grasp_weights, tmp_path / "b128.onnx", "int4", block_size=128)
    for path in (no_pad, b128):
        sess = FusedDecoderSession(path)
        assert not sess.exact_rows() and sess.length == 0


def test_the_pad_input_gives_one_token_calls_the_pad_row_and_others_none(grasp_weights, fused, tmp_path):
    """With the pad as an input (the builder's default) a session runs the pad row in one-token calls
    only: a multi-token call leaves cache row L+T untouched, a one-token call writes it (zeros over
    a marker put there); the logits equal those of a graph whose pad is always there, bit for bit."""
    always = FusedDecoderSession(build_decoder(grasp_weights, tmp_path / "always.onnx", "fp32", pad_input=False))
    given = FusedDecoderSession(fused["fp32"])
    assert given._pad_input and not always._pad_input
    ids = np.random.default_rng(3).integers(4, 1290, 9)
    for sess in (given, always):
        sess.prefill(ids[:5])
    key = given._kv[0].reshape(given.n_heads, -1, given.head_dim)  # layer 0's keys [H, C, D], a view
    for new in (ids[5:8], ids[8:9]):
        pad_row = given.length + len(new)
        key[:, pad_row] = 7.0  # never read by a real row
        np.testing.assert_array_equal(given.forward(new), always.forward(new))
        assert np.all(key[:, pad_row] == (0.0 if len(new) == 1 else 7.0)), len(new)


def test_a_pad_input_needs_a_cache_row_for_the_pad(fused, tmp_path):
    model = onnx.load(str(fused["fp32"]))
    next(p for p in model.metadata_props if p.key == "query_pad").value = "0"
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(ValueError, match="needs metadata query_pad 1"):
        FusedDecoderSession(tmp_path / "bad.onnx")


@pytest.mark.parametrize("query_pad,min_step_tokens", [(True, 1), (False, 2)])
def test_speculative_equals_plain_greedy_bit_for_bit(grasp, grasp_weights, fused, tmp_path, query_pad, min_step_tokens):
    """With the query pad (int8: exact rows on every CPU), or without it in exact mode (every pass
    >= 2 rows, int4), speculative decoding emits plain greedy's tokens from the very same logits."""
    from sol_control.bench.decode_bench import decision_prefixes

    path = fused["int8"] if query_pad else build_decoder(grasp_weights, tmp_path / "int4.onnx", "int4", query_pad=False)
    draft = DecoderSession(grasp.verify(grasp.manifest.draft.files["fp32"]), grasp.manifest.max_context)
    target = FusedDecoderSession(path, min_step_tokens=min_step_tokens)
    for prefix in decision_prefixes(grasp, 8):
        for k in (None, 1, 4):
            draft.reset()
            target.reset()
            spec = speculate(draft, target, prefix, 15, k=k)
            target.reset()
            plain = greedy(target, prefix, 15)
            assert spec.tokens == plain.tokens
            # the same logits; their confidences come from the graph's softmax, whose float32 sums
            # may round differently for a row inside a wider call (MLAS vectorises by alignment)
            np.testing.assert_allclose(spec.probs, plain.probs, rtol=1e-6)
            assert spec.stats.verify_passes < 14  # it did speculate


def test_logits_rows_are_bounded_but_prefill_chunks_are_not(fused):
    """A call returns at most max_rows rows of logits (the buffer bound once); a prefill reads one
    row per chunk, so a prefix longer than max_rows (and than a chunk) is fine and gives the same
    last row as one pass."""
    rng = np.random.default_rng(8)
    ids = rng.integers(4, 1290, 40)
    small = FusedDecoderSession(fused["fp32"], max_rows=8, max_step_tokens=16)
    with pytest.raises(ValueError, match="max_rows"):
        small.forward(ids[:9])
    whole = FusedDecoderSession(fused["fp32"])
    np.testing.assert_allclose(small.prefill(ids), whole.prefill(ids), rtol=FP32_RTOL, atol=FP32_ATOL)


def test_bad_graphs_and_settings_are_refused(tmp_path, fused):
    with pytest.raises(ValueError, match="fused layout"):
        FusedDecoderSession(MODELS / "grasp" / "target_fp32.onnx")  # the Optimum layout
    with pytest.raises(ValueError, match="max_context"):
        FusedDecoderSession(fused["fp32"], max_context=65)
    with pytest.raises(ValueError, match="precision"):
        build_decoder(tiny_weights(), tmp_path / "x.onnx", "int3")
    w = tiny_weights()
    del w.tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="up_proj"):
        build_decoder(w, tmp_path / "x.onnx", "fp32")


# -- draft heads -------------------------------------------------------------------------------------
def tiny_heads(w: LlamaWeights, k: int = 3, offset: int = 40, n_out: int = 48, seed: int = 1):
    from sol_control.graph.weights import DraftHeads

    rng = np.random.default_rng(seed)
    h = w.config.hidden_size
    return DraftHeads((0.3 * rng.standard_normal((k, h, h))).astype(np.float32),
                      rng.standard_normal((k, n_out, h)).astype(np.float32), offset)


def _silu(u: np.ndarray) -> np.ndarray:
    return u / (1.0 + np.exp(-u))


def _heads_reference(w: LlamaWeights, hidden_row: np.ndarray, vocab: int | None = None) -> np.ndarray:
    """argmax(w2_j (h + SiLU(w1_j h))) + offset for one hidden row [H] -> [K], as tools/train_heads.py
    (w2 = None: every head through the lm_head, or its first `vocab` rows; chained heads, w_prev:
    head j adds w_prev_j e, e the embedding of the row's argmax, then of head j - 1's guess)."""
    u = np.einsum("koi,i->ko", w.heads.w1, hidden_row)
    head = w.linear(w.lm_head_name)
    if w.heads.w_prev is not None:
        ids, prev = [], int(np.argmax(head @ hidden_row))
        for j in range(w.heads.k):
            e = w.tensors["model.embed_tokens.weight"][prev]
            ids.append(prev := int(np.argmax(head[:vocab] @ (hidden_row + _silu(u[j] + w.heads.w_prev[j] @ e)))))
        return np.array(ids)
    hj = hidden_row[None, :] + _silu(u)
    if w.heads.w2 is None:
        return (hj @ head[:vocab].T).argmax(-1)
    return np.einsum("kvh,kh->kv", w.heads.w2, hj).argmax(-1) + w.heads.token_offset


@pytest.mark.parametrize("shared_head,vocab,chained", [(False, None, False), (True, None, False), (True, 40, False),
                                                       (True, None, True), (True, 40, True)],
                         ids=["own_w2", "lm_head", "lm_head_first_40", "chained", "chained_first_40"])
def test_draft_heads_in_the_graph_match_a_numpy_reference(tmp_path, shared_head, vocab, chained):
    """The graph checks the guesses (the first one differing from the argmax of the row before it)
    and runs the heads on that row (through their own w2, the lm_head, or its first 40 rows:
    heads_vocab; chained heads one after another, each reading the embedding of the token before its
    guess); all against the numpy reference forward."""
    from sol_control.graph.from_onnx import read_heads
    from sol_control.graph.weights import DraftHeads
    from sol_control.lm.reference import LlamaReference

    w = tiny_weights()
    w.heads = tiny_heads(w)
    if shared_head:
        w_prev = (0.5 * np.random.default_rng(2).standard_normal(w.heads.w1.shape)).astype(np.float32)
        w.heads = DraftHeads(w.heads.w1, None, 0, w_prev if chained else None)
    sess = FusedDecoderSession(build_decoder(w, tmp_path / "h.onnx", "fp32", heads_vocab=vocab))
    assert sess.draft_heads == 3
    ref = LlamaReference(w)
    ids = np.array([1, 5, 9, 17, 23, 31, 7], np.int64)
    logits = sess.forward(ids, rows=1)  # a prefill: one row, no guesses
    hid, want = ref.hidden(ids), ref.logits(ids)
    assert logits.shape == (1, 96) and sess.accepted == 0
    assert np.array_equal(sess.head_ids, _heads_reference(w, hid[-1], vocab))
    if vocab is not None and not chained:  # the slice matters here: the whole head would guess other tokens
        assert not np.array_equal(sess.head_ids, _heads_reference(w, hid[-1]))
    if chained:  # and the chain matters: heads reading h alone would guess other tokens
        unchained = LlamaWeights(w.config, w.tensors, heads=DraftHeads(w.heads.w1, None, 0))
        assert not np.array_equal(sess.head_ids, _heads_reference(unchained, hid[-1], vocab))
    # a verify pass: the first guess right (the argmax after 7), the second wrong
    right = int(np.argmax(want[-1]))
    nxt = np.array([right, (int(np.argmax(ref.logits([*ids, right])[-1])) + 1) % 96], np.int64)
    sess.reset()
    sess.forward(ids[:-1], rows=1)
    rows = sess.forward(np.concatenate([ids[-1:], nxt]), rows=3)  # cur + 2 guesses
    assert rows.shape == (3, 96) and sess.accepted == 1
    full = np.concatenate([ids, nxt])
    assert np.array_equal(sess.head_ids, _heads_reference(w, ref.hidden(full)[len(ids)], vocab))
    back = read_heads(tmp_path / "h.onnx")  # what make_models --refresh-graphs rebuilds from
    for name in ("w1", "w2", "w_prev"):
        want_arr, got_arr = getattr(w.heads, name), getattr(back, name)
        assert (want_arr is None and got_arr is None) or np.array_equal(want_arr, got_arr)


@pytest.mark.parametrize("shared_head,vocab,chained", [(False, None, False), (True, None, False), (True, 64, False),
                                                       (True, 64, True)],
                         ids=["own_w2", "lm_head", "lm_head_first_64", "chained_first_64"])
@pytest.mark.parametrize("precision", ["fp32", "int4", "int8"])
def test_speculation_with_the_targets_own_heads_equals_plain_greedy(tmp_path, precision, shared_head, vocab, chained):
    """Whatever the heads guess, the output is plain greedy's, token for token, on every precision.
    Heads that repeat the target's next token (w1 = 0, w2 = its lm_head, or the lm_head itself;
    chained: plus a little of the previous token's embedding) are right wherever the tiny random
    model repeats itself and wrong elsewhere, so both paths of the rule run."""
    from sol_control.decoding import speculate_heads
    from sol_control.graph.weights import DraftHeads

    w = tiny_weights(seed=3)
    head = w.tensors["lm_head.weight"]
    w_prev = (0.05 * np.random.default_rng(4).standard_normal((4, 64, 64))).astype(np.float32) if chained else None
    w.heads = DraftHeads(np.zeros((4, 64, 64), np.float32), None if shared_head else np.repeat(head[None], 4, 0), 0,
                         w_prev)
    sess = FusedDecoderSession(build_decoder(w, tmp_path / f"h_{precision}.onnx", precision, heads_vocab=vocab))
    rng = np.random.default_rng(5)
    accepted = rejected = 0
    length = GuessLength()
    length.costs.update(1, 0, None, 1.0)
    length.costs.update(4, 0, None, 40.0)  # wide passes look dear: it checks 1-2 guesses
    for _ in range(8):
        prefix = rng.integers(0, 96, int(rng.integers(2, 9)))
        plain = greedy(sess, prefix, 12).tokens
        r = speculate_heads(sess, prefix, 12)
        assert r.tokens == plain and r.complete
        # the confidences come from the graph (`probs`): the numpy softmax's within float32 rounding
        np.testing.assert_allclose(r.probs, greedy(sess, prefix, 12).probs, rtol=1e-5)
        assert sess.row_probs is not None and len(sess.row_probs) == sess._bound[1]
        assert speculate_heads(sess, prefix, 12, length=length).tokens == plain  # fewer guesses a pass
        stop = (plain[int(rng.integers(0, 12))],)  # a stop id ends both alike, guesses past it dropped
        assert speculate_heads(sess, prefix, 12, stop_ids=stop).tokens == greedy(sess, prefix, 12, stop_ids=stop).tokens
        accepted += r.stats.accepted
        rejected += r.stats.proposed - r.stats.accepted
    assert accepted > 0 and rejected > 0  # both paths of the acceptance rule ran
    assert sess.exact_rows() >= (precision in ROW_EXACT_ON_EVERY_CPU)  # the query pad: one-token rows = verify rows


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_plain_decoding_switches_the_heads_off_and_loses_nothing(tmp_path, precision):
    """The heads sit behind the `heads_on` input: greedy switches them off (head_ids then K zeros,
    and reading them is refused), speculate_heads on; logits, tokens and the heads' guesses equal a
    graph without the switch, where the heads always run."""
    from sol_control.decoding import speculate_heads

    w = tiny_weights(seed=6)
    w.heads = tiny_heads(w)
    switched = FusedDecoderSession(build_decoder(w, tmp_path / "on.onnx", precision))
    always = FusedDecoderSession(build_decoder(w, tmp_path / "always.onnx", precision, heads_switch=False))
    assert "heads_on" in {i.name for i in switched.session.get_inputs()}
    assert "heads_on" not in {i.name for i in always.session.get_inputs()}
    prefix = np.array([3, 14, 15, 92, 65, 35], np.int64)
    plain = greedy(switched, prefix, 10)
    assert plain.tokens == greedy(always, prefix, 10).tokens
    assert not switched._heads_on and np.array_equal(switched._heads[:3], np.zeros(3))  # the else branch ran
    with pytest.raises(AssertionError, match="heads are off"):
        switched.head_ids
    np.testing.assert_array_equal(switched.prefill(prefix), always.prefill(prefix))
    fast = speculate_heads(switched, prefix, 10)
    assert fast.tokens == plain.tokens and switched._heads_on
    switched.reset(), always.reset()
    switched.prefill(prefix), always.prefill(prefix)
    assert np.array_equal(switched.head_ids, always.head_ids)
    assert not np.array_equal(switched.head_ids, np.zeros(3))


def _cached(sess, n: int) -> np.ndarray:
    """A fused session's cache [tensor, kv heads, position, dim] at its first n positions (a view)."""
    return sess._kv.reshape(len(sess._kv), sess.n_heads, -1, sess.head_dim)[:, :, :n]


def test_a_prefill_graph_runs_the_prefill_chunks_on_the_same_cache(tmp_path):
    """An int4 session with the int8 graph for prefills: `prefill` runs through the int8 graph,
    `forward` through int4, on one cache; the cache it leaves is the one a
    pure int8 prefill leaves (the next one-token logits equal a fresh int8 session's, switched to
    int4 by hand), speculation with heads still equals plain greedy, and a graph of another shape
    is refused."""
    from sol_control.decoding import speculate_heads
    from sol_control.graph.weights import DraftHeads

    w = tiny_weights(seed=3)
    w.heads = DraftHeads(np.zeros((4, 64, 64), np.float32), None, 0)
    int4, int8 = (build_decoder(w, tmp_path / f"{p}.onnx", p) for p in ("int4", "int8"))
    sess = FusedDecoderSession(int4, prefill_path=int8)
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, 96, 12)
    calls = sess.calls  # the exactness probe's calls (`_run`: the int4 graph)
    assert sess.prefill_calls == 0
    sess.prefill(prefix)  # one call of 12 ids (exact mode: 11, then the last paired through int4)
    exact = sess.min_step_tokens == 2
    assert (sess.prefill_calls, sess.calls) == (1, calls + 1 + exact)
    sess.forward(prefix[:5])  # a verify pass: the int4 graph
    assert (sess.prefill_calls, sess.calls) == (1, calls + 2 + exact)
    # the same cache as an int8 prefill: an int8 session's cache, then the int4 graph on it
    ref8 = FusedDecoderSession(int8)
    ref8.prefill(prefix)
    mixed = FusedDecoderSession(int4, prefill_path=int8, min_step_tokens=1)
    mixed.prefill(prefix)
    assert np.array_equal(_cached(mixed, len(prefix)), _cached(ref8, len(prefix)))
    one = prefix[:1]
    ref4 = FusedDecoderSession(int4, min_step_tokens=1)
    ref4._kv[:] = ref8._kv  # an int4 session on the int8 prefill's cache
    ref4.length, ref4.tokens[:len(prefix)] = len(prefix), prefix
    assert np.array_equal(mixed.forward(one), ref4.forward(one))
    for _ in range(6):
        p = rng.integers(0, 96, int(rng.integers(5, 12)))
        sess.reset()
        plain = greedy(sess, p, 12).tokens
        assert speculate_heads(sess, p, 12).tokens == plain
    w_other = tiny_weights(seed=3)
    w_other.heads = DraftHeads(np.zeros((2, 64, 64), np.float32), None, 0)
    other = build_decoder(w_other, tmp_path / "other.onnx", "int8")
    with pytest.raises(ValueError, match="does not match"):
        FusedDecoderSession(int4, prefill_path=other)


def test_in_exact_mode_the_last_prefix_token_goes_through_the_main_graph(tmp_path):
    """Exact mode with a prefill graph: plain decoding's first step runs the last prefix token
    again, through the int4 graph; so the prefill leaves that token's cache row as the int4 graph
    writes it (paired with the token before it), a plain step then leaves the prefix's cache as
    the prefill wrote it, and speculation with heads equals plain greedy."""
    from sol_control.decoding import speculate_heads
    from sol_control.graph.weights import DraftHeads

    w = tiny_weights(seed=4)
    w.heads = DraftHeads(np.zeros((4, 64, 64), np.float32), None, 0)
    int4, int8 = (build_decoder(w, tmp_path / f"{p}.onnx", p) for p in ("int4", "int8"))
    sess = FusedDecoderSession(int4, prefill_path=int8, min_step_tokens=2)
    rng = np.random.default_rng(8)
    for n in (1, 2, 9):
        prefix = rng.integers(0, 96, n)
        sess.reset()
        calls = sess.prefill_calls
        first = int(np.argmax(sess.prefill(prefix)))
        assert sess.prefill_calls - calls == (n > 1)  # the prefill graph up to the last token
        written = _cached(sess, n).copy()
        sess.forward(np.array([first]))  # exact mode: (prefix[-1], first) through the int4 graph
        assert np.array_equal(_cached(sess, n), written)
    for _ in range(6):
        p = rng.integers(0, 96, int(rng.integers(3, 12)))
        sess.reset()
        plain = greedy(sess, p, 12).tokens
        assert speculate_heads(sess, p, 12, lookup=4).tokens == plain


def test_lookup_guesses_copy_what_followed_the_latest_repeat():
    from sol_control.decoding.speculative import lookup_match

    seq = np.array([5, 6, 7, 8, 9, 1, 2, 6, 7, 3, 4, 5, 6, 7], np.int64)
    assert lookup_match(seq, 4) == ([8, 9, 1, 2], 3)  # the longest repeat first: "5 6 7" at 0
    assert lookup_match(seq, 4, n_max=2) == ([3, 4, 5, 6], 2)  # "6 7": its latest earlier place is 7..8
    assert lookup_match(np.array([1, 2, 3, 4], np.int64), 4) == ([], 0)  # nothing repeats
    assert lookup_match(np.array([9, 9, 9], np.int64), 2) == ([9], 2)  # the repeat may overlap the tail


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_speculation_with_lookup_guesses_equals_plain_greedy(tmp_path, precision):
    """Prompt-lookup guesses instead of the heads' where the text repeats: the same tokens as plain
    greedy (whatever is guessed), and on a text that repeats itself they are accepted more often."""
    from sol_control.decoding import speculate_heads
    from sol_control.graph.weights import DraftHeads

    w = tiny_weights(seed=3)
    w.heads = DraftHeads(np.zeros((2, 64, 64), np.float32), None, 0)
    sess = FusedDecoderSession(build_decoder(w, tmp_path / f"l_{precision}.onnx", precision))
    rng = np.random.default_rng(9)
    more = 0
    for _ in range(6):
        base = rng.integers(0, 96, 6)
        prefix = np.concatenate([base, base, base[:3]])  # the model may continue the repeat
        plain = greedy(sess, prefix, 16).tokens
        heads = speculate_heads(sess, prefix, 16)
        looked = speculate_heads(sess, prefix, 16, lookup=6)
        chosen = speculate_heads(sess, prefix, 16, lookup=6, length=GuessLength())  # lookup or heads a pass
        assert looked.tokens == plain == heads.tokens == chosen.tokens
        more += looked.stats.proposed > heads.stats.proposed
    assert more > 0  # lookup proposed longer guesses somewhere


def test_prompt_lookup_alone_on_targets_without_heads_equals_plain_greedy(tmp_path):
    """Targets without draft heads (a fused graph built without them, the tiny fixture's plain
    decoder-with-past graph) speculate with lookup's guesses alone, checked against their rows'
    argmaxes: plain greedy's tokens, guesses offered on a repeating text; lookup 0 is refused."""
    from sol_control.decoding import speculate_heads

    from .conftest import FIXTURES

    fused = FusedDecoderSession(build_decoder(tiny_weights(seed=3), tmp_path / "bare.onnx", "int8"))
    plain_layout = DecoderSession(FIXTURES / "tiny" / "target_fp32.onnx", 128)
    rng = np.random.default_rng(9)
    for sess, vocab in ((fused, 96), (plain_layout, 48)):
        for _ in range(4):
            prefix = _repeating_prefix(sess, rng, vocab)
            plain = greedy(sess, prefix, 14).tokens
            looked = speculate_heads(sess, prefix, 14, lookup=6)
            chosen = speculate_heads(sess, prefix, 14, lookup=6, length=GuessLength())
            assert looked.tokens == chosen.tokens == plain
            assert looked.stats.proposed > 0 and looked.stats.verify_passes <= len(plain) - 1
        with pytest.raises(ValueError, match="no draft heads"):
            speculate_heads(sess, prefix, 4)


def _repeating_prefix(sess, rng, vocab: int) -> np.ndarray:
    """A prefix whose last token and the model's first answer token already stand together in it,
    [a, b, f, x, y, z] + p with p ending in a, b and f the model's greedy token after it, so prompt
    lookup has guesses at the first pass (found by trying random p)."""
    from sol_control.decoding.speculative import lookup_match

    for _ in range(200):
        p = rng.integers(3, vocab, 8)
        f = greedy(sess, p, 1).tokens[0]
        prefix = np.concatenate([p[-2:], [f], rng.integers(3, vocab, 3), p])
        first = greedy(sess, prefix, 1).tokens[0]
        if lookup_match(np.append(prefix, first), 6)[0]:
            return prefix
    raise AssertionError("no repeating prefix found")


def test_dual_int8_activations_are_closer_to_fp32_and_still_row_exact(tmp_path):
    """int8_activations='dual' (rows + their residuals, one GEMM of 2T rows): logits closer to the
    fp32 graph's than 8-bit rows give, and one-token rows still equal verify rows bit for bit."""
    w = tiny_weights(seed=4)
    ids = np.random.default_rng(2).integers(0, 96, 24)
    # the reference: fp32 on the int8 graph's own weights, so only the activations' rounding differs
    same = LlamaWeights(w.config, dict(w.tensors))
    for name in same.tensors:
        if name.endswith("proj.weight") or name == "lm_head.weight":
            q, scales = quant.per_channel_int8(same.tensors[name])
            same.tensors[name] = q.astype(np.float32) * scales[:, None]
    want = all_logits(build_decoder(same, tmp_path / "f.onnx", "fp32"), ids, [24])
    err = {}
    for mode in ("rows", "dual"):
        path = build_decoder(w, tmp_path / f"{mode}.onnx", "int8", int8_activations=mode)
        err[mode] = np.abs(all_logits(path, ids, [24]) - want).max()
        assert FusedDecoderSession(path).exact_rows()
    assert err["dual"] < err["rows"] / 4, err
    with pytest.raises(ValueError, match="int8_activations"):
        build_decoder(w, tmp_path / "x.onnx", "int8", int8_activations="int16")
