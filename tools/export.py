"""Export a Hugging Face `LlamaForCausalLM` to ONNX in the decoder-with-past layout (dev-only, torch).

The layout is the one Hugging Face Optimum produces for causal LMs, so the engine also runs a
user's own Optimum export:

    input_ids [1, T] int64, attention_mask [1, P+T] int64, position_ids [1, T] int64,
    past_key_values.{i}.key|value [1, H, P, D] float32
      -> logits [1, T, V] float32, present.{i}.key|value [1, H, P+T, D] float32

T and P are dynamic and P may be 0 (the first call passes empty [1, H, 0, D] past tensors).
We use the dynamo exporter (`torch.onnx.export(..., dynamo=True)`); at opset 23 ONNX Runtime gets
fused `Attention`, `RotaryEmbedding` and `RMSNormalization` nodes instead of ~440 small ones.

    python tools/export.py --check            # export a tiny random Llama and run the parity check
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

MAX_SINGLE_FILE_BYTES = 2_000_000_000  # protobuf limit is 2 GiB; above it weights go to external data


def io_names(n_layers: int) -> tuple[list[str], list[str]]:
    kv = [(i, kind) for i in range(n_layers) for kind in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids"] + [f"past_key_values.{i}.{k}" for i, k in kv]
    outputs = ["logits"] + [f"present.{i}.{k}" for i, k in kv]
    return inputs, outputs


class DecoderWithPast(nn.Module):
    """Flat-tensor wrapper: past tensors in, logits + present tensors out (what ONNX needs)."""

    def __init__(self, model: LlamaForCausalLM):
        super().__init__()
        self.model = model
        self.n_layers = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache(config=self.model.config)
        for i in range(self.n_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)  # [1, H, P, D] each
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache, use_cache=True)
        present = []
        for layer in out.cache.layers:
            present += [layer.keys, layer.values]  # [1, H, P+T, D] each
        return (out.logits, *present)  # logits [1, T, V]


def kv_shape(config: LlamaConfig, past_len: int) -> tuple[int, int, int, int]:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (1, config.num_key_value_heads, past_len, head_dim)


def example_inputs(config: LlamaConfig, past_len: int = 3, new_len: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (1, new_len), generator=g)
    mask = torch.ones(1, past_len + new_len, dtype=torch.long)
    pos = torch.arange(past_len, past_len + new_len)[None]
    past = [torch.randn(kv_shape(config, past_len), generator=g) for _ in range(2 * config.num_hidden_layers)]
    return (ids, mask, pos, *past)


def export_decoder(model: LlamaForCausalLM, out_path: str | Path, opset: int = 23,
                   max_context: int | None = None) -> Path:
    """Write `model` as one ONNX file in the decoder-with-past layout; return its path."""
    out_path = Path(out_path)
    model = model.eval().float()
    config = model.config
    config._attn_implementation = "sdpa"  # exported as the fused ONNX Attention op at opset >= 23
    max_len = max_context or config.max_position_embeddings
    wrapper = DecoderWithPast(model).eval()
    args = example_inputs(config)
    new_len = torch.export.Dim("T", min=1, max=max_len)
    past_len = torch.export.Dim("P", min=0, max=max_len)
    total_len = torch.export.Dim.DYNAMIC  # P + T, the exporter derives the relation itself
    dynamic_shapes = ({1: new_len}, {1: total_len}, {1: new_len}, tuple({2: past_len} for _ in args[3:]))
    inputs, outputs = io_names(config.num_hidden_layers)
    n_bytes = sum(p.numel() * 4 for p in model.parameters())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), native_gqa():
        torch.onnx.export(wrapper, args, str(out_path), dynamo=True, opset_version=opset,
                          dynamic_shapes=dynamic_shapes, input_names=inputs, output_names=outputs,
                          external_data=n_bytes >= MAX_SINGLE_FILE_BYTES, optimize=True, verbose=False)
    if n_bytes < MAX_SINGLE_FILE_BYTES:
        strip_debug_metadata(out_path)
    return out_path


@contextlib.contextmanager
def native_gqa():
    """transformers repeats the K/V heads of grouped-query attention before SDPA (an Expand and
    Reshapes per layer) unless it may pass `enable_gqa=True`; the ONNX Attention op takes
    kv_num_heads < q_num_heads itself. Measured on a 25M model: 18 -> 2 Expand, 49 -> 33 Reshape
    nodes, ~5-10 % less time per int4/int8 token, identical logits."""
    key, old = "TRANSFORMERS_SDPA_FORCE_GQA", os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old


def strip_debug_metadata(path: Path) -> None:
    """Drop the exporter's per-node debug metadata (fx node, stack traces with local paths): it is
    ~40 % of a small model's file and makes the bytes depend on where the export ran."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        del value.metadata_props[:]
    for tensor in model.graph.initializer:
        del tensor.metadata_props[:]
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def export_decoder_genai(hf_dir: str | Path, out_path: str | Path, precision: str = "fp32",
                         block_size: int = 32, accuracy_level: int = 4) -> Path:
    """Alternative exporter: ONNX Runtime GenAI's model builder (`pip install onnxruntime-genai`).

    Its graph is leaner than the dynamo export (GroupQueryAttention, SkipSimplifiedLayerNormalization,
    fused QKV projection, no mask subgraph): ~0.3 ms less per pass on a 25M model, i.e. 13-16 % per
    int8/int4 token. Same decoder-with-past layout minus `position_ids` (positions come from
    `attention_mask`); its rotary tables cover `max_position_embeddings` positions only. The builder
    quantizes by itself (`precision` int8/int4: MatMulNBits, block `block_size`). We inline the
    weights into one file and make head_dim static (it leaves it symbolic).
    """
    import json
    import shutil
    import subprocess
    import tempfile

    from sol_control.bench.peers import add_word_tokenizer

    out_path = Path(out_path)
    with tempfile.TemporaryDirectory() as tmp:
        src, built = Path(tmp) / "hf", Path(tmp) / "built"
        shutil.copytree(hf_dir, src)
        if not (src / "tokenizer.json").is_file():  # the builder insists on one
            add_word_tokenizer(src, json.loads((src / "config.json").read_text())["vocab_size"])
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(built),
               "-p", precision, "-e", "cpu", "--extra_options", f"int4_accuracy_level={accuracy_level}",
               f"int4_block_size={block_size}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        head_dim = json.loads((built / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
        model = onnx.load(str(built / "model.onnx"))  # with its external weights
    for value in list(model.graph.input) + list(model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "kv_cache_dim":
                dim.dim_value = head_dim
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_path), save_as_external_data=model.ByteSize() >= MAX_SINGLE_FILE_BYTES)
    return out_path


def op_counts(path: str | Path) -> dict[str, int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


# ---- parity: ONNX Runtime (incremental, with KV cache) vs torch (one full forward) ----------------

def ort_session(path: str | Path, threads: int = 1):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_logits_incremental(sess, ids: np.ndarray, chunks: list[int]) -> np.ndarray:
    """Feed `ids` in chunks of the given lengths through the KV cache; return logits [len(ids), V]."""
    past_inputs = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    past = [np.zeros((1, a.shape[1], 0, a.shape[3]), np.float32) for a in past_inputs]  # P = 0
    has_positions = any(i.name == "position_ids" for i in sess.get_inputs())  # GenAI builds have none
    start, logits = 0, []
    for n in chunks:
        chunk = ids[start:start + n]
        feed = {"input_ids": chunk[None].astype(np.int64),
                "attention_mask": np.ones((1, start + n), np.int64)}
        if has_positions:
            feed["position_ids"] = np.arange(start, start + n, dtype=np.int64)[None]
        feed.update({a.name: p for a, p in zip(past_inputs, past)})
        out = sess.run(None, feed)
        logits.append(out[0][0])  # [n, V]
        past = out[1:]
        start += n
    assert start == len(ids), (start, len(ids))
    return np.concatenate(logits)  # [len(ids), V]


def torch_logits(model: LlamaForCausalLM, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].float().numpy()  # [T, V]


def torch_greedy(model: LlamaForCausalLM, prefix: np.ndarray, n_new: int) -> np.ndarray:
    """Plain greedy continuation (no cache tricks): the reference the engine must reproduce."""
    ids = list(prefix)
    for _ in range(n_new):
        ids.append(int(torch_logits(model, np.asarray(ids))[-1].argmax()))
    return np.asarray(ids[len(prefix):], np.int64)


def parity(model: LlamaForCausalLM, onnx_path: str | Path, n_tokens: int = 24, seed: int = 0) -> float:
    """Max |logits_ort - logits_torch| for a random prefix fed as prefill + 1-token + multi-token steps."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, model.config.vocab_size, n_tokens)
    chunks = [n_tokens // 2, 1, 1, n_tokens - n_tokens // 2 - 2]
    got = ort_logits_incremental(ort_session(onnx_path), ids, chunks)
    return float(np.abs(got - torch_logits(model, ids)).max())


def tiny_config(**overrides) -> LlamaConfig:
    cfg = dict(vocab_size=48, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
               tie_word_embeddings=False)
    cfg.update(overrides)
    return LlamaConfig(**cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf", help="HF model folder (LlamaForCausalLM); default: a tiny random Llama")
    ap.add_argument("--out", default="/tmp/sol_control_export/decoder.onnx")
    ap.add_argument("--opset", type=int, default=23)
    ap.add_argument("--check", action="store_true", help="run the ORT vs torch parity check")
    ap.add_argument("--via-genai", action="store_true", help="export with onnxruntime-genai's builder (needs --hf)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(args.hf) if args.hf else LlamaForCausalLM(tiny_config())
    if args.via_genai:
        if not args.hf:
            ap.error("--via-genai needs --hf")
        path = export_decoder_genai(args.hf, args.out)
    else:
        path = export_decoder(model, args.out, opset=args.opset)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB) ops {op_counts(path)}")
    if args.check:
        diff = parity(model, path)
        scale = float(np.abs(torch_logits(model, np.arange(4, 28) % model.config.vocab_size)).max())
        from sol_control.lm.reference import parity_tolerance

        tol = parity_tolerance(model.config.num_hidden_layers, scale)
        print(f"parity: max |ort - torch| logits = {diff:.3g} (tolerance {tol:.3g}: {model.config.num_hidden_layers} "
              f"layers, logits up to {scale:.3g})")
        return 0 if diff <= tol else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
