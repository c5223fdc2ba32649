"""Guesses of an answer's first tokens before the prefill, checked by the prefill itself.

A policy's answer starts where its draft heads cannot help: the heads read the hidden state of the
row before a token, and at the prefill's last row the target has not yet decided the part's class,
so its heads guess the defect's position badly (QC: the first guess wrong on 55 % of decisions).
But the observation tokens themselves say a lot about the answer: a linear model over them names
QC's class right 99.6 % of the time and, given it, the u and v bins ~60 % of the time.

So the prefill runs the prefix plus these guesses, and the fused graph checks them as it checks
any verify pass (`FusedDecoderSession.prefill_guessed`, `speculate_heads`): when all are right the
one call gives the whole of a short answer (QC's `ok` parts and ~40 % of its defects); a wrong one
costs a row. The published tokens are still the target's own argmaxes: lossless.

`AnswerGuesser`: per answer position j a weight matrix w_j [vocab, n_j] over token counts and the
token ids it picks among (ids_j [n_j]); guess j = ids_j[argmax(sum of w_j's rows of the prefix
tokens and guesses 0..j-1)]. Stored as an .npz (`w0`, `ids0`, `w1`, ...; no pickles), listed in
the manifest as `target.guesses`. `fit_guesser` trains it (numpy, softmax regression on the
target's own answers; `tools/make_models.py`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MAX_POSITIONS = 16


class AnswerGuesser:
    """Guesses of an answer's first `positions` tokens from its prefix (module docstring)."""

    def __init__(self, weights: list[np.ndarray], ids: list[np.ndarray]):
        self.ids = [np.asarray(i, np.int64) for i in ids]
        self._all = np.concatenate([np.asarray(w, np.float32) for w in weights], axis=1)  # [vocab, sum n_j]
        self._cols = np.cumsum([0] + [w.shape[1] for w in weights]).tolist()
        self.weights = [self._all[:, a:b] for a, b in zip(self._cols, self._cols[1:])]  # views, not copies

    @property
    def positions(self) -> int:
        return len(self.weights)

    def guess(self, prefix: np.ndarray, n: int | None = None) -> list[int]:
        """The first min(n, positions) answer tokens this model expects after `prefix` [L] int64."""
        n = self.positions if n is None else min(n, self.positions)
        scores = self._all[np.asarray(prefix, np.int64)].sum(axis=0)  # every position's sums at once
        out: list[int] = []
        for j, ids in enumerate(self.ids[:n]):
            out.append(int(ids[int(np.argmax(scores[self._cols[j]:self._cols[j + 1]]))]))
            if j + 1 < n:
                scores += self._all[out[-1]]  # the guess counts as a token for the positions after it
        return out

    def save(self, path: Path) -> None:
        arrays = {f"w{j}": w for j, w in enumerate(self.weights)}
        arrays.update({f"ids{j}": i for j, i in enumerate(self.ids)})
        with open(path, "wb") as f:  # np.savez(path) would append .npz to a name without it
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, vocab: int) -> "AnswerGuesser":
        """Read and check an .npz written by `save`; ValueError naming the file when it is not one
        (not an npz, pickled, missing or misshapen arrays, ids outside [0, vocab))."""
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # not a zip, a pickled array, truncated ...
            raise ValueError(f"guesses {path}: not a readable .npz ({e})") from None
        n = sum(1 for k in arrays if k.startswith("w"))
        if not 0 < n <= MAX_POSITIONS or set(arrays) != {f"{p}{j}" for j in range(n) for p in ("w", "ids")}:
            raise ValueError(f"guesses {path}: expected arrays w0, ids0 ... w{{n-1}}, ids{{n-1}} "
                             f"(n <= {MAX_POSITIONS}), got {sorted(arrays)}")
        for j in range(n):
            w, ids = arrays[f"w{j}"], arrays[f"ids{j}"]
            if w.dtype != np.float32 or w.ndim != 2 or w.shape[0] != vocab or ids.shape != (w.shape[1],) \
                    or ids.dtype.kind not in "iu" or not np.isfinite(w).all():
                raise ValueError(f"guesses {path}: w{j} must be finite float32 [{vocab}, n] and ids{j} "
                                 f"integer [n], got {w.dtype} {w.shape} and {ids.dtype} {ids.shape}")
            if len(ids) == 0 or ids.min() < 0 or ids.max() >= vocab:
                raise ValueError(f"guesses {path}: ids{j} must be non-empty and lie in [0, {vocab})")
        return cls([arrays[f"w{j}"] for j in range(n)], [arrays[f"ids{j}"] for j in range(n)])


def token_counts(sequences: list[np.ndarray], vocab: int) -> np.ndarray:
    """[N, vocab] float32: how often each token id occurs in each sequence (ids < 0 are padding)."""
    x = np.zeros((len(sequences), vocab), np.float32)
    for i, s in enumerate(sequences):
        s = np.asarray(s, np.int64)
        np.add.at(x[i], s[s >= 0], 1.0)
    return x


def _softmax_regression(x: np.ndarray, y: np.ndarray, n_out: int, steps: int, l2: float) -> np.ndarray:
    """W [features, n_out] minimising cross-entropy + l2 |W|^2 / 2 (full batch, Adam, from zeros:
    deterministic)."""
    w = np.zeros((x.shape[1], n_out), np.float32)
    m, v = np.zeros_like(w), np.zeros_like(w)
    target = np.eye(n_out, dtype=np.float32)[y]
    for t in range(1, steps + 1):
        z = x @ w
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        g = x.T @ (p - target) / len(x) + l2 * w
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w -= 0.05 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return w


def fit_guesser(prefixes: list[np.ndarray], answers: np.ndarray, vocab: int, positions: int,
                steps: int = 400, l2: float = 1e-4) -> AnswerGuesser:
    """Softmax regression per answer position on the target's own answers [N, >= positions]:
    position j reads the prefix's token counts plus the true answer tokens before j (teacher
    forcing; at run time they are the guesses before it) and picks among the ids seen there."""
    answers = np.asarray(answers, np.int64)
    if not 0 < positions <= min(MAX_POSITIONS, answers.shape[1]) or len(prefixes) != len(answers):
        raise ValueError(f"need one answer of >= {positions} tokens per prefix (positions <= {MAX_POSITIONS})")
    weights, ids = [], []
    for j in range(positions):
        x = token_counts([np.concatenate([p, a[:j]]) for p, a in zip(prefixes, answers)], vocab)
        seen, y = np.unique(answers[:, j], return_inverse=True)
        weights.append(_softmax_regression(x, y, len(seen), steps, l2))
        ids.append(seen)
    return AnswerGuesser(weights, ids)
