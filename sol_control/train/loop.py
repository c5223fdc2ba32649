"""Training on the action tokens (torch): one `Trainer` holds a run's state, so a run can stop at a
checkpoint and go on from it.

`LlamaForCausalLM` on prefix + action sequences (all the same length), loss on the action tokens
only, AdamW with warmup + cosine, batches drawn with replacement from a generator seeded 1. With
`heads` (heads.Heads) the draft heads learn with the target (multi-token prediction): loss = LM loss
+ heads_weight x the heads' loss, so the target's hidden state learns to carry what the next few
tokens need.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from .heads import Heads, action_labels


def _sequences(data: dict[str, np.ndarray]) -> tuple[torch.Tensor, int]:
    seq = torch.from_numpy(np.concatenate([data["prefix"], data["actions"]], axis=1))  # [N, P+A]
    return seq, data["prefix"].shape[1]


class Trainer:
    """`steps` optimizer steps on `data` (prefix [N, P], actions [N, A] int64); `next()` runs one.
    `action_offset`: the first action token id (the heads predict over the action tokens only)."""

    def __init__(self, model, data: dict[str, np.ndarray], steps: int, lr: float, batch: int,
                 heads: Heads | None = None, heads_weight: float = 0.5, action_offset: int = 0):
        torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", "2")))
        seq, self.p = _sequences(data)
        self.model, self.heads, self.heads_weight, self.batch, self.steps = model, heads, heads_weight, batch, steps
        self.inputs, self.targets = seq[:, :-1], seq[:, 1:].clone()  # [N, L-1]
        self.targets[:, :self.p - 1] = -100  # loss only on action tokens
        self.head_targets = None
        if heads is not None:
            self.head_targets = action_labels(seq[:, self.p:], heads.w1.shape[0], action_offset)  # [N, A, K]
        self.params = list(model.parameters()) + (heads.params() if heads is not None else [])
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
        warm = max(1, steps // 20)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
        self.gen = torch.Generator().manual_seed(1)
        self.step, self.hist = 0, []
        model.train()

    def next(self) -> tuple[float, float]:
        """One optimizer step on a random batch: (its loss, its action-token accuracy)."""
        p = self.p
        idx = torch.randint(0, len(self.inputs), (self.batch,), generator=self.gen)
        hidden = self.model.model(input_ids=self.inputs[idx], use_cache=False).last_hidden_state  # [B, L-1, H]
        logits = self.model.lm_head(hidden[:, p - 1:])  # [B, A, V]: only positions that predict actions
        tgt = self.targets[idx][:, p - 1:]  # [B, A]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        if self.heads is not None:
            loss = loss + self.heads_weight * self.heads.loss(hidden[:, p - 1:], self.head_targets[idx])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.step += 1
        with torch.no_grad():
            acc = (logits.argmax(-1) == tgt).float().mean().item()
        return loss.item(), acc

    def state_dict(self) -> dict:
        heads = {} if self.heads is None else {"w1": self.heads.w1.detach(), "w2": self.heads.w2.detach()}
        return {"model": self.model.state_dict(), "heads": heads, "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(), "gen": self.gen.get_state(), "step": self.step, "hist": self.hist}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        if self.heads is not None:
            with torch.no_grad():
                self.heads.w1.copy_(state["heads"]["w1"])
                self.heads.w2.copy_(state["heads"]["w2"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.gen.set_state(state["gen"])
        self.step, self.hist = int(state["step"]), [tuple(h) for h in state["hist"]]


def save_checkpoint(trainer: Trainer, path: Path) -> None:
    """The run's whole state, written next to `path` first and renamed (never half a checkpoint)."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(trainer.state_dict(), tmp)
    os.replace(tmp, path)


def load_checkpoint(trainer: Trainer, path: Path) -> None:
    """A checkpoint this process's own `save_checkpoint` wrote (tensors and plain values only)."""
    trainer.load_state_dict(torch.load(path, weights_only=True))


def train(model, data: dict[str, np.ndarray], steps: int, lr: float, batch: int, log_path: Path,
          ckpt_dir: Path | None = None, label: str = "", heads: Heads | None = None, heads_weight: float = 0.5,
          action_offset: int = 0) -> dict:
    """`steps` steps, a line in `log_path` every 50; `ckpt_dir`: the model saved there every 500
    steps and at the end (`save_pretrained`)."""
    run = Trainer(model, data, steps, lr, batch, heads, heads_weight, action_offset)
    t0 = time.monotonic()
    with open(log_path, "a") as log:
        for step in range(steps):
            loss, acc = run.next()
            if step % 50 == 0 or step == steps - 1:
                run.hist.append((step, loss, acc))
                print(f"{label} step {step}/{steps} loss {loss:.4f} tok_acc {acc:.4f} {time.monotonic() - t0:.0f}s",
                      file=log, flush=True)
            if ckpt_dir is not None and step and step % 500 == 0:
                model.save_pretrained(ckpt_dir)
    model.eval()
    if ckpt_dir is not None:
        model.save_pretrained(ckpt_dir)
    return {"steps": steps, "train_s": round(time.monotonic() - t0, 1), "final_loss": run.hist[-1][1],
            "final_tok_acc": run.hist[-1][2]}
