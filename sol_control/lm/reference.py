"""A plain numpy Llama forward from `LlamaWeights`, in float32: the reference that importers and the
graph builder are checked against. No KV cache: every call runs the whole sequence (tests, checks).

int4 linears are dequantized once (`Int4Blocks.dequantize`), so the reference is the full-precision
model those blocks stand for. Rotary is Hugging Face's rotate-half form on HF-ordered q/k rows.
"""
from __future__ import annotations

import numpy as np

from sol_control.graph.weights import LlamaWeights


def parity_tolerance(n_layers: int, logit_scale: float) -> float:
    """How far an fp32 graph's logits may sit from the reference's: fp32 rounding grows with depth
    and with the logits' size, so 1e-6 per layer of the largest logit, never below 1e-4 (SmolLM2's 30
    layers differ by 1.4e-4 on logits of ~20 while every greedy token is equal)."""
    return max(1e-4, 1e-6 * n_layers * abs(logit_scale))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [T, hidden] -> [T, hidden]."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def rotary(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate-half rotary: x [heads, T, head_dim] at positions [T] -> same shape."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (np.arange(half, dtype=np.float32) * 2 / x.shape[-1]))  # [half]
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :].astype(np.float32)  # [T, half]
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


class LlamaReference:
    """The forward of one LlamaWeights, its linears held as dense float32 [out, in]."""

    def __init__(self, weights: LlamaWeights) -> None:
        self.config = weights.config
        self.dense = dict(weights.tensors)
        self.dense.update({name: blocks.dequantize() for name, blocks in weights.int4.items()})
        self.head = self.dense[weights.lm_head_name]  # [vocab, hidden]

    def _attention(self, x: np.ndarray, prefix: str) -> np.ndarray:
        """x [T, hidden] (normed) -> [T, hidden]: causal GQA self-attention with rotary."""
        c, T = self.config, x.shape[0]
        q = (x @ self.dense[f"{prefix}.q_proj.weight"].T).reshape(T, c.n_heads, c.head_dim).transpose(1, 0, 2)
        k = (x @ self.dense[f"{prefix}.k_proj.weight"].T).reshape(T, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        v = (x @ self.dense[f"{prefix}.v_proj.weight"].T).reshape(T, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        positions = np.arange(T)
        q, k = rotary(q, positions, c.rope_theta), rotary(k, positions, c.rope_theta)  # [heads, T, hd]
        group = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)                # [n_heads, T, hd]
        scores = q @ k.transpose(0, 2, 1) / np.float32(np.sqrt(c.head_dim))           # [n_heads, T, T]
        scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, np.float32(-np.inf))
        out = (softmax(scores) @ v).transpose(1, 0, 2).reshape(T, c.n_heads * c.head_dim)  # [T, q_rows]
        return out @ self.dense[f"{prefix}.o_proj.weight"].T

    def _mlp(self, x: np.ndarray, prefix: str) -> np.ndarray:
        """x [T, hidden] (normed) -> [T, hidden]: SwiGLU."""
        gate = x @ self.dense[f"{prefix}.gate_proj.weight"].T  # [T, intermediate]
        up = x @ self.dense[f"{prefix}.up_proj.weight"].T
        return (gate / (1.0 + np.exp(-gate)) * up) @ self.dense[f"{prefix}.down_proj.weight"].T

    def logits(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """ids [T] -> logits [T, vocab], float32."""
        return (self.hidden(ids) @ self.head.T).astype(np.float32)

    def hidden(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """ids [T] -> the final normed hidden states [T, hidden] (what the lm_head reads)."""
        c = self.config
        h = self.dense["model.embed_tokens.weight"][np.asarray(ids, dtype=np.int64)]  # [T, hidden]
        for layer in range(c.n_layers):
            p = f"model.layers.{layer}"
            x = rms_norm(h, self.dense[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
            h = h + self._attention(x, f"{p}.self_attn")
            x = rms_norm(h, self.dense[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
            h = h + self._mlp(x, f"{p}.mlp")
        return rms_norm(h, self.dense["model.norm.weight"], c.rms_norm_eps)

    def greedy(self, ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
        """The generated ids (argmax each step), ending after a stop id or max_new_tokens."""
        seq, new = list(ids), []
        for _ in range(max_new_tokens):
            token = int(np.argmax(self.logits(seq)[-1]))
            seq.append(token)
            new.append(token)
            if token in stop_ids:
                break
        return new
