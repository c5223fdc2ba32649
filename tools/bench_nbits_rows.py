"""What one more row costs ONNX Runtime's int4 MatMulNBits on this CPU (docs/BENCHMARKS.md, "The two
5x figures on the Zen 4 host").

A verify pass of T rows multiplies T activation rows by every int4 linear. Where the kernel reuses
the unpacked weights across rows, rows after the first are nearly free and speculation pays at any
acceptance; where it does not, every row costs what the first did and the pass is compute-bound.
This times one [K -> N] MatMulNBits (random Q4 blocks of 32, no zero points: the shipped graphs'
form) for M = 1..16 rows at each accuracy level, as the mean of `--nodes` such nodes in one graph.

    .venv/bin/python tools/bench_nbits_rows.py [--k 576 --n 3072] [--rows 1,2,3,4,5,8,16] [--runs 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sol_control.decoding.session import session_options  # noqa: E402

BLOCK = 32


def nbits_session(k: int, n: int, accuracy: int, nodes: int, seed: int = 0) -> ort.InferenceSession:
    """`nodes` MatMulNBits of one input, outputs concatenated (one thread)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, (n, k // BLOCK, BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(n * (k // BLOCK)) * 0.01).astype(np.float32)
    inits, graph_nodes = [], []
    for i in range(nodes):
        inits += [numpy_helper.from_array(q, f"q{i}"), numpy_helper.from_array(scales, f"s{i}")]
        graph_nodes.append(helper.make_node("MatMulNBits", ["x", f"q{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                                            K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=accuracy))
    graph_nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(nodes)], ["y"], axis=-1))
    graph = helper.make_graph(graph_nodes, "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])


def node_ms(session: ort.InferenceSession, x: np.ndarray, nodes: int, runs: int) -> float:
    """Median ms of one node (a run's time over `nodes`), after 3 warm-up runs."""
    for _ in range(3):
        session.run(None, {"x": x})
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3 / nodes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=576, help="inputs (SmolLM2's hidden size)")
    ap.add_argument("--n", type=int, default=3072, help="outputs (SmolLM2's gate and up, fused)")
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--accuracy", default="0,4", help="MatMulNBits accuracy_level values (4: int8 activations)")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    if args.k % BLOCK:
        ap.error(f"--k must be a multiple of {BLOCK}")
    levels = [int(a) for a in args.accuracy.split(",")]
    sessions = {a: nbits_session(args.k, args.n, a, args.nodes) for a in levels}
    rng = np.random.default_rng(1)
    print(f"ms a [{args.k} -> {args.n}] int4 MatMulNBits node, 1 thread, ONNX Runtime {ort.__version__}")
    print("rows  " + "  ".join(f"accuracy {a:<2d}    " for a in levels))
    first = {}
    for m in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((1, m, args.k)).astype(np.float32)
        cells = []
        for a, s in sessions.items():
            ms = node_ms(s, x, args.nodes, args.runs)
            first.setdefault(a, ms)
            cells.append(f"{ms:6.3f} ({ms / first[a]:4.1f}x)")
        print(f"{m:4d}  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
