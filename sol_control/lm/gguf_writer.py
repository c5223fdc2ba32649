"""`LlamaWeights` -> a Llama GGUF file, laid out the way llama.cpp's converter writes one.

What tests and tiny-model benchmarks use to make GGUF files of their own (no download, no torch):
HF names become llama.cpp names, q/k rows are permuted into llama.cpp's interleaved-rotary order
(within each head, HF row j * head_dim/2 + i goes to row 2i + j), linear weights are quantized with
`gguf`'s own quantizer (Q4_1 by default) and the tokenizer goes in as `tokenizer.ggml.*` metadata.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from sol_control.graph.weights import LlamaWeights

_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GGUF_LAYER_PARTS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


@dataclass(frozen=True)
class GGUFVocab:
    """A byte-level BPE tokenizer as GGUF metadata (ids = positions in `tokens`)."""

    tokens: list[str]
    token_types: list[int]   # 1 normal, 3 control, 4 user-defined
    merges: list[str]        # "left right", best first
    pre: str = "smollm"
    bos_id: int | None = None
    eos_id: int | None = None
    chat_template: str | None = None


def gguf_name(hf: str) -> str:
    """Hugging Face LlamaForCausalLM name -> llama.cpp name."""
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)  # model.layers.{i}.{part}.weight
    return f"blk.{layer}.{_GGUF_LAYER_PARTS[rest.removesuffix('.weight')]}.weight"


def permute_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half row order -> llama.cpp interleaved order (its converter's `permute`), per head."""
    head_dim = rows.shape[0] // n_heads
    split = rows.reshape(n_heads, 2, head_dim // 2, *rows.shape[1:])  # [heads, 2, hd/2, ...]
    return np.ascontiguousarray(split.swapaxes(1, 2)).reshape(rows.shape)


def _add_config(writer: gguf.GGUFWriter, weights: LlamaWeights) -> None:
    c = weights.config
    writer.add_block_count(c.n_layers)
    writer.add_context_length(c.max_context)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.n_heads)
    writer.add_head_count_kv(c.n_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)


def _add_vocab(writer: gguf.GGUFWriter, vocab: GGUFVocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    if vocab.bos_id is not None:
        writer.add_bos_token_id(vocab.bos_id)
    if vocab.eos_id is not None:
        writer.add_eos_token_id(vocab.eos_id)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)


def _tensor_type(name: str, array: np.ndarray, linear_type: gguf.GGMLQuantizationType,
                 embed_type: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    if array.ndim == 1:
        return gguf.GGMLQuantizationType.F32
    return embed_type if name == "model.embed_tokens.weight" else linear_type


def llama_gguf_writer(path: str | Path, weights: LlamaWeights, vocab: GGUFVocab,
                      linear_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q4_1,
                      embed_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
                      arch: str = "llama") -> gguf.GGUFWriter:
    """A writer holding `weights` (HF order; int4 entries from their dequantized values) and `vocab`,
    not yet on disk: callers may add keys or tensors, then `finish_gguf` it."""
    c = weights.config
    writer = gguf.GGUFWriter(str(path), arch)
    _add_config(writer, weights)
    _add_vocab(writer, vocab)
    for name in dict.fromkeys([*weights.tensors, *weights.int4]):
        array = weights.linear(name).astype(np.float32)
        if name.endswith("q_proj.weight"):
            array = permute_rows(array, c.n_heads)
        elif name.endswith("k_proj.weight"):
            array = permute_rows(array, c.n_kv_heads)
        qtype = _tensor_type(name, array, linear_type, embed_type)
        writer.add_tensor(gguf_name(name), gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    return writer


def finish_gguf(writer: gguf.GGUFWriter) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(writer.path)


def write_llama_gguf(path: str | Path, weights: LlamaWeights, vocab: GGUFVocab,
                     linear_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q4_1,
                     embed_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32) -> Path:
    """Write `weights` and `vocab` as a llama.cpp-style Llama GGUF file."""
    return finish_gguf(llama_gguf_writer(path, weights, vocab, linear_type, embed_type))
