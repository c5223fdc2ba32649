"""A trained target -> ONNX (torch): the Optimum decoder-with-past export and the engine's fused
graphs, checked against torch.

The Optimum layout (what Hugging Face Optimum produces for causal LMs, so the engine also runs a
user's own Optimum export):

    input_ids [1, T] int64, attention_mask [1, P+T] int64, position_ids [1, T] int64,
    past_key_values.{i}.key|value [1, H, P, D] float32
      -> logits [1, T, V] float32, present.{i}.key|value [1, H, P+T, D] float32

T and P are dynamic and P may be 0 (the first call passes empty [1, H, 0, D] past tensors).
We use the dynamo exporter (`torch.onnx.export(..., dynamo=True)`); at opset 23 ONNX Runtime gets
fused `Attention`, `RotaryEmbedding` and `RMSNormalization` nodes instead of ~440 small ones.
The fused graphs (`sol_control.graph.llama`, fp32 / int8 / int4 with the draft heads inside) are
built from the weights read back from that file (`graph.from_onnx.read_decoder`).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from .layout import FUSED
from .model import n_params

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


def torch_logits(model: LlamaForCausalLM, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].float().numpy()  # [T, V]


def fused_parity(model: LlamaForCausalLM, path: Path, n_tokens: int = 24, seed: int = 0) -> float:
    """Max |logits_ort - logits_torch| of a fused graph, the prefix fed in three calls."""
    from sol_control.decoding.fused import FusedDecoderSession

    ids = np.random.default_rng(seed).integers(4, model.config.vocab_size, n_tokens)
    sess = FusedDecoderSession(path)
    got = np.concatenate([sess.forward(ids[:n_tokens // 2]).copy(), sess.forward(ids[n_tokens // 2:-1]).copy(),
                          sess.forward(ids[-1:]).copy()])
    return float(np.abs(got - torch_logits(model, ids)).max())


def build_fused(weights, out: Path, precisions: tuple[str, ...] = ("fp32", "int4")) -> None:
    """The engine's fused graphs of `weights` (graph.weights.LlamaWeights, heads included) in `out`.
    int4: 4-bit blocks of 32 with zero points and an 8-bit lm_head (the builder's defaults): fine
    256-bin action tokens hang on small logit gaps that a 4-bit lm_head blurs (models/README.md).
    int8 with static activations is built on calibrated weights (`build_static_int8`)."""
    from sol_control.graph.llama import build_decoder

    for precision in precisions:
        build_decoder(weights, out / FUSED[precision], precision)


def build_static_int8(weights, out: Path) -> Path:
    """The int8 fused graph of calibrated weights (train.calibrate.static_int8): activations on
    static scales, 15-19 % less a decision than per-row scales."""
    from sol_control.graph.llama import build_decoder

    return build_decoder(weights, out / FUSED["int8"], "int8", int8_activations="static")


def spec(model: LlamaForCausalLM, files: dict[str, str], **extra) -> dict:
    """A manifest's decoder entry (bundle.DecoderSpec) for a transformers model."""
    c = model.config
    return {"n_layers": c.num_hidden_layers, "n_kv_heads": c.num_key_value_heads, "head_dim": c.head_dim,
            "hidden_size": c.hidden_size, "params": n_params(model), "files": files, **extra}
