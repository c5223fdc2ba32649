"""Hugging Face transformers, plain and assisted generation (runs inside its own venv, see tools/setup_peers.sh)."""
from __future__ import annotations

import time
from pathlib import Path

from .common import (Decide, LMGenerate, LMWork, Workload, cut_at_stop, folder_mb,
                     time_decisions, time_lm, timed_row)


def first_token_streamer():
    """A streamer that notes when the first new token came (`first_ns`): generate() calls put()
    with the prompt, then with each new token."""
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):
        def __init__(self):
            self.calls, self.first_ns = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:
                self.first_ns = time.monotonic_ns()

        def end(self):
            pass

    return FirstToken()


def load_model(hf_dir: Path, threads: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def timed_generate(model, ids: list[int], assistant_model=None, past_key_values=None, **config) -> tuple[list[int], float]:
    """Greedy `generate()` on `ids` (`config`: GenerationConfig fields): the new tokens, and ms to the
    first of them."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(min_new_tokens=0, do_sample=False, num_beams=1, **config)
    x = torch.tensor([ids], dtype=torch.long)
    streamer = first_token_streamer()
    t0 = time.monotonic_ns()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=config, streamer=streamer,
                             assistant_model=assistant_model, past_key_values=past_key_values)
    return out[0, len(ids):].tolist(), ((streamer.first_ns or time.monotonic_ns()) - t0) / 1e6


def transformers_decide(model, new_tokens: int, assistant=None) -> Decide:
    def decide(prefix: list[int]):
        return (*timed_generate(model, prefix, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
                                assistant_model=assistant), {})

    return decide


def run_decisions(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path | None = None,
                  precisions=("fp32",), timer=time_decisions) -> list[dict]:
    """fp32 only (`work` and `precisions` are the other runners' arguments)."""
    target = load_model(hf_target, w.threads)
    target.generation_config.eos_token_id = None  # fixed-length decisions, like ours
    rows = [timed_row("transformers", "plain", "fp32", transformers_decide(target, w.new_tokens), w, timer)]
    if hf_draft:
        draft = load_model(hf_draft, w.threads)
        draft.generation_config.eos_token_id = None
        draft.generation_config.num_assistant_tokens = w.k
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        rows.append(timed_row("transformers", f"assisted k={w.k}", "fp32",
                              transformers_decide(target, w.new_tokens, draft), w, timer))
    return rows


# ---- language models (sol_control.bench.peers.lm) -----------------------------------------------

HF_LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens (max_matching_ngram_size stays at its default, 2)


def transformers_lm_generate(model, stop_ids, lookup: int | None = None) -> LMGenerate:
    """`generate()` greedy, eos = our stop ids. Plain keeps one DynamicCache across loop rounds
    (cropped to the conversation after each answer: the last token is not in it yet); assisted
    generation (prompt lookup) re-runs the whole input when given a filled cache (transformers
    5.24: it appends the whole prompt again), so there every call prefills from scratch."""
    from transformers import DynamicCache

    cache = [None]

    def generate(ids: list[int], max_new_tokens: int, keep: bool):
        if lookup or not keep or cache[0] is None:
            cache[0] = None if lookup else DynamicCache(config=model.config)
        tokens, first_ms = timed_generate(model, ids, max_new_tokens=max_new_tokens, eos_token_id=list(stop_ids),
                                          pad_token_id=int(stop_ids[-1]), prompt_lookup_num_tokens=lookup,
                                          past_key_values=cache[0])
        tokens = cut_at_stop(tokens, stop_ids, max_new_tokens)
        if cache[0] is not None:
            extra = cache[0].get_seq_length() - (len(ids) + len(tokens) - 1)
            if extra > 0:
                cache[0].crop(-extra)
        return tokens, first_ms

    return generate


def prepare_lm(hf_dir: Path, work: Path, precision: str, threads: int) -> dict:
    if precision != "fp32":
        raise ValueError(f"transformers runs fp32 only here, got {precision!r}")
    return {"format": "fp32 (torch eager, sdpa)", "model_mb": folder_mb(hf_dir / "model.safetensors")}


def run_lm(hf_dir: Path, w: LMWork, work: Path, precision: str, mode: str, timer=time_lm) -> dict:
    model = load_model(hf_dir, w.threads)
    lookup = HF_LOOKUP_TOKENS if mode == "lookup" else None
    note = ("DynamicCache kept across loop rounds" if lookup is None else
            "assisted generation cannot continue a filled cache: every loop round prefills the whole conversation")
    label = "plain" if lookup is None else f"prompt lookup k={lookup} n=2"
    return {"mode": label, "note": note, **timer(transformers_lm_generate(model, w.stop_ids, lookup), w)}
