"""Quantize an fp32 decoder-with-past ONNX file with ONNX Runtime's own quantizers (dev-only).

- int8 (default `method="nbits"`): `MatMulNBitsQuantizer` with 8-bit blocks -> com.microsoft
  `MatMulNBits`. `method="dynamic"`: `quantize_dynamic` (DynamicQuantizeMatMul), one activation
  scale per call, so logits depend on the other tokens in the pass (see `quantize_int8`).
- int4: `MatMulNBitsQuantizer` — MatMul weights in 4-bit blocks (block_size along K) ->
  com.microsoft `MatMulNBits`; `accuracy_level=4` computes with int8 activations (fastest on CPU).

Every MatMul is quantized, the lm_head included (it is ~1/3 faster per token with int4 on a 25M
model); `keep_lm_head_fp32=True` leaves it fp32, and int4 can give it 8 bits (`lm_head_bits=8`).
The shipped bundles' int4 (and this CLI's default) is 4-bit blocks with zero points and an 8-bit
lm_head: fine 256-bin action tokens hang on small logit gaps (see models/README.md). Blocks of 128
instead of 32 cut int4 decode time by ~1/3 on a 25M model (measured) at some accuracy cost; the
default stays 32.

Attention, RMSNormalization, the embedding Gather and the KV cache stay fp32, so the graph keeps
the decoder-with-past signature unchanged.

    python tools/quantize.py SRC.onnx --int8 DST8.onnx --int4 DST4.onnx
"""
from __future__ import annotations

import argparse
import collections
import logging
import sys
from pathlib import Path

import onnx


def lm_head_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMul nodes that produce `logits` (the lm_head)."""
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and "logits" in n.output]


def _name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every node a unique name (the quantizers select and exclude nodes by name)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return model


def _quiet_quantizer_logs() -> None:
    """matmul_nbits_quantizer calls logging.basicConfig(level=INFO) at import: one line per node."""
    import onnxruntime.quantization.matmul_nbits_quantizer  # noqa: F401  (runs its basicConfig)

    logging.getLogger().setLevel(logging.WARNING)


def quantize_int8(src: str | Path, dst: str | Path, method: str = "nbits", per_channel: bool = True,
                  keep_lm_head_fp32: bool = False, block_size: int = 32) -> Path:
    """int8 weights for every MatMul.

    `nbits` (default): MatMulNBits with 8-bit blocks, int8 activations quantized per row block
    (accuracy_level 4). Its result for a token does not depend on the other tokens in the same
    pass, so speculative verification of k tokens at once gives exactly plain greedy's output.
    `dynamic`: quantize_dynamic (DynamicQuantizeMatMul): activations share one scale per call,
    so a token's logits change with the tokens verified beside it, and speculative decoding is
    no longer token-for-token identical to plain decoding on the same model (measured: 30 of 40
    fixture decisions differed).
    """
    if method == "nbits":
        return _matmul_nbits(src, dst, bits=8, block_size=block_size, accuracy_level=4, symmetric=True,
                             lm_head_bits=None if keep_lm_head_fp32 else 8)
    if method != "dynamic":
        raise ValueError(f"int8 method must be 'nbits' or 'dynamic', got {method!r}")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _quiet_quantizer_logs()
    model = _name_nodes(onnx.load(str(src)))
    exclude = lm_head_nodes(model) if keep_lm_head_fp32 else []
    quantize_dynamic(model, str(dst), op_types_to_quantize=["MatMul"], per_channel=per_channel,
                     weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                     extra_options={"MatMulConstBOnly": True})
    return Path(dst)


def quantize_int4(src: str | Path, dst: str | Path, block_size: int = 32, accuracy_level: int = 4,
                  symmetric: bool = False, lm_head_bits: int | None = 8) -> Path:
    """4-bit block quantization of every MatMul weight into com.microsoft MatMulNBits; the lm_head
    gets `lm_head_bits` (4, 8 = symmetric 8-bit blocks, None = left fp32). The defaults are the
    shipped bundles' layout (zero points, 8-bit lm_head)."""
    return _matmul_nbits(src, dst, 4, block_size, accuracy_level, symmetric, lm_head_bits)


def _matmul_nbits(src, dst, bits: int, block_size: int, accuracy_level: int, symmetric: bool,
                  lm_head_bits: int | None) -> Path:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    _quiet_quantizer_logs()
    model = _name_nodes(onnx.load(str(src)))
    head = lm_head_nodes(model)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric,
                                     accuracy_level=accuracy_level,
                                     nodes_to_exclude=[] if lm_head_bits == bits else head,
                                     op_types_to_quantize=("MatMul",))
    quantizer.process()
    if lm_head_bits not in (None, bits):  # a second pass for the lm_head alone
        quantizer = MatMulNBitsQuantizer(quantizer.model.model, bits=lm_head_bits, block_size=block_size,
                                         is_symmetric=True, accuracy_level=accuracy_level,
                                         nodes_to_include=head, op_types_to_quantize=("MatMul",))
        quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)
    return Path(dst)


def op_counts(path: str | Path) -> dict[str, int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("--int8", help="output path of the int8 model")
    ap.add_argument("--int4", help="output path of the int4 model")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--accuracy-level", type=int, default=4)
    ap.add_argument("--keep-lm-head-fp32", action="store_true", help="int8 and int4: leave the lm_head fp32")
    ap.add_argument("--int4-lm-head-bits", type=int, choices=(4, 8), default=8)  # = quantize_int4's
    ap.add_argument("--int4-symmetric", action="store_true", help="int4 blocks without zero points")
    args = ap.parse_args(argv)
    if args.int8:
        quantize_int8(args.src, args.int8, keep_lm_head_fp32=args.keep_lm_head_fp32)
        print(f"int8 {args.int8}: {op_counts(args.int8)}")
    if args.int4:
        quantize_int4(args.src, args.int4, args.block_size, args.accuracy_level, args.int4_symmetric,
                      None if args.keep_lm_head_fp32 else args.int4_lm_head_bits)
        print(f"int4 {args.int4}: {op_counts(args.int4)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
