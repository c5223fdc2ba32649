"""`sol-control import` and `sol-control generate` end to end on a tiny Llama written here (no 135M model).

Checked: a GGUF (Q4_1 linears, Q8_0 tied embedding, context 8192) imports through the CLI into a
bundle whose manifest holds the stop ids, the model's own context, the tokenizer and the chat
template; greedy `generate` in fp32 equals the numpy reference forward on the GGUF's dequantized
weights; the int4 graph's weights equal gguf's dequantization of the Q4_1 blocks within fp32
rounding, in the fast form (uint8 zero points + mins); generation stops at a stop id; `--json`
keys; a draft gives the same tokens as plain greedy; an Optimum-style ONNX folder imports and
decodes as its torch reference; bad sources fail with a clear message and a nonzero exit.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tokenizers import Tokenizer, models

from sol_control.bundle import Bundle, write_manifest
from sol_control.cli import main
from sol_control.graph import quant
from sol_control.lm.ggml_q4 import q4_1_nibbles
from sol_control.lm.gguf_reader import read_gguf_weights, unpermute_rows
from sol_control.lm.gguf_writer import finish_gguf, gguf_name, llama_gguf_writer, write_llama_gguf
from sol_control.lm.reference import LlamaReference
from sol_control.lm.tiny import CHATML, random_llama, tiny_config, tiny_vocab

from .conftest import FIXTURES

Q = gguf.GGMLQuantizationType
U = np.float32(2.0 ** -24)  # fp32 unit roundoff
STOPS = (0, 2)  # <|endoftext|>, <|im_end|>
PROMPTS = [[1, 100, 71, 234, 5], [40, 41, 42], [1, 290 - 20, 7, 7, 7, 9, 150, 3]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(GGUF path, the bundle imported from it with int4, its LlamaWeights as the reader sees them)."""
    root, vocab = tmp_path_factory.mktemp("lm"), tiny_vocab()
    config = replace(tiny_config(len(vocab.tokens), tie_embeddings=True), max_context=8192)
    weights = random_llama(config, seed=11)
    path = write_llama_gguf(root / "tiny.gguf", weights, vocab, embed_type=Q.Q8_0)
    assert main(["import", str(path), "--out", str(root / "bundle"), "--quantize", "int4"]) == 0
    return path, root / "bundle", read_gguf_weights(path)


def generate(bundle: Path, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "gen.json"
    assert main(["generate", "--bundle", str(bundle), "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_import_writes_an_lm_manifest(tiny):
    _, bundle, weights = tiny
    b = Bundle.load(bundle)  # every sha256 checked
    m = b.manifest
    assert m.task == "lm" and m.vocab.size == weights.config.vocab_size
    assert m.vocab.stop_ids == STOPS
    assert m.max_context == 8192  # the model's own context, no cap
    assert m.target.fused == {"fp32": "target_fp32.onnx", "int4": "target_int4.onnx"} and not m.target.files
    assert m.vocab.observation is None and m.vocab.action is None and m.actions == ()
    assert m.tokenizer.file == "tokenizer.json" and b.path("chat_template.jinja").read_text() == CHATML
    tok = Tokenizer.from_file(str(b.path("tokenizer.json")))
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.decode(tok.encode("the part on belt 2").ids) == "the part on belt 2"
    assert m.metrics["import"]["target"]["int4_linears_exact"] == 7 * weights.config.n_layers
    assert set(m.files) == {"target_fp32.onnx", "target_int4.onnx", "tokenizer.json", "chat_template.jinja"}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_generate_fp32_equals_reference(tiny, tmp_path, prompt):
    _, bundle, weights = tiny
    got = generate(bundle, tmp_path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "12")
    assert got["tokens"] == LlamaReference(weights).greedy(prompt, 12, STOPS)


def test_generate_chat_uses_the_template(tiny, tmp_path):
    _, bundle, weights = tiny
    got = generate(bundle, tmp_path, "--chat", "is the part on belt 2 ok?", "--max-new-tokens", "6")
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    ids = tok.encode("<|im_start|>user\nis the part on belt 2 ok?<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False).ids
    assert got["prompt_tokens"] == len(ids)
    assert got["tokens"] == LlamaReference(weights).greedy(ids, 6, STOPS)


def graph_linear(init: dict[str, np.ndarray], key: str) -> np.ndarray:
    """[n, k] float32 from a MatMulNBits linear in the mins form: (q - 8) * scale + mins."""
    packed, scales, mins = init[f"{key}.q4"], init[f"{key}.scales"], init[f"{key}.mins.T"].T
    assert f"{key}.zero_points" not in init  # symmetric blocks (implicit zero point 8): the prepacked fast path
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1).astype(np.float32)
    return ((q - 8) * scales[..., None] + mins[..., None]).reshape(packed.shape[0], -1)


def test_int4_weights_equal_gguf_dequantization(tiny):
    path, bundle, weights = tiny
    model = onnx.load(str(bundle / "target_int4.onnx"))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert not [t for n, t in init.items() if n.endswith("zero_points") and t.dtype != np.uint8]
    raw = {t.name: t for t in gguf.GGUFReader(path).tensors}
    c = weights.config
    for i in range(c.n_layers):
        p = f"model.layers.{i}"
        parts = {f"{p}.self_attn.qkv_proj.weight": [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"],
                 f"{p}.mlp.gate_up_proj.weight": [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up")],
                 **{f"{p}.{n}.weight": [f"{p}.{n}.weight"] for n in ("self_attn.o_proj", "mlp.down_proj")}}
        for key, names in parts.items():
            expected, bound = [], []
            for name in names:
                data = np.asarray(raw[gguf_name(name)].data)
                w = gguf.quants.dequantize(data, Q.Q4_1)
                q, d, m = q4_1_nibbles(data)
                b = U * (3 * np.abs(m)[..., None] + 24 * np.abs(d)[..., None] + np.abs(d[..., None] * q)
                         + 3 * np.abs(w).reshape(q.shape))  # mins = m + 8 d, rounded once
                b = b.reshape(w.shape)
                heads = c.n_heads if "q_proj" in name else c.n_kv_heads if "k_proj" in name else None
                if heads:
                    w, b = unpermute_rows(w, heads), unpermute_rows(b, heads)
                expected.append(w)
                bound.append(b)
            diff = np.abs(graph_linear(init, key) - np.concatenate(expected))
            assert np.all(diff <= np.concatenate(bound)), f"{key}: max |diff| {diff.max()}"


def test_int4_generates_from_its_bundle(tiny, tmp_path):
    """int4 decodes from its own file (int8 activations: close to fp32, not bit-equal to it)."""
    _, bundle, _ = tiny
    got = generate(bundle, tmp_path, "--prompt-ids", "1,100,71", "--max-new-tokens", "8", "--precision", "int4")
    assert got["precision"] == "int4" and 1 <= len(got["tokens"]) <= 8


def test_int4_prefills_through_the_int8_graph_when_the_bundle_has_it(tiny, tmp_path, monkeypatch):
    """With int8 beside int4, generate's int4 prompt runs through the int8 graph where the CPU runs
    int8 prefills faster (`default_prefill`: not on x86 without VNNI), and the report names the
    graph: its tokens are plain greedy on a session prefilling through that graph;
    `--prefill-precision int8` / `int4` pick the graph; a prefill precision the bundle lacks is
    refused."""
    monkeypatch.setenv("SOL_CONTROL_BACKEND", "onnxruntime")  # "auto" would measure where the prefill runs
    from sol_control.decoding import greedy, open_decoder
    from sol_control.decoding.factory import default_prefill

    path, only_int4, _ = tiny
    bundle = tmp_path / "both"
    assert main(["import", str(path), "--out", str(bundle), "--quantize", "int8,int4"]) == 0
    b, ids, args = Bundle.load(bundle), np.array(PROMPTS[2], np.int64), ("--max-new-tokens", "12", "--precision", "int4")
    prompt = ("--prompt-ids", ",".join(map(str, PROMPTS[2])))
    hybrid = open_decoder(b, "target", "int4", prefill_precision="int8")
    own = open_decoder(b, "target", "int4")
    want = {"int8": greedy(hybrid, ids, 12, stop_ids=STOPS).tokens, "int4": greedy(own, ids, 12, stop_ids=STOPS).tokens}
    assert hybrid.prefill_calls >= 1 and own.prefill_calls == 0
    chosen = generate(bundle, tmp_path, *prompt, *args, "--no-draft")
    assert chosen["prefill_precision"] == (default_prefill(b, "target", "int4") or "int4")
    assert chosen["tokens"] == want[chosen["prefill_precision"]]
    picked = generate(bundle, tmp_path, *prompt, *args, "--no-draft", "--prefill-precision", "int8")
    assert picked["prefill_precision"] == "int8" and picked["tokens"] == want["int8"]
    avx2, vnni, arm = frozenset({"avx2", "fma"}), frozenset({"avx2", "avx512_vnni"}), frozenset({"asimd"})
    for flags, int8 in ((avx2, False), (vnni, True), (frozenset({"avx2", "avx_vnni"}), True), (arm, True)):
        assert default_prefill(b, "target", "int4", flags) == ("int8" if int8 else None), flags
    assert default_prefill(b, "target", "int8", vnni) is None
    assert default_prefill(Bundle.load(only_int4), "target", "int4", vnni) is None
    assert generate(bundle, tmp_path, *prompt, *args, "--no-draft", "--prefill-precision", "int4")["tokens"] == \
        want["int4"]
    with pytest.raises(ValueError, match="needs both in the fused layout"):
        open_decoder(Bundle.load(only_int4), "target", "int4", prefill_precision="int8")


def test_auto_precision_is_the_cpus_fastest_quantized_graph(tiny, tmp_path):
    """`--precision auto`: int4 where the native pass runs; on ONNX Runtime int8 where the CPU's
    integer GEMM is fast (VNNI, or not x86), else int4; among the bundle's fused graphs only (an
    int4-only import gets int4 everywhere; an fp32-only one fp32); generate decodes with the chosen
    graph and reports it."""
    from sol_control.decoding.factory import fast_precision

    path, only_int4, _ = tiny
    both, fp32_only = tmp_path / "both", tmp_path / "fp32"
    assert main(["import", str(path), "--out", str(both), "--quantize", "int8,int4"]) == 0
    assert main(["import", str(path), "--out", str(fp32_only)]) == 0
    avx2, vnni, arm = frozenset({"avx2", "fma"}), frozenset({"avx2", "avx512_vnni"}), frozenset({"asimd"})
    b, b4, b32 = Bundle.load(both), Bundle.load(only_int4), Bundle.load(fp32_only)
    assert [fast_precision(b, "target", f, native=False) for f in (avx2, vnni, arm)] == ["int4", "int8", "int8"]
    assert [fast_precision(b, "target", f, native=True) for f in (avx2, vnni, arm)] == ["int4", "int4", "int4"]
    assert [fast_precision(b4, "target", f, native=False) for f in (avx2, vnni)] == ["int4", "int4"]
    assert fast_precision(b32, "target", vnni, native=True) == "fp32"
    prompt = ("--prompt-ids", ",".join(map(str, PROMPTS[2])), "--max-new-tokens", "8", "--no-draft")
    got = generate(both, tmp_path, *prompt, "--precision", "auto")
    assert got["precision"] == fast_precision(b)
    assert got["tokens"] == generate(both, tmp_path, *prompt, "--precision", got["precision"])["tokens"]


def test_symmetric_int4_requantizes_into_symmetric_blocks(tiny, tmp_path):
    """--int4-mode symmetric: every linear and the tied head/embedding are symmetric 4-bit
    blocks (no zero points) quantized from the GGUF's dequantized weights, and the graph decodes."""
    path, _, weights = tiny
    bundle = tmp_path / "symmetric"
    assert main(["import", str(path), "--out", str(bundle), "--quantize", "int4", "--int4-mode", "symmetric"]) == 0
    source = Bundle.load(bundle).manifest.metrics["import"]["target"]
    assert source["int4_mode"] == "symmetric" and source["int4_linears_exact"] == 0
    model = onnx.load(str(bundle / "target_int4.onnx"))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
    assert len(nbits) == 4 * weights.config.n_layers + 2  # qkv, o, gate and up, down; the head; the embedding
    for node in nbits:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == 4 and not node.input[3:], node.name  # no zero points: symmetric
    key = "model.layers.0.mlp.down_proj.weight"
    want = quant.quantize(weights.linear(key), 4, 32, symmetric=True)
    assert np.array_equal(init[f"{key}.q4"], want.packed) and np.array_equal(init[f"{key}.scales"], want.scales)
    got = generate(bundle, tmp_path, "--prompt-ids", "1,100,71", "--max-new-tokens", "8", "--precision", "int4")
    assert 1 <= len(got["tokens"]) <= 8


def test_exact_int4_generates_the_reference_tokens(tiny, tmp_path):
    """--int4-mode exact (fp32 activations and head): the GGUF's own numbers, so greedy tokens equal
    the numpy reference on the dequantized weights."""
    path, _, weights = tiny
    bundle = tmp_path / "exact"
    assert main(["import", str(path), "--out", str(bundle), "--quantize", "int4", "--int4-mode", "exact"]) == 0
    assert Bundle.load(bundle).manifest.metrics["import"]["target"]["int4_options"]["accuracy_level"] == 0
    for prompt in PROMPTS:
        got = generate(bundle, tmp_path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "12",
                       "--precision", "int4")
        assert got["tokens"] == LlamaReference(weights).greedy(prompt, 12, STOPS)


def test_generation_stops_at_a_stop_id(tiny, tmp_path):
    """A stop id the reference emits at step 4 (stop ids edited in a copy's manifest) ends the answer there."""
    _, bundle, weights = tiny
    prompt = PROMPTS[0]
    free = LlamaReference(weights).greedy(prompt, 12)
    step = next(i for i in range(3, 12) if free[i] not in free[:i])
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["vocab"]["stop_ids"] = [free[step]]
    write_manifest(copy, manifest)
    got = generate(copy, tmp_path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "12")
    assert got["tokens"] == free[:step + 1] and got["stopped"] is True


def test_json_report(tiny, tmp_path, capsys):
    _, bundle, _ = tiny
    got = generate(bundle, tmp_path, "--prompt", "the part on the belt", "--max-new-tokens", "5")
    assert {"tokens", "ttft_ms", "decode_tokens_per_s", "mean_accepted"} <= set(got)
    assert len(got["tokens"]) <= 5 and all(isinstance(t, int) for t in got["tokens"])
    assert got["ttft_ms"] > 0 and got["mean_accepted"] == 1.0
    assert len(got["tokens"]) == 1 or got["decode_tokens_per_s"] > 0
    assert "TTFT" in capsys.readouterr().err
    assert got["backend"] == "onnxruntime"  # fp32: the native pass computes quantized graphs only
    int4 = generate(bundle, tmp_path, "--prompt", "the part on the belt", "--max-new-tokens", "5", "--precision",
                    "int4", "--backend", "onnxruntime")
    assert int4["backend"] == "onnxruntime" and int4["precision"] == "int4"
    native = generate(bundle, tmp_path, "--prompt", "the part on the belt", "--max-new-tokens", "5", "--precision",
                      "int4", "--backend", "native")
    assert native["backend"] == "native" and 1 <= len(native["tokens"]) <= 5


def test_prompt_lookup_alone_gives_plain_greedy_tokens(tiny, tmp_path):
    """--lookup N on a bundle with neither a draft nor heads: prompt lookup alone, plain's tokens."""
    _, bundle, weights = tiny
    ids = ",".join(map(str, PROMPTS[2] * 3))
    for precision in ("fp32", "int4"):
        looked = generate(bundle, tmp_path, "--prompt-ids", ids, "--max-new-tokens", "12", "--lookup", "6",
                          "--precision", precision)
        plain = generate(bundle, tmp_path, "--prompt-ids", ids, "--max-new-tokens", "12", "--precision", precision)
        assert (looked["mode"], plain["mode"]) == ("lookup", "plain") and looked["tokens"] == plain["tokens"]
    want = LlamaReference(weights).greedy(PROMPTS[2] * 3, 12, STOPS)
    assert generate(bundle, tmp_path, "--prompt-ids", ids, "--max-new-tokens", "12", "--lookup", "6")["tokens"] == want


def test_draft_gives_plain_greedy_tokens(tiny, tmp_path):
    """--draft: a second GGUF (another random model, so some drafts are rejected) as the draft."""
    path, _, weights = tiny
    vocab = tiny_vocab()
    other = random_llama(replace(weights.config, n_layers=1), seed=12)
    draft = write_llama_gguf(tmp_path / "draft.gguf", other, vocab, embed_type=Q.Q8_0)
    bundle = tmp_path / "with_draft"
    assert main(["import", str(path), "--out", str(bundle), "--draft", str(path)]) == 0
    same = generate(bundle, tmp_path, "--prompt-ids", "1,100,71,234,5", "--max-new-tokens", "12")
    plain = generate(bundle, tmp_path, "--prompt-ids", "1,100,71,234,5", "--max-new-tokens", "12", "--no-draft")
    assert same["mode"] == "draft" and plain["mode"] == "plain"
    assert same["tokens"] == plain["tokens"] == LlamaReference(weights).greedy(PROMPTS[0], 12, STOPS)
    assert len(same["tokens"]) < 3 or same["mean_accepted"] > 1.5  # the same model: drafts accepted
    bundle2 = tmp_path / "other_draft"
    assert main(["import", str(path), "--out", str(bundle2), "--draft", str(draft)]) == 0
    other_draft = generate(bundle2, tmp_path, "--prompt-ids", "1,100,71,234,5", "--max-new-tokens", "12")
    assert other_draft["mode"] == "draft" and other_draft["tokens"] == plain["tokens"]
    free = LlamaReference(weights).greedy(PROMPTS[0], 12)  # a stop id at step 4: the answer is cut there
    step = next(i for i in range(3, 12) if free[i] not in free[:i])
    manifest = json.loads((bundle2 / "manifest.json").read_text())
    manifest["vocab"]["stop_ids"] = [free[step]]
    write_manifest(bundle2, manifest)
    cut = generate(bundle2, tmp_path, "--prompt-ids", "1,100,71,234,5", "--max-new-tokens", "12")
    assert cut["mode"] == "draft" and cut["tokens"] == free[:step + 1] and cut["stopped"] is True


def optimum_folder(root: Path) -> Path:
    """An Optimum-style export folder around the tiny fixture's decoder-with-past graph (vocab 48)."""
    src = root / "optimum"
    src.mkdir()
    shutil.copyfile(FIXTURES / "tiny" / "target_fp32.onnx", src / "model.onnx")
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                 "max_position_embeddings": 128, "bos_token_id": 1,
                                                 "eos_token_id": 2}))
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [2]}))
    (src / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "t2"}))
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(48)}, unk_token="t0")).save(str(src / "tokenizer.json"))
    return src


def assert_generates_the_fixture_reference(bundle: Path, tmp_path: Path) -> None:
    """The tiny fixture's torch greedy continuations of its first 3 prefixes, up to the stop id 2."""
    ref = np.load(FIXTURES / "tiny" / "reference.npz")
    for prefix, n, greedy in list(zip(ref["prefix_ids"], ref["prefix_len"], ref["greedy_ids"]))[:3]:
        want = greedy.tolist()
        want = want[:want.index(2) + 1] if 2 in want else want
        got = generate(bundle, tmp_path, "--prompt-ids", ",".join(map(str, prefix[:n])),
                       "--max-new-tokens", str(len(greedy)))
        assert got["tokens"] == want


def test_optimum_folder_import(tmp_path):
    src = optimum_folder(tmp_path)
    bundle = tmp_path / "bundle"
    assert main(["import", str(src), "--out", str(bundle)]) == 0
    m = Bundle.load(bundle).manifest
    assert (m.vocab.size, m.vocab.stop_ids, m.max_context) == (48, (2,), 128)
    assert m.target.files == {"fp32": "target_fp32.onnx"} and (m.target.n_layers, m.target.hidden_size) == (2, 64)
    assert (bundle / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert_generates_the_fixture_reference(bundle, tmp_path)


def test_hf_folder_import(tmp_path):
    """The tiny fixture as a Hugging Face folder (safetensors): fused fp32 graph decodes as its torch
    greedy reference; int4 (round to nearest) and int8 graphs are written and run."""
    bundle = tmp_path / "bundle"
    assert main(["import", str(FIXTURES / "tiny_hf"), "--out", str(bundle), "--quantize", "int8,int4"]) == 0
    m = Bundle.load(bundle).manifest
    assert (m.vocab.size, m.vocab.stop_ids, m.max_context) == (48, (2,), 128)
    assert set(m.target.fused) == {"fp32", "int8", "int4"} and m.metrics["import"]["target"]["kind"] == "hf"
    assert_generates_the_fixture_reference(bundle, tmp_path)
    for precision in ("int8", "int4"):
        got = generate(bundle, tmp_path, "--prompt-ids", "1,5,6", "--max-new-tokens", "4", "--precision", precision)
        assert got["precision"] == precision and 1 <= len(got["tokens"]) <= 4


def test_hf_bf16_tensors_read_as_float32(tmp_path):
    """A BF16 safetensors tensor is the top half of a float32: read back exactly."""
    from sol_control.lm.hf_reader import read_safetensors

    values = np.array([[1.0, -2.5], [3.140625, 1e-3]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bf16.tobytes())
    np.testing.assert_array_equal(read_safetensors(path)["w"], (bf16.astype(np.uint32) << 16).view(np.float32))
    assert abs(read_safetensors(path)["w"][0, 1] + 2.5) == 0


def hf_folder(root: Path, model_type: str) -> Path:
    """A Hugging Face folder: the tiny fixture's config as `model_type`, junk safetensors."""
    src = root / "hf"
    src.mkdir()
    config = json.loads((FIXTURES / "tiny_hf" / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    (src / "model.safetensors").write_bytes(bytes(16))
    return src


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.gguf", "does not exist"),
    (lambda d: (d / "notes.txt").write_text("hello, not a model") and d / "notes.txt", "not a GGUF file"),
    (lambda d: (d / "junk.gguf").write_bytes(b"GGUF" + bytes(12)) and d / "junk.gguf", "not a readable GGUF"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "has no model.onnx"),
    (lambda d: hf_folder(d, "qwen2"), "model_type 'qwen2' is not supported"),
    (lambda d: hf_folder(d, "llama"), "not a safetensors file"),
])
def test_bad_sources_fail_clearly(tmp_path, capsys, make, message):
    src = make(tmp_path)
    assert main(["import", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sol-control: ") and message in err
    assert not (tmp_path / "out").exists()


def test_failed_import_leaves_no_bundle(tmp_path, capsys):
    """A GGUF of an architecture the graph builder cannot express: refused, the new folder removed."""
    vocab = tiny_vocab()
    weights = random_llama(tiny_config(len(vocab.tokens)), seed=1)
    path = finish_gguf(llama_gguf_writer(tmp_path / "qwen.gguf", weights, vocab, arch="qwen2"))
    assert main(["import", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "qwen2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_requests_fail_clearly(tiny, tmp_path, capsys):
    path, bundle, _ = tiny
    cases = [
        (["import", str(path), "--out", str(tmp_path / "q"), "--quantize", "int3"], "--quantize takes"),
        (["import", str(path), "--out", str(bundle)], "not an empty folder"),
        (["generate", "--bundle", str(bundle), "--prompt-ids", "1,999999"], "prompt ids must lie in"),
        (["generate", "--bundle", str(bundle), "--prompt-ids", "1,x"], "comma-separated integers"),
        (["generate", "--bundle", str(bundle), "--prompt", "hi", "--precision", "int8"], "target has"),
        (["generate", "--bundle", str(tmp_path / "nowhere"), "--prompt", "hi"], "no manifest.json"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
