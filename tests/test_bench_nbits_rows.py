"""tools/bench_nbits_rows.py times the graph it means: a MatMulNBits without zero points computes
x @ ((q - 8) * scale).T, blocks of 32 along K, low nibble first."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import bench_nbits_rows as B  # noqa: E402


def test_the_timed_node_is_the_int4_linear_it_claims():
    k, n, nodes = 64, 16, 2
    session = B.nbits_session(k, n, accuracy=0, nodes=nodes, seed=3)
    rng = np.random.default_rng(3)  # the same draws as nbits_session
    packed = rng.integers(0, 256, (n, k // B.BLOCK, B.BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(n * (k // B.BLOCK)) * 0.01).astype(np.float32).reshape(n, k // B.BLOCK)
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, k // B.BLOCK, B.BLOCK).astype(np.float32)
    w = ((q - 8) * scales[:, :, None]).reshape(n, k)
    x = np.random.default_rng(4).standard_normal((1, 3, k)).astype(np.float32)
    y = session.run(None, {"x": x})[0]
    assert y.shape == (1, 3, n * nodes)
    np.testing.assert_allclose(y[..., :n], x @ w.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y[..., n:], y[..., :n])
    assert B.node_ms(session, x, nodes, runs=3) > 0
