"""The policy decoders as Hugging Face `LlamaForCausalLM` models (torch): made, loaded, decoded.

    model = make_model("qc", TARGET_ARCH)                  # a fresh target, ordinal embeddings
    model = target_from_bundle(Path("models/qc"), work)     # a bundle's fp32 target, bit for bit
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .layout import layout

# Target: sized so both bundles (fp32 + int8 + int4 + draft, two tasks) stay under 100 MB in all.
TARGET_ARCH = dict(hidden_size=256, intermediate_size=640, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64)
DRAFT_ARCH = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64)
MAX_CONTEXT = 64


def make_model(task: str, arch: dict, seed: int = 0, labels: tuple[str, ...] | None = None) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    lay = layout(task, labels)
    cfg = LlamaConfig(vocab_size=lay["vocab"]["size"], max_position_embeddings=MAX_CONTEXT, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, attention_bias=False, mlp_bias=False, **arch)
    model = LlamaForCausalLM(cfg)
    _ordinal_init(model, lay)
    return model


def _ordinal_init(model: LlamaForCausalLM, lay: dict) -> None:
    """Give neighbouring bins of every ordinal range (observation features, action bins) similar
    input/output embeddings (a few low-frequency sin/cos components), so nearby values share what
    they learn."""
    ranges = [(f["offset"], f["size"]) for f in lay["observation"]["features"] if f["size"] >= 8]
    bins = [(f["token_offset"], f["size"]) for f in lay["actions"] if f["kind"] == "bins"]
    ranges += sorted(set(bins))
    n_freq = 8
    with torch.no_grad():
        for emb in (model.get_input_embeddings().weight, model.lm_head.weight):
            std = float(emb.std())
            for off, size in ranges:
                b = torch.arange(size, dtype=torch.float32)[:, None]
                k = 2.0 ** torch.arange(n_freq, dtype=torch.float32)[None, :]  # 1, 2, 4, ... 128
                ang = math.pi * b / size * k
                feats = torch.cat([torch.sin(ang), torch.cos(ang)], dim=1) * std * 2.0  # [size, 16]
                emb[off:off + size, :2 * n_freq] = feats


def greedy_batch(model: LlamaForCausalLM, prefix: np.ndarray, n_new: int, batch: int = 256) -> np.ndarray:
    """Greedy continuations [N, n_new] of equal-length prefixes, with a KV cache, in batches."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(prefix), batch):
            ids = torch.from_numpy(prefix[i:i + batch])
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                                 min_new_tokens=n_new, do_sample=False, pad_token_id=0, eos_token_id=None)
            outs.append(gen[:, prefix.shape[1]:].numpy())
    return np.concatenate(outs).astype(np.int64)


def load_model(path: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(path).eval()


def n_params(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def target_from_bundle(bundle_dir: Path, work: Path) -> LlamaForCausalLM:
    """The bundle's fp32 target as a transformers model: its weights read back from the ONNX file
    (sol_control.lm.hf_from_onnx, bit-identical), so training starts from exactly the target
    that ships."""
    from sol_control.lm.hf_from_onnx import convert_bundle

    folder = work / "hf_from_bundle"
    if not (folder / "target" / "config.json").is_file():
        convert_bundle(bundle_dir, folder)
    return load_model(folder / "target")
