"""Dev-only (torch): token layout, cached datasets, and training of the target and draft decoders.

Data: every scene comes from `sol_control.tasks.{qc,grasp}.make_sample(split, index)` (deterministic
by seed); the prefix is `ObservationTokenizer.encode`, the action tokens are the analytic teacher's
label through `ActionTokenizer.encode`. Token arrays are cached as .npy under .work/data/.

Training: `LlamaForCausalLM` on prefix + action sequences (all the same length per task), loss only
on the action tokens, AdamW with warmup + cosine. The draft is distilled on the target's own greedy
outputs for the training prefixes (so acceptance is high).

    python tools/train.py data   --task qc --split train --n 12000
    python tools/train.py target --task qc --steps 3000
    python tools/train.py draft  --task qc --steps 2000
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sol_control.actions import ActionTokenizer  # noqa: E402
from sol_control.bundle import ActionField  # noqa: E402
from sol_control.perception import ObservationTokenizer  # noqa: E402
from sol_control.tasks import common, grasp, qc  # noqa: E402
from sol_control.tasks.common import BOS, EOS, SEP, feature_config  # noqa: E402

WORK = ROOT / ".work"
TASKS = {"qc": qc, "grasp": grasp}

# Target: sized so both bundles (fp32 + int8 + int4 + draft, two tasks) stay under 100 MB in all.
TARGET_ARCH = dict(hidden_size=256, intermediate_size=640, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64)
DRAFT_ARCH = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64)
MAX_CONTEXT = 64


# ---- token layout --------------------------------------------------------------------------------
def layout(task: str) -> dict:
    """Vocabulary, observation config and action fields of a task's bundle."""
    obs = feature_config(task)
    a0 = obs["token_range"][1]
    fields = []
    if task == "qc":
        fields.append(dict(name="defect", kind="categorical", token_offset=a0, size=len(common.QC_DEFECTS),
                           labels=list(common.QC_DEFECTS)))
        bins0 = a0 + len(common.QC_DEFECTS)
        for name in common.QC_FIELDS[1:]:
            unit, low, high, tol = common.QC_RANGES[name]
            fields.append(dict(name=name, kind="bins", token_offset=bins0, size=common.ACTION_BINS,
                               unit=unit, low=low, high=high, tolerance=tol))
        a1 = bins0 + common.ACTION_BINS
    else:
        for name in common.GRASP_FIELDS:
            unit, low, high, tol = common.GRASP_RANGES[name]
            fields.append(dict(name=name, kind="bins", token_offset=a0, size=common.ACTION_BINS,
                               unit=unit, low=low, high=high, tolerance=tol))
        a1 = a0 + common.ACTION_BINS
    size = int(math.ceil(a1 / 16) * 16)
    vocab = {"size": size, "pad": 0, "bos": BOS, "eos": EOS, "sep": SEP, "observation": list(obs["token_range"]),
             "action": [a0, a1]}
    return {"vocab": vocab, "observation": obs, "actions": fields}


def action_tokenizer(task: str) -> ActionTokenizer:
    return ActionTokenizer(task, tuple(ActionField(**f) for f in layout(task)["actions"]))


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
    return prefix, act_tok.encode(s.label)


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


# ---- models --------------------------------------------------------------------------------------
def make_model(task: str, arch: dict, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    lay = layout(task)
    cfg = LlamaConfig(vocab_size=lay["vocab"]["size"], max_position_embeddings=MAX_CONTEXT, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, attention_bias=False, mlp_bias=False, **arch)
    model = LlamaForCausalLM(cfg)
    _ordinal_init(model, lay)
    return model


def _ordinal_init(model, lay: dict) -> None:
    """Give neighbouring bins of every ordinal range (observation features, action bins) similar
    input/output embeddings (a few low-frequency sin/cos components), so nearby values share what
    they learn."""
    import torch

    ranges = [(f["offset"], f["size"]) for f in lay["observation"]["features"] if f["size"] >= 8]
    bins = [(f["token_offset"], f["size"]) for f in lay["actions"] if f["kind"] == "bins"]
    ranges += sorted(set(bins))
    n_freq = 8
    with torch.no_grad():
        for emb in (model.get_input_embeddings().weight, model.lm_head.weight):
            std = float(emb.std())
            for off, size in ranges:
                b = torch.arange(size, dtype=torch.float32)[:, None]
                k = 2.0 ** torch.arange(n_freq, dtype=torch.float32)[None, :]  # 1, 2, 4, ... 128
                ang = math.pi * b / size * k
                feats = torch.cat([torch.sin(ang), torch.cos(ang)], dim=1) * std * 2.0  # [size, 16]
                emb[off:off + size, :2 * n_freq] = feats


def _sequences(data: dict[str, np.ndarray]):
    import torch

    seq = torch.from_numpy(np.concatenate([data["prefix"], data["actions"]], axis=1))  # [N, P+A]
    return seq, data["prefix"].shape[1]


def train(model, data: dict[str, np.ndarray], steps: int, lr: float, batch: int, log_path: Path,
          ckpt_dir: Path | None = None, label: str = "", heads=None, heads_weight: float = 0.5,
          action_offset: int = 0) -> dict:
    """Train on the action tokens. With `heads` (train_heads.Heads) the draft heads learn with the
    target (multi-token prediction): loss = LM loss + heads_weight x the heads' loss, so the
    target's hidden state learns to carry what the next few tokens need. `action_offset`: the first
    action token id (the heads predict over the action tokens only)."""
    import torch

    from train_heads import action_labels

    torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", "2")))
    seq, p = _sequences(data)
    n, length = seq.shape
    inputs, targets = seq[:, :-1], seq[:, 1:].clone()
    targets[:, :p - 1] = -100  # loss only on action tokens
    head_targets = None
    if heads is not None:
        head_targets = action_labels(seq[:, p:], heads.w1.shape[0], action_offset)  # [N, A, K]
    params = list(model.parameters()) + (heads.params() if heads is not None else [])
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    g = torch.Generator().manual_seed(1)
    model.train()
    t0 = time.monotonic()
    hist = []
    log = open(log_path, "a")
    for step in range(steps):
        idx = torch.randint(0, n, (batch,), generator=g)
        hidden = model.model(input_ids=inputs[idx], use_cache=False).last_hidden_state  # [B, L-1, H]
        logits = model.lm_head(hidden[:, p - 1:])  # [B, A, V]: only positions that predict actions
        tgt = targets[idx][:, p - 1:]  # [B, A]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        if heads is not None:
            head_loss = heads.loss(hidden[:, p - 1:], head_targets[idx])
            loss = loss + heads_weight * head_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            with torch.no_grad():
                acc = (logits.argmax(-1) == tgt).float().mean().item()
            hist.append((step, float(loss), acc))
            msg = f"{label} step {step}/{steps} loss {loss.item():.4f} tok_acc {acc:.4f} {time.monotonic() - t0:.0f}s"
            print(msg, file=log, flush=True)
        if ckpt_dir is not None and step and step % 500 == 0:
            model.save_pretrained(ckpt_dir)
    model.eval()
    if ckpt_dir is not None:
        model.save_pretrained(ckpt_dir)
    log.close()
    return {"steps": steps, "train_s": round(time.monotonic() - t0, 1), "final_loss": hist[-1][1],
            "final_tok_acc": hist[-1][2]}


def greedy_batch(model, prefix: np.ndarray, n_new: int, batch: int = 256) -> np.ndarray:
    """Greedy continuations [N, n_new] of equal-length prefixes, with a KV cache, in batches."""
    import torch

    outs = []
    with torch.no_grad():
        for i in range(0, len(prefix), batch):
            ids = torch.from_numpy(prefix[i:i + batch])
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                                 min_new_tokens=n_new, do_sample=False, pad_token_id=0, eos_token_id=None)
            outs.append(gen[:, prefix.shape[1]:].numpy())
    return np.concatenate(outs).astype(np.int64)


def load_model(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path).eval()


def n_params(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


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
