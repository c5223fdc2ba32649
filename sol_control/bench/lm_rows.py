"""`sol-control bench lm`, the measuring: the workload, rows and runs.

A row (`row.Row`) owns its sessions: a prompt starts from an empty cache, a loop round from what the row's
previous round left, so the prefill computes only the new turn (KV kept across rounds). Plain rows
run the engine's `greedy`, speculative rows `speculate` (a draft model) or `speculate_heads` (the
target's draft heads); all of them end after a stop id (kept) or the answer budget.
Rows alternate prompt by prompt and round by round (`turns`), so a noisy neighbour slows every
row alike. A loop round's time is its generate call: the new turn's prefill on the kept cache and
the answer (rendering the template, the harness's work, is left out).

With a second import of the same GGUF in `--int4-mode symmetric` (ONNX Runtime GenAI's int4 recipe:
symmetric 4-bit blocks of 32, 4-bit head, int8 activations; imported without heads), its
SYMMETRIC_ROWS (plain, + lookup alone, or + draft with a draft model) run beside the bundle's own
under the precision label `int4-symmetric`: our engine on the int4 weights the peer runs. A third
import, the symmetric one with draft heads trained on that graph's own answers
(tools/lm_selfdistill_graph.py), adds SYMMETRIC_HEADS_ROWS under the same label.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..decoding import GuessLength, open_decoder
from ..decoding.factory import default_prefill
from . import row
from .peers.common import LMWork, next_loop_context
from .common import cpu_s, rate, rotated

WORKLOAD = Path(__file__).parent / "data" / "lm_workload.json"
PROMPT_NEW_TOKENS = 128  # the prompts' answer budget, as the peers' (bench.peers.lm); a loop answer: the workload's 64
QUICK_PROMPTS, QUICK_LOOP_ROUNDS = 3, 3  # as the peers' --quick
LOOKUP = 8  # prompt-lookup guesses of the "+ lookup" row (speculate_heads(lookup=...))
ROWS = [  # (row name, target precision, how it decodes, prompt lookup)
    ("standard", "fp32", "plain", 0),
    ("int8 plain", "int8", "plain", 0),
    ("int4 plain", "int4", "plain", 0),
    ("fp32 + draft", "fp32", "draft", 0),  # "draft": the bundle's draft model, else its draft heads
    ("int8 + draft", "int8", "draft", 0),
    ("int4 + draft", "int4", "draft", 0),
    ("int8 + draft + lookup", "int8", "draft", LOOKUP),  # heads bundles only
    ("int4 + draft + lookup", "int4", "draft", LOOKUP),
]
SYMMETRIC = "int4-symmetric"  # rows on the symmetric import's int4 graph (imported without heads)
SYMMETRIC_ROWS = [(f"{SYMMETRIC} plain", SYMMETRIC, "plain", 0),
                  (f"{SYMMETRIC} + draft", SYMMETRIC, "draft", 0),  # with --draft
                  (f"{SYMMETRIC} + lookup", SYMMETRIC, "lookup", LOOKUP)]  # "lookup": prompt lookup alone
SYMMETRIC_HEADS_ROWS = [(f"{SYMMETRIC} + draft + lookup", SYMMETRIC, "draft", LOOKUP)]  # its own heads, + lookup

_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"bench lm {time.monotonic() - _T0:7.1f} s: {msg}", file=sys.stderr, flush=True)


# ---- the workload -------------------------------------------------------------------------------

def load_workload(quick: bool, max_new_tokens: int | None = None, prompts: int | None = None,
                  loop_rounds: int | None = None) -> dict:
    """The committed workload: the first `prompts` prompts and `loop_rounds` rounds (quick: 3 and 3),
    `max_new_tokens` capping every answer."""
    w = json.loads(WORKLOAD.read_text())
    for name, value in (("--max-new-tokens", max_new_tokens), ("--prompts", prompts), ("--loop-rounds", loop_rounds)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    w["prompts"] = w["prompts"][:prompts or (QUICK_PROMPTS if quick else None)]
    loop = w["agent_loop"]
    loop["tool_results"] = loop["tool_results"][:loop_rounds or (QUICK_LOOP_ROUNDS if quick else None)]
    w.setdefault("max_new_tokens", PROMPT_NEW_TOKENS)
    if max_new_tokens is not None:
        w["max_new_tokens"] = min(w["max_new_tokens"], max_new_tokens)
        w["agent_loop"]["max_new_tokens"] = min(w["agent_loop"]["max_new_tokens"], max_new_tokens)
    return w


# ---- rows ---------------------------------------------------------------------------------------

@dataclass
class Run:
    tokens: list[int]
    ttft_ms: float
    wall_ms: float
    cpu_s: float
    target_calls: int  # decoding passes after the prefill

    @property
    def decode_tokens(self) -> int:
        """The tokens after the first (the first comes with the prefill, TTFT)."""
        return len(self.tokens) - 1

    @property
    def decode_ms(self) -> float:
        return self.wall_ms - self.ttft_ms

    @property
    def decode_tokens_per_s(self) -> float:
        return rate(self.decode_tokens, self.decode_ms) if self.decode_tokens > 0 else float("nan")


@dataclass
class Row(row.Row):
    threads: int = 1
    prompts: list[list[Run]] = field(default_factory=list)  # [repetition][prompt]
    loops: list[list[Run]] = field(default_factory=list)  # [repetition][round]
    proposed: int = 0
    source: tuple[str, str] | None = None  # (bundle folder, precision there) the target came from

    @property
    def label(self) -> str:
        return f"{self.name} @{self.threads}t"

    def generate(self, ids: list[int], max_new: int, stops: tuple[int, ...], fresh: bool) -> Run:
        """One answer after `ids`: from an empty cache (`fresh`), else reusing what the cache holds."""
        if fresh:
            self.reset()
        prefix = np.asarray(ids, np.int64)
        c0, t0 = cpu_s(), time.monotonic_ns()
        res = self.decode(prefix, max_new, stops)
        wall_ms, cpu = (time.monotonic_ns() - t0) / 1e6, cpu_s() - c0
        self.proposed += res.stats.proposed
        return Run(res.tokens, res.stats.ttft_ms, wall_ms, cpu, res.stats.verify_passes)


def make_rows(bundle: Bundle, threads: list[int], symmetric: Bundle | None = None,
              symmetric_heads: Bundle | None = None) -> tuple[list[Row], list[dict]]:
    """The rows this bundle can run, each with sessions of its own, and the skipped ones with a note.
    "draft" is the bundle's draft model when it has one (as `generate` does), else its draft heads.
    `symmetric`: the same model imported with `--int4-mode symmetric` without heads (plain calls 6 %
    cheaper, docs/LM.md); its SYMMETRIC_ROWS follow. `symmetric_heads`: that import with heads of its
    own; its SYMMETRIC_HEADS_ROWS come last."""
    sources = [(bundle, ROWS), (symmetric, SYMMETRIC_ROWS), (symmetric_heads, SYMMETRIC_HEADS_ROWS)]
    sources = [(b, specs) for b, specs in sources if b is not None]
    rows, skipped = [], []
    for t in threads:
        for b, specs in sources:
            for name, label, how, lookup in specs:
                row, note = _row(b, t, name, label, how, lookup)
                if row is None:
                    skipped.append({"name": name, "threads": t, "note": note})
                else:
                    rows.append(row)
    return rows, skipped


def _row(bundle: Bundle, t: int, name: str, label: str, how: str, lookup: int) -> tuple[Row | None, str]:
    """One row with its sessions (label: the row's precision; SYMMETRIC opens the bundle's int4), or
    (None, why it cannot run)."""
    m = bundle.manifest
    prec = "int4" if label == SYMMETRIC else label
    spec_mode = "draft" if m.draft is not None else "heads" if m.target.draft_heads else None
    if prec not in m.target.precisions:
        return None, f"the bundle has no {prec} target"
    if how == "draft" and spec_mode is None:
        return None, "the bundle has neither a draft model nor draft heads"
    if how == "draft" and lookup and spec_mode != "heads":
        return None, "prompt lookup beside a draft runs with draft heads only"
    if how == "lookup" and spec_mode is not None:
        return None, "prompt lookup alone runs on a bundle without a draft model or heads (else: '+ draft')"
    prefill = default_prefill(bundle, "target", prec)  # int4 rows: through the int8 graph where the CPU has VNNI
    r = Row(name, label, spec_mode if how == "draft" else how, threads=t, lookup=lookup, source=(str(bundle.root), prec),
            target=open_decoder(bundle, "target", prec, t, name=f"{name} @{t}t", prefill_precision=prefill))
    if r.mode == "draft":
        r.open_draft(bundle, t, f"{r.label} draft")
    if r.mode in ("heads", "lookup"):
        r.length = GuessLength()
    return r, ""


def turns(rows: list[Row], i: int) -> list[Row]:
    """Every thread group in order, each group's starting row moved on by one per turn."""
    return [r for t in sorted({r.threads for r in rows}) for r in rotated([r for r in rows if r.threads == t], i)]


# ---- measuring ----------------------------------------------------------------------------------

def run_workload(rows: list[Row], w: LMWork, reps: int) -> None:
    """`reps` times every prompt (a new conversation each), then the agent loop, its rounds' ids as
    the peers get them (`peers.lm.lm_work`: each round extends the last with the row's own answer)."""
    stops = tuple(w.stop_ids)
    for r in rows:  # warm-up: ORT allocates its arenas in the first runs
        r.generate(w.prompts[0], 8, stops, fresh=True)
    rounds = 1 + len(w.loop_turns)
    for rep in range(reps):
        for r in rows:
            r.prompts.append([])
            r.loops.append([])
        for i, ids in enumerate(w.prompts):
            for r in turns(rows, i):
                run = r.generate(ids, w.prompt_new_tokens, stops, fresh=True)  # a new conversation
                r.prompts[rep].append(run)
                say(f"rep {rep + 1}/{reps} prompt {i + 1}/{len(w.prompts)} {r.label:20s} {len(run.tokens):3d} "
                    f"tokens {run.decode_tokens_per_s:6.1f} tok/s  TTFT {run.ttft_ms:6.1f} ms")
        contexts = {}
        for k in range(rounds):
            for r in turns(rows, k):
                ids = contexts[r.label] = w.loop_first if k == 0 else next_loop_context(
                    contexts[r.label], r.loops[rep][-1].tokens, w.loop_turns[k - 1], w.close, w.stop_ids)
                if len(ids) + w.loop_new_tokens > r.target.max_context:
                    raise ValueError(f"agent loop round {k + 1}: {len(ids)} tokens + {w.loop_new_tokens} "
                                     f"exceed max_context={r.target.max_context}")
                run = r.generate(ids, w.loop_new_tokens, stops, fresh=k == 0)  # KV kept across rounds
                r.loops[rep].append(run)
                say(f"rep {rep + 1}/{reps} loop round {k + 1}/{rounds} {r.label:20s} "
                    f"prompt {len(ids):4d}  {len(run.tokens):2d} tokens  {run.wall_ms:7.1f} ms")
