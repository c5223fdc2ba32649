"""Peer engines on a pretrained language model (a Llama GGUF, SmolLM2-135M-Instruct) with the LM
benchmark workload (`sol_control/bench/data/lm_workload.json`).

Two halves, as in `sol_control.bench.peers`:
- `run_lm_peers(gguf, workload, threads)` runs in our venv: it turns the workload into token ids
  with OUR tokenizer and chat template (`lm_work`), writes the GGUF's dequantized weights as a
  Hugging Face folder once (`sol_control.lm.hf_writer`, cached under `.work/lm/hf/`), then runs one
  worker per (engine, precision, mode) in the engine's venv — a fresh process per row, so its peak
  RSS and CPU time are that row's — and returns one row each. A missing venv gives one row per
  engine with `skipped` and a note.
- `PeerServer.start(gguf, workload, threads, peer)` keeps one row's worker running (its "serve"
  step, `common.serve_lm`: one prompt per request line) for `bench lm --paired`.
- the worker (`python -m sol_control.bench.peers SPEC OUT`, `lm_step`) imports its engine only:
    llama.cpp     the GGUF itself (Q4_1), and F32 / Q8_0 GGUFs from the HF folder (its converter
                  and quantizer); plain and prompt lookup (`LlamaPromptLookupDecoding`)
    ort-genai     the builder on the HF folder, fp32 / int8 / int4; plain and n-gram drafting
    openvino      optimum-cli export, fp32 / int8 / int4; plain and prompt lookup
    transformers  fp32; plain and `prompt_lookup_num_tokens`

Every engine gets the same ids, decodes greedily and stops at a stop id (kept) or max new tokens
(prompts 128, loop 64). The agent loop keeps each engine's own cache across rounds where its API
allows it (the row's `note` says how); round r's context is round r-1's + its answer + `close`
+ the next tool result's user turn (`common.next_loop_context`), so each engine follows its own
answers; our rows get the same ids (`bench.lm_rows.run_workload`).
"""
from __future__ import annotations

import functools
import json
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from ..common import REPO
from .common import (VENVS, LMWork, ServedWorker, build_once, call_worker, decode_rate,
                     serve_worker, venv_ready)

LM_ENGINES = ("llama.cpp", "ort-genai", "openvino", "transformers")
# (precision, mode) per engine, in the order they run; "lookup"/"ngram" = the engine's own
# prompt-lookup (n-gram) speculative mode, lossless by construction
LM_MODES = {
    "llama.cpp": [("int4", "plain"), ("int4", "lookup"), ("int8", "plain"), ("fp32", "plain"), ("fp32", "lookup")],
    "ort-genai": [("fp32", "plain"), ("fp32", "ngram"), ("int8", "plain"), ("int4", "plain"), ("int4", "ngram")],
    "openvino": [("fp32", "plain"), ("fp32", "lookup"), ("int8", "plain"), ("int4", "plain"), ("int4", "lookup")],
    "transformers": [("fp32", "plain"), ("fp32", "lookup")],
}
FROM_HF = "HF folder of the GGUF's dequantized weights (fp32, sol_control.lm.hf_writer)"
TIMEOUT_S = 5400  # a worker step's limit (converting a model included)
ROW_KEYS = ("engine", "mode", "precision", "threads", "weights_from", "decode_tokens_per_s", "ttft_ms",
            "tokens_per_s_with_prefill", "loop_s", "cpu_s_per_query", "rss_mb", "outputs", "note")


# ---- the workload as our tokenizer's ids ------------------------------------------------------------

def lm_work(tok, workload: dict, threads: int = 1) -> LMWork:
    """Prompts through our chat template; the loop as the first context, the later user turns and
    the ids that close an answer, all cut from the template's own renderings."""
    loop = workload["agent_loop"]
    system = {"role": "system", "content": loop["system"]}
    results = loop["tool_results"]
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"]]
    first = tok.encode_chat([system, {"role": "user", "content": results[0]}])
    base = tok.render_chat([system], add_generation_prompt=False)
    turns = []
    for result in results[1:]:
        text = tok.render_chat([system, {"role": "user", "content": result}])
        if not text.startswith(base):
            raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
        turns.append(tok.encode(text[len(base):]))
    marker = "\x01answer\x01"
    answered = tok.render_chat([system, {"role": "user", "content": results[0]},
                                {"role": "assistant", "content": marker}], add_generation_prompt=False)
    close = tok.encode(answered.split(marker, 1)[1])
    if not close:
        raise ValueError("the chat template puts nothing after an assistant answer (no end-of-turn)")
    return LMWork(prompts=prompts, loop_first=first, loop_turns=turns, close=close, stop_ids=list(tok.stop_ids),
                  prompt_new_tokens=int(workload.get("max_new_tokens", 128)),
                  loop_new_tokens=int(loop.get("max_new_tokens", 64)), threads=threads)


@functools.cache
def file_digest(path: Path) -> str:
    """The sha256 prefix of a file, read once per path in a process."""
    from sol_control.bundle import sha256_file

    return sha256_file(path)[:12]


def hf_folder(gguf: Path) -> Path:
    """The GGUF's dequantized weights + tokenizer as a HF folder, written once under
    `.work/lm/hf/<stem>-<sha256 prefix>` (git-ignored: weights we did not train are never committed)."""
    from sol_control.lm.hf_writer import gguf_to_hf

    folder = REPO / ".work" / "lm" / "hf" / f"{gguf.stem}-{file_digest(gguf)}"
    if not (folder / "config.json").is_file():
        t0 = time.monotonic_ns()

        def build(tmp: Path) -> None:
            gguf_to_hf(gguf, tmp)
            (tmp / "sol_control.json").write_text(json.dumps({"from": gguf.name, "sha256_prefix": file_digest(gguf),
                                                              "write_s": round((time.monotonic_ns() - t0) / 1e9, 2)}))
        build_once(folder, build)
    return folder


# ---- the worker (inside the engine's venv) ----------------------------------------------------------

def lm_call(spec: dict, step: str):
    """The worker's `step` of the LM row `spec` in its engine's venv: "prepare" and "run" give its
    output, "serve" the worker kept running (a `PeerServer`)."""
    threads, work = spec["work_ids"]["threads"], Path(spec["work"])
    tag = f"{spec['engine']}-{spec['precision']}-{spec['mode']}-{step}-t{threads}"
    if step == "serve":
        return serve_worker(spec["engine"], spec, work, tag, threads, cls=PeerServer)
    return call_worker(spec["engine"], {**spec, "step": step}, work, tag, threads, TIMEOUT_S)


def prepared(spec: dict) -> dict:
    """The engine's model at `precision` (the worker converts it when it is not there yet) and its
    format, size and notes; the first conversion's time is recorded next to it, so runs on the
    cached model still report it (`convert_s`, the worker process's wall time)."""
    record = Path(spec["work"]) / f"{spec['engine']}-{spec['precision']}.convert.json"
    t0 = time.monotonic_ns()
    info = lm_call(spec, "prepare")
    if not record.is_file():
        record.write_text(json.dumps({"convert_s": round((time.monotonic_ns() - t0) / 1e9, 1)}))
    return {**info, "convert_s": json.loads(record.read_text())["convert_s"]}


def empty_row(engine: str, mode: str | None, precision: str | None, threads: int, note: str) -> dict:
    """A row that did not run: ROW_KEYS, its figures None, why in `note`."""
    return {**dict.fromkeys(ROW_KEYS), "engine": engine, "mode": mode, "precision": precision,
            "threads": threads, "note": note, "skipped": True}


def worker_spec(gguf: Path, w: LMWork, engine: str, precision: str, mode: str,
                work: Path | None) -> dict:
    """What a worker is told: the engine, its row, the model (llama.cpp's int4 is the GGUF itself,
    the rest start from the HF folder of its dequantized weights, written once), the ids, and where
    its converted models and logs live (default `.work/lm/peers/<stem>-<sha256 prefix>/ENGINE`)."""
    native = engine == "llama.cpp" and precision == "int4"
    hf_dir = None if native else hf_folder(gguf)
    work = work or REPO / ".work" / "lm" / "peers" / f"{gguf.stem}-{file_digest(gguf)}"
    return {"engine": engine, "precision": precision, "mode": mode, "gguf": str(gguf), "native": native,
            "hf_dir": str(hf_dir) if hf_dir else None, "work": str(work / engine), "work_ids": asdict(w)}


def run_lm_peers(gguf: Path, workload: dict, threads: int, engines=None, *,
                 modes: dict | None = None, work: Path | None = None) -> list[dict]:
    """One row per (engine, precision, mode) on `workload` (the lm_workload.json dict) at `threads`.

    Row keys: ROW_KEYS plus `spec_mode` (the LM_MODES name of the row's mode), `format`, `convert_s`,
    `model_mb`, `loop_ttft_ms`, `loop_new_tokens`, `loop_context_tokens`, `prompts` and
    `loop_rounds`. An engine without its venv, or a row whose worker failed, has `skipped: True`,
    None figures and the reason in `note`."""
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    gguf = Path(gguf).resolve()
    w = lm_work(read_gguf_tokenizer(gguf), workload, threads)
    rows = []
    for engine in engines or LM_ENGINES:
        if not venv_ready(engine):
            venv, target = VENVS[engine]
            rows.append(empty_row(engine, None, None, threads,
                                  f"skipped: no {venv.name} (run `bash tools/setup_peers.sh {target}`)"))
            continue
        for precision, mode in (modes or LM_MODES)[engine]:
            spec = worker_spec(gguf, w, engine, precision, mode, work)
            try:
                info, row = prepared(spec), lm_call(spec, "run")
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as err:
                rows.append(empty_row(engine, mode, precision, threads, f"failed: {str(err)[-600:]}"))
                continue
            row = {"engine": engine, "precision": precision, "threads": threads, "spec_mode": mode,
                   "weights_from": info.get("weights_from") or FROM_HF, **row,
                   "format": info.get("format"), "convert_s": info.get("convert_s"), "model_mb": info.get("model_mb"),
                   "prompts": len(w.prompts), "loop_rounds": 1 + len(w.loop_turns)}
            row["note"] = "; ".join(n for n in (info.get("note"), row.get("note")) if n)
            rows.append(row)
    return rows


class PeerServer(ServedWorker):
    """One peer row kept running (`bench lm --paired`): its worker in the engine's venv, started once
    with the "serve" step (`common.serve_lm`), answers one prompt per `decode_tokens_per_s` call, so
    that its answers and ours can alternate prompt by prompt."""

    @classmethod
    def start(cls, gguf: Path, workload: dict, threads: int, peer: dict) -> PeerServer:
        """The worker for `peer` (engine, precision, spec_mode) at `threads`, its model prepared first."""
        from sol_control.lm.tokenizer import read_gguf_tokenizer

        gguf, engine = Path(gguf).resolve(), peer["engine"]
        if not venv_ready(engine):
            raise RuntimeError(f"no venv for {engine} (run `bash tools/setup_peers.sh {VENVS[engine][1]}`)")
        w = lm_work(read_gguf_tokenizer(gguf), workload, threads)
        spec = worker_spec(gguf, w, engine, peer["precision"], peer["spec_mode"], None)
        prepared(spec)
        return lm_call(spec, "serve")

    def decode_tokens_per_s(self, ids: list[int], max_new_tokens: int) -> float | None:
        """The peer's answer to `ids` from an empty cache: decode tokens/s as `time_lm` counts them."""
        r = self.ask({"ids": [int(i) for i in ids], "max_new": max_new_tokens})
        return decode_rate(len(r["tokens"]), r["first_ms"], r["wall_ms"])


# ---- our fp32 reference and agreement ---------------------------------------------------------------
