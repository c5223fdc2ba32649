"""The shipped bundles (models/qc, models/grasp): verified files, fp32 parity with the torch
reference outputs stored at export, quantized agreement, and a small accuracy check."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sol_control.actions import ActionTokenizer
from sol_control.bundle import Bundle
from sol_control.decoding import open_decoder
from sol_control.eval import evaluate
from sol_control.graph.from_onnx import all_nodes
from sol_control.perception import ObservationTokenizer

MODELS = Path(__file__).resolve().parents[1] / "models"
FP32_ATOL, FP32_RTOL = 1e-4, 1e-5  # |ort - torch| <= 1e-4 + 1e-5 * |logit| (float32 rounding of big logits)
MAX_TOTAL_BYTES = 100 * 1024 * 1024


@pytest.fixture(scope="module", params=["qc", "grasp"])
def bundle(request) -> Bundle:
    return Bundle.load(MODELS / request.param)  # verifies every sha256


@pytest.fixture(scope="module")
def ref(bundle) -> dict[str, np.ndarray]:
    with bundle.load_array("reference.npz") as z:
        return {k: z[k] for k in z.files}


def test_models_fit_the_size_budget():
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert total < MAX_TOTAL_BYTES, f"models/ holds {total / 1e6:.1f} MB"


def test_bundle_layout(bundle):
    m = bundle.manifest
    assert set(m.target.files) == {"fp32"}  # the Optimum export: reference, peers' source
    assert set(m.target.fused) == {"fp32", "int8", "int4"} and m.target.draft_heads > 0 and m.draft is not None
    obs = ObservationTokenizer.from_bundle(bundle)
    acts = ActionTokenizer.from_manifest(m)
    assert obs.task == m.task and acts.task == m.task
    assert list(m.vocab.observation) == obs.config["token_range"]
    assert obs.prefix_len + acts.n_tokens <= m.max_context
    for split in ("test", "heldout"):
        for prec in ("fp32", "int8", "int4"):
            key = "accuracy" if m.task == "qc" else "success_rate"
            assert 0.0 <= m.metrics[split][prec][key] <= 1.0


@pytest.mark.parametrize("role", ["target", "draft"])
def test_fp32_parity_with_torch(bundle, ref, role):
    sess = open_decoder(bundle, role, "fp32")
    p = int(ref["prefix_len"])
    for ids, want in zip(ref["ids"], ref[f"{role}_logits"]):
        sess.reset()
        got = sess.forward(ids)  # [T, V] in one pass
        np.testing.assert_allclose(got, want, rtol=FP32_RTOL, atol=FP32_ATOL)
        sess.reset()
        # forward returns a view valid until the next call: copy each step
        steps = [sess.forward(ids[:p])[-1].copy()]
        steps += [sess.forward(ids[i:i + 1])[-1].copy() for i in range(p, len(ids) - 1)]
        np.testing.assert_allclose(np.stack(steps), want[p - 1:-1], rtol=FP32_RTOL, atol=FP32_ATOL)  # KV cache


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_agreement(bundle, ref, precision):
    sess = open_decoder(bundle, "target", precision)
    p = int(ref["prefix_len"])
    same = []
    for ids, want in zip(ref["ids"], ref["target_logits"]):
        sess.reset()
        got = sess.forward(ids)
        same.append(got[p - 1:-1].argmax(-1) == want[p - 1:-1].argmax(-1))
    agreement = float(np.mean(same))
    print(f"{bundle.manifest.name} {precision}: argmax agreement with fp32 {agreement:.3f}")
    assert agreement >= 0.6  # fine bins may flip to a neighbour; the eval metrics are the real check
    if bundle.manifest.task == "qc":
        assert all(row[0] for row in same)  # the class token never flips


def test_small_eval_slice(bundle):
    rep = evaluate(bundle.root, "test", precisions=("int8",), n=24, quiet=True)
    plain, draft, heads = (rep["precisions"][f"int8{s}"] for s in ("", "+draft", "+heads"))
    key = "accuracy" if bundle.manifest.task == "qc" else "success_rate"
    assert plain[key] >= 0.85
    if bundle.manifest.task == "qc":
        assert plain["defect_recall"] >= 0.85
    for spec in (draft, heads):
        assert spec[key] == plain[key]  # greedy speculation = plain greedy
    assert draft["acceptance"] >= 0.5
    assert heads["acceptance"] >= (0.6 if bundle.manifest.task == "grasp" else 0.2)  # QC's heads guess less


def test_int4_target_is_4bit_with_an_int8_lm_head(bundle):
    """The shipped int4 layout (make_models): every body linear in 4-bit blocks with zero points,
    the lm_head and the draft heads in int8 (integer GEMMs), nothing left in fp32 MatMuls; an
    all-4-bit lm_head moved a quarter of the QC actions by a bin."""
    import onnx

    nodes = all_nodes(onnx.load(str(bundle.verify(bundle.manifest.target.fused["int4"]))).graph)
    nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
    assert nbits and all(next(a.i for a in n.attribute if a.name == "bits") == 4 and len(n.input) >= 4
                         for n in nbits)  # 4th input: zero points
    integer = sorted(n.output[0] for n in nodes if n.op_type == "MatMulIntegerToFloat")
    k = bundle.manifest.target.draft_heads
    assert integer == sorted(["logits.unscaled", "heads.u.unscaled", *(f"heads.logits{j}" for j in range(k))])
    assert not [n for n in nodes if n.op_type == "MatMul"]
