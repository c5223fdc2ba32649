"""A Hugging Face Llama folder (`config.json` + safetensors) -> `LlamaWeights` (numpy only, no torch).

The tensors already have Hugging Face names and order. safetensors is read here by hand: an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw data,
memory-mapped; F32, F16 and BF16 become float32 (numpy has no bfloat16, which most checkpoints
use, so `safetensors.numpy` cannot load them). Sharded checkpoints are followed through
`model.safetensors.index.json`.

Refused with a ValueError naming the key: a model type other than llama, rope scaling, biases,
an activation other than SiLU, a tensor missing, unexpected or misshapen.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from sol_control.graph.weights import LlamaConfig, LlamaWeights

INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """name -> float32 array of one .safetensors file."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{str(path)!r} is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if not 0 < n <= MAX_HEADER_BYTES:
            raise ValueError(f"{str(path)!r} is not a safetensors file (header length {n})")
        try:
            header = json.loads(fh.read(n))
        except json.JSONDecodeError as err:
            raise ValueError(f"{str(path)!r}: unreadable safetensors header: {err}") from None
    data = np.memmap(path, np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        kind = _DTYPES.get(entry["dtype"])
        if kind is None:
            raise ValueError(f"{str(path)!r}: tensor {name!r} has dtype {entry['dtype']}; F32, F16 and BF16 are read")
        start, stop = entry["data_offsets"]
        raw = np.frombuffer(data[start:stop], kind).reshape(entry["shape"])
        if entry["dtype"] == "BF16":  # the top 16 bits of a float32
            out[name] = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out[name] = raw.astype(np.float32)
    return out


def read_hf_config(config: dict[str, Any], where: str) -> LlamaConfig:
    if config.get("model_type") != "llama":
        raise ValueError(f"{where}: model_type {config.get('model_type')!r} is not supported (only 'llama')")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"{where}: {key} is not supported")
    if config.get("rope_scaling") or (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        raise ValueError(f"{where}: rope scaling is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {config['hidden_act']!r} is not supported (only silu)")
    try:
        heads = int(config["num_attention_heads"])
        theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return LlamaConfig(
            vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]), n_layers=int(config["num_hidden_layers"]),
            n_heads=heads, n_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads), rope_theta=float(theta),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_context=int(config["max_position_embeddings"]),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)))
    except KeyError as err:
        raise ValueError(f"{where}: config.json has no {err.args[0]!r}") from None


def read_hf_weights(folder: str | Path) -> LlamaWeights:
    """LlamaWeights from a Hugging Face Llama folder (config.json, model.safetensors or shards)."""
    folder = Path(folder)
    config = read_hf_config(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))
    if (folder / INDEX).is_file():
        files = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    elif (folder / SINGLE).is_file():
        files = [SINGLE]
    else:
        raise ValueError(f"{str(folder)!r} has neither {SINGLE} nor {INDEX}")
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(folder / name))
    for name in [n for n in tensors if n.endswith("rotary_emb.inv_freq")]:  # older checkpoints keep it
        del tensors[name]
    if config.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # some checkpoints store the tied copy too
    weights = LlamaWeights(config=config, tensors=tensors)
    weights.validate()
    return weights
