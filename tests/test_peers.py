"""Peer-engine runners (benchmark only): no peer library leaks into our venv, the speculative GenAI
folder is laid out as ONNX Runtime GenAI expects, and — when `.venv-peers` exists — ORT GenAI on
the fixture weights reproduces our standard greedy outputs, plain and speculative."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sol_control.bench import peers
from sol_control.bundle import Bundle

from .conftest import FIXTURES, REPO


def test_import_pulls_in_no_peer_library():
    code = ("import sys, sol_control.bench.peers as p; "
            "print([m for m in ('torch', 'transformers', 'onnxruntime_genai') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_agreement_counts_decisions_and_tokens():
    ref = [[1, 2, 3], [4, 5, 6]]
    assert peers.agreement(ref, ref) == {"match_standard": 1.0, "token_agreement": 1.0}
    got = peers.agreement([[1, 2, 3], [4, 0, 6]], ref)
    assert got["match_standard"] == 0.5 and got["token_agreement"] == pytest.approx(5 / 6)


def test_speculative_genai_folder_layout(tmp_path):
    for name, layers in (("t", 8), ("d", 2)):
        (tmp_path / name).mkdir()
        decoder = {"filename": "model.onnx", "num_hidden_layers": layers, "session_options": {}}
        (tmp_path / name / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "decoder": decoder}}))
    out = peers.genai_speculative_folder(tmp_path / "t", tmp_path / "d", tmp_path / "spec", k=6)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "target/model.onnx"
    assert config["model"]["draft"]["filename"] == "draft/model.onnx"
    assert config["model"]["draft"]["num_hidden_layers"] == 2
    assert config["speculative"] == {"max_draft_tokens": 6}
    assert (out / "target").resolve() == (tmp_path / "t").resolve()
    assert ".." not in json.dumps(config)  # GenAI refuses parent paths


@pytest.mark.skipif(not (peers.PEERS_VENV / "bin" / "python").exists(),
                    reason="no .venv-peers (bash tools/setup_peers.sh)")
def test_ort_genai_matches_standard_outputs(tmp_path):
    bundle = Bundle.load(FIXTURES / "tiny")
    result = peers.run_all(bundle, quick=True, engines=("ort-genai",), precisions=("fp32",), work=tmp_path)
    assert not result["errors"], result["errors"]
    modes = {r["mode"]: r for r in result["rows"]}
    assert set(modes) == {"plain", "speculative k=8"}
    for row in modes.values():
        assert row["match_standard"] == 1.0 and row["tokens_per_s"] > 0
    assert 0.0 < modes["speculative k=8"]["acceptance"] <= 1.0
