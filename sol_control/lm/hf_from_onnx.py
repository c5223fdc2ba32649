"""Hugging Face `LlamaForCausalLM` folders rebuilt from a bundle's fp32 ONNX decoders (numpy + onnx).

Peer engines (ORT GenAI, transformers, OpenVINO, llama.cpp; `bench.peers`) load Hugging Face
folders, and `sol-control train` starts from one. The shipped fp32 ONNX files hold every weight, so
we read them back (`sol_control.graph.from_onnx.read_decoder`, the one place that knows our export's
layout): the result is the bundle's weights bit for bit, not a retrained look-alike, and a peer
benchmark on a fresh clone compares engines on provably the same weights. The safetensors file is
written here (a JSON header plus raw little-endian arrays), so no torch, safetensors or pydantic is
needed: the peer venvs import this too.

    python tools/onnx_to_hf.py --bundle models/grasp --out /tmp/grasp_hf [--check]   # target/, draft/
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from sol_control.graph.from_onnx import read_decoder

WEIGHTS = "model.safetensors"


# ---- safetensors without the safetensors package -------------------------------------------------

_DTYPES = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("int64"): "I64"}


def save_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    """The safetensors layout: u64 header size, JSON header (dtype, shape, byte offsets), raw data."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<"), copy=False)
        blobs.append(a.tobytes())
        header[name] = {"dtype": _DTYPES[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blobs[-1])]}
        offset += len(blobs[-1])
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format wants the data 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for blob in blobs:
            fh.write(blob)


# ---- weights out of the graph (sol_control.graph.from_onnx) --------------------------------------

def convert_decoder(onnx_path: Path, spec: dict, vocab: dict, max_context: int) -> tuple[dict, dict]:
    """(HF config dict, {HF parameter name: array}) for one decoder-with-past ONNX file, cross-checked
    with the manifest's entry for it (`spec`: n_layers, n_kv_heads, head_dim, hidden_size)."""
    weights = read_decoder(onnx_path, max_context)
    c = weights.config
    got = {"n_layers": c.n_layers, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "hidden_size": c.hidden_size}
    for key, value in got.items():
        if spec[key] != value:
            raise ValueError(f"{onnx_path}: manifest says {key}={spec[key]}, the graph has {value}")
    if c.vocab_size != vocab["size"]:
        raise ValueError(f"{onnx_path}: vocab {c.vocab_size}, manifest {vocab['size']}")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "float32",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim, "hidden_act": "silu", "max_position_embeddings": max_context,
        "rms_norm_eps": c.rms_norm_eps,
        # both spellings: transformers 5 reads rope_parameters, older readers (optimum-intel's
        # exporter, llama.cpp's converter) read rope_theta
        "rope_theta": c.rope_theta, "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "tie_word_embeddings": c.tie_embeddings, "use_cache": True,
        "bos_token_id": vocab["bos"], "eos_token_id": vocab["eos"], "pad_token_id": vocab["pad"],
    }
    return config, weights.tensors


def write_hf(out_dir: Path, config: dict, params: dict[str, np.ndarray]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(params, out_dir / WEIGHTS)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out_dir


def convert_bundle(bundle_dir: Path, out_dir: Path) -> dict[str, Path]:
    """{role: HF folder} for the bundle's fp32 target and (if any) fp32 draft. Reads the manifest
    as plain JSON and checks each ONNX file's sha256 against it (no sol_control import needed)."""
    import hashlib

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    out = {}
    for role in ("target", "draft"):
        spec = manifest.get(role)
        if not spec or "fp32" not in spec.get("files", {}):
            continue
        fname = spec["files"]["fp32"]
        path = bundle_dir / fname
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != manifest["files"][fname]["sha256"]:
            raise ValueError(f"{path}: sha256 does not match the manifest")
        config, params = convert_decoder(path, spec, manifest["vocab"], manifest["max_context"])
        config["sol_control"] = {"from": f"{manifest['name']}/{fname}", "sha256": digest}
        out[role] = write_hf(out_dir / role, config, params)
    return out
