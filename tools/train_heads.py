"""Draft heads on a shipped target, trained on its own greedy answers to synthetic training scenes
(dev-only, torch). The heads and how they learn (with the target, or on a frozen one, Medusa
style) are in sol_control/train/heads.py; this command labels the synthetic splits for them.

Two ways to train them:
- with the target (what `make models` does): `Heads` passed to the training loop
  (sol_control.train.loop, `heads=`, `heads_weight=`) on the teacher's tokens;
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
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import train as T  # noqa: E402

from sol_control.train.heads import Heads, first_trained, fit_frozen  # noqa: E402,F401
from sol_control.train.model import target_from_bundle  # noqa: E402


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
    split's prefixes -> work/heads.npz (sol_control.train.heads.fit_frozen). `keep` (DraftHeads,
    k_keep < K) stay as they are in front: only heads k_keep + 1 .. K are trained."""
    lo, hi = T.layout(task)["vocab"]["action"]
    first_trained(k, keep)
    tag = target_tag(target)
    pairs = {}
    for split, n in (("train", n_train), ("test", 512)):
        prefix = T.build_split(task, split, n)["prefix"]
        cache = work / f"heads_greedy_{split}_{len(prefix)}_{tag}.npy"
        if not cache.exists():
            np.save(cache, T.greedy_batch(target, prefix, len(T.layout(task)["actions"])))
        pairs[split] = (prefix, np.load(cache, allow_pickle=False))
    arrays, info = fit_frozen(target, pairs["train"], pairs["test"], k, (lo, hi), steps, lr, batch, keep)
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
