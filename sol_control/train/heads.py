"""Draft heads for a target (multi-token prediction, Medusa style), trained with the target or on a
frozen one (torch).

A head j (1..K) reads the target's final hidden state h at position t and guesses the token at
t + 1 + j, one step further than the target's own next-token logits:

    h_j = h + SiLU(W1_j h)          # [hidden] one residual block per head
    id_j = argmax(W2_j h_j) + lo    # W2_j: [n_out, hidden] over the action tokens [lo, lo + n_out)

The heads live in the target's fused graph (sol_control/graph/llama.py), so one runtime call both
verifies the previous guesses and makes the next ones. W2 starts from the target's lm_head rows and
W1 from zero: every head starts as "the next token".

Two ways to train them: with the target (`Heads` passed to loop.Trainer, the loss on the teacher's
tokens), or afterwards on a frozen target (`fit_frozen`): labels are the target's own greedy
continuations, so a head learns to predict the target.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch


def _print(msg: str) -> None:
    print(msg, flush=True)


def hidden_states(model, seq: np.ndarray, batch: int = 512) -> np.ndarray:
    """The target's final (normed) hidden states [N, L, hidden] for token sequences [N, L]."""
    out = []
    with torch.no_grad():
        for i in range(0, len(seq), batch):
            out.append(model.model(input_ids=torch.from_numpy(seq[i:i + batch]), use_cache=False)
                       .last_hidden_state.float().numpy())
    return np.concatenate(out)


def head_examples(hidden: np.ndarray, actions: np.ndarray, prefix_len: int, k: int, lo: int, first: int = 1):
    """(h [M, hidden], labels [M, k]) from every position that predicts an action token: position
    p - 1 + i predicts action i; head j (first .. first + k - 1) there predicts action i + j
    (label -100 past the end)."""
    n, n_act = actions.shape
    h = hidden[:, prefix_len - 1:prefix_len - 1 + n_act]  # [N, A, hidden]
    labels = np.full((n, n_act, k), -100, np.int64)
    for j in range(first, first + k):
        labels[:, :n_act - j, j - first] = actions[:, j:] - lo
    keep = (labels != -100).any(-1).reshape(-1)
    return h.reshape(n * n_act, -1)[keep], labels.reshape(n * n_act, k)[keep]


class Heads:
    """K residual heads over the action tokens (torch), exportable as numpy arrays."""

    def __init__(self, lm_head: np.ndarray, k: int):
        n_out, hidden = lm_head.shape
        self.w1 = torch.zeros(k, hidden, hidden, requires_grad=True)  # [K, H_out, H_in]
        self.w2 = torch.tensor(np.repeat(lm_head[None], k, 0), requires_grad=True)  # [K, n_out, H]

    @classmethod
    def from_arrays(cls, w1: np.ndarray, w2: np.ndarray) -> Heads:
        """Heads that go on from trained ones (a bundle's `graph.weights.DraftHeads`)."""
        heads = cls(w2[0], w1.shape[0])
        with torch.no_grad():
            heads.w1.copy_(torch.from_numpy(np.ascontiguousarray(w1, np.float32)))
            heads.w2.copy_(torch.from_numpy(np.ascontiguousarray(w2, np.float32)))
        return heads

    def logits(self, h):  # h [..., H] -> [..., K, n_out]
        hj = h[..., None, :] + torch.nn.functional.silu(torch.einsum("koi,...i->...ko", self.w1, h))
        return torch.einsum("kvh,...kh->...kv", self.w2, hj)

    def loss(self, h, labels, weights=None):
        """Cross-entropy of every head (labels [..., K], -100 = none), each weighted (default 1)."""
        logits = self.logits(h)
        k = logits.shape[-2]
        per = [torch.nn.functional.cross_entropy(logits[..., j, :].reshape(-1, logits.shape[-1]),
                                                 labels[..., j].reshape(-1), ignore_index=-100) for j in range(k)]
        w = weights or [1.0] * k
        return sum(wj * lj for wj, lj in zip(w, per)) / sum(w)

    def params(self):
        return [self.w1, self.w2]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"w1": self.w1.detach().numpy().astype(np.float32), "w2": self.w2.detach().numpy().astype(np.float32)}


def action_labels(actions, k: int, lo: int):
    """Head labels [N, A, K] for the positions that predict actions: head j at the position that
    predicts action i targets action i + j (-100 past the end)."""
    n, n_act = actions.shape
    labels = torch.full((n, n_act, k), -100, dtype=torch.long)
    for j in range(1, k + 1):
        labels[:, :n_act - j, j - 1] = actions[:, j:] - lo
    return labels


def train_heads(h: np.ndarray, labels: np.ndarray, lm_head: np.ndarray, steps: int, lr: float,
                batch: int, seed: int = 0, log=_print) -> tuple[Heads, dict]:
    torch.manual_seed(seed)
    heads = Heads(lm_head, labels.shape[1])
    opt = torch.optim.AdamW(heads.params(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    hx, ly = torch.from_numpy(h), torch.from_numpy(labels)
    g = torch.Generator().manual_seed(seed)
    t0 = time.monotonic()
    for step in range(steps):
        idx = torch.randint(0, len(hx), (batch,), generator=g)
        loss = heads.loss(hx[idx], ly[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"heads step {step}/{steps} loss {loss.item():.4f} {time.monotonic() - t0:.0f}s")
    return heads, {"steps": steps, "train_s": round(time.monotonic() - t0, 1), "final_loss": loss.item()}


def head_accuracy(heads: Heads, h: np.ndarray, labels: np.ndarray) -> list[float]:
    """Per head: the share of its labelled positions where its argmax is the target's token."""
    with torch.no_grad():
        pred = heads.logits(torch.from_numpy(h)).argmax(-1).numpy()  # [M, K]
    ok = labels != -100
    return [float((pred[:, j] == labels[:, j])[ok[:, j]].mean()) for j in range(labels.shape[1])]


def first_trained(k: int, keep) -> int:
    """The first head to train when `keep` (DraftHeads or None) stay in front of K heads."""
    first = 1 + (keep.k if keep is not None else 0)
    if first > k:
        raise ValueError(f"asked for {k} heads, the bundle already has {first - 1}")
    return first


def fit_frozen(target, train: tuple, test: tuple, k: int, action: tuple[int, int], steps: int, lr: float = 3e-3,
               batch: int = 512, keep=None, log=_print) -> tuple[dict[str, np.ndarray], dict]:
    """K heads on a frozen transformers `target` from its own answers: `train`, `test` = (prefix
    [N, P], the target's greedy answers [N, A]); `action` = the action tokens [lo, hi). `keep`
    (DraftHeads, k_keep < K) stay as they are in front: only heads k_keep + 1 .. K are trained
    (each head is independent of the others). (arrays w1, w2 for all K heads, a training record)."""
    lo, hi = action
    first = first_trained(k, keep)
    lm_head = target.lm_head.weight.detach().numpy()[lo:hi].astype(np.float32)  # [n_out, H]
    examples = {}
    for name, (prefix, answers) in (("train", train), ("test", test)):
        hidden = hidden_states(target, np.concatenate([prefix, answers], axis=1))
        examples[name] = head_examples(hidden, answers, prefix.shape[1], k - first + 1, lo, first)
    heads, info = train_heads(*examples["train"], lm_head, steps, lr, batch, log=log)
    arrays = heads.arrays()
    if keep is not None:
        arrays = {"w1": np.concatenate([keep.w1, arrays["w1"]]), "w2": np.concatenate([keep.w2, arrays["w2"]])}
    info.update(heads=k, trained_heads=list(range(first, k + 1)), token_offset=int(lo), n_out=int(hi - lo),
                test_accuracy=head_accuracy(heads, *examples["test"]),
                train_accuracy=head_accuracy(heads, *examples["train"]))
    return arrays, info
