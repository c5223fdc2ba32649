"""A bundle with fused graphs and draft heads, end to end: the manifest lists them, open_decoder
opens the fused graph, the fast planner speculates with the target's own heads (or the draft model,
or not at all, as `decoding.speculation` says) and its output equals plain greedy."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sol_control.budget import Budget
from sol_control.bundle import Bundle, write_manifest
from sol_control.config import from_flat
from sol_control.decoding import greedy, open_decoder
from sol_control.decoding.fused import FusedDecoderSession
from sol_control.graph.from_onnx import read_decoder
from sol_control.graph.llama import build_decoder
from sol_control.graph.weights import DraftHeads
from sol_control.planners import FastPlanner, speculation_mode
from tests.conftest import FIXTURES

N_TOKENS = 8


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Bundle:
    """The tiny fixture plus fused fp32 / int4 targets whose heads repeat the target's next token
    (w1 = 0, w2 = its lm_head): right where the random model repeats itself, wrong elsewhere."""
    root = tmp_path_factory.mktemp("heads") / "bundle"
    shutil.copytree(FIXTURES / "tiny", root)
    m = json.loads((root / "manifest.json").read_text())
    weights = read_decoder(root / m["target"]["files"]["fp32"], m["max_context"])
    head = weights.tensors["lm_head.weight"]
    weights.heads = DraftHeads(np.zeros((3, head.shape[1], head.shape[1]), np.float32), np.repeat(head[None], 3, 0))
    fused = {p: f"target_fused_{p}.onnx" for p in ("fp32", "int4")}
    for p, name in fused.items():
        build_decoder(weights, root / name, p)
    m["target"].update(fused=fused, draft_heads=3)
    m["files"].update({name: {} for name in fused.values()})
    write_manifest(root, m)
    return Bundle.load(root)


def test_the_manifest_lists_fused_graphs_with_heads_and_open_decoder_prefers_them(bundle):
    spec = bundle.manifest.target
    assert spec.draft_heads == 3 and set(spec.fused) == {"fp32", "int4"} and spec.precisions == ("fp32", "int8", "int4")
    sess = open_decoder(bundle, "target", "int4")
    assert isinstance(sess, FusedDecoderSession) and sess.draft_heads == 3
    assert sess.min_step_tokens == (1 if sess.exact_rows() else 2)  # the exactness rule (decoding/fused.py)
    assert not isinstance(open_decoder(bundle, "target", "int8"), FusedDecoderSession)  # only Optimum


@pytest.mark.parametrize("mode", ["heads", "draft", "none"])
def test_the_fast_planner_speculates_as_configured_and_equals_plain_greedy(bundle, mode):
    dec = from_flat({"decoding.fast_precision": "int4", "decoding.speculation": mode}).decoding
    planner = FastPlanner(bundle, N_TOKENS, dec)
    assert planner.mode == mode
    plain = open_decoder(bundle, "target", "int4")
    rng = np.random.default_rng(4)
    proposed = 0
    for _ in range(6):
        prefix = rng.integers(4, 40, int(rng.integers(3, 10)))
        res = planner.plan(prefix, Budget.unlimited())
        assert res.complete and res.tokens == greedy(plain, prefix, N_TOKENS).tokens
        proposed += res.stats.proposed
    assert (proposed > 0) == (mode != "none")  # (the draft model's k adapts and may pause drafting)


def test_auto_prefers_heads_and_a_missing_kind_is_a_clear_error(bundle):
    assert speculation_mode(bundle, "auto") == "heads"
    tiny = Bundle.load(FIXTURES / "tiny")
    assert speculation_mode(tiny, "auto") == "draft"
    with pytest.raises(ValueError, match="no draft heads"):
        speculation_mode(tiny, "heads")
