"""Dev-only (torch): token layout, cached datasets, and training of the target and draft decoders.

Data: every scene comes from `sol_control.tasks.{qc,grasp}.make_sample(split, index)` (deterministic
by seed); the prefix is `ObservationTokenizer.encode`, the action tokens are the analytic teacher's
label through `ActionTokenizer.encode`. Token arrays are cached as .npy under .work/data/.

Training (sol_control/train/: the token layout, the models and the loop, shared with `sol-control
train`): `LlamaForCausalLM` on prefix + action sequences (all the same length per task), loss only
on the action tokens, AdamW with warmup + cosine. The draft is distilled on the target's own greedy
outputs for the training prefixes (so acceptance is high).

    python tools/train.py data   --task qc --split train --n 12000
    python tools/train.py target --task qc --steps 3000
    python tools/train.py draft  --task qc --steps 2000
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sol_control.perception import ObservationTokenizer  # noqa: E402
from sol_control.tasks import grasp, qc  # noqa: E402
from sol_control.tasks.common import BOS, SEP  # noqa: E402
from sol_control.train.layout import action_tokenizer, layout  # noqa: E402,F401
from sol_control.train.loop import train  # noqa: E402,F401
from sol_control.train.model import (DRAFT_ARCH, MAX_CONTEXT, TARGET_ARCH, greedy_batch, load_model,  # noqa: E402,F401
                                     make_model, n_params)

WORK = ROOT / ".work"
TASKS = {"qc": qc, "grasp": grasp}


# ---- datasets ------------------------------------------------------------------------------------
def _one(args: tuple[str, str, int]) -> tuple[np.ndarray, list[int]] | None:
    task, split, index = args
    lay = _LAYOUT_CACHE.setdefault(task, (ObservationTokenizer(layout(task)["observation"], BOS, SEP),
                                             action_tokenizer(task)))
    obs_tok, act_tok = lay
    s = TASKS[task].make_sample(split, index)
    try:
        prefix = obs_tok.encode(s.image, getattr(s, "joints_rad", None))
    except ValueError:
        return None
    return prefix, act_tok.encode(s.label, prefix)


_LAYOUT_CACHE: dict = {}


def build_split(task: str, split: str, n: int, workers: int = 2) -> dict[str, np.ndarray]:
    """Cached token arrays: prefix [n, P] int64, actions [n, A] int64, index [n] (scene index)."""
    path = WORK / "data" / f"{task}_{split}_{n}.npz"
    if path.exists():
        d = np.load(path, allow_pickle=False)
        return {k: d[k] for k in d.files}
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    jobs = [(task, split, i) for i in range(n)]
    if workers > 1:
        with Pool(workers) as pool:
            rows = pool.map(_one, jobs, chunksize=64)
    else:
        rows = [_one(j) for j in jobs]
    keep = [i for i, r in enumerate(rows) if r is not None]
    out = {"prefix": np.stack([rows[i][0] for i in keep]).astype(np.int64),
           "actions": np.asarray([rows[i][1] for i in keep], np.int64), "index": np.asarray(keep, np.int64)}
    np.savez(path, **out)
    print(f"data {task}/{split}: {len(keep)}/{n} scenes in {time.monotonic() - t0:.0f} s -> {path}", flush=True)
    return out


def extra_prefixes(task: str, start: int, n: int, workers: int = 2) -> np.ndarray:
    """Prefixes of training scenes start..start+n-1 (no labels needed: draft distillation)."""
    if n <= 0:
        return np.zeros((0, layout(task)["observation"]["prefix_len"]), np.int64)
    path = WORK / "data" / f"{task}_train_extra_{start}_{n}.npy"
    if path.exists():
        return np.load(path, allow_pickle=False)
    jobs = [(task, "train", i) for i in range(start, start + n)]
    if workers > 1:
        with Pool(workers) as pool:
            rows = pool.map(_one, jobs, chunksize=64)
    else:
        rows = [_one(j) for j in jobs]
    out = np.stack([r[0] for r in rows if r is not None]).astype(np.int64)
    np.save(path, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["data", "target", "draft"])
    ap.add_argument("--task", choices=["qc", "grasp"], required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--n", type=int, default=12000)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    out = WORK / args.task
    out.mkdir(parents=True, exist_ok=True)
    if args.stage == "data":
        build_split(args.task, args.split, args.n, args.workers)
        return 0
    data = build_split(args.task, "train", args.n, args.workers)
    if args.stage == "target":
        model = make_model(args.task, TARGET_ARCH)
        info = train(model, data, args.steps, args.lr, args.batch, WORK / "train.log", out / "target", "target")
    else:
        target = load_model(out / "target")
        n_act = data["actions"].shape[1]
        cache = out / "target_greedy.npy"
        if cache.exists():
            acts = np.load(cache, allow_pickle=False)
        else:
            acts = greedy_batch(target, data["prefix"], n_act)
            np.save(cache, acts)
        agree = float((acts == data["actions"]).mean())
        model = make_model(args.task, DRAFT_ARCH, seed=1)
        info = train(model, {"prefix": data["prefix"], "actions": acts}, args.steps, args.lr, args.batch,
                     WORK / "train.log", out / "draft", "draft")
        info["target_teacher_token_agreement"] = agree
    info["params"] = n_params(model)
    (out / f"{args.stage}_train.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
