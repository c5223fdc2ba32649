"""A row of a benchmark table: one configuration (target precision, how it decodes) with sessions
of its own, so warm caches stay per row. The decision bench (`decode_bench`) and the LM bench
(`lm_rows`) each add what they record; both time single target calls with `call_ms` and measure
resident memory per decoder in fresh processes with `probe_rss`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..decoding import AdaptiveK, GuessLength, greedy, open_decoder, speculate, speculate_heads
from .common import rss_bytes


def call_ms(sess, context, ids: np.ndarray, sizes) -> dict[int, float]:
    """{T: ms of one target call with the first T of `ids` after `context`} (the context prefilled
    untimed, the session rewound to it after each call): the cost of a verify pass of T tokens."""
    sess.prefill(np.asarray(context, np.int64))
    n, out = sess.length, {}
    for T in sizes:
        t0 = time.perf_counter_ns()
        sess.forward(ids[:T])
        out[T] = (time.perf_counter_ns() - t0) / 1e6
        sess.rewind(n)
    return out


def draft_precision(manifest) -> str:
    """The draft model's precision the rows run: int8 where there is one."""
    return "int8" if "int8" in manifest.draft.precisions else manifest.draft.precisions[0]


@dataclass
class Row:
    name: str
    precision: str
    mode: str  # plain | heads | draft | lookup (prompt lookup alone, on a target without heads)
    target: object = None
    draft: object = None
    controller: AdaptiveK | None = None
    length: GuessLength | None = None  # heads / lookup rows: guesses a pass checks, learnt across answers
    lookup: int = 0  # heads / lookup rows: prompt-lookup guesses where the text repeats

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    def open_draft(self, bundle, threads: int, name: str) -> None:
        """The bundle's draft model beside the target, its length adapted per pass."""
        self.draft = open_decoder(bundle, "draft", draft_precision(bundle.manifest), threads, name=name)
        self.controller = AdaptiveK()

    def reset(self) -> None:
        """Empty the caches: the next answer starts cold."""
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()

    def decode(self, prefix, max_new: int, stops: tuple[int, ...] = (), k: int | None = None, cold: bool = False):
        """One answer after `prefix` (the caches emptied first when `cold`): greedy, the target's
        draft heads (with prompt lookup), or the draft model."""
        if cold:
            self.reset()
        if self.mode == "plain":
            return greedy(self.target, prefix, max_new, stop_ids=stops)
        if self.mode in ("heads", "lookup"):
            return speculate_heads(self.target, prefix, max_new, stop_ids=stops, lookup=self.lookup,
                                   length=self.length)
        return speculate(self.draft, self.target, prefix, max_new, k=k, controller=self.controller, stop_ids=stops)


def probe_rss(specs: dict[str, dict]) -> dict[str, dict]:
    """{label: {"before": RSS bytes, "after": {mode: RSS bytes}}}: a fresh process per spec (all at
    once: this measures memory, not time) that opens the spec's decoder and answers in each mode
    (`rss_probe`)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = {label: subprocess.Popen([sys.executable, "-m", __name__, json.dumps(spec)], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for label, spec in specs.items()}
    out = {}
    for label, p in procs.items():
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise ValueError(f"RSS probe {label} failed: {stderr.strip().splitlines()[-1:]}")
        out[label] = json.loads(stdout.strip().splitlines()[-1])
    return out


def rss_probe(spec: dict) -> None:
    """`python -m sol_control.bench.row SPEC`: opens the decoder (`bundle`, `role`, `precision`; then
    the draft, for mode `draft`) and answers `ids` once per mode of `modes` (`max_new` tokens, to an
    LM bundle's stop id); prints the process RSS before and after each mode (a speculative mode
    reuses the plain one's target, as a fresh process would)."""
    from ..bundle import Bundle
    from ..lm.generate import load_tokenizer

    bundle = Bundle.load(spec["bundle"], verify=False)  # the parent process has checked every sha256
    tok = load_tokenizer(bundle)  # None for a decision bundle
    before, after = rss_bytes(), {}
    row = Row("probe", spec["precision"], "plain", open_decoder(bundle, spec["role"], spec["precision"], 1))
    for mode in spec["modes"]:
        row.mode, row.lookup = mode, spec.get("lookup", 0) * (mode == "lookup")
        if mode == "draft":
            row.open_draft(bundle, 1, "probe draft")
        row.decode(np.asarray(spec["ids"], np.int64), spec["max_new"], tok.stop_ids if tok else (), cold=True)
        after[mode] = rss_bytes()
    print(json.dumps({"before": before, "after": after}))


if __name__ == "__main__":
    rss_probe(json.loads(sys.argv[1]))
