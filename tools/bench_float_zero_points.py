"""What float zero points cost in ONNX Runtime's CPU `MatMulNBits`, on one SmolLM2-sized linear (T = 1).

Q4_1 blocks (w = d*q + m) fit `MatMulNBits` exactly with a float zero point zp = -m/d. Another exact
form keeps integer zero points: zp = 0 (w = d*q) plus a small fp32 term for the mins,
x @ W.T = MatMulNBits(x) + blocksum(x) @ M.T, where blocksum(x) [T, k/32] sums x over each block
and M [n, k/32] holds the mins. This times both against plain uint8 zero points, variants
alternating in rounds, medians from the one run, and prints each variant's error against
x @ W.T in float64 where W is the weight it stands for.

    .venv/bin/python tools/bench_float_zero_points.py [--k 576] [--n 1536] [--rounds 30]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32


def q4_1_like(k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q uint8 [n, k/32, 32], d float32 [n, k/32], m float32 [n, k/32]) shaped like real Q4_1 blocks."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (n, k // BLOCK, BLOCK), dtype=np.uint8)
    d = (rng.random((n, k // BLOCK)) * 0.01 + 0.001).astype(np.float32)
    m = (-rng.random((n, k // BLOCK)) * 0.08).astype(np.float32)
    return q, d, m


def linear_model(k: int, n: int, q, d, zero_points, accuracy_level: int, mins: np.ndarray | None):
    """y [1, n] = MatMulNBits(x [1, k]) (+ blocksum(x) @ mins.T when mins are given)."""
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(d, "scales"),
             numpy_helper.from_array(zero_points, "zero_points")]
    nbits_out = "y" if mins is None else "y_q"
    nodes = [helper.make_node("MatMulNBits", ["x", "B", "scales", "zero_points"], [nbits_out], domain="com.microsoft",
                              K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=accuracy_level)]
    if mins is not None:
        inits += [numpy_helper.from_array(np.array([-1, k // BLOCK, BLOCK], np.int64), "blocks_shape"),
                  numpy_helper.from_array(np.array([2], np.int64), "block_axis"),
                  numpy_helper.from_array(np.ascontiguousarray(mins.T), "mins_t")]  # [k/32, n]
        nodes += [helper.make_node("Reshape", ["x", "blocks_shape"], ["x_blocks"]),
                  helper.make_node("ReduceSum", ["x_blocks", "block_axis"], ["x_sums"], keepdims=0),  # [1, k/32]
                  helper.make_node("MatMul", ["x_sums", "mins_t"], ["y_m"]),
                  helper.make_node("Add", ["y_q", "y_m"], ["y"])]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def variants(k: int, n: int) -> dict[str, tuple[ort.InferenceSession, np.ndarray]]:
    """name -> (session, the [n, k] weight it stands for)."""
    q, d, m = q4_1_like(k, n)
    q41 = (d[..., None] * q.astype(np.float64) + m[..., None]).reshape(n, k)
    zp_bytes = (k // BLOCK + 1) // 2
    plain = ((q.astype(np.float64) - 8) * d[..., None]).reshape(n, k)
    out = {}
    for level in (4, 0):
        out[f"uint8 zp (plain int4), accuracy_level {level}"] = (
            linear_model(k, n, q, d, np.full((n, zp_bytes), 0x88, np.uint8), level, None), plain)
        out[f"float zp = -m/d (Q4_1 exact), accuracy_level {level}"] = (
            linear_model(k, n, q, d, (-m / d).astype(np.float32), level, None), q41)
        out[f"uint8 zp 0 + mins term (Q4_1 exact), accuracy_level {level}"] = (
            linear_model(k, n, q, d, np.zeros((n, zp_bytes), np.uint8), level, m), q41)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=576)
    parser.add_argument("--n", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="calls timed together in one round")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    x = np.random.default_rng(1).standard_normal((1, args.k)).astype(np.float32)
    runs = variants(args.k, args.n)
    times_us: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (session, _) in runs.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                session.run(None, {"x": x})
            times_us[name].append((time.perf_counter() - start) / args.calls * 1e6)
    base = statistics.median(times_us["uint8 zp (plain int4), accuracy_level 4"])
    for name, (session, weight) in runs.items():
        error = np.abs(session.run(None, {"x": x})[0] - x.astype(np.float64) @ weight.T).max()
        median = statistics.median(times_us[name])
        print(f"{name:55s} {median:8.1f} us  {median / base:6.2f}x   max |error| {error:.2e}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
