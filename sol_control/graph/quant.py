"""Block-wise round-to-nearest weight quantization into ONNX Runtime's `MatMulNBits` layout (numpy).

A linear weight W [n_out, k_in] (Hugging Face order) is cut along k into blocks of `block` values;
each block gets a float scale and, when asymmetric, a zero point:

    asymmetric: lo = min(0, block.min()), hi = max(0, block.max()), scale = (hi - lo) / (2^bits - 1),
                zp = clip(round(-lo / scale), 0, 2^bits - 1)
    symmetric:  m = the block value of largest magnitude, scale = m / -2^(bits-1), zp = 2^(bits-1)
    q = clip(round(w / scale + zp), 0, 2^bits - 1)          w ~ (q - zp) * scale

with float32 arithmetic and round-half-away-from-zero (C's roundf), as ONNX Runtime's own
quantizer (MLAS) does: the
result is byte-identical to `onnxruntime.quantization.MatMulNBitsQuantizer`'s RTN (checked in
tests/test_graph.py), so our graphs carry the same int4/int8 weights as the shipped files.

`Blocks` holds what `MatMulNBits` takes: packed [n, k/block, block*bits/8] uint8 (4-bit: the even
k in the low nibble), scales [n, k/block] float32, zero points either packed uint8 [n,
ceil(k_blocks*bits/8)] or float32 [n, k/block] (a GGUF Q4_1 block's min is not an integer zero
point), or None (symmetric: ORT's default 2^(bits-1)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .weights import Int4Blocks


@dataclass(frozen=True)
class Blocks:
    bits: int
    block_size: int
    packed: np.ndarray  # uint8 [n, k_blocks, block_size * bits // 8]
    scales: np.ndarray  # float32 [n, k_blocks]
    zero_points: np.ndarray | None  # uint8 packed [n, ceil(k_blocks*bits/8)], float32 [n, k_blocks], or None

    @property
    def n(self) -> int:
        return self.packed.shape[0]

    @property
    def k(self) -> int:
        return self.packed.shape[1] * self.block_size

    def dequantize(self) -> np.ndarray:
        """[n, k] float32: the weight these blocks stand for."""
        q = _unpack(self.packed, self.bits).astype(np.float32)  # [n, k_blocks, block]
        zp = self._zero_points_float()
        return ((q - zp[..., None]) * self.scales[..., None]).reshape(self.n, self.k).astype(np.float32)

    def _zero_points_float(self) -> np.ndarray:
        kb = self.packed.shape[1]
        if self.zero_points is None:
            return np.full((self.n, kb), 2.0 ** (self.bits - 1), np.float32)
        if self.zero_points.dtype == np.float32:
            return self.zero_points
        return _unpack(self.zero_points[:, :, None], self.bits).reshape(self.n, -1)[:, :kb].astype(np.float32)


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., m] -> uint8 [..., m * 8 // bits], low bits first."""
    if bits == 8:
        return packed
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., m] -> uint8 [..., m * bits // 8], low bits first (m even for 4 bits)."""
    if bits == 8:
        return q.astype(np.uint8)
    pairs = q.reshape(*q.shape[:-1], -1, 2).astype(np.uint8)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def _round(x: np.ndarray) -> np.ndarray:
    """C's roundf of a float32 array (halves away from zero), exact: the +0.5 is done in float64."""
    return (np.sign(x) * np.floor(np.abs(x).astype(np.float64) + 0.5)).astype(np.float32)


def quantize(w: np.ndarray, bits: int = 4, block_size: int = 32, symmetric: bool = False) -> Blocks:
    """Round-to-nearest block quantization of a linear weight w [n_out, k_in]."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    w = np.asarray(w, np.float32)
    n, k = w.shape
    if k % block_size:
        raise ValueError(f"k_in={k} must be a multiple of block_size={block_size}")
    blocks = w.reshape(n, k // block_size, block_size)  # [n, kb, block]
    qmax = np.float32(2 ** bits - 1)
    if symmetric:
        idx = np.abs(blocks).argmax(-1)[..., None]
        big = np.take_along_axis(blocks, idx, -1)[..., 0]  # signed value of largest magnitude
        scale = (big / np.float32(-(2 ** (bits - 1)))).astype(np.float32)
        zp = np.full_like(scale, 2 ** (bits - 1))
    else:
        lo = np.minimum(blocks.min(-1), np.float32(0))
        hi = np.maximum(blocks.max(-1), np.float32(0))
        scale = ((hi - lo) / qmax).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp_f = np.where(scale != 0, -lo / scale, lo).astype(np.float32)
        zp = np.clip(_round(zp_f), 0, qmax)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.clip(_round(blocks * inv[..., None] + zp[..., None].astype(np.float32)), 0, qmax).astype(np.uint8)
    zero_points = None
    if not symmetric:
        zpu = zp.astype(np.uint8)
        if bits == 4 and zpu.shape[1] % 2:  # odd block count: the spare nibble holds the default 8
            zpu = np.concatenate([zpu, np.full((n, 1), 8, np.uint8)], axis=1)
        zero_points = _pack(zpu, bits)
    return Blocks(bits, block_size, _pack(q, bits), scale, zero_points)


def per_channel_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [n_out, k_in] -> (int8 [n_out, k_in], float32 scales [n_out]): symmetric per output
    channel, scale = |row max| / 127 (1 for an all-zero row), rounded as `_round` does."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)
    scales = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.clip(_round(w / scales[:, None]), -127, 127).astype(np.int8)
    return q, scales


def from_int4(b: Int4Blocks) -> Blocks:
    """An `Int4Blocks` (float zero points, e.g. a GGUF Q4_1 block's min / scale) as given."""
    return Blocks(4, b.block_size, np.ascontiguousarray(b.packed, np.uint8),
                  np.ascontiguousarray(b.scales, np.float32), np.ascontiguousarray(b.zero_points, np.float32))


def concat(parts: list[Blocks]) -> Blocks:
    """The blocks of several linears stacked along n_out (a packed q|k|v projection). Zero points
    of mixed kinds become float32 (a symmetric part gets its implicit 2^(bits-1))."""
    first = parts[0]
    if len(parts) == 1:
        return first
    for p in parts[1:]:
        if (p.bits, p.block_size, p.k) != (first.bits, first.block_size, first.k):
            raise ValueError(f"cannot stack blocks of (bits, block, k_in) {(p.bits, p.block_size, p.k)} "
                             f"onto {(first.bits, first.block_size, first.k)}")
    kinds = {None if p.zero_points is None else p.zero_points.dtype for p in parts}
    if kinds == {None}:
        zero_points = None
    elif kinds == {np.dtype(np.uint8)}:
        zero_points = np.concatenate([p.zero_points for p in parts])
    else:
        zero_points = np.concatenate([p._zero_points_float() for p in parts])
    return Blocks(first.bits, first.block_size, np.concatenate([p.packed for p in parts]),
                  np.concatenate([p.scales for p in parts]), zero_points)


def split_mins(b: Blocks) -> tuple[Blocks, np.ndarray]:
    """4-bit blocks with float zero points as (the same q and scales, symmetric: no zero points, so
    ONNX Runtime's implicit 8; mins [n, k/block] float32): w = (q - zp) * scale = (q - 8) * scale +
    mins, mins = (8 - zp) * scale (computed in float64: a Q4_1 block's fp16 min m and scale d give
    m + 8 d, exact in float32 unless their exponents lie 13 or more apart)."""
    assert b.bits == 4 and b.zero_points is not None and b.zero_points.dtype == np.float32, b.zero_points
    mins = ((8.0 - b.zero_points.astype(np.float64)) * b.scales.astype(np.float64)).astype(np.float32)
    return Blocks(4, b.block_size, b.packed, b.scales, None), mins
