"""`LlamaWeights` -> a Hugging Face Llama folder (numpy only, no torch): what peer engines load.

The inverse of `sol_control.lm.hf_reader`: `config.json` (tie_word_embeddings, rope theta under
both spellings), `model.safetensors` in float32 (int4 blocks dequantized: `LlamaWeights.linear`),
`generation_config.json` with the stop ids, and, given an `LMTokenizer`, `tokenizer.json` plus
`tokenizer_config.json` with the chat template. A GGUF's dequantized weights written here are the
full-precision reference in Hugging Face form.

safetensors is written by hand: an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}} padded with spaces to 8 bytes, then the raw arrays in order.

    python -m sol_control.lm.hf_writer model.gguf OUT_DIR
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

from sol_control.graph.weights import LlamaWeights
from sol_control.lm.tokenizer import LMTokenizer

WEIGHTS = "model.safetensors"


def write_safetensors(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None) -> None:
    """float32 tensors as one safetensors file, names sorted, data 8-byte aligned."""
    header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for name in sorted(tensors):
        a = tensors[name]
        if a.dtype != np.float32:
            raise ValueError(f"write_safetensors: {name} is {a.dtype}, only float32 is written")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for name in sorted(tensors):
            fh.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())


def hf_config(weights: LlamaWeights, bos_id: int | None, eos_id: int | None, pad_id: int | None) -> dict:
    c = weights.config
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, "hidden_act": "silu", "max_position_embeddings": c.max_context,
        "rms_norm_eps": c.rms_norm_eps,
        # both spellings: transformers 5 reads rope_parameters; optimum-intel's exporter and
        # llama.cpp's converter read rope_theta
        "rope_theta": c.rope_theta, "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "pretraining_tp": 1, "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
        "use_cache": True, "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
    }


def tokenizer_config(tok: LMTokenizer, max_context: int) -> dict:
    """What `AutoTokenizer` (and the peers' exporters) read next to tokenizer.json."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tok.chat_template,
            "bos_token": tok.bos_token, "eos_token": tok.eos_token, "pad_token": tok.eos_token,
            "unk_token": None, "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "model_max_length": max_context}


def write_hf_folder(weights: LlamaWeights, out: str | Path, tok: LMTokenizer | None = None,
                    stop_ids: tuple[int, ...] | None = None, bos_id: int | None = None) -> Path:
    """Write `weights` (and `tok`) as a Hugging Face `LlamaForCausalLM` folder at `out`.

    Stop ids: `stop_ids`, else the tokenizer's. config.json's eos_token_id is the tokenizer's eos
    (else the last stop id); generation_config.json lists every stop id, so
    `sol_control.lm.importer` reads the same tuple back. pad = eos."""
    weights.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stops = tuple(stop_ids if stop_ids is not None else (tok.stop_ids if tok else ()))
    vocab = tok.tokenizer.get_vocab() if tok else {}
    eos = vocab.get(tok.eos_token) if tok and tok.eos_token else None
    eos = eos if eos is not None else (stops[-1] if stops else None)
    bos = bos_id if bos_id is not None else (vocab.get(tok.bos_token) if tok and tok.bos_token else None)
    config = hf_config(weights, bos, eos, eos)
    tensors = {name: np.asarray(weights.linear(name), np.float32) for name in weights.expected_shapes()}
    write_safetensors(tensors, out / WEIGHTS)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": bos, "eos_token_id": list(stops) if stops else eos, "pad_token_id": eos,
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if tok is not None:
        (out / "tokenizer.json").write_text(tok.to_json())
        (out / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(tok, weights.config.max_context), indent=2) + "\n")
    return out


def gguf_to_hf(gguf_path: str | Path, out: str | Path) -> Path:
    """A GGUF's dequantized weights, tokenizer, chat template and stop ids as a HF folder."""
    from sol_control.lm.gguf_reader import gguf_field, open_gguf, read_gguf_weights
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    reader = open_gguf(gguf_path)
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id", None)
    return write_hf_folder(read_gguf_weights(reader), out, read_gguf_tokenizer(reader),
                           bos_id=None if bos is None else int(bos))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(gguf_to_hf(argv[0], argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
