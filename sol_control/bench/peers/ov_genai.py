"""OpenVINO GenAI, plain and speculative, fp32 and its own int8 / int4 (runs inside its own venv, see tools/setup_peers.sh)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from .common import (PRECISIONS, Decide, LMGenerate, LMWork, Workload, build_once, cut_at_stop,
                     folder_mb, time_decisions, time_lm, timed_row)
from .ort_genai import hf_copy

# optimum-cli --weight-format and the extra options for each precision. int4 uses groups of 32 on
# every MatMul (ratio 1.0), the layout of our own int4 and of ORT GenAI's.
OV_FORMATS = {"fp32": ["--weight-format", "fp32"], "int8": ["--weight-format", "int8"],
              "int4": ["--weight-format", "int4", "--group-size", "32", "--ratio", "1.0"]}


def ov_export(hf_dir: Path, out_dir: Path, precision: str) -> Path:
    """`optimum-cli export openvino` HF folder -> OpenVINO IR folder (fp32, or NNCF int8/int4)."""
    if not (out_dir / "openvino_model.xml").is_file():
        src = hf_copy(hf_dir, out_dir.parent / f"{out_dir.name}-hf")
        cli = Path(sys.executable).with_name("optimum-cli")

        def export(tmp: Path) -> None:  # into a temporary folder: a failed export leaves no half one
            cmd = [str(cli), "export", "openvino", "--model", str(src), "--task", "text-generation-with-past",
                   *OV_FORMATS[precision], str(tmp)]
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"optimum-cli export ({precision}) failed: {proc.stderr[-1500:]}")
        build_once(out_dir, export)
    return out_dir


def ov_properties(precision: str, threads: int) -> dict:
    """fp32 rows compute and cache in f32 (OpenVINO's CPU defaults are bf16 compute and a u8 KV
    cache, which would not be the fp32 model); quantized rows keep OpenVINO's own defaults."""
    props = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}
    if precision == "fp32":
        # the paged-attention backend (speculative, and plain by default) reads KEY_/VALUE_CACHE_PRECISION
        props.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32", KEY_CACHE_PRECISION="f32",
                     VALUE_CACHE_PRECISION="f32")
    return props


def ov_decide(pipe, new_tokens: int, k: int | None = None) -> Decide:
    import openvino as ov

    config = pipe.get_generation_config()
    # ignore_eos alone: it goes on past EOS and keeps EOS a candidate; min_new_tokens would mask
    # EOS out of the logits instead, and greedy would pick another token than ours
    config.max_new_tokens, config.min_new_tokens = new_tokens, 0
    config.ignore_eos, config.do_sample = True, False
    if k:
        config.num_assistant_tokens = k

    def decide(prefix: list[int]):
        res = pipe.generate(ov.Tensor(np.asarray([prefix], np.int64)), config)
        tokens = list(res.tokens[0])
        if len(tokens) != new_tokens:
            raise RuntimeError(f"OpenVINO returned {len(tokens)} tokens, asked for {new_tokens}")
        info = {}
        extended = getattr(res, "extended_perf_metrics", None)
        if k and extended is not None and hasattr(extended, "get_num_accepted_tokens"):
            drafted = extended.get_num_draft_tokens()
            if drafted:
                info["acceptance"] = extended.get_num_accepted_tokens() / drafted
        return tokens, float(res.perf_metrics.get_ttft().mean), info

    return decide


def run_decisions(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
                 precisions=PRECISIONS["openvino"], timer=time_decisions) -> list[dict]:
    import openvino_genai as og

    rows = []
    draft = ov_export(hf_draft, work / "ov-draft-fp32", "fp32") if hf_draft else None
    for prec in precisions:
        target = ov_export(hf_target, work / f"ov-target-{prec}", prec)
        props = ov_properties(prec, w.threads)
        pipe = og.LLMPipeline(str(target), "CPU", **props)
        rows.append(timed_row("openvino", "plain", prec, ov_decide(pipe, w.new_tokens), w, timer))
        del pipe
        if draft is not None:
            # the draft stays fp32 (with fp32 properties) whatever the target's precision, as ours
            spec = og.LLMPipeline(str(target), "CPU", draft_model=og.draft_model(str(draft), "CPU",
                                  **ov_properties("fp32", w.threads)), **props)
            rows.append(timed_row("openvino", f"speculative k={w.k}", prec, ov_decide(spec, w.new_tokens, w.k), w,
                                  timer))
            del spec
    return rows


# ---- language models (sol_control.bench.peers.lm) -----------------------------------------------

OV_LOOKUP = {"num_assistant_tokens": 5, "max_ngram_size": 3}  # the values of OpenVINO's prompt-lookup sample


def ov_lm_generate(pipe, stop_ids, lookup: dict | None = None) -> LMGenerate:
    """`pipe.generate(ids)` with the whole conversation every time: OpenVINO GenAI 2026.4 keeps the
    KV cache of the longest prefix a call shares with the previous one by itself (the stateful
    and the prompt-lookup pipeline alike, chat mode or not), so a loop round prefills only its new
    ids. A prompt must start cold, so `generate.reset` (called untimed by `time_lm` before each
    prompt) runs one 1-token call on a lone `<|endoftext|>`-style id that no prompt starts with."""
    import openvino as ov

    config = pipe.get_generation_config()
    config.do_sample, config.ignore_eos, config.min_new_tokens = False, False, 0
    config.stop_token_ids = set(stop_ids)
    config.eos_token_id = int(stop_ids[-1])
    if lookup:
        config.num_assistant_tokens, config.max_ngram_size = lookup["num_assistant_tokens"], lookup["max_ngram_size"]

    def run(ids: list[int], max_new_tokens: int):
        config.max_new_tokens = max_new_tokens
        return pipe.generate(ov.Tensor(np.asarray([ids], np.int64)), config)

    def generate(ids: list[int], max_new_tokens: int, keep: bool):
        res = run(ids, max_new_tokens)
        tokens = cut_at_stop([int(t) for t in res.tokens[0]], stop_ids, max_new_tokens)
        return tokens, float(res.perf_metrics.get_ttft().mean)

    generate.reset = lambda: run([int(stop_ids[0])], 1)
    return generate


def prepare_lm(hf_dir: Path, work: Path, precision: str, threads: int) -> dict:
    out = ov_export(hf_dir, work / f"ov-{precision}", precision)
    shutil.rmtree(out.parent / f"{out.name}-hf", ignore_errors=True)  # the exporter's copy of the source
    fmt = {"fp32": "fp32 (f32 compute and KV cache)", "int8": "NNCF int8 weights",
           "int4": "NNCF int4 weights, group 32, ratio 1.0"}[precision]
    return {"format": fmt, "model_mb": folder_mb(out),
            "note": "the pipeline reuses the KV cache of the prefix a call shares with the previous one "
                    "(loop rounds); an untimed 1-token call clears it before each prompt"}


def run_lm(hf_dir: Path, w: LMWork, work: Path, precision: str, mode: str, timer=time_lm) -> dict:
    import openvino_genai as og

    target = ov_export(hf_dir, work / f"ov-{precision}", precision)
    lookup = OV_LOOKUP if mode == "lookup" else None
    pipe = og.LLMPipeline(str(target), "CPU", **ov_properties(precision, w.threads),
                          **({"prompt_lookup": True} if lookup else {}))
    label = "plain" if lookup is None else f"prompt lookup k={lookup['num_assistant_tokens']} n={lookup['max_ngram_size']}"
    return {"mode": label, **timer(ov_lm_generate(pipe, w.stop_ids, lookup), w)}
