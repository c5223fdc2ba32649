"""What every peer runner shares: the workload, the timing loop, where the venvs are."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..common import REPO, pct

PEERS_VENV = REPO / ".venv-peers"
OV_VENV = REPO / ".venv-ov"
LLAMA_VENV = REPO / ".venv-llama"
ENGINES = ("ort-genai", "transformers", "openvino", "llama.cpp")
# engine -> (venv, `tools/setup_peers.sh` target that makes it)
VENVS = {"ort-genai": (PEERS_VENV, "genai"), "transformers": (PEERS_VENV, "genai"),
         "openvino": (OV_VENV, "ov"), "llama.cpp": (LLAMA_VENV, "llama")}
# precisions each engine runs by default; "int8"/"int4" are the engine's own weight quantization
PRECISIONS = {"ort-genai": ("fp32", "int4"), "transformers": ("fp32",),
              "openvino": ("fp32", "int8", "int4"), "llama.cpp": ("fp32", "int8", "int4")}
WEIGHTS_FROM = "bundle fp32 ONNX"


@dataclass
class Workload:
    prefixes: list[list[int]]
    new_tokens: int
    rounds: int = 5
    threads: int = 1
    k: int = 8  # draft tokens per speculative step (fixed, the peers' usual knob)


# decide(prefix) -> (new tokens, ttft_ms, extra info)
Decide = Callable[[list[int]], tuple[list[int], float, dict]]


def time_decisions(decide: Decide, w: Workload) -> dict:
    """Run every prefix `w.rounds` times; per round tokens/s over all decisions, medians over rounds."""
    decide(w.prefixes[0])  # warm-up: first calls allocate
    tok_s, decode_tok_s, decision_ms, ttft_ms, outputs, infos = [], [], [], [], [], []
    for rnd in range(w.rounds):
        wall = decode = 0.0
        for prefix in w.prefixes:
            t0 = time.perf_counter()
            tokens, ttft, info = decide(prefix)
            ms = (time.perf_counter() - t0) * 1e3
            wall, decode = wall + ms, decode + ms - ttft
            decision_ms.append(ms)
            ttft_ms.append(ttft)
            infos.append(info)
            if rnd == 0:
                outputs.append([int(t) for t in tokens])
        n = len(w.prefixes)
        tok_s.append(n * w.new_tokens / wall * 1e3)
        decode_tok_s.append(n * (w.new_tokens - 1) / decode * 1e3 if decode > 0 else float("nan"))
    accepted = [i["acceptance"] for i in infos if i.get("acceptance") is not None]
    return {
        "tokens_per_s": pct(tok_s, 50), "tokens_per_s_min": min(tok_s), "tokens_per_s_max": max(tok_s),
        "decode_tokens_per_s": pct(decode_tok_s, 50),
        "decision_ms_p50": pct(decision_ms, 50), "ttft_ms_p50": pct(ttft_ms, 50),
        "acceptance": float(np.mean(accepted)) if accepted else None,
        "resumed_after_stop": int(sum(i.get("resumed", 0) for i in infos[:len(w.prefixes)])),
        "outputs": outputs,
    }
