"""SmolLM2 int4 graph forms side by side: ms of one call and agreement with fp32 (docs/BENCHMARKS.md,
"A SmolLM2-135M call on an AVX2 host").

Builds each variant from the `make lm-model` GGUF into .work/lm/graphs/ (once; `max_context` 1024),
then times calls of T = 1, 2, 5 tokens after a 200-token prefix, variants alternating round by
round (medians of the round medians), and, with --prompts N, greedy answers to the first N
workload prompts against the fp32 graph's: the first token where each differs (median) and how
many answers reach a stop id.

    .venv/bin/python tools/bench_lm_graphs.py [--variants q4_1,symmetric,...] [--rounds 12] [--prompts 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sol_control.decoding import greedy  # noqa: E402
from sol_control.decoding.fused import FusedDecoderSession  # noqa: E402
from sol_control.graph.llama import build_decoder  # noqa: E402
from sol_control.graph.weights import DraftHeads, LlamaWeights  # noqa: E402
from sol_control.lm.importer import INT4_MODES  # noqa: E402

OUT = REPO / ".work" / "lm" / "graphs"
HEADS = REPO / "models" / "lm" / "smollm2_heads_k3.npz"
FAST = {"int4_zero_points": "mins", "head_bits": 8, "int8_activations": "dual"}
VARIANTS = {  # name -> (requantize the Q4_1 blocks, build options, with the shipped heads)
    "fp32": (False, {"precision": "fp32"}, False),
    "q4_1": (False, FAST, False),  # --int4-mode fast
    "q4_1_heads": (False, FAST, True),  # ... with 4 heads over the whole lm_head
    "q4_1_heads8k": (False, {**FAST, "heads_vocab": 8192}, True),  # ... over its first 8192 rows
    "q4_1_heads4k": (False, {**FAST, "heads_vocab": 4096}, True),  # ... over its first 4096 rows (the import's)
    "q4_1_head8nbits": (False, {**FAST, "int8_kernel": "nbits"}, False),  # 8-bit head as MatMulNBits blocks (Q8_0's form)
    "q4_1_exact": (False, INT4_MODES["exact"], False),  # --int4-mode exact
    "q4_1_head4": (False, {"int4_zero_points": "mins", "head_bits": 4, "symmetric": True}, False),
    "symmetric": (True, {"head_bits": 4, "symmetric": True}, False),  # --int4-mode symmetric
    "symmetric_nopad": (True, {"head_bits": 4, "symmetric": True, "query_pad": False}, False),
}


def build(weights: LlamaWeights, name: str) -> Path:
    path = OUT / f"{name}.onnx"
    if not path.exists():
        requantize, options, heads = VARIANTS[name]
        options = dict(options)
        precision = options.pop("precision", "int4")
        tensors = {**weights.tensors, **{n: b.dequantize() for n, b in weights.int4.items()}} if requantize else weights.tensors
        w = LlamaWeights(weights.config, tensors, {} if requantize else weights.int4,
                         DraftHeads.load(HEADS) if heads else None)
        build_decoder(w, path, precision, max_context=1024, **options)
    return path


def call_ms(sessions: dict, rounds: int, sizes=(1, 2, 5)) -> dict:
    rng = np.random.default_rng(0)
    prefix = rng.integers(100, 40000, 200)
    got = {n: {T: [] for T in sizes} for n in sessions}
    for r in range(rounds):
        for n, s in sessions.items():
            s.reset()
            s.prefill(prefix)
            for T in sizes:
                ts = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    s.forward(rng.integers(100, 40000, T), rows=T)
                    ts.append((time.perf_counter() - t0) * 1e3)
                    s.rewind(len(prefix))
                got[n][T].append(statistics.median(ts))
        print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    return {n: {T: statistics.median(v) for T, v in per.items()} for n, per in got.items()}


def agreement(sessions: dict, prompts: list[list[int]], stops: tuple[int, ...]) -> dict:
    def answers(s):
        out = []
        for p in prompts:
            s.reset()
            out.append(greedy(s, np.array(p, np.int64), 96, stop_ids=stops).tokens)
        return out

    ref = answers(sessions["fp32"])
    result = {}
    for n, s in sessions.items():
        outs = answers(s)
        # the first differing token; a shorter answer that is a prefix of the other differs where it ends
        first = [next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), None if r == o else min(len(r), len(o)))
                 for r, o in zip(ref, outs)]
        differ = [f for f in first if f is not None]
        result[n] = {"equal_answers": len(first) - len(differ),
                     "first_difference_median": float(np.median(differ)) if differ else None,
                     "stopped": sum(o[-1] in stops for o in outs), "answers": len(outs)}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="q4_1,symmetric,q4_1_heads,q4_1_heads8k",
                    help=f"comma separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=0, help="greedy agreement with fp32 on the first N workload prompts")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    from sol_control.lm.cache import smollm2_gguf
    from sol_control.lm.gguf_reader import open_gguf, read_gguf_weights

    reader = open_gguf(smollm2_gguf())
    weights = read_gguf_weights(reader)
    OUT.mkdir(parents=True, exist_ok=True)
    sessions = {n: FusedDecoderSession(build(weights, n), threads=1, min_step_tokens=1) for n in names}
    report = {"call_ms": call_ms(sessions, args.rounds)}
    for n, per in report["call_ms"].items():
        print(f"{n:16s} " + "  ".join(f"T={T} {ms:6.2f} ms" for T, ms in per.items()))
    if args.prompts:
        from sol_control.lm.tokenizer import read_gguf_tokenizer

        tok = read_gguf_tokenizer(reader)
        workload = json.loads((REPO / "sol_control" / "bench" / "data" / "lm_workload.json").read_text())
        prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"][:args.prompts]]
        sessions.setdefault("fp32", FusedDecoderSession(build(weights, "fp32"), threads=1))
        report["agreement"] = agreement(sessions, prompts, tok.stop_ids)
        for n, a in report["agreement"].items():
            print(f"{n:16s} {a['equal_answers']}/{a['answers']} answers equal fp32's, first difference (median) "
                  f"{a['first_difference_median']}, {a['stopped']}/{a['answers']} answers stop")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
