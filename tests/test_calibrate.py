"""Static int8 activations (sol_control.train.calibrate + int8_activations="static"): calibration
against numpy, smoothing that leaves the fp32 model as it is, and a static graph that is smaller,
row-exact, close to fp32 and decodes speculatively exactly as plain greedy."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from sol_control.decoding import greedy, speculate_heads
from sol_control.decoding.fused import FusedDecoderSession
from sol_control.graph import quant
from sol_control.graph.from_onnx import all_nodes
from sol_control.graph.llama import build_decoder
from sol_control.graph.weights import DraftHeads, LlamaWeights
from sol_control.lm.reference import rms_norm
from sol_control.train.calibrate import AMAX_STEPS, channel_amax, on_grid, smooth_mlp, static_int8
from tests.test_graph import all_logits, tiny_weights

PER_ROW_OPS = ("Abs", "Div")  # two of the five nodes a per-row scale costs an input (ReduceMax: also the probs')


def sequences(seed: int = 0, n: int = 12) -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 96, int(rng.integers(6, 20))), int(rng.integers(2, 6))) for _ in range(n)]


@pytest.fixture(scope="module")
def calibrated() -> LlamaWeights:
    w = tiny_weights(seed=3)
    w.heads = DraftHeads(np.zeros((4, 64, 64), np.float32), np.repeat(w.tensors["lm_head.weight"][None], 4, 0), 0)
    return static_int8(w, sequences())


def test_channel_amax_is_each_channels_largest_value():
    """The first layer's normed input, against numpy: every row of every sequence counts."""
    w = tiny_weights(seed=1)
    seqs = sequences(1)
    amax = channel_amax(w, seqs)
    ids = np.concatenate([s for s, _ in seqs])
    c = w.config
    want = np.abs(rms_norm(w.tensors["model.embed_tokens.weight"][ids], w.tensors["model.layers.0.input_layernorm.weight"],
                           c.rms_norm_eps)).max(axis=0)
    np.testing.assert_allclose(amax["model.layers.0.ln1"], want, rtol=1e-5)
    assert set(amax) >= {f"model.layers.{i}.{x}" for i in range(c.n_layers) for x in ("ln1", "attn", "ln2", "gated")}
    with pytest.raises(ValueError, match="no calibration"):
        channel_amax(w, [])
    with pytest.raises(ValueError, match="context"):
        channel_amax(w, [(np.zeros(c.max_context + 1, np.int64), 2)])


def test_smoothing_leaves_the_fp32_model_bit_for_bit(tmp_path):
    """Powers of two in and out of the MLP: the same logits to the last bit, and the down_proj
    input's channels closer together (one |max| for the input fits them better)."""
    w = tiny_weights(seed=2)
    seqs = sequences(2)
    amax = channel_amax(w, seqs)
    smooth = smooth_mlp(w, amax)
    ids = np.random.default_rng(4).integers(0, 96, 20)
    before = all_logits(build_decoder(w, tmp_path / "a.onnx", "fp32"), ids, [20])
    after = all_logits(build_decoder(smooth, tmp_path / "b.onnx", "fp32"), ids, [20])
    assert np.array_equal(before, after)
    x = "model.layers.1.gated"
    spread = lambda a: a.max() / np.median(a)  # noqa: E731
    assert spread(channel_amax(smooth, seqs)[x]) < 0.75 * spread(amax[x])
    assert smooth.tensors is not w.tensors and not np.array_equal(smooth.tensors["model.layers.1.mlp.up_proj.weight"],
                                                                  w.tensors["model.layers.1.mlp.up_proj.weight"])


def test_calibrated_constants_sit_on_a_grid():
    v = np.array([0.3, 1.0, 5.17, 5.17 * (1 + 2e-7), 100.0], np.float32)
    g = on_grid(v, AMAX_STEPS)
    assert np.all(g >= v * (1 - 1e-6)) and np.all(g <= v * 2 ** (1 / AMAX_STEPS) * (1 + 1e-6))
    assert g[2] == g[3]  # a last-bit difference (another CPU's kernels) gives the same constant
    assert np.allclose(np.log2(g) * AMAX_STEPS, np.round(np.log2(g) * AMAX_STEPS), atol=1e-4)


def test_the_static_graph_quantizes_each_input_once_and_keeps_rows_exact(calibrated, tmp_path):
    static = build_decoder(calibrated, tmp_path / "static.onnx", "int8", int8_activations="static")
    rows = build_decoder(calibrated, tmp_path / "rows.onnx", "int8")
    ops = [n.op_type for n in all_nodes(onnx.load(str(static)).graph)]
    n_rows = len(all_nodes(onnx.load(str(rows)).graph))
    assert not any(op in ops for op in PER_ROW_OPS) and len(ops) < n_rows - 30
    assert ops.count("QuantizeLinear") == len(calibrated.activation_amax)
    assert FusedDecoderSession(static).exact_rows()
    # an input left out of the calibration keeps its per-row scales, alone
    partial = LlamaWeights(calibrated.config, calibrated.tensors, heads=calibrated.heads,
                           activation_amax={k: v for k, v in calibrated.activation_amax.items() if k != "model.layers.0.attn"})
    ops = [n.op_type for n in all_nodes(onnx.load(str(build_decoder(partial, tmp_path / "p.onnx", "int8",
                                                                    int8_activations="static"))).graph)]
    assert [ops.count(op) for op in PER_ROW_OPS] == [1, 1]


def test_static_int8_is_as_close_to_fp32_as_row_scales(calibrated, tmp_path):
    """Against fp32 on the int8 graph's own weights (so only the activations' rounding differs),
    on sequences the calibration did not see."""
    same = LlamaWeights(calibrated.config, dict(calibrated.tensors))
    for name in same.tensors:
        if name.endswith("proj.weight") or name == "lm_head.weight":
            q, scales = quant.per_channel_int8(same.tensors[name])
            same.tensors[name] = q.astype(np.float32) * scales[:, None]
    ids = np.random.default_rng(9).integers(0, 96, 24)
    want = all_logits(build_decoder(same, tmp_path / "f.onnx", "fp32"), ids, [24])
    err = {mode: np.abs(all_logits(build_decoder(calibrated, tmp_path / f"{mode}.onnx", "int8", int8_activations=mode),
                                   ids, [24]) - want).max() for mode in ("rows", "static")}
    assert err["static"] < 2 * err["rows"], err


def test_static_int8_speculation_equals_plain_greedy(calibrated, tmp_path):
    sess = FusedDecoderSession(build_decoder(calibrated, tmp_path / "s.onnx", "int8", int8_activations="static"))
    rng = np.random.default_rng(6)
    accepted = rejected = 0
    for _ in range(8):
        prefix = rng.integers(0, 96, int(rng.integers(2, 9)))
        r = speculate_heads(sess, prefix, 12)
        assert r.tokens == greedy(sess, prefix, 12).tokens and r.complete
        accepted += r.stats.accepted
        rejected += r.stats.proposed - r.stats.accepted
    assert accepted > 0 and rejected > 0  # both paths of the acceptance rule ran
