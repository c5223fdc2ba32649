"""Draft heads for SmolLM2-135M-Instruct (Medusa-1 on the frozen target, dev-only, torch), trained on
the target's own greedy answers (tools/lm_selfdistill.py), so that they guess what it will say.

Head j (1..K) reads the final normed hidden state h of the row whose argmax is answer token i and
guesses answer token i + j, through the model's own (tied) lm_head E:

    h_j  = h + SiLU(W1_j h)       # W1_j [hidden, hidden], starts at 0: every head starts as "the next token"
    id_j = argmax(E h_j)          # E [vocab, hidden], frozen; int8 per output channel as in the int8 graph

Labels are the target's tokens at i + j (`head_labels`), the loss the mean over heads of each one's
cross-entropy. The heads are independent (head j's loss reaches only W1_j, and Adam's steps do not
depend on a loss weight), so one K-head run also gives the first k heads for every k < K. The run
reports, on a held-out share of the self-distilled answers (never
the benchmark workload), each head's top-1 accuracy and the tokens a target call would emit:
1 + sum_j P(heads 1..j all right).

    python tools/train_lm_heads.py train --heads 5 --save-k 3,4,5   # -> .work/lm/heads/smollm2_heads_k{3,4,5}.npz
    python tools/train_lm_heads.py eval --base B0 --bundle k4=B4 ...  # the workload, int8, 1 thread

`eval` runs `sol-control generate` (in process, `--json`) on the benchmark workload: per prompt plain
greedy on a bundle without heads, then each bundle with heads; tokens must be equal (lossless).

h rows come from the data (fp32 forward of the generation, stored float16). With `--int8` (default)
training sees the int8 graph's numbers: W1 and E quantized per output channel (symmetric, |max|/127),
h and h_j rounded per row as the graph rounds them (ROW_LEVELS) before each product (straight-through
gradients).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import lm_selfdistill as D  # noqa: E402

from sol_control.graph.llama import ROW_LEVELS  # noqa: E402

IGNORE = -100


def head_labels(answers: np.ndarray, lengths: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, labels [M, k]) for answers laid end to end (`answers` flat [sum(lengths)]): the row of
    answer token i (flat index g) gets answer token i + j as head j's label, IGNORE past the answer's
    end; rows with no label at all (each answer's last token) are left out."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)  # [N] flat start of each token's answer
    pos = np.arange(len(answers)) - starts  # [N] index inside its answer
    ends = np.repeat(lengths, lengths)
    labels = np.full((len(answers), k), IGNORE, np.int64)
    for j in range(1, k + 1):
        ok = pos + j < ends
        labels[ok, j - 1] = answers[np.nonzero(ok)[0] + j]
    keep = labels[:, 0] != IGNORE
    return np.nonzero(keep)[0], labels[keep]


def split_rows(ex: D.Examples, every: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, validation) over the flat answer rows: every `every`-th example is validation."""
    lengths = ex.answer_lengths()
    val_example = (np.arange(len(ex)) % every) == every - 1
    val = np.repeat(val_example, lengths)
    return ~val, val


def answers_flat(ex: D.Examples) -> np.ndarray:
    """Every answer's tokens laid end to end [sum of answer lengths], aligned with ex.hidden."""
    return np.concatenate([ex.answer(i) for i in range(len(ex))]).astype(np.int64)


def int8_lm_head(embed: np.ndarray) -> np.ndarray:
    """E as the int8 graph holds it: per-channel symmetric int8, dequantized [vocab, hidden]."""
    from sol_control.graph.quant import per_channel_int8

    q, scales = per_channel_int8(embed)
    return (q.astype(np.float32) * scales.reshape(-1, 1)).astype(np.float32)


def _vocab_ce():
    """An autograd Function: weighted cross-entropy of rows x [M, H] through a head E [V, H] (`head_dtype`),
    chunked so the [rows, V] logits never exist at once; the gradient is made in the forward pass
    ((softmax - onehot) @ E), which is 2-3x faster on CPU than autograd through a [M, V] product."""
    import torch

    class VocabCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, head, labels, row_w, chunk=512):
            loss, grad = x.new_zeros(()), torch.empty_like(x)
            for i in range(0, len(x), chunk):
                y = (x[i:i + chunk].to(head.dtype) @ head.T).float()  # [c, V]
                lse = torch.logsumexp(y, -1, keepdim=True)
                lab, w = labels[i:i + chunk, None], row_w[i:i + chunk, None]
                loss += ((lse - y.gather(1, lab)) * w).sum()
                p = (y - lse).exp_()
                p.scatter_add_(1, lab, -torch.ones_like(w))
                grad[i:i + chunk] = ((p * w).to(head.dtype) @ head).float()
            ctx.save_for_backward(grad)
            return loss

        @staticmethod
        def backward(ctx, g):
            (grad,) = ctx.saved_tensors
            return g * grad, None, None, None, None

    return VocabCE


def head_dtype():
    """bfloat16 for the [rows, vocab] products where the CPU has bf16 instructions (avx512_bf16,
    amx_bf16), else float32: on an AVX2 host torch emulates bf16, 6x slower than fp32 ([512, 576] x
    [576, 8000])."""
    import torch

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32


def _fake_int8(x, levels: int = 127):
    """x rounded on a symmetric scale per last-axis row (|row max| / levels), as the graph's
    per-channel weights (127) and per-row activations (ROW_LEVELS); the gradient passes straight
    through."""
    scale = x.detach().abs().amax(-1, keepdim=True).clamp_min(1e-30) / levels
    return x + ((x / scale).round().clamp(-levels, levels) * scale - x).detach()


class LMHeads:
    """K residual heads on the frozen lm_head (torch). Training reads the head's rows for `vocab`
    only (the tokens of the data, see `train`); prediction always spans the whole vocabulary.
    `chain`: each head also reads the (tied) embedding e of the token before its guess,
    h_j = h + SiLU(W1_j h + Wp_j e) (DraftHeads.w_prev); training feeds the true tokens (teacher
    forcing), which is what the graph feeds whenever the guesses before are right."""

    def __init__(self, lm_head: np.ndarray, k: int, int8: bool = True, chain: bool = False):
        import torch

        vocab, hidden = lm_head.shape
        self.w1 = torch.zeros(k, hidden, hidden, requires_grad=True)  # [K, H_out, H_in]
        self.w_prev = torch.zeros(k, hidden, hidden, requires_grad=True) if chain else None
        self.lm_head = torch.from_numpy(lm_head)  # [V, H], frozen; tied: the embedding too
        self.int8 = int8
        self.ce = _vocab_ce()

    @property
    def params(self) -> list:
        return [self.w1] + ([self.w_prev] if self.w_prev is not None else [])

    def _q(self, x, levels: int = 127):
        return _fake_int8(x, levels) if self.int8 else x

    def hidden(self, h, prev=None, heads: slice = slice(None)):
        """h [B, H] -> h_j [B, K', H] of `heads` (default all K); prev [B, K'] the token before each
        head's guess (chain only). With int8, as the int8 graph: weights per output channel, inputs
        and h_j per row (straight-through)."""
        import torch

        pre = torch.einsum("koi,bi->bko", self._q(self.w1[heads]), self._q(h, ROW_LEVELS))
        if self.w_prev is not None:
            pre = pre + torch.einsum("koi,bki->bko", self._q(self.w_prev[heads]),
                                     self._q(self.lm_head[prev], ROW_LEVELS))
        hj = h[:, None, :] + torch.nn.functional.silu(pre)
        return self._q(hj, ROW_LEVELS)

    def loss(self, h, labels, head_e, prev=None):
        """The mean over heads of each head's mean cross-entropy (labels [B, K] index head_e's
        rows, IGNORE = none)."""
        b, k = labels.shape
        ok = labels != IGNORE
        row_w = (ok.float() / ok.sum(0).clamp_min(1).float()[None, :] / k).reshape(-1)  # [B*K]
        x = self.hidden(h, prev).reshape(b * k, -1)
        loss = self.ce.apply(x, head_e, labels.clamp_min(0).reshape(-1), row_w)
        return loss

    def predict(self, h, first: np.ndarray, batch: int = 1024) -> np.ndarray:
        """Each head's argmax over the whole vocabulary [M, K] (fp32 product; with int8, the numbers
        of the int8 graph up to its integer accumulation). Chained heads run as the graph runs them:
        head 1 reads `first` [M] (the row's own token), head j head j - 1's guess."""
        import torch

        out, k = [], self.w1.shape[0]
        with torch.no_grad():
            for i in range(0, len(h), batch):
                hb = torch.from_numpy(h[i:i + batch].astype(np.float32))
                if self.w_prev is None:
                    out.append((self.hidden(hb) @ self.lm_head.T).argmax(-1).numpy())
                    continue
                guess, guesses = torch.from_numpy(first[i:i + batch]).long(), []
                for j in range(k):  # head j's guess becomes head j + 1's input
                    guess = (self.hidden(hb, guess[:, None], slice(j, j + 1))[:, 0] @ self.lm_head.T).argmax(-1)
                    guesses.append(guess)
                out.append(torch.stack(guesses, 1).numpy())
        return np.concatenate(out)

    def draft_heads(self, k: int | None = None):
        from sol_control.graph.weights import DraftHeads

        w1, wp = (None if w is None else w.detach().numpy()[:k].astype(np.float32) for w in (self.w1, self.w_prev))
        return DraftHeads(w1, None, 0, wp)


def prev_tokens(answers: np.ndarray, rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[M, K] the token before each head's label: the row's own answer token, then labels 1..K-1
    (0 where the answer has ended: that head has no label either)."""
    return np.concatenate([answers[rows][:, None], np.maximum(labels[:, :-1], 0)], 1)


def acceptance(pred: np.ndarray, labels: np.ndarray) -> dict:
    """Per head top-1 accuracy (on its labelled rows) and the mean tokens a target call emits, per K:
    1 + sum_j P(heads 1..j all right) (a missing label counts as a miss: the answer had ended)."""
    right = pred == labels  # [M, K]; IGNORE never equals a token
    ok = labels != IGNORE
    chain = np.cumprod(right, axis=1)  # heads 1..j all right
    return {"accuracy": [round(float(right[ok[:, j], j].mean()), 4) for j in range(labels.shape[1])],
            "tokens_per_call": [round(1.0 + float(chain[:, :k].sum(1).mean()), 4)
                                for k in range(1, labels.shape[1] + 1)]}


def train(heads: LMHeads, h: np.ndarray, labels: np.ndarray, prev: np.ndarray, steps: int, lr: float, batch: int,
          seed: int = 0, log_every: int = 50) -> dict:
    """AdamW on W1 (warm-up, cosine), rows drawn at random; the softmax spans the tokens that occur as
    labels (`vocab`), the rest of the vocabulary never being a target."""
    import torch

    torch.manual_seed(seed)
    vocab = np.unique(labels[labels != IGNORE])  # [V'] sorted token ids
    remap = np.full(heads.lm_head.shape[0], IGNORE, np.int64)
    remap[vocab] = np.arange(len(vocab))
    local = np.where(labels == IGNORE, IGNORE, remap[np.maximum(labels, 0)])  # labels in vocab's order
    head_e = heads.lm_head[torch.from_numpy(vocab)].to(head_dtype()).contiguous()  # [V', H]
    opt = torch.optim.AdamW(heads.params, lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    rng = np.random.default_rng(seed)
    t0, smooth = time.monotonic(), None
    for step in range(steps):
        idx = np.sort(rng.integers(0, len(h), batch))
        loss = heads.loss(torch.from_numpy(h[idx].astype(np.float32)), torch.from_numpy(local[idx]), head_e,
                          torch.from_numpy(prev[idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step}/{steps} loss {loss.item():.4f} (smoothed {smooth:.4f}) "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
    return {"steps": steps, "lr": lr, "batch": batch, "train_vocab": int(len(vocab)),
            "train_s": round(time.monotonic() - t0, 1), "final_loss_smoothed": round(smooth, 4)}


# -- on the held-out workload, with our engine ------------------------------------------------
def _generate(bundle: Path, ids: list[int], max_new: int, precision: str, heads: bool, threads: int,
              lookup: int = 0) -> dict:
    """One `sol-control generate --prompt-ids ... --json` run, in process (the session opened anew)."""
    import tempfile

    from sol_control.cli import main as cli

    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "text", "w") as text:
        out = Path(tmp) / "gen.json"
        argv = ["generate", "--bundle", str(bundle), "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
                str(max_new), "--precision", precision, "--threads", str(threads), "--json", str(out)]
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):  # the answer's text, its timing line
            code = cli(argv + (["--lookup", str(lookup)] if heads else ["--no-draft"]))
        if code != 0:
            raise RuntimeError(f"generate failed: {argv}")
        return json.loads(out.read_text())


def _median(values: list[float]) -> float:
    return round(float(np.median([v for v in values if v is not None])), 2)


def evaluate(base: Path, bundles: dict[str, Path], precision: str, max_new: int, agent_max_new: int,
             threads: int, agent_rounds: int, n_prompts: int | None = None, lookup: int = 0) -> dict:
    """Per workload prompt: plain greedy on `base` (no heads in its graph), then each heads bundle;
    tokens equal (lossless), tokens per target call, decode tokens/s. Then the agent loop: each round
    the system prompt, the tool results so far and plain greedy's own answers, as a chat. `lookup` > 0
    adds a row per bundle with `generate --lookup N` (prompt-lookup guesses where the text repeats)."""
    from sol_control.bundle import Bundle
    from sol_control.lm.generate import load_tokenizer

    tok = load_tokenizer(Bundle.load(base))
    workload = json.loads(D.WORKLOAD.read_text())
    cases = [("prompt", tok.encode_chat([{"role": "user", "content": p}]), max_new)
             for p in workload["prompts"][:n_prompts]]
    loop, history = workload["agent_loop"], []
    runs = [(name, bundle, 0) for name, bundle in bundles.items()]
    runs += [(f"{name}+lookup{lookup}", bundle, lookup) for name, bundle in bundles.items() if lookup]
    rows = {name: [] for name in ["plain", *(r[0] for r in runs)]}
    for r in range(agent_rounds + len(cases)):
        if r < len(cases):
            kind, ids, n = cases[r]
        else:  # the agent loop grows with plain greedy's answers (the same as every lossless run's)
            history.append({"role": "user", "content": loop["tool_results"][r - len(cases)]})
            ids = tok.encode_chat([{"role": "system", "content": loop["system"]}, *history])
            kind, n = "agent", agent_max_new
        plain = _generate(base, ids, n, precision, False, threads)
        rows["plain"].append({"kind": kind, "tokens": len(plain["tokens"]), "tps": plain["decode_tokens_per_s"]})
        line = [f"{kind} {r:2d}: plain {plain['decode_tokens_per_s'] or 0:5.1f} tok/s, "
                f"{len(plain['tokens']):3d} tokens"]
        for name, bundle, look in runs:
            got = _generate(bundle, ids, n, precision, True, threads, look)
            rows[name].append({"kind": kind, "tps": got["decode_tokens_per_s"], "accepted": got["mean_accepted"],
                               "lossless": got["tokens"] == plain["tokens"]})
            line.append(f"{name} {got['decode_tokens_per_s'] or 0:5.1f} tok/s x{got['mean_accepted']:.2f}"
                        f"{'' if got['tokens'] == plain['tokens'] else ' DIFFERENT TOKENS'}")
        print("; ".join(line), flush=True)
        if kind == "agent":
            history.append({"role": "assistant", "content": tok.decode([t for t in plain["tokens"]
                                                                       if t not in tok.stop_ids])})
    summary = {}
    for kind in ("prompt", "agent"):
        plain = [x for x in rows["plain"] if x["kind"] == kind]
        if not plain:
            continue
        summary[kind] = {"n": len(plain), "plain_tokens_per_s": _median([x["tps"] for x in plain]),
                         "answer_tokens_median": _median([x["tokens"] for x in plain])}
        for name, _, _ in runs:
            mine = [x for x in rows[name] if x["kind"] == kind]
            summary[kind][name] = {"tokens_per_s": _median([x["tps"] for x in mine]),
                                   "mean_accepted_median": _median([x["accepted"] for x in mine]),
                                   "mean_accepted_mean": round(float(np.mean([x["accepted"] for x in mine])), 3),
                                   "lossless": f"{sum(x['lossless'] for x in mine)}/{len(mine)}"}
    return {"precision": precision, "threads": threads, "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train K heads on the self-distilled data")
    t.add_argument("--gguf", type=Path, default=D.GGUF)
    t.add_argument("--data", type=Path, default=D.DATA)
    t.add_argument("--heads", type=int, default=5)
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--batch", type=int, default=512, help="rows per step (each through K heads)")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True,
                   help="train through the int8 graph's numbers (default on)")
    t.add_argument("--chain", action="store_true",
                   help="chained heads: each also reads the embedding of the token before its guess (w_prev)")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--out", type=Path, default=ROOT / ".work/lm/heads",
                   help="folder for smollm2_heads_k{k}.npz (DraftHeads, w1 only) and train_report.json")
    t.add_argument("--save-k", default="", help="save the first k heads for each k, e.g. 3,4,5 (default: all K)")
    e = sub.add_parser("eval", help="acceptance and tokens/s on the held-out workload (sol-control generate)")
    e.add_argument("--base", type=Path, required=True, help="the same model imported without heads (plain rows)")
    e.add_argument("--bundle", action="append", required=True, help="NAME=DIR of a bundle imported with --heads")
    e.add_argument("--precision", default="int8")
    e.add_argument("--max-new-tokens", type=int, default=128)
    e.add_argument("--prompts", type=int, default=None, help="the first N workload prompts (default all 20)")
    e.add_argument("--agent-rounds", type=int, default=20, help="rounds of the workload's agent loop (0: none)")
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--lookup", type=int, default=0, help="also each bundle with generate --lookup N")
    e.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.command == "eval":
        bundles = dict(b.split("=", 1) for b in args.bundle)
        report = evaluate(args.base, {k: Path(v) for k, v in bundles.items()}, args.precision, args.max_new_tokens,
                          json.loads(D.WORKLOAD.read_text())["agent_loop"]["max_new_tokens"], args.threads,
                          args.agent_rounds, args.prompts, args.lookup)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report["summary"], indent=2))
        return 0
    return train_main(args)


def train_main(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    ex = D.load_examples(args.data)
    if ex.hidden is None:
        raise SystemExit(f"{args.data} holds no hidden rows: regenerate with tools/lm_selfdistill.py")
    answers = answers_flat(ex)
    rows, labels = head_labels(answers, ex.answer_lengths(), args.heads)
    prev = prev_tokens(answers, rows, labels)
    train_mask, val_mask = split_rows(ex)
    tr, va = rows[train_mask[rows]], rows[val_mask[rows]]
    ltr, lva = labels[train_mask[rows]], labels[val_mask[rows]]
    weights, _ = D.read_target(args.gguf)
    embed = weights.linear(weights.lm_head_name)
    lm_head = int8_lm_head(embed) if args.int8 else embed
    print(f"{len(ex)} answers, {len(tr)} train rows, {len(va)} validation rows, {time.monotonic() - t0:.0f} s",
          flush=True)
    h_tr, h_va = ex.hidden[tr], ex.hidden[va]
    heads = LMHeads(lm_head, args.heads, int8=args.int8, chain=args.chain)
    first_va = answers[va]  # each validation row's own token: the first chained head's input
    before = acceptance(heads.predict(h_va, first_va), lva)  # w1 = 0: "the next token" again
    info = train(heads, h_tr, ltr, prev[train_mask[rows]], args.steps, args.lr, args.batch)
    after = acceptance(heads.predict(h_va, first_va), lva)
    report = {"heads": args.heads, "chain": args.chain, "int8": args.int8, "answers": len(ex), "train_rows": int(len(tr)),
              "validation_rows": int(len(va)), **info, "validation_w1_zero": before, "validation": after}
    args.out.mkdir(parents=True, exist_ok=True)
    for k in [int(x) for x in args.save_k.split(",") if x.strip()] or [args.heads]:
        if not 1 <= k <= args.heads:
            raise SystemExit(f"--save-k {k}: trained {args.heads} heads")
        heads.draft_heads(k).save(args.out / f"smollm2_heads_k{k}.npz")
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
