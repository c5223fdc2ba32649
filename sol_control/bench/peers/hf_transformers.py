"""Hugging Face transformers, plain and assisted generation (runs inside its own venv, see tools/setup_peers.sh)."""
from __future__ import annotations

import time
from pathlib import Path

from .common import Decide, Workload, time_decisions

def transformers_decide(model, new_tokens: int, assistant=None) -> Decide:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=0, do_sample=False,
                              eos_token_id=None, pad_token_id=0, num_beams=1)

    class FirstToken(BaseStreamer):  # generate() calls put() with the prompt, then new tokens
        def __init__(self):
            self.calls, self.first_s = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:
                self.first_s = time.perf_counter()

        def end(self):
            pass

    def decide(prefix: list[int]):
        ids = torch.tensor([prefix], dtype=torch.long)
        streamer = FirstToken()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                 assistant_model=assistant, streamer=streamer)
        ttft_ms = ((streamer.first_s or time.perf_counter()) - t0) * 1e3
        return out[0, len(prefix):].tolist(), ttft_ms, {}

    return decide


def run_transformers(hf_target: Path, hf_draft: Path | None, w: Workload) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(w.threads)
    target = AutoModelForCausalLM.from_pretrained(hf_target, dtype=torch.float32).eval()
    target.generation_config.eos_token_id = None  # fixed-length decisions, like ours
    rows = [{"engine": "transformers", "mode": "plain", "precision": "fp32",
             **time_decisions(transformers_decide(target, w.new_tokens), w)}]
    if hf_draft:
        draft = AutoModelForCausalLM.from_pretrained(hf_draft, dtype=torch.float32).eval()
        draft.generation_config.eos_token_id = None
        draft.generation_config.num_assistant_tokens = w.k
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        rows.append({"engine": "transformers", "mode": f"assisted k={w.k}", "precision": "fp32",
                     **time_decisions(transformers_decide(target, w.new_tokens, draft), w)})
    return rows
