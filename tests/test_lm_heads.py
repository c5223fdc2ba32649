"""Draft heads for a language model: `sol-control import --heads H.npz` and the pure-numpy parts of
their training (tools/train_lm_heads.py, tools/lm_selfdistill.py), on a tiny Llama written here (no
torch, no 135M model).

Checked: the heads go into every fused target graph (manifest `target.draft_heads`, the graph's
`heads.w1` equal to the file's, the import record names the file and its sha256); generation with
them gives plain greedy's tokens at fp32, int8 and int4, with guesses both accepted and rejected;
a bad heads file (missing, not an npz, pickled, incomplete, misshapen, non-finite) or a source or
option it cannot go with fails with one `sol-control: ...` line, exit 2, and no bundle. Training
side: head labels are the target's tokens j ahead inside one answer, the validation split and the
acceptance estimate count what they say, example shards round-trip, and the generated prompts
share no run of words with the held-out benchmark workload.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from sol_control.bundle import Bundle
from sol_control.cli import main
from sol_control.graph.from_onnx import initializers
from sol_control.graph.quant import per_channel_int8
from sol_control.lm.gguf_writer import write_llama_gguf
from sol_control.lm.reference import LlamaReference
from sol_control.lm.tiny import random_llama, tiny_config, tiny_vocab

from .conftest import REPO

Q = gguf.GGMLQuantizationType
STOPS = (0, 2)
PROMPTS = [[1, 100, 71, 234, 5], [40, 41, 42], [1, 270, 7, 7, 7, 9, 150, 3], [5, 5, 5, 5]]
K = 3


def _tool(name: str):
    """A tools/ script as a module (they put tools/ on sys.path for their own imports)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_heads(path: Path, hidden: int, k: int = K, seed: int = 0, scale: float = 0.02, chain: bool = False,
                prev_hidden: int | None = None) -> Path:
    """w1 (and with `chain`, w_prev [K, prev_hidden or hidden, hidden]) of small random numbers."""
    from sol_control.graph.weights import DraftHeads

    rng = np.random.default_rng(seed)
    w1 = (scale * rng.standard_normal((k, hidden, hidden))).astype(np.float32)
    w_prev = (scale * rng.standard_normal((k, prev_hidden or hidden, hidden))).astype(np.float32) if chain else None
    DraftHeads(w1, None, 0, w_prev).save(path)
    return path


def _import_with_heads(root: Path, chain: bool) -> tuple[Path, Path, Path]:
    """(GGUF path, heads file, bundle imported with those heads and int8,int4) of the tiny model."""
    vocab = tiny_vocab()
    config = replace(tiny_config(len(vocab.tokens), tie_embeddings=True), max_context=512)
    path = write_llama_gguf(root / "tiny.gguf", random_llama(config, seed=11), vocab, embed_type=Q.Q8_0)
    heads = write_heads(root / "heads.npz", config.hidden_size, chain=chain)
    bundle = root / "bundle"
    assert main(["import", str(path), "--out", str(bundle), "--quantize", "int8,int4", "--heads", str(heads)]) == 0
    return path, heads, bundle


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(GGUF path, heads file, bundle imported with --heads and int8,int4, the reader's weights)."""
    from sol_control.lm.gguf_reader import read_gguf_weights

    path, heads, bundle = _import_with_heads(tmp_path_factory.mktemp("lm_heads"), chain=False)
    return path, heads, bundle, read_gguf_weights(path)


@pytest.fixture(scope="module")
def chained(tmp_path_factory):
    """The same with chained heads (w_prev: each head also reads the token before its guess)."""
    from sol_control.lm.gguf_reader import read_gguf_weights

    path, heads, bundle = _import_with_heads(tmp_path_factory.mktemp("lm_chained"), chain=True)
    return path, heads, bundle, read_gguf_weights(path)


def generate(bundle: Path, tmp_path: Path, prompt: list[int], *args: str) -> dict:
    out = tmp_path / "gen.json"
    assert main(["generate", "--bundle", str(bundle), "--prompt-ids", ",".join(map(str, prompt)),
                 "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_import_puts_the_heads_into_every_target_graph(tiny):
    _, heads, bundle, _ = tiny
    m = Bundle.load(bundle).manifest
    assert m.target.draft_heads == K and set(m.target.fused) == {"fp32", "int8", "int4"}
    record = m.metrics["import"]["target"]["heads"]
    assert record["k"] == K and record["file"] == "heads.npz" and record["shared_lm_head"] is True
    assert record["sha256"] == hashlib.sha256(heads.read_bytes()).hexdigest()
    w1 = np.load(heads)["w1"]
    for precision, name in m.target.fused.items():
        model = onnx.load(str(bundle / name))
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["draft_heads"] == str(K), precision
        assert "head_ids" in [o.name for o in model.graph.output], precision
        init = {n: numpy_helper.to_array(t) for n, t in initializers(model).items() if n.startswith("heads.w1")}
        hidden = w1.shape[1]
        if precision == "fp32":  # [H_in, K * H_out]
            np.testing.assert_array_equal(init["heads.w1"], w1.transpose(2, 0, 1).reshape(hidden, K * hidden))
        else:  # int8 per output channel, as the int8 linears
            q, _ = per_channel_int8(w1.reshape(K * hidden, hidden))
            np.testing.assert_array_equal(init["heads.w1.s8.T"], q.T)


@pytest.mark.parametrize("heads_kind", ["tiny", "chained"])
@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_generation_with_heads_equals_plain_greedy(request, tmp_path, precision, heads_kind):
    """Lossless: the heads' tokens are plain greedy's at every precision (fp32: also the numpy
    reference's), with heads and with chained heads; over the prompts some guesses are accepted and
    some rejected."""
    _, _, bundle, weights = request.getfixturevalue(heads_kind)
    if heads_kind == "chained":
        assert Bundle.load(bundle).manifest.metrics["import"]["target"]["heads"]["chained"] is True
    accepted = []
    for prompt in PROMPTS:
        heads = generate(bundle, tmp_path, prompt, "--max-new-tokens", "16", "--precision", precision)
        plain = generate(bundle, tmp_path, prompt, "--max-new-tokens", "16", "--precision", precision, "--no-draft")
        assert heads["mode"] == "heads" and plain["mode"] == "plain"
        assert heads["tokens"] == plain["tokens"], (precision, prompt)
        if precision == "fp32":
            assert heads["tokens"] == LlamaReference(weights).greedy(prompt, 16, STOPS)
        accepted.append(heads["mean_accepted"])
    assert max(accepted) > 1.0, accepted  # some guesses were right ...
    assert min(accepted) < K + 1, accepted  # ... and some wrong: both paths of the rule ran


def _pickled(d: Path) -> Path:
    np.savez(d / "h.npz", w1=np.array([{"not": "weights"}], dtype=object), token_offset=np.int64(0))
    return d / "h.npz"


def _only_offset(d: Path) -> Path:
    np.savez(d / "h.npz", token_offset=np.int64(0))
    return d / "h.npz"


def _non_finite(d: Path) -> Path:
    path = write_heads(d / "h.npz", 64)
    w1 = np.load(path)["w1"]
    w1[1, 2, 3] = np.nan
    np.savez(path, w1=w1, token_offset=np.int64(0))
    return path


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.npz", "does not exist"),
    (lambda d: (d / "h.npz").write_text("w1 = zeros") and d / "h.npz", "is not an .npz file"),
    (_pickled, "is not a plain .npz of draft heads"),
    (_only_offset, "has no w1 array"),
    (lambda d: write_heads(d / "h.npz", 32), "expected [K, 64, 64]"),
    (lambda d: write_heads(d / "h.npz", 64, k=17), "K in 1..16"),
    (_non_finite, "non-finite"),
    (lambda d: write_heads(d / "h.npz", 64, chain=True, prev_hidden=32), "w_prev (3, 32, 64) must be"),
])
def test_bad_heads_fail_clearly(tiny, tmp_path, capsys, make, message):
    path = tiny[0]
    heads = make(tmp_path)
    out = tmp_path / "out"
    assert main(["import", str(path), "--out", str(out), "--quantize", "int8", "--heads", str(heads)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sol-control: ") and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_heads_refused_where_they_cannot_go(tiny, tmp_path, capsys):
    """An ONNX export is copied (no graph to write heads into); --draft and --heads together would
    leave the heads unused."""
    path, heads, _, _ = tiny
    from .test_lm_generate import optimum_folder

    cases = [(["import", str(optimum_folder(tmp_path)), "--out", str(tmp_path / "a"), "--heads", str(heads)],
              "--heads applies to GGUF and Hugging Face sources", tmp_path / "a"),
             (["import", str(path), "--out", str(tmp_path / "b"), "--heads", str(heads), "--draft", str(path)],
              "give one", tmp_path / "b")]
    for argv, message, out in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
        assert not out.exists()


# -- training side (numpy) ---------------------------------------------------------------------
def test_head_labels_are_the_tokens_j_ahead_inside_one_answer():
    T = _tool("train_lm_heads")
    answers = np.array([10, 11, 12, 13, 20, 21, 30], np.int64)  # answers of lengths 4, 2, 1 end to end
    rows, labels = T.head_labels(answers, np.array([4, 2, 1]), 3)
    assert rows.tolist() == [0, 1, 2, 4]  # each answer's last row predicts nothing: left out
    x = T.IGNORE
    assert labels.tolist() == [[11, 12, 13], [12, 13, x], [13, x, x], [21, x, x]]
    # chained heads read the token before their label: the row's own, then labels 1..K-1 (0 past the end)
    assert T.prev_tokens(answers, rows, labels).tolist() == [[10, 11, 12], [11, 12, 13], [12, 13, 0], [20, 21, 0]]


def test_validation_split_and_acceptance_estimate():
    T, D = _tool("train_lm_heads"), _tool("lm_selfdistill")
    ex = D.Examples.build([[1, 2]] * 40, [[5, 6, 7]] * 40, [D.CHAT] * 40)
    train, val = T.split_rows(ex, every=20)
    assert val.sum() == 2 * 3 and (train ^ val).all()  # examples 19 and 39, their 3 rows each
    assert np.flatnonzero(val).tolist() == [57, 58, 59, 117, 118, 119]
    x = T.IGNORE
    labels = np.array([[1, 2, 3], [1, 2, x], [1, x, x], [1, 2, 3]])
    pred = np.array([[1, 2, 3], [1, 9, 9], [9, 9, 9], [1, 2, 9]])
    got = T.acceptance(pred, labels)
    assert got["accuracy"] == [0.75, 0.6667, 0.5]
    # tokens per call with K heads: 1 + mean over rows of the leading run of right guesses (<= K)
    assert got["tokens_per_call"] == [1.75, 2.25, 2.5]


def test_examples_round_trip_with_hidden_rows(tmp_path):
    D = _tool("lm_selfdistill")
    rng = np.random.default_rng(0)
    answers = [[7, 8, 2], [9, 2]]
    hidden = [rng.standard_normal((len(a), 4)).astype(np.float16) for a in answers]
    a = D.Examples.build([[1, 2, 3], [4]], answers, [D.CHAT, D.AGENT], hidden)
    b = D.Examples.build([[5, 6]], [[3]], [D.CHAT], [rng.standard_normal((1, 4)).astype(np.float16)])
    a.save(tmp_path / "shard_000.npz")
    b.save(tmp_path / "shard_001.npz")
    ex = D.load_examples(tmp_path)
    assert len(ex) == 3 and ex.answer_tokens() == 6 and ex.answer_lengths().tolist() == [3, 2, 1]
    assert [ex.answer(i).tolist() for i in range(3)] == [[7, 8, 2], [9, 2], [3]]
    assert ex.sequence(1).tolist() == [4, 9, 2] and ex.kind.tolist() == [D.CHAT, D.AGENT, D.CHAT]
    np.testing.assert_array_equal(ex.hidden, np.concatenate([*hidden, b.hidden]))
    assert D.cut_at_stop([5, 2, 2, 2], STOPS) == [5, 2] and D.cut_at_stop([5, 6], STOPS) == [5, 6]


def test_training_prompts_hold_out_the_benchmark_workload():
    D = _tool("lm_selfdistill")
    held_out = D.workload_texts()
    assert len(held_out) == 20 + 1 + 20
    chats, agents = D.chat_prompts(600, seed=0), D.agent_conversations(60, seed=1)
    texts = [m["content"] for c in chats for m in c] + [a["system"] for a in agents] + \
        [t for a in agents for t in a["tool_results"]]
    assert len(set(texts)) > 600 and D.held_out_overlap(texts, held_out) == []
    # the check itself catches a workload prompt, whole or inside a longer one
    probe = ["Please answer: " + held_out[3], held_out[25]]
    assert [h for _, h in D.held_out_overlap(probe, held_out)] == [held_out[3], held_out[25]]
    assert D.chat_prompts(50, seed=0) == chats[:50]  # deterministic for a seed


@pytest.mark.parametrize("precision, with_heads", [("int4", False), ("int8", True)])
def test_selfdistill_graph_answers_with_the_graphs_own_tokens_and_rows(tiny, tmp_path, precision, with_heads):
    """tools/lm_selfdistill_graph.py on the tiny model: each prompt's new answer is the graph's plain
    greedy (the symmetric int4 graph as `generate` decodes a symmetric import; the int8 graph, here
    answered through a graph with draft heads, as `generate --no-draft` decodes the int8 bundle), the
    prefill's argmaxes equal it, and hidden row i is the graph's last row after prompt + answer[:i]
    (whose argmax is token i)."""
    R, D = _tool("lm_selfdistill_graph"), _tool("lm_selfdistill")
    path, heads = tiny[0], tiny[1]
    graph = R.build(path, precision, "symmetric", tmp_path / "graph.onnx")
    fast = R.build(path, precision, "symmetric", tmp_path / "heads.onnx", heads) if with_heads else graph
    model, answer = R.TeacherForced(graph, 1), R.Answerer(fast, 1, STOPS, 10)
    prompts = [np.array(p, np.int64) for p in PROMPTS]
    new, same = R.answer_again(prompts, [D.CHAT] * len(PROMPTS), answer, model)
    assert same == new.answer_tokens() and new.hidden.shape == (new.answer_tokens(), tiny[3].config.hidden_size)
    if precision == "int4":
        bundle = tmp_path / "sym"
        assert main(["import", str(path), "--out", str(bundle), "--quantize", "int4", "--int4-mode", "symmetric"]) == 0
    else:
        bundle = tiny[2]
    starts = np.cumsum([0, *new.answer_lengths()])
    for i, prompt in enumerate(PROMPTS):
        assert new.sequence(i)[:len(prompt)].tolist() == prompt
        plain = generate(bundle, tmp_path, prompt, "--precision", precision, "--no-draft", "--max-new-tokens", "10")
        assert new.answer(i).tolist() == plain["tokens"]
        for j in (0, len(plain["tokens"]) - 1):
            h, _ = model(np.array(prompt + plain["tokens"][:j], np.int64))
            np.testing.assert_allclose(new.hidden[starts[i] + j].astype(np.float32), h[-1], rtol=2e-3, atol=2e-3)


def test_selfdistill_graph_makes_its_own_chat_prompts_in_shards(tiny):
    """--chat N: lm_selfdistill's N chat prompts (same seed), chat-templated, CHAT_SHARD a shard, in order."""
    from sol_control.lm.gguf_reader import open_gguf
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    R, D = _tool("lm_selfdistill_graph"), _tool("lm_selfdistill")
    tok = read_gguf_tokenizer(open_gguf(tiny[0]))
    args = R.argparse.Namespace(chat=R.CHAT_SHARD + 7, seed=0, data=Path("/nonexistent"))
    shards = R.shard_prompts(args, tok)
    assert list(shards) == ["shard_000.npz", "shard_001.npz"]
    assert [len(ids) for ids, _ in shards.values()] == [R.CHAT_SHARD, 7]
    assert all(k == [D.CHAT] * len(ids) for ids, k in shards.values())
    chats = D.chat_prompts(R.CHAT_SHARD + 7, seed=0)
    assert shards["shard_001.npz"][0][-1].tolist() == tok.encode_chat(chats[-1])
    with pytest.raises(SystemExit, match="no shard_"):
        R.shard_prompts(R.argparse.Namespace(chat=0, seed=0, data=Path("/nonexistent")), tok)


@pytest.mark.parametrize("name, k", [("smollm2_heads_k3.npz", 3), ("smollm2_symmetric_heads_k2.npz", 2)])
def test_shipped_smollm2_heads_are_chained_heads_on_the_lm_head(name, k):
    """The committed heads files read as the import reads them: K chained heads for SmolLM2's hidden
    size 576, guessing through the model's own lm_head (no w2 of their own)."""
    from sol_control.lm.importer import read_heads

    heads = read_heads(REPO / "models" / "lm" / name)
    assert heads.k == k and heads.shared_head and heads.w1.shape == heads.w_prev.shape == (k, 576, 576)
