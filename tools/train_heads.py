"""Draft heads for a target (multi-token prediction, Medusa style): trained with the target or on a
frozen one (dev-only, torch).

A head j (1..K) reads the target's final hidden state h at position t and guesses the token at
t + 1 + j, one step further than the target's own next-token logits:

    h_j = h + SiLU(W1_j h)          # [hidden] one residual block per head
    id_j = argmax(W2_j h_j) + lo    # W2_j: [n_out, hidden] over the action tokens [lo, lo + n_out)

The heads live in the target's fused graph (sol_control/graph/llama.py), so one runtime call both
verifies the previous guesses and makes the next ones. W2 starts from the target's lm_head rows and
W1 from zero: every head starts as "the next token".

Two ways to train them:
- with the target (what `make models` does): `Heads` and `head_examples` here, the loss added to the
  target's by tools/train.py (`heads=`, `heads_weight=`) on the teacher's tokens;
- afterwards, on a frozen target (this command, Medusa style): labels are the target's greedy
  continuations of training-split prefixes, so a head learns to predict the target. On grasp this
  accepted ~30 % fewer guesses than joint training.

    python tools/train_heads.py --task grasp --heads 4        # -> .work/grasp/heads.npz
    python tools/train_heads.py --task grasp --heads 7 --extend   # the bundle's 4, plus 3 trained here
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import train as T  # noqa: E402


def hidden_states(model, seq: np.ndarray, batch: int = 512) -> np.ndarray:
    """The target's final (normed) hidden states [N, L, hidden] for token sequences [N, L]."""
    import torch

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
        import torch

        n_out, hidden = lm_head.shape
        self.w1 = torch.zeros(k, hidden, hidden, requires_grad=True)  # [K, H_out, H_in]
        self.w2 = torch.tensor(np.repeat(lm_head[None], k, 0), requires_grad=True)  # [K, n_out, H]

    def logits(self, h):  # h [..., H] -> [..., K, n_out]
        import torch

        hj = h[..., None, :] + torch.nn.functional.silu(torch.einsum("koi,...i->...ko", self.w1, h))
        return torch.einsum("kvh,...kh->...kv", self.w2, hj)

    def loss(self, h, labels, weights=None):
        """Cross-entropy of every head (labels [..., K], -100 = none), each weighted (default 1)."""
        import torch

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
    import torch

    n, n_act = actions.shape
    labels = torch.full((n, n_act, k), -100, dtype=torch.long)
    for j in range(1, k + 1):
        labels[:, :n_act - j, j - 1] = actions[:, j:] - lo
    return labels


def train_heads(h: np.ndarray, labels: np.ndarray, lm_head: np.ndarray, steps: int, lr: float,
                batch: int, seed: int = 0) -> tuple[Heads, dict]:
    import torch

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
            print(f"heads step {step}/{steps} loss {loss.item():.4f} {time.monotonic() - t0:.0f}s", flush=True)
    return heads, {"steps": steps, "train_s": round(time.monotonic() - t0, 1), "final_loss": loss.item()}


def head_accuracy(heads: Heads, h: np.ndarray, labels: np.ndarray) -> list[float]:
    """Per head: the share of its labelled positions where its argmax is the target's token."""
    import torch

    with torch.no_grad():
        pred = heads.logits(torch.from_numpy(h)).argmax(-1).numpy()  # [M, K]
    ok = labels != -100
    return [float((pred[:, j] == labels[:, j])[ok[:, j]].mean()) for j in range(labels.shape[1])]


def target_from_bundle(bundle_dir: Path, work: Path):
    """The bundle's fp32 target as a transformers model: its weights read back from the ONNX file
    (sol_control.bench.peers.hf_folder, bit-identical), so heads fit exactly the target that ships."""
    from sol_control.bench.peers.hf_folder import convert_bundle

    folder = work / "hf_from_bundle"
    if not (folder / "target" / "config.json").is_file():
        convert_bundle(bundle_dir, folder)
    return T.load_model(folder / "target")


def build_heads(task: str, bundle_dir: Path, work: Path, k: int, steps: int, n_train: int = 16000,
                lr: float = 3e-3, batch: int = 512, extend: bool = False) -> dict:
    """Train K heads on the bundle's target; write work/heads.npz and return the training report.
    `extend`: keep the bundle's own heads (trained with the target) and train only heads
    k_bundle + 1 .. K on top of them."""
    keep = None
    if extend:
        from sol_control.bundle import Bundle
        from sol_control.graph.from_onnx import read_heads

        m = Bundle.load(bundle_dir).manifest
        keep = read_heads(bundle_dir / m.target.fused["fp32"])
    return fit_heads(task, target_from_bundle(bundle_dir, work), work, k, steps, n_train, lr, batch, keep)


def target_tag(target) -> str:
    """12 hex digits of sha256 over the target's weights: greedy labels cached under this tag are
    never reused for a retrained target."""
    h = hashlib.sha256()
    for name, tensor in sorted(target.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().numpy().tobytes())
    return h.hexdigest()[:12]


def fit_heads(task: str, target, work: Path, k: int, steps: int, n_train: int = 16000, lr: float = 3e-3,
              batch: int = 512, keep=None) -> dict:
    """K heads on a frozen transformers `target`, labelled with its own greedy continuations of the
    split's prefixes -> work/heads.npz. `keep` (DraftHeads, k_keep < K) stay as they are in front:
    only heads k_keep + 1 .. K are trained (each head is independent of the others)."""
    lo, hi = T.layout(task)["vocab"]["action"]
    first = 1 + (keep.k if keep is not None else 0)
    if first > k:
        raise ValueError(f"asked for {k} heads, the bundle already has {first - 1}")
    lm_head = target.lm_head.weight.detach().numpy()[lo:hi].astype(np.float32)  # [n_out, H]
    tag = target_tag(target)
    examples = {}
    for split, n in (("train", n_train), ("test", 512)):
        prefix = T.build_split(task, split, n)["prefix"]
        cache = work / f"heads_greedy_{split}_{len(prefix)}_{tag}.npy"
        if not cache.exists():
            np.save(cache, T.greedy_batch(target, prefix, len(T.layout(task)["actions"])))
        acts = np.load(cache, allow_pickle=False)
        hidden = hidden_states(target, np.concatenate([prefix, acts], axis=1))
        examples[split] = head_examples(hidden, acts, prefix.shape[1], k - first + 1, lo, first)
    heads, info = train_heads(*examples["train"], lm_head, steps, lr, batch)
    arrays = heads.arrays()
    if keep is not None:
        arrays = {"w1": np.concatenate([keep.w1, arrays["w1"]]), "w2": np.concatenate([keep.w2, arrays["w2"]])}
    info.update(heads=k, trained_heads=list(range(first, k + 1)), token_offset=int(lo), n_out=int(hi - lo),
                test_accuracy=head_accuracy(heads, *examples["test"]),
                train_accuracy=head_accuracy(heads, *examples["train"]))
    np.savez(work / "heads.npz", **arrays, token_offset=np.int64(lo))
    (work / "heads_train.json").write_text(json.dumps(info, indent=2))
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["qc", "grasp"], required=True)
    ap.add_argument("--bundle", type=Path, default=None, help="bundle folder (default: models/<task>)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--extend", action="store_true",
                    help="keep the bundle's heads and train only the ones after them, up to --heads")
    args = ap.parse_args(argv)
    work = T.WORK / args.task
    work.mkdir(parents=True, exist_ok=True)
    bundle = args.bundle or ROOT / "models" / args.task
    print(json.dumps(build_heads(args.task, bundle, work, args.heads, args.steps, lr=args.lr,
                                        extend=args.extend), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
