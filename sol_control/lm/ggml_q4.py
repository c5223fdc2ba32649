"""ggml Q4_1 blocks -> ONNX Runtime `MatMulNBits` blocks (`Int4Blocks`), with nothing rounded away.

A Q4_1 block holds 32 weights of one row in 20 bytes: f16 scale d, f16 min m, then 16 bytes qs.
Weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16]; w = d * q + m.

`MatMulNBits` reads w = (q - zp) * scale, two weights a byte with the even one in the low nibble.
So scale = d and zp = -m / d (a float zero point) carry the block; only zp's fp32 rounding differs
from ggml's own d * q + m (a few ulp of |m|). A block with d == 0 holds 32 copies of m: it becomes
q = 0, scale = 1, zp = -m, which is exact.
"""
from __future__ import annotations

import numpy as np

from sol_control.graph.weights import Int4Blocks

Q4_1_BLOCK = 32        # weights per block
Q4_1_BLOCK_BYTES = 20  # 2 (d) + 2 (m) + 16 (qs)


def q4_1_nibbles(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """raw uint8 [n_out, n_blocks * 20] -> (q uint8 [n_out, n_blocks, 32] in weight order,
    d float32 [n_out, n_blocks], m float32 [n_out, n_blocks])."""
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] % Q4_1_BLOCK_BYTES:
        raise ValueError(f"Q4_1 data must be uint8 [rows, n_blocks * {Q4_1_BLOCK_BYTES}], "
                         f"got {raw.dtype} {list(raw.shape)}")
    n_out = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n_out, -1, Q4_1_BLOCK_BYTES)  # [n, b, 20]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [n, b]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)  # [n, b]
    qs = blocks[..., 4:]                                                     # [n, b, 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)                       # [n, b, 32]
    return q, d, m


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """q uint8 [..., 32] values 0..15 -> uint8 [..., 16], weight 2i in the low nibble of byte i."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def q4_1_to_int4(raw: np.ndarray) -> Int4Blocks:
    """raw Q4_1 rows (uint8 [n_out, k_in / 32 * 20]) -> Int4Blocks for the [n_out, k_in] weight."""
    q, d, m = q4_1_nibbles(raw)
    if not (np.isfinite(d).all() and np.isfinite(m).all()):
        raise ValueError("Q4_1 data holds a non-finite scale or min (corrupt file?)")
    flat = d == 0  # [n, b] blocks where every weight equals m
    q = np.where(flat[..., None], np.uint8(0), q)
    scales = np.where(flat, np.float32(1.0), d).astype(np.float32)  # [n, b]
    zero_points = (-m / scales).astype(np.float32)                  # [n, b]; -m where d == 0
    return Int4Blocks(packed=pack_nibbles(q), scales=scales, zero_points=zero_points, block_size=Q4_1_BLOCK)


def q4_1_reference(raw: np.ndarray) -> np.ndarray:
    """float32 [n_out, k_in]: ggml's own Q4_1 arithmetic (d * q + m in fp32), for checks."""
    q, d, m = q4_1_nibbles(raw)
    w = d[..., None] * q.astype(np.float32) + m[..., None]
    return w.reshape(raw.shape[0], -1)
