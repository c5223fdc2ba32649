"""A Llama-family GGUF file -> `LlamaWeights` (numpy only, runtime install, no torch).

- The config comes from the file's metadata (`llama.*` keys).
- F32/F16/BF16 tensors become float32 arrays under Hugging Face names.
- Q4_1 linear weights become `Int4Blocks` exactly (see `ggml_q4`); any other quantized tensor, and a
  quantized embedding, is dequantized with `gguf`'s own dequantizer into `tensors`.
- llama.cpp stores q_proj/k_proj rows permuted for its interleaved rotary (its converter's `permute`:
  within each head, row j * head_dim/2 + i of HF goes to row 2i + j); the inverse is applied here so
  the weights are in HF order (rotate-half rotary).

Anything the graph cannot express (another architecture, biases, rope scaling, experts, partial
rotary) is refused with a ValueError naming the key or tensor.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from sol_control.graph.weights import Int4Blocks, LlamaConfig, LlamaWeights
from sol_control.lm.ggml_q4 import q4_1_to_int4

SUPPORTED_ARCHITECTURES = ("llama",)
_MISSING = object()

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """A memory-mapped reader; ValueError when the path is missing or not a GGUF file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GGUF path {str(path)!r} is not a file")
    try:
        return gguf.GGUFReader(path, "r")
    except (ValueError, OSError) as err:
        raise ValueError(f"{str(path)!r} is not a readable GGUF file: {err}") from err


def gguf_field(reader: gguf.GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """A metadata value as Python (str, int, float, bool or list); ValueError when required and absent."""
    field = reader.get_field(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF metadata key {key!r} is missing")
        return default
    return field.contents()


def _scalar_int(reader: gguf.GGUFReader, key: str, default: Any = _MISSING) -> int:
    value = gguf_field(reader, key, default)
    if isinstance(value, list):
        raise ValueError(f"GGUF {key} is per-layer {value[:4]}...; only one value for all layers is supported")
    return int(value)


def _scalar_float(reader: gguf.GGUFReader, key: str, default: Any = _MISSING) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(gguf_field(reader, key, default))))


def _refuse_unsupported(reader: gguf.GGUFReader, arch: str) -> None:
    scaling = gguf_field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise ValueError(f"GGUF {arch}.rope.scaling.type {scaling!r} is not supported (only unscaled rotary)")
    experts = _scalar_int(reader, f"{arch}.expert_count", 0)
    if experts:
        raise ValueError(f"GGUF {arch}.expert_count {experts}: mixture-of-experts models are not supported")


def read_llama_config(reader: gguf.GGUFReader, vocab_size: int, tie_embeddings: bool) -> LlamaConfig:
    """The LlamaConfig that the file's `llama.*` metadata describes."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF general.architecture {arch!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})")
    _refuse_unsupported(reader, arch)
    hidden = _scalar_int(reader, f"{arch}.embedding_length")
    n_heads = _scalar_int(reader, f"{arch}.attention.head_count")
    head_dim = _scalar_int(reader, f"{arch}.attention.key_length", hidden // max(n_heads, 1))
    for key in (f"{arch}.attention.value_length", f"{arch}.rope.dimension_count"):
        value = _scalar_int(reader, key, head_dim)
        if value != head_dim:
            raise ValueError(f"GGUF {key} {value} differs from head_dim {head_dim} (partial rotary or "
                             f"unequal key/value sizes are not supported)")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=_scalar_int(reader, f"{arch}.feed_forward_length"),
        n_layers=_scalar_int(reader, f"{arch}.block_count"),
        n_heads=n_heads,
        n_kv_heads=_scalar_int(reader, f"{arch}.attention.head_count_kv", n_heads),
        head_dim=head_dim,
        rope_theta=_scalar_float(reader, f"{arch}.rope.freq_base", 10000.0),
        rms_norm_eps=_scalar_float(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        max_context=_scalar_int(reader, f"{arch}.context_length"),
        tie_embeddings=tie_embeddings,
    )


def hf_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> Hugging Face LlamaForCausalLM name; ValueError for anything else."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.match(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} is not part of a plain Llama decoder (biases, rope_freqs "
                         f"and other extras are not supported)")
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"


def unpermute_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k `permute`: rows [n_heads * head_dim, ...] from interleaved-rotary
    order (pairs 2i, 2i+1) back to HF rotate-half order (i, i + head_dim/2), per head."""
    head_dim = rows.shape[0] // n_heads
    split = rows.reshape(n_heads, head_dim // 2, 2, *rows.shape[1:])  # [heads, hd/2, 2, ...]
    return np.ascontiguousarray(split.swapaxes(1, 2)).reshape(rows.shape)


def _unpermute_blocks(blocks: Int4Blocks, n_heads: int) -> Int4Blocks:
    return Int4Blocks(packed=unpermute_rows(blocks.packed, n_heads), scales=unpermute_rows(blocks.scales, n_heads),
                      zero_points=unpermute_rows(blocks.zero_points, n_heads), block_size=blocks.block_size)


def _dequantized(tensor: gguf.ReaderTensor) -> np.ndarray:
    """float32 in numpy order ([rows, cols] = reversed GGUF shape), through gguf's own dequantizer."""
    try:
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    except NotImplementedError as err:
        raise ValueError(f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the gguf "
                         f"package cannot dequantize: {err}") from err
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.array(values, dtype=np.float32, copy=True).reshape(shape)  # owns its memory, not the mmap


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> [out, in] (or [n]) shape for every tensor a decoder with this config holds."""
    hidden, q_rows, kv_rows = config.hidden_size, config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    per_layer = {
        "input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
        "self_attn.q_proj": (q_rows, hidden), "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden), "self_attn.o_proj": (hidden, q_rows),
        "mlp.gate_proj": (config.intermediate_size, hidden), "mlp.up_proj": (config.intermediate_size, hidden),
        "mlp.down_proj": (hidden, config.intermediate_size),
    }
    for layer in range(config.n_layers):
        shapes.update({f"model.layers.{layer}.{part}.weight": shape for part, shape in per_layer.items()})
    return shapes


def _rotary_heads(name: str, config: LlamaConfig) -> int | None:
    """Heads whose rows llama.cpp permuted (q: n_heads, k: n_kv_heads), None for other tensors."""
    if name.endswith("self_attn.q_proj.weight"):
        return config.n_heads
    if name.endswith("self_attn.k_proj.weight"):
        return config.n_kv_heads
    return None


def _load_tensor(name: str, tensor: gguf.ReaderTensor, config: LlamaConfig, weights: LlamaWeights) -> None:
    heads = _rotary_heads(name, config)
    is_linear = name.split(".")[-2] in _LINEARS
    if is_linear and tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1:
        blocks = q4_1_to_int4(np.asarray(tensor.data))
        weights.int4[name] = blocks if heads is None else _unpermute_blocks(blocks, heads)
        return
    values = _dequantized(tensor)
    weights.tensors[name] = values if heads is None else unpermute_rows(values, heads)


def read_gguf_weights(source: str | Path | gguf.GGUFReader) -> LlamaWeights:
    """LlamaWeights (HF names, HF q/k order) from a Llama GGUF file or an open reader."""
    reader = source if isinstance(source, gguf.GGUFReader) else open_gguf(source)
    by_name = {hf_name(tensor.name): tensor for tensor in reader.tensors}
    embed = by_name.get("model.embed_tokens.weight")
    if embed is None:
        raise ValueError("GGUF has no token_embd.weight tensor")
    config = read_llama_config(reader, vocab_size=int(embed.shape[-1]), tie_embeddings="lm_head.weight" not in by_name)
    shapes = expected_shapes(config)
    missing, extra = sorted(set(shapes) - set(by_name)), sorted(set(by_name) - set(shapes))
    if missing or extra:
        raise ValueError(f"GGUF tensors do not match the config: missing {missing[:4]}, unexpected {extra[:4]}")
    weights = LlamaWeights(config=config, tensors={})
    for name, tensor in by_name.items():
        got = tuple(int(n) for n in reversed(tensor.shape))
        if got != shapes[name]:
            raise ValueError(f"GGUF tensor {tensor.name!r} has shape {list(got)}, expected {list(shapes[name])}")
        _load_tensor(name, tensor, config, weights)
    return weights
