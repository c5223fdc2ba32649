"""A tiny random Llama and a tiny byte-level BPE vocabulary: what tests (and tiny-model benchmarks)
write as GGUF themselves, so that nothing is downloaded and no 135M model is needed.

The vocabulary looks like SmolLM2's: control tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at
ids 0-2, one user-defined token, the 256 byte-level characters, then a few merges; its chat template
is ChatML.
"""
from __future__ import annotations

import numpy as np

from sol_control.graph.weights import LlamaConfig, LlamaWeights
from sol_control.lm.gguf_writer import GGUFVocab

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ c", "Ġc on", "r e", "Ġ s", "a t", "Ġ p",
          "a r", "Ġp ar", "Ġpar t", "Ġ b", "e l", "Ġb el", "Ġbel t", "Ċ Ċ", "Ġ Ġ", "ĠĠ ĠĠ"]


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each byte 0..255, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[byte] for byte in range(256)]


def tiny_vocab(pre: str = "smollm") -> GGUFVocab:
    """Specials (0-2, control), `<tool>` (3, user-defined), 256 bytes, then one token per merge."""
    tokens = [*SPECIALS, *USER_DEFINED, *byte_alphabet(), *(m.replace(" ", "") for m in MERGES)]
    types = [3] * len(SPECIALS) + [4] * len(USER_DEFINED) + [1] * (len(tokens) - len(SPECIALS) - len(USER_DEFINED))
    return GGUFVocab(tokens=tokens, token_types=types, merges=list(MERGES), pre=pre, bos_id=1, eos_id=2,
                     chat_template=CHATML)


def tiny_config(vocab_size: int, tie_embeddings: bool = True) -> LlamaConfig:
    """2 layers, hidden 64, GQA 4/2 heads of 16; every linear's input a multiple of 32 (Q4_1 blocks)."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, n_layers=2, n_heads=4,
                       n_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, max_context=256,
                       tie_embeddings=tie_embeddings)


def random_llama(config: LlamaConfig, seed: int = 0, std: float = 0.15) -> LlamaWeights:
    """Random float32 weights (HF names and order); norms near 1 so every layer matters."""
    rng = np.random.default_rng(seed)
    h, q_rows, kv_rows, inter = (config.hidden_size, config.n_heads * config.head_dim,
                                 config.n_kv_heads * config.head_dim, config.intermediate_size)
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.n_layers):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
                       f"{p}.self_attn.q_proj.weight": (q_rows, h), f"{p}.self_attn.k_proj.weight": (kv_rows, h),
                       f"{p}.self_attn.v_proj.weight": (kv_rows, h), f"{p}.self_attn.o_proj.weight": (h, q_rows),
                       f"{p}.mlp.gate_proj.weight": (inter, h), f"{p}.mlp.up_proj.weight": (inter, h),
                       f"{p}.mlp.down_proj.weight": (h, inter)})
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return LlamaWeights(config=config, tensors=tensors)
