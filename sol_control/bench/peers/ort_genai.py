"""ONNX Runtime GenAI, plain and speculative, on the bundle's weights (runs inside its own venv, see tools/setup_peers.sh)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import (Decide, LMGenerate, LMWork, Workload, cut_at_stop, folder_mb,
                     time_decisions, time_lm, timed_row)


def add_word_tokenizer(hf_dir: Path, vocab_size: int) -> None:
    """The GenAI builder insists on a tokenizer; token-id workloads never use it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(hf_dir)


def hf_copy(hf_dir: Path, dst: Path) -> Path:
    """A copy of the HF folder for a converter, with a tokenizer (without one the converters refuse
    or invent a 32k-token one)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(hf_dir, dst)
    if not (dst / "tokenizer.json").is_file():
        add_word_tokenizer(dst, json.loads((dst / "config.json").read_text())["vocab_size"])
    return dst


def genai_convert(hf_dir: Path, out_dir: Path, precision: str, threads: int) -> Path:
    """`onnxruntime_genai.models.builder` HF folder -> GenAI folder (fp32 or its own int4)."""
    if not (out_dir / "genai_config.json").is_file():
        src = hf_copy(hf_dir, out_dir.parent / f"{out_dir.name}-hf")
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out_dir),
               "-p", precision, "-e", "cpu"]
        if precision == "int4":
            cmd += ["--extra_options", "int4_accuracy_level=4", "int4_block_size=32"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    config = json.loads((out_dir / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=1))
    return out_dir


def genai_speculative_folder(target: Path, draft: Path, out_dir: Path, k: int) -> Path:
    """Composite GenAI model: target decoder + `model.draft` decoder + `speculative` options. GenAI
    refuses paths with `..`, so target and draft are symlinked inside the folder."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    (out_dir / "target").symlink_to(target.resolve())
    (out_dir / "draft").symlink_to(draft.resolve())
    config = json.loads((target / "genai_config.json").read_text())
    draft_decoder = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    config["model"]["decoder"]["filename"] = "target/" + config["model"]["decoder"]["filename"]
    config["model"]["draft"] = {**draft_decoder, "filename": "draft/" + draft_decoder["filename"]}
    config["speculative"] = {"max_draft_tokens": k}
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=1))
    return out_dir


def genai_decide(model_dir: Path, new_tokens: int) -> Decide:
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    generators: dict[int, object] = {}  # one Generator per sequence length, kept across decisions

    def decide(prefix: list[int]):
        # A new Generator costs ~14 ms here (its buffers): a serving loop keeps one and rewinds it to
        # the empty sequence, so no KV is kept from one decision to the next.
        length = len(prefix) + new_tokens
        if length not in generators:
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=length, do_sample=False)
            generators[length] = og.Generator(model, params)
        gen = generators[length]
        t0 = time.perf_counter()
        gen.rewind_to(0)
        gen.append_tokens(np.asarray(prefix, np.int32))
        ttft_ms, resumed = None, 0
        while gen.token_count() < len(prefix) + new_tokens:
            if gen.is_done():  # stopped on EOS/pad: our decisions are fixed-length, so go on
                gen.append_tokens(np.asarray(gen.get_next_tokens()[:1], np.int32))
                resumed += 1
            else:
                gen.generate_next_token()
            if ttft_ms is None:
                ttft_ms = (time.perf_counter() - t0) * 1e3
        tokens = list(gen.get_sequence(0))[len(prefix):]
        info = {"resumed": resumed}
        stats = gen.get_speculative_stats() if hasattr(gen, "get_speculative_stats") else None
        if stats and stats.get("draft_tokens_evaluated"):
            info["acceptance"] = stats["draft_tokens_accepted"] / stats["draft_tokens_evaluated"]
        return tokens, ttft_ms or 0.0, info

    return decide


def run_decisions(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
                  precisions=("fp32", "int4"), timer=time_decisions) -> list[dict]:
    rows = []
    draft = genai_convert(hf_draft, work / "genai-draft-fp32", "fp32", w.threads) if hf_draft else None
    for prec in precisions:
        target = genai_convert(hf_target, work / f"genai-target-{prec}", prec, w.threads)
        rows.append(timed_row("ort-genai", "plain", prec, genai_decide(target, w.new_tokens), w, timer))
        if draft is not None:
            spec = genai_speculative_folder(target, draft, work / f"genai-spec-{prec}", w.k)
            rows.append(timed_row("ort-genai", f"speculative k={w.k}", prec, genai_decide(spec, w.new_tokens), w,
                                  timer))
    return rows


# ---- language models (sol_control.bench.peers.lm) -----------------------------------------------

GENAI_NGRAM = {"ngram_size": 3, "max_draft_tokens": 4}  # 0.18's n-gram drafting; 4 = its default K


def genai_lm_generate(model_dir: Path, max_length: int, stop_ids, ngram: dict | None = None) -> LMGenerate:
    """One `og.Generator` for the whole run (its KV buffer is max_length long): a prompt rewinds it
    to the empty sequence, a loop round appends the new ids to what it holds and goes on (the KV
    cache kept). Stops on our stop ids (the builder copies them into genai_config's eos list too;
    a generator done on one leaves it out of the sequence: `get_next_tokens` has it); n-gram steps
    that run past a stop are cut and the generator rewound."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    if ngram:
        params.set_speculative_options(**ngram)
    gen = og.Generator(model, params)
    stops = set(stop_ids)
    held: list[int] = []  # the sequence the generator holds

    def generate(ids: list[int], max_new_tokens: int, keep: bool):
        t0 = time.monotonic_ns()
        if keep:
            assert ids[:len(held)] == held, "a loop round must extend the conversation"
            new = ids[len(held):]
        else:
            gen.rewind_to(0)
            new = ids
        gen.append_tokens(np.asarray(new, np.int32))
        start, first_ms, seen = len(ids), None, 0
        while gen.token_count() - start < max_new_tokens and not gen.is_done():
            gen.generate_next_token()
            if first_ms is None:
                first_ms = (time.monotonic_ns() - t0) / 1e6
            n = gen.token_count() - start
            last = [int(gen.get_next_tokens()[0])] if n == seen + 1 else list(gen.get_sequence(0))[start + seen:]
            seen = n
            if stops.intersection(int(t) for t in last):
                break
        tokens = [int(t) for t in gen.get_sequence(0)[start:]]
        if gen.is_done() and len(tokens) < max_new_tokens:  # done on a stop id: it is not in the sequence
            tokens.append(int(gen.get_next_tokens()[0]))
        tokens = cut_at_stop(tokens, stops, max_new_tokens)
        # the last token was chosen, not yet run through the model: append_tokens would not run
        # it, so the generator gives it back and the next round appends it with the new ids
        gen.rewind_to(start + len(tokens) - 1)
        held[:] = ids + tokens[:-1]
        return tokens, first_ms or 0.0

    return generate


def run_lm(hf_dir: Path, w: LMWork, work: Path, precision: str, mode: str, timer=time_lm) -> dict:
    """One row: the builder's model at `precision` (converted once, cached in `work`), plain or n-gram."""
    target = genai_convert(hf_dir, work / f"genai-{precision}", precision, w.threads)
    ngram = GENAI_NGRAM if mode == "ngram" else None
    generate = genai_lm_generate(target, w.loop_context_max + 16, w.stop_ids, ngram)
    label = "plain" if ngram is None else f"n-gram n={ngram['ngram_size']} k={ngram['max_draft_tokens']}"
    return {"mode": label, **timer(generate, w)}


def prepare_lm(hf_dir: Path, work: Path, precision: str, threads: int) -> dict:
    out = genai_convert(hf_dir, work / f"genai-{precision}", precision, threads)
    shutil.rmtree(out.parent / f"{out.name}-hf", ignore_errors=True)  # the builder's copy of the source
    fmt = {"fp32": "fp32", "int8": "builder int8 (MatMulNBits 8-bit)",
           "int4": "builder int4 (MatMulNBits, block 32, accuracy level 4)"}[precision]
    return {"format": fmt, "model_mb": folder_mb(out),
            "note": "one og.Generator: prompts rewind it to 0, loop rounds append to its KV cache"}
