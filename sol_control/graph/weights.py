"""A Llama-family decoder as plain arrays: what the graph builder writes an ONNX decoder from.

Importers (an fp32 ONNX bundle, a Hugging Face folder, a GGUF file) produce `LlamaWeights`; the
builder (`sol_control.graph.llama`) turns them into a decoder graph. No torch: numpy only.

Tensor names are Hugging Face `LlamaForCausalLM` names, linear weights stored [out, in] as in HF:

    model.embed_tokens.weight                    [vocab, hidden]
    model.layers.{i}.input_layernorm.weight      [hidden]
    model.layers.{i}.self_attn.q_proj.weight     [n_heads * head_dim, hidden]
    model.layers.{i}.self_attn.k_proj.weight     [n_kv_heads * head_dim, hidden]
    model.layers.{i}.self_attn.v_proj.weight     [n_kv_heads * head_dim, hidden]
    model.layers.{i}.self_attn.o_proj.weight     [hidden, n_heads * head_dim]
    model.layers.{i}.post_attention_layernorm.weight [hidden]
    model.layers.{i}.mlp.gate_proj.weight        [intermediate, hidden]
    model.layers.{i}.mlp.up_proj.weight          [intermediate, hidden]
    model.layers.{i}.mlp.down_proj.weight        [hidden, intermediate]
    model.norm.weight                            [hidden]
    lm_head.weight                               [vocab, hidden]   (absent when tied)

q/k rows are in Hugging Face order (rotate-half rotary), not llama.cpp's interleaved order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_context: int = 2048  # positions the model was trained for (the KV cache never holds more)
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads", "n_kv_heads",
                     "head_dim", "max_context"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LlamaConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")


@dataclass(frozen=True)
class Int4Blocks:
    """A linear weight W [n_out, k_in] already in ONNX Runtime's `MatMulNBits` 4-bit layout:
    w[n, k] = (q[n, k] - zero_points[n, k // block]) * scales[n, k // block].

    packed: uint8 [n_out, k_in // block, block // 2], two values a byte, the even k in the low nibble;
    scales, zero_points: float32 [n_out, k_in // block] (float zero points hold a Q4_1 min exactly).
    """

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    block_size: int = 32

    def dequantize(self) -> np.ndarray:
        """[n_out, k_in] float32: the weight these blocks stand for."""
        lo = (self.packed & 0x0F).astype(np.float32)
        hi = (self.packed >> 4).astype(np.float32)
        q = np.stack([lo, hi], axis=-1).reshape(self.packed.shape[0], self.packed.shape[1], self.block_size)
        w = (q - self.zero_points[..., None]) * self.scales[..., None]  # [n, blocks, block]
        return w.reshape(self.packed.shape[0], -1).astype(np.float32)


@dataclass(frozen=True)
class DraftHeads:
    """K draft heads on the final (normed) hidden state h (Medusa style, tools/train_heads.py):
    head j guesses the token after the next as argmax(w2[j] @ (h + SiLU(w1[j] @ h))) + token_offset,
    over `n_out` tokens from `token_offset` (a policy's action tokens). `w2 = None`: every head
    reads the model's own lm_head instead (Medusa-1 on a language model, whose vocabulary-wide head
    is too big to copy per head; tools/train_lm_heads.py), over the whole vocabulary.

    `w_prev` [K, hidden, hidden] (optional, heads on the lm_head only): each head also reads the
    input embedding e of the token before its guess (Hydra style), h + SiLU(w1[j] @ h + w_prev[j] @ e):
    head 1 the row's own argmax, head j > 1 head j - 1's guess, so the heads run one after another."""

    w1: np.ndarray  # [K, hidden, hidden] float32
    w2: np.ndarray | None  # [K, n_out, hidden] float32, or None: the lm_head
    token_offset: int = 0
    w_prev: np.ndarray | None = None  # [K, hidden, hidden] float32, or None: heads read h only

    @property
    def k(self) -> int:
        return int(self.w1.shape[0])

    @property
    def shared_head(self) -> bool:
        return self.w2 is None

    def validate(self, hidden: int, vocab: int) -> None:
        k = self.k
        if self.w1.shape != (k, hidden, hidden) or (
                self.w2 is not None and (self.w2.ndim != 3 or self.w2.shape[::2] != (k, hidden))):
            shape = None if self.w2 is None else self.w2.shape
            raise ValueError(f"DraftHeads: w1 {self.w1.shape} / w2 {shape} do not fit {k} heads "
                             f"on hidden size {hidden}")
        if self.w_prev is not None and (self.w_prev.shape != self.w1.shape or self.w2 is not None):
            raise ValueError(f"DraftHeads: w_prev {self.w_prev.shape} must be [K, hidden, hidden] like w1 "
                             f"{self.w1.shape}, on heads that read the lm_head (no w2)")
        n_out = vocab if self.w2 is None else self.w2.shape[1]
        if self.w2 is None and self.token_offset:
            raise ValueError(f"DraftHeads: heads on the lm_head cover the whole vocabulary, token_offset "
                             f"must be 0, got {self.token_offset}")
        if not 0 <= self.token_offset and self.token_offset + n_out <= vocab:
            raise ValueError(f"DraftHeads: tokens [{self.token_offset}, {self.token_offset + n_out}) "
                             f"outside the vocabulary of {vocab}")

    @classmethod
    def load(cls, path) -> DraftHeads:
        """From the .npz tools/train_heads.py or train_lm_heads.py writes (w1, optional w2 and
        w_prev, token_offset; no pickles)."""
        with np.load(path, allow_pickle=False) as z:
            w2, w_prev = (z[n].astype(np.float32) if n in z.files else None for n in ("w2", "w_prev"))
            return cls(z["w1"].astype(np.float32), w2, int(z["token_offset"]), w_prev)

    def save(self, path) -> None:
        arrays = {"w1": self.w1.astype(np.float32), "token_offset": np.int64(self.token_offset)}
        for name in ("w2", "w_prev"):
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name).astype(np.float32)
        np.savez(path, **arrays)


@dataclass
class LlamaWeights:
    config: LlamaConfig
    tensors: dict[str, np.ndarray]  # HF names -> float32 arrays (see the module docstring)
    int4: dict[str, Int4Blocks] = field(default_factory=dict)  # optional pre-quantized linears, HF names
    heads: DraftHeads | None = None  # optional draft heads, written into the graph as `head_ids`
    activation_amax: dict[str, float] = field(default_factory=dict)  # graph tensor -> |max| (train.calibrate)

    def linear(self, name: str) -> np.ndarray:
        """A linear weight [out, in] in float32, dequantized when only its int4 blocks are held."""
        if name in self.tensors:
            return self.tensors[name]
        return self.int4[name].dequantize()

    @property
    def lm_head_name(self) -> str:
        return "model.embed_tokens.weight" if self.config.tie_embeddings else "lm_head.weight"

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF name -> shape for every tensor this configuration needs (see the module docstring)."""
        c = self.config
        q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size), "model.norm.weight": (c.hidden_size,)}
        if not c.tie_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
        for i in range(c.n_layers):
            p = f"model.layers.{i}"
            shapes.update({
                f"{p}.input_layernorm.weight": (c.hidden_size,),
                f"{p}.self_attn.q_proj.weight": (q, c.hidden_size),
                f"{p}.self_attn.k_proj.weight": (kv, c.hidden_size),
                f"{p}.self_attn.v_proj.weight": (kv, c.hidden_size),
                f"{p}.self_attn.o_proj.weight": (c.hidden_size, q),
                f"{p}.post_attention_layernorm.weight": (c.hidden_size,),
                f"{p}.mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
                f"{p}.mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
                f"{p}.mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
            })
        return shapes

    def validate(self) -> None:
        """ValueError naming the tensor when one is missing, extra, or of the wrong shape."""
        if self.heads is not None:
            self.heads.validate(self.config.hidden_size, self.config.vocab_size)
        want = self.expected_shapes()
        held = set(self.tensors) | set(self.int4)
        for name in sorted(held - set(want)):
            raise ValueError(f"LlamaWeights: unexpected tensor {name!r}")
        for name, shape in want.items():
            if name not in held:
                raise ValueError(f"LlamaWeights: missing tensor {name!r} (shape {shape})")
            if name in self.int4:
                b = self.int4[name]
                got = (b.packed.shape[0], b.packed.shape[1] * b.block_size)
            else:
                got = tuple(self.tensors[name].shape)
            if got != shape:
                raise ValueError(f"LlamaWeights: {name} has shape {got}, expected {shape}")
