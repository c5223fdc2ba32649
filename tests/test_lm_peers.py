"""Peer engines on a pretrained LM (sol_control.bench.peers.lm) and the HF folder they load.

Always run (no torch, no peer venv): `hf_writer` round trip through `hf_reader` (bit-identical
tensors, same config; stop ids, chat template and tokenizer as `sol-control import` reads them), the LM
workload's ids equal the chat template's rendering of the whole conversation, missing venvs are
skipped with a note, importing the module pulls in no peer library. For each engine whose venv
exists: the worker on a tiny GGUF gives our fp32 engine's greedy tokens (prompts and every agent
loop round, cache kept), plain and in its prompt-lookup mode; our fp32 tokens equal the numpy
reference's.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from dataclasses import replace

import gguf
import numpy as np
import pytest

from sol_control.bench import lm_rows
from sol_control.bench.peers import common, lm
from sol_control.bundle import Bundle
from sol_control.decoding import open_decoder
from sol_control.lm.gguf_reader import read_gguf_weights
from sol_control.lm.gguf_writer import write_llama_gguf
from sol_control.lm.hf_reader import read_hf_weights
from sol_control.lm.hf_writer import WEIGHTS, gguf_to_hf, write_hf_folder
from sol_control.lm.importer import import_model
from sol_control.lm.reference import LlamaReference
from sol_control.lm.tiny import random_llama, tiny_config, tiny_vocab
from sol_control.lm.tokenizer import read_gguf_tokenizer

from .conftest import REPO

TINY_WORKLOAD = {"prompts": ["the part on belt 2", "is the reject gate open?", "the conveyor then"],
                 "agent_loop": {"system": "You control the belt.", "max_new_tokens": 64,
                                "tool_results": ["qc/verdict: part 1041 reject", "part 1042 pass", "belt 2 stopped"]}}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny Llama (Q4_1 linears, Q8_0 tied embedding, context 1024) with a ChatML vocabulary;
    `<|im_end|>`'s embedding row is scaled up so that some answers end on it and some do not."""
    vocab = tiny_vocab()
    weights = random_llama(replace(tiny_config(len(vocab.tokens)), max_context=1024), seed=5)
    weights.tensors["model.embed_tokens.weight"][2] *= 1.5
    path = tmp_path_factory.mktemp("lm_peers") / "tiny.gguf"
    return write_llama_gguf(path, weights, vocab, embed_type=gguf.GGMLQuantizationType.Q8_0)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("tied", [True, False])
def test_hf_writer_round_trip_is_bit_identical(tmp_path, tiny_gguf, tied):
    tok = read_gguf_tokenizer(tiny_gguf)
    weights = random_llama(tiny_config(300, tie_embeddings=tied), seed=11)
    weights.tensors["model.norm.weight"][:3] = [-0.0, 1e-42, np.float32(3.4e38)]  # sign, subnormal, near max
    folder = write_hf_folder(weights, tmp_path / "hf", tok)
    back = read_hf_weights(folder)
    assert back.config == weights.config
    assert sorted(back.tensors) == sorted(weights.tensors)
    for name, want in weights.tensors.items():
        assert back.tensors[name].shape == want.shape and np.array_equal(bits(back.tensors[name]), bits(want)), name
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied and config["model_type"] == "llama"
    bundle = tmp_path / "bundle"  # what `sol-control import` reads from the folder
    m = import_model(folder, bundle, check=False)
    assert m.vocab.stop_ids == tok.stop_ids == (0, 2)
    assert (bundle / m.tokenizer.chat_template).read_text() == tok.chat_template
    assert (bundle / m.tokenizer.file).read_text() == tok.to_json()
    assert (m.tokenizer.bos_token, m.tokenizer.eos_token) == (tok.bos_token, tok.eos_token)
    raw = (folder / WEIGHTS).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert n % 8 == 0 and header["__metadata__"]["format"] == "pt"
    spans = sorted(e["data_offsets"] for k, e in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, nothing in between


def test_gguf_to_hf_holds_the_dequantized_weights(tmp_path, tiny_gguf):
    folder = gguf_to_hf(tiny_gguf, tmp_path / "hf")
    want, back = read_gguf_weights(tiny_gguf), read_hf_weights(folder)
    assert want.int4 and back.config == want.config
    for name in want.expected_shapes():
        assert np.array_equal(bits(back.tensors[name]), bits(want.linear(name))), name
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [0, 2]


def test_loop_ids_are_the_template_rendering_of_the_conversation(tiny_gguf):
    """Round r's context = the chat template's rendering of system, tool results and the answers
    so far (answers as token ids: one ending on the end-of-turn id, one cut at max tokens)."""
    tok = read_gguf_tokenizer(tiny_gguf)
    w = lm.lm_work(tok, TINY_WORKLOAD, threads=2)
    assert w.threads == 2 and w.stop_ids == [0, 2] and w.prompt_new_tokens == 128 and w.loop_new_tokens == 64
    assert w.prompts[1] == tok.encode_chat([{"role": "user", "content": "is the reject gate open?"}])
    assert len(w.loop_turns) == 2 and w.close == tok.encode("<|im_end|>\n")
    loop = TINY_WORKLOAD["agent_loop"]
    # ended on <|im_end|>; cut at max tokens; ended on <|endoftext|> (dropped: the template has no place for it)
    answers = [tok.encode("continue") + [2], tok.encode("divert 1041"), tok.encode("alert") + [0]]
    workload = {**TINY_WORKLOAD, "agent_loop": {**loop, "tool_results": [*loop["tool_results"], "belt 3 idle"]}}
    w = lm.lm_work(tok, workload)
    context = w.loop_first
    messages = [{"role": "system", "content": loop["system"]}, {"role": "user", "content": loop["tool_results"][0]}]
    for r, answer in enumerate(answers):
        context = common.next_loop_context(context, answer, w.loop_turns[r], w.close, w.stop_ids)
        messages += [{"role": "assistant", "content": tok.decode(answer, skip_special=True)},
                     {"role": "user", "content": workload["agent_loop"]["tool_results"][r + 1]}]
        assert context == tok.encode_chat(messages)
    assert w.loop_context_max >= len(context) + 64


def test_cut_at_stop():
    assert common.cut_at_stop([5, 2, 7, 0], (0, 2), 10) == [5, 2]
    assert common.cut_at_stop([5, 6, 7], (0, 2), 2) == [5, 6]
    assert common.cut_at_stop([0], (0, 2), 5) == [0]


def test_missing_venvs_are_skipped_with_a_note(tmp_path, monkeypatch, tiny_gguf):
    monkeypatch.setattr(common, "VENVS", {e: (tmp_path / "nowhere", "x") for e in lm.LM_ENGINES})
    rows = lm.run_lm_peers(tiny_gguf, TINY_WORKLOAD, 1, work=tmp_path)
    assert [r["engine"] for r in rows] == list(lm.LM_ENGINES)
    assert all(r["skipped"] and r["decode_tokens_per_s"] is None and "setup_peers.sh" in r["note"] for r in rows)
    assert set(lm.ROW_KEYS) <= set(rows[0])


@pytest.mark.process
def test_import_pulls_in_no_peer_library():
    code = ("import sys, sol_control.bench.peers.lm, sol_control.lm.hf_writer; "
            "print([m for m in ('torch', 'transformers', 'onnxruntime_genai', 'openvino', 'openvino_genai', "
            "'llama_cpp', 'onnx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# ---- each peer on the tiny model (skipped without its venv) -----------------------------------------

# 8 loop rounds: the conversation passes 512 tokens (llama-cpp-python's prompt lookup broke there)
LONG_WORKLOAD = {**TINY_WORKLOAD, "agent_loop": {**TINY_WORKLOAD["agent_loop"], "tool_results": [
    f"qc/verdict: part {1041 + i} {'reject' if i % 3 else 'pass'} latency_ms={4 + i}.2" for i in range(8)]}}


@pytest.fixture(scope="module")
def ref_bundle(tiny_gguf, tmp_path_factory):
    """The tiny GGUF imported as `sol-control import` imports it (fp32)."""
    out = tmp_path_factory.mktemp("lm_ref") / "bundle"
    import_model(tiny_gguf, out)
    return Bundle.load(out)


def our_fp32(bundle, gguf, workload: dict) -> dict:
    """Our fp32 engine's greedy tokens on the peers' ids: a plain fp32 row through the workload as
    `bench lm` runs its rows (`lm_rows.run_workload`: a loop round's context from its answers)."""
    row = lm_rows.Row("fp32", "fp32", "plain", open_decoder(bundle, "target", "fp32"))
    lm_rows.run_workload([row], lm.lm_work(read_gguf_tokenizer(gguf), workload), 1)
    return {"prompts": [r.tokens for r in row.prompts[0]], "loop": [r.tokens for r in row.loops[0]]}


@pytest.fixture(scope="module")
def reference(tiny_gguf, ref_bundle):
    """Our fp32 engine's greedy tokens, checked against numpy."""
    ref = our_fp32(ref_bundle, tiny_gguf, TINY_WORKLOAD)
    w = lm.lm_work(read_gguf_tokenizer(tiny_gguf), TINY_WORKLOAD)
    numpy_ref = LlamaReference(read_gguf_weights(tiny_gguf))
    assert ref["prompts"] == [numpy_ref.greedy(p, 128, (0, 2)) for p in w.prompts]
    assert ref["loop"][0] == numpy_ref.greedy(w.loop_first, 64, (0, 2))
    answers = ref["prompts"] + ref["loop"]
    assert any(a[-1] == 2 for a in answers) and any(a[-1] not in (0, 2) for a in answers), answers  # both ends
    return ref


def skip_without(engine: str):
    venv, target = lm.VENVS[engine]
    return pytest.mark.skipif(not lm.venv_ready(engine), reason=f"no {venv.name} (bash tools/setup_peers.sh {target})")


def assert_peer_matches(engine: str, modes, tiny_gguf, reference, tmp_path, exact=("fp32",),
                        workload=TINY_WORKLOAD) -> list[dict]:
    rows = lm.run_lm_peers(tiny_gguf, workload, 1, engines=(engine,), modes={engine: modes},
                           work=tmp_path)
    assert len(rows) == len(modes)
    rounds = len(workload["agent_loop"]["tool_results"])
    for row in rows:
        assert not row.get("skipped"), row["note"]
        assert row["decode_tokens_per_s"] > 0 and row["ttft_ms"] >= 0 and row["loop_s"] > 0 and row["rss_mb"] > 0
        assert len(row["outputs"]["prompts"]) == 3 and len(row["outputs"]["loop"]) == rounds
        if row["precision"] in exact:  # every prompt's and every loop round's tokens are ours
            want = {"prompts": reference["prompts"], "loop": reference["loop"]}
            assert row["outputs"] == want, row["mode"]
    return rows


@pytest.mark.process
@pytest.mark.timeout(600)
@skip_without("ort-genai")
def test_ort_genai_lm_matches_our_fp32(tiny_gguf, reference, tmp_path):
    assert_peer_matches("ort-genai", [("fp32", "plain"), ("fp32", "ngram")], tiny_gguf, reference, tmp_path)


@pytest.mark.process
@pytest.mark.timeout(600)
@skip_without("openvino")
def test_openvino_lm_matches_our_fp32(tiny_gguf, reference, tmp_path):
    assert_peer_matches("openvino", [("fp32", "plain"), ("fp32", "lookup")], tiny_gguf, reference, tmp_path)


@pytest.mark.process
@pytest.mark.timeout(600)
@skip_without("transformers")
def test_transformers_lm_matches_our_fp32(tiny_gguf, reference, tmp_path):
    assert_peer_matches("transformers", [("fp32", "plain"), ("fp32", "lookup")], tiny_gguf, reference, tmp_path)


@pytest.mark.process
@pytest.mark.timeout(600)
@skip_without("llama.cpp")
def test_llama_cpp_lm_matches_our_fp32(tiny_gguf, ref_bundle, tmp_path):
    """F32 GGUF from the HF folder: our tokens, over a loop past 512 tokens; the file itself
    (Q4_1, int8 activations) just runs."""
    reference = our_fp32(ref_bundle, tiny_gguf, LONG_WORKLOAD)
    rows = assert_peer_matches("llama.cpp", [("fp32", "plain"), ("fp32", "lookup"), ("int4", "plain")],
                               tiny_gguf, reference, tmp_path, workload=LONG_WORKLOAD)
    assert all(r["loop_context_tokens"] > 512 for r in rows)
    assert rows[-1]["weights_from"].startswith("the GGUF itself")
