"""Peer-engine runners (benchmark only): no peer library leaks into our venv, the HF folders the
peers load are the bundle's own weights (rebuilt from its ONNX), the speculative GenAI folder is
laid out as ONNX Runtime GenAI expects, and — for each engine whose venv exists — the engine on
the fixture weights reproduces our standard greedy outputs, plain and speculative."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

from sol_control.bench import peers
from sol_control.bench.peers import common, ort_genai
from sol_control.bundle import Bundle

from .conftest import FIXTURES, REPO


@pytest.mark.process
def test_import_pulls_in_no_peer_library():
    code = ("import sys, sol_control.bench.peers as p; "
            "print([m for m in ('torch', 'transformers', 'onnxruntime_genai', 'openvino', 'openvino_genai', "
            "'llama_cpp', 'onnx') if m in sys.modules])")
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
    out = ort_genai.genai_speculative_folder(tmp_path / "t", tmp_path / "d", tmp_path / "spec", k=6)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "target/model.onnx"
    assert config["model"]["draft"]["filename"] == "draft/model.onnx"
    assert config["model"]["draft"]["num_hidden_layers"] == 2
    assert config["speculative"] == {"max_draft_tokens": 6}
    assert (out / "target").resolve() == (tmp_path / "t").resolve()
    assert ".." not in json.dumps(config)  # GenAI refuses parent paths


def test_onnx_to_hf_rebuilds_the_fixture_weights_bit_for_bit(tmp_path):
    """tests/fixtures/tiny_hf{,_draft} are the folders the fixture bundle was exported from:
    rebuilding them from the bundle's ONNX must give the same tensors and configuration. (The
    converter is a module of the package, sol_control.lm.hf_from_onnx.)"""
    from sol_control.lm.hf_from_onnx import convert_bundle
    from sol_control.lm.hf_reader import read_safetensors

    folders = convert_bundle(FIXTURES / "tiny", tmp_path)
    for role, original in (("target", "tiny_hf"), ("draft", "tiny_hf_draft")):
        got = read_safetensors(folders[role] / "model.safetensors")
        want = read_safetensors(FIXTURES / original / "model.safetensors")
        assert sorted(got) == sorted(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
        config = json.loads((folders[role] / "config.json").read_text())
        ref = json.loads((FIXTURES / original / "config.json").read_text())
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
                    "max_position_embeddings", "bos_token_id", "eos_token_id"):
            assert config[key] == ref[key], key
        assert (folders[role] / "generation_config.json").is_file()


def test_hf_folders_are_rebuilt_once_and_cached(tmp_path):
    bundle = Bundle.load(FIXTURES / "tiny")
    target, draft = peers.hf_folders(bundle, cache=tmp_path)
    assert (target / "config.json").is_file() and (draft / "model.safetensors").is_file()
    assert target.parent.name.startswith("tiny-")
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert peers.hf_folders(bundle, cache=tmp_path) == (target, draft)
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp


def test_missing_peer_venvs_are_skipped_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "VENVS", {e: (tmp_path / "nowhere", "x") for e in peers.ENGINES})
    result = peers.run_all(Bundle.load(FIXTURES / "tiny"), quick=True, work=tmp_path)
    assert result["rows"] == [] and not result.get("errors")
    assert set(result["skipped"]) == set(peers.ENGINES)
    assert "setup_peers.sh" in result["skipped"]["openvino"]


def has_venv(engine: str) -> bool:
    return peers.venv_ready(engine)


def skip_without(engine: str):
    venv, target = peers.VENVS[engine]
    return pytest.mark.skipif(not has_venv(engine), reason=f"no {venv.name} (bash tools/setup_peers.sh {target})")


@pytest.mark.process
@skip_without("transformers")
def test_onnx_to_hf_check_against_onnx_runtime(tmp_path):
    """In .venv-peers (torch): transformers on the rebuilt folders gives ONNX Runtime's logits
    within 1e-4 and the same greedy tokens."""
    python = peers.VENVS["transformers"][0] / "bin" / "python"
    proc = subprocess.run([str(python), str(REPO / "tools" / "onnx_to_hf.py"),
                           "--bundle", str(FIXTURES / "tiny"), "--out", str(tmp_path), "--check"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("-> ok") == 2, proc.stdout


def assert_matches_standard(engine: str, tmp_path, fp32_label: str = "fp32") -> dict:
    bundle = Bundle.load(FIXTURES / "tiny")
    result = peers.run_all(bundle, quick=True, engines=(engine,), precisions=("fp32",), work=tmp_path)
    assert not result["errors"], result["errors"]
    assert result["weights_from"] == "bundle fp32 ONNX"
    modes = {r["mode"]: r for r in result["rows"]}
    assert set(modes) == {"plain", "speculative k=8"}, modes.keys()
    for row in modes.values():
        assert row["precision"] == fp32_label
        assert row["match_standard"] == 1.0 and row["tokens_per_s"] > 0, row
    assert 0.0 < modes["speculative k=8"]["acceptance"] <= 1.0
    return modes


@pytest.mark.process
@skip_without("ort-genai")
def test_ort_genai_matches_standard_outputs(tmp_path):
    assert_matches_standard("ort-genai", tmp_path)


@pytest.mark.timeout(600)
@skip_without("openvino")
def test_openvino_matches_standard_outputs(tmp_path):
    assert_matches_standard("openvino", tmp_path)


@pytest.mark.timeout(600)
@skip_without("llama.cpp")
def test_llama_cpp_matches_standard_outputs(tmp_path):
    assert_matches_standard("llama.cpp", tmp_path)


@pytest.mark.process
@skip_without("ort-genai")
def test_paired_rounds_alternate_the_best_peer_row_with_ours():
    """`bench all`'s paired check with the real peer served: the ratio is the peer's ms over ours,
    and a mode the peer does not run is an error."""
    from sol_control.bench import paired

    bundle = Bundle.load(REPO / "models" / "qc")
    lines = []
    best = {"engine": "ort-genai", "precision": "int4", "mode": "plain"}
    rep = paired.paired(bundle, best, 1, "_qc", progress=lines.append)
    (r,) = rep["paired_qc"]["rounds"]
    assert rep["paired_qc"]["peer"] == best and len(lines) == 1
    assert r["peer_ms"] > 0 and 0 < r["ours_warm_ms"] and 0 < r["ours_cold_ms"]
    assert rep["vs_best_peer_qc_paired"] == r["peer_ms"] / r["ours_warm_ms"]
    assert rep["vs_best_peer_qc_paired_cold"] == r["peer_ms"] / r["ours_cold_ms"]
    with pytest.raises(RuntimeError, match=r"ort-genai has no speculative k=3 row at \['int4'\]"):
        peers.serve_row(bundle, {**best, "mode": "speculative k=3"})


# A stand-in engine behind the real serve loop: it answers by counting up from the prompt's last id,
# prints chatter on stdout as engines may, and exits or stalls on the prompts [13] and [14].
STAND_IN = """
import sys, time
from sol_control.bench.peers.common import LMWork, serve_lm

def generate(ids, max_new, keep):
    if ids == [13]:
        sys.exit(3)
    if ids == [14]:
        time.sleep(60)
    print("engine chatter", flush=True)
    time.sleep(0.02)
    return [ids[-1] + i + 1 for i in range(max_new)], 5.0

print(serve_lm(generate, LMWork(prompts=[[1, 2]], loop_first=[1], loop_turns=[], close=[2], stop_ids=[2])))
"""


def _stand_in_server(tmp_path, timeout_s=30, script=STAND_IN, cls=None):
    from sol_control.bench.peers.lm import PeerServer

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return (cls or PeerServer)([sys.executable, "-c", script], env, tmp_path / "serve.log", timeout_s=timeout_s)


@pytest.mark.process
def test_peer_server_answers_prompt_by_prompt_over_a_pipe(tmp_path):
    """`bench lm --paired`'s peer worker: started once, one answer per request (chatter on stdout
    skipped), decode tokens/s as time_lm counts them: (tokens - 1) over the time after the first."""
    with _stand_in_server(tmp_path) as server:
        rates = [server.decode_tokens_per_s([7, 8], 9), server.decode_tokens_per_s([40], 1)]
    assert rates[1] is None  # one token: no decode time
    assert 0 < rates[0] < 8 / 0.015 * 1e3  # 8 tokens after the first, over at least 20 - 5 ms
    with _stand_in_server(tmp_path) as server:
        with pytest.raises(RuntimeError, match=r"peer worker exited \(3\)"):
            server.decode_tokens_per_s([13], 4)
    with _stand_in_server(tmp_path, timeout_s=1) as server:
        with pytest.raises(RuntimeError, match="no reply in 1 s"):
            server.decode_tokens_per_s([14], 4)


# A stand-in decision engine behind the real decision serve loop: two rows, only "plain" served.
STAND_IN_DECIDE = """
import time
from sol_control.bench.peers.common import Workload, serve_decisions, timed_row

def decide(prefix):
    time.sleep(0.005)
    return [t + 1 for t in prefix[:3]], 1.0, {}

timer = serve_decisions("plain")
w = Workload(prefixes=[[1, 2, 3]], new_tokens=3)
rows = [timed_row("x", "speculative k=8", "fp32", decide, w, timer), timed_row("x", "plain", "fp32", decide, w, timer)]
assert rows[0]["skipped"] and rows[1]["served"] == 2, rows
"""


@pytest.mark.process
def test_a_served_decision_row_answers_each_prefix(tmp_path):
    """`bench all`'s paired peer: the worker serves the asked row only (the other is skipped), one
    decision per request, timed inside the worker; it exits cleanly when the input ends."""
    from sol_control.bench.peers.common import ServedWorker

    with _stand_in_server(tmp_path, script=STAND_IN_DECIDE, cls=ServedWorker) as peer:
        got = [peer.ask({"prefix": [7, 8, 9, 10]}), peer.ask({"prefix": [1, 2, 3]})]
        proc = peer._proc
    assert [g["tokens"] for g in got] == [[8, 9, 10], [2, 3, 4]]
    assert all(g["ms"] >= 5.0 for g in got)
    assert proc.returncode == 0  # its own check of the rows passed


def test_paired_decisions_alternate_with_the_peer_on_real_sessions(monkeypatch):
    """`bench/paired.py`: per prefix ours warm, ours cold (the QC bundle, a real session) and two of
    the peer's, strictly alternating, so each side always runs right after the other; a round's
    ratio is the peer's median ms over ours."""
    from sol_control.bench import paired

    bundle = Bundle.load(REPO / "models" / "qc")
    calls, real = [], paired.speculate_heads

    def ours(sess, *a, **k):
        calls.append("cold" if sess.length == 0 else "warm")  # cold: the cache was just emptied
        return real(sess, *a, **k)

    class Peer:
        def ask(self, req):
            calls.append("peer")
            return {"ms": 100.0 + len(req["prefix"])}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append("closed")

    monkeypatch.setattr(paired, "speculate_heads", ours)
    monkeypatch.setattr(paired, "REPEATS", 1)
    rep = paired.paired(bundle, {"engine": "x", "precision": "int4", "mode": "plain"}, 2, "_qc",
                        progress=lambda line: None, open_peer=Peer)
    calls = calls[2:]  # the warm-up
    assert calls[-1] == "closed" and len(calls) == 2 * 16 * 4 + 1
    assert calls[:4] == ["warm", "peer", "cold", "peer"] and calls[64:68] == ["peer", "warm", "peer", "cold"]
    seq = calls[:-1]
    assert seq.count("warm") == seq.count("cold") == 32 and seq.count("peer") == 64
    same_side_twice = [i for i in range(1, len(seq)) if (seq[i] == "peer") == (seq[i - 1] == "peer")]
    assert same_side_twice == [64]  # only where round 2 starts with the peer again
    r = rep["paired_qc"]["rounds"][0]
    assert 100 < r["peer_ms"] and rep["vs_best_peer_qc_paired"] == statistics.median(
        x["peer_ms"] / x["ours_warm_ms"] for x in rep["paired_qc"]["rounds"])
