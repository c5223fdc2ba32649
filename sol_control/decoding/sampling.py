"""Turning logits into tokens: greedy, temperature + top-p sampling, and token probabilities."""
from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = logits.astype(np.float64) / max(temperature, 1e-6)  # [V]
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def token_prob(logits: np.ndarray, token: int) -> float:
    """Probability of `token` under softmax(logits), without building the distribution twice."""
    m = float(logits.max())
    return float(np.exp(float(logits[token]) - m) / np.exp(logits.astype(np.float64) - m).sum())


def argmax_probs(rows: np.ndarray) -> list[float]:
    """The probability of each row's argmax under softmax, for rows [n, V] at once (greedy emits
    argmaxes: one vectorized pass per verify step instead of one `token_prob` per token)."""
    z = rows - rows.max(axis=1, keepdims=True)  # [n, V]
    return (1.0 / np.exp(z, out=z).sum(axis=1, dtype=np.float64)).tolist()


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of tokens whose mass reaches top_p; renormalise."""
    if top_p >= 1.0:
        return probs
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    keep = order[: int(np.searchsorted(cum, top_p) + 1)]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def distribution(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """The sampling distribution [V] for one position."""
    return top_p_filter(softmax(logits, temperature), top_p)


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from `probs` (inverse CDF; robust to tiny rounding)."""
    cum = np.cumsum(probs)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(probs) - 1))
