"""Check the GGUF import on a real model (default: the SmolLM2-135M GGUF from `make lm-model`).

Runtime part (no torch): import time by phase (median of --repeats), and every Q4_1 tensor's
Int4Blocks.dequantize() against gguf's own dequantization (bitwise share, max difference, and the
fp32 rounding bound). Dev part (transformers + accelerate, skipped when absent): the rebuilt
tokenizer against transformers' GGUF tokenizer, and the numpy reference forward against
transformers' fp32 GGUF load: logits and greedy tokens on a few chat prompts.

    .venv/bin/python tools/check_gguf_import.py [--gguf PATH] [--new-tokens 48] [--json .work/lm/check.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gguf
import numpy as np

from sol_control.lm.cache import smollm2_gguf
from sol_control.lm.ggml_q4 import q4_1_nibbles
from sol_control.lm.gguf_reader import hf_name, open_gguf, read_gguf_weights, unpermute_rows
from sol_control.lm.reference import LlamaReference
from sol_control.lm.tokenizer import read_gguf_tokenizer

U = 2.0 ** -24
PROMPTS = ["Is the part on conveyor belt 2 defective? Answer yes or no.",
           "The gripper reports 12.5 N of force at a width of 0.04 m. Is the grasp secure?",
           "List three checks before restarting a robot cell after an emergency stop.",
           "Write a JSON object with fields action and width_m for holding a 4 cm part.",
           "What does a deadline miss mean for a real-time controller?"]
TOKENIZER_STRINGS = PROMPTS + ["  two  spaces\n\n\ttab", "x=12.5mm, y=-0.045 m", "ünïcödé 日本語 🤖",
                               "def f(x):\n    return x ** 2  # square", "<|im_start|>user\nhi<|im_end|>\n",
                               "don't won't it's we'll", "https://example.com/a?b=c&d=e", "1,000,000 in 2026"]


def timed(fn, repeats: int) -> tuple[float, object]:
    """(median seconds, last result) of fn() run `repeats` times."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def import_times(path: Path, repeats: int) -> dict:
    open_s, reader = timed(lambda: open_gguf(path), repeats)
    weights_s, _ = timed(lambda: read_gguf_weights(reader), repeats)
    tokenizer_s, _ = timed(lambda: read_gguf_tokenizer(reader), repeats)
    return {"open_s": open_s, "weights_s": weights_s, "tokenizer_s": tokenizer_s,
            "total_s": open_s + weights_s + tokenizer_s, "repeats": repeats}


def int4_vs_gguf(path: Path) -> dict:
    reader = open_gguf(path)
    weights = read_gguf_weights(reader)
    c, n, equal, worst_abs, worst_ratio = weights.config, 0, 0, 0.0, 0.0
    for tensor in reader.tensors:
        if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            continue
        name, raw = hf_name(tensor.name), np.asarray(tensor.data)
        expected = gguf.quants.dequantize(raw, tensor.tensor_type)
        q, d, m = q4_1_nibbles(raw)
        dq = np.abs(d[..., None] * q)
        bound = (U * (np.abs(m)[..., None] + dq + 3 * np.abs(expected.reshape(q.shape)))).reshape(expected.shape)
        heads = c.n_heads if "q_proj" in name else c.n_kv_heads if "k_proj" in name else None
        if heads:
            expected, bound = unpermute_rows(expected, heads), unpermute_rows(bound, heads)
        diff = np.abs(weights.int4[name].dequantize() - expected)
        n, equal = n + diff.size, equal + int(np.count_nonzero(diff == 0))
        worst_abs, worst_ratio = max(worst_abs, float(diff.max())), max(worst_ratio, float((diff / bound).max()))
    return {"q4_1_weights": n, "bitwise_equal_share": equal / n, "max_abs_diff": worst_abs,
            "max_diff_over_fp32_bound": worst_ratio, "within_fp32_rounding": worst_ratio <= 1.0}


def transformers_checks(path: Path, new_tokens: int) -> dict:
    try:
        import torch
        import transformers
    except ImportError as err:
        return {"skipped": f"dev extra absent: {err}"}
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok, ref = read_gguf_tokenizer(path), LlamaReference(read_gguf_weights(path))
    same_ids = [tok.encode(s) == hf_tok(s, add_special_tokens=False)["input_ids"] for s in TOKENIZER_STRINGS]
    rows = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ids = tok.encode_chat(messages)
        chat_same = tok.render_chat(messages) == hf_tok.apply_chat_template(messages, tokenize=False,
                                                                             add_generation_prompt=True)
        with torch.no_grad():
            hf_logits = model(torch.tensor([ids])).logits[0].numpy()
            hf_out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                    eos_token_id=list(tok.stop_ids), pad_token_id=tok.stop_ids[0])
        ours = ref.greedy(ids, new_tokens, stop_ids=tok.stop_ids)
        theirs = hf_out[0, len(ids):].tolist()
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        rows.append({"prompt_tokens": len(ids), "chat_template_same": chat_same,
                     "max_abs_logit_diff": float(np.abs(ref.logits(ids) - hf_logits).max()),
                     "greedy_tokens_ours": len(ours), "greedy_tokens_transformers": len(theirs),
                     "greedy_same": ours == theirs, "greedy_agree_prefix": agree, "text": tok.decode(ours)})
    return {"tokenizer_same_ids": f"{sum(same_ids)}/{len(same_ids)}", "prompts": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the `make lm-model` SmolLM2 file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path, default=Path(".work/lm/check.json"))
    args = parser.parse_args()
    path = args.gguf or smollm2_gguf()
    report = {"gguf": str(path), "import": import_times(path, args.repeats), "int4_vs_gguf": int4_vs_gguf(path)}
    print(json.dumps(report, indent=1))
    report["transformers"] = transformers_checks(path, args.new_tokens)
    print(json.dumps(report["transformers"], indent=1, ensure_ascii=False))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
