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
- the worker (`python -m sol_control.bench.peers worker SPEC OUT`, `lm_step`) imports its engine only:
    llama.cpp     the GGUF itself (Q4_1), and F32 / Q8_0 GGUFs from the HF folder (its converter
                  and quantizer); plain and prompt lookup (`LlamaPromptLookupDecoding`)
    ort-genai     the builder on the HF folder, fp32 / int8 / int4; plain and n-gram drafting
    openvino      optimum-cli export, fp32 / int8 / int4; plain and prompt lookup
    transformers  fp32; plain and `prompt_lookup_num_tokens`

Every engine gets the same ids, decodes greedily and stops at a stop id (kept) or max new tokens
(prompts 128, loop 64). The agent loop keeps each engine's own cache across rounds where its API
allows it (the row's `note` says how); round r's context is round r-1's + its answer + `close`
+ the next tool result's user turn (`common.next_loop_context`), so each engine follows its own
answers; our rows get the same ids (`bench.lm_rows.run_workload`). `fp32_reference` gives our
engine's fp32 greedy tokens on the same procedure; `lm_agreement` compares.

    python -m sol_control.bench.peers --gguf G --threads 1 [--quick] [--reference] [--json out.json]
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from ..common import REPO, first_difference, fmt as _f, table
from .common import (VENVS, LMWork, ServedWorker, build_once, call_worker, decode_rate, next_loop_context,
                     serve_worker)

WORKLOAD = REPO / "sol_control" / "bench" / "data" / "lm_workload.json"
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
ROW_KEYS = ("engine", "mode", "precision", "threads", "weights_from", "decode_tokens_per_s", "ttft_ms",
            "tokens_per_s_with_prefill", "loop_s", "cpu_s_per_query", "rss_mb", "outputs", "note")


# ---- the workload as our tokenizer's ids ------------------------------------------------------------

def lm_work(tok, workload: dict, threads: int = 1, quick: bool = False) -> LMWork:
    """Prompts through our chat template; the loop as the first context, the later user turns and
    the ids that close an answer, all cut from the template's own renderings."""
    n = 3 if quick else None
    loop = workload["agent_loop"]
    system = {"role": "system", "content": loop["system"]}
    results = loop["tool_results"][:n]
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in workload["prompts"][:n]]
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


def file_digest(path: Path) -> str:
    """The sha256 prefix of a file, read once per (path, size, mtime) in a process."""
    st = Path(path).stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    from sol_control.bundle import sha256_file

    return sha256_file(Path(path))[:12]


def hf_folder(gguf: Path, cache: Path | None = None) -> Path:
    """The GGUF's dequantized weights + tokenizer as a HF folder, written once under
    `.work/lm/hf/<stem>-<sha256 prefix>` (git-ignored: weights we did not train are never committed)."""
    from sol_control.lm.hf_writer import gguf_to_hf

    folder = Path(cache or REPO / ".work" / "lm" / "hf") / f"{gguf.stem}-{file_digest(gguf)}"
    if not (folder / "config.json").is_file():
        t0 = time.monotonic_ns()

        def build(tmp: Path) -> None:
            gguf_to_hf(gguf, tmp)
            (tmp / "sol_control.json").write_text(json.dumps({"from": gguf.name, "sha256_prefix": file_digest(gguf),
                                                              "write_s": round((time.monotonic_ns() - t0) / 1e9, 2)}))
        build_once(folder, build)
    return folder


# ---- the worker (inside the engine's venv) ----------------------------------------------------------

def venv_ready(engine: str) -> bool:
    """The venv's stamp file: `tools/setup_peers.sh` writes it last, after every install step."""
    return (VENVS[engine][0] / ".peers-installed").is_file()


def lm_call(spec: dict, step: str, work: Path, timeout_s: float) -> dict:
    """The worker's `step` ("prepare", "run") of the LM row `spec`, in its engine's venv."""
    threads = spec["work_ids"]["threads"]
    tag = f"{spec['engine']}-{spec['precision']}-{spec['mode']}-{step}-t{threads}"
    return call_worker(spec["engine"], {**spec, "step": step}, work, tag, threads, timeout_s)


def prepared(spec: dict, work: Path, timeout_s: float) -> dict:
    """The engine's model at `precision` (the worker converts it when it is not there yet) and its
    format, size and notes; the first conversion's time is recorded next to it, so runs on the
    cached model still report it (`convert_s`, the worker process's wall time)."""
    record = work / f"{spec['engine']}-{spec['precision']}.convert.json"
    t0 = time.monotonic_ns()
    info = lm_call(spec, "prepare", work, timeout_s)
    if not record.is_file():
        record.write_text(json.dumps({"convert_s": round((time.monotonic_ns() - t0) / 1e9, 1)}))
    return {**info, "convert_s": json.loads(record.read_text())["convert_s"]}


def empty_row(engine: str, mode: str | None, precision: str | None, threads: int, note: str) -> dict:
    """A row that did not run: ROW_KEYS, its figures None, why in `note`."""
    return {**dict.fromkeys(ROW_KEYS), "engine": engine, "mode": mode, "precision": precision,
            "threads": threads, "note": note, "skipped": True}


def work_dir(gguf: Path) -> Path:
    """Where the peers' converted models and worker logs for this GGUF live (git-ignored)."""
    return REPO / ".work" / "lm" / "peers" / f"{gguf.stem}-{file_digest(gguf)}"


def worker_spec(gguf: Path, w: LMWork, engine: str, precision: str, mode: str, work: Path) -> dict:
    """What a worker is told: the engine, its row, the model (llama.cpp's int4 is the GGUF itself,
    the rest start from the HF folder of its dequantized weights, written once) and the ids."""
    native = engine == "llama.cpp" and precision == "int4"
    hf_dir = None if native else hf_folder(gguf)
    return {"engine": engine, "precision": precision, "mode": mode, "gguf": str(gguf), "native": native,
            "hf_dir": str(hf_dir) if hf_dir else None, "work": str(work / engine), "work_ids": asdict(w)}


def run_lm_peers(gguf: Path, workload: dict, threads: int, engines=None, quick: bool = False, *,
                 reference: dict | None = None, modes: dict | None = None, work: Path | None = None,
                 timeout_s: float = 5400) -> list[dict]:
    """One row per (engine, precision, mode) on `workload` (the lm_workload.json dict) at `threads`.

    Row keys: ROW_KEYS plus `spec_mode` (the LM_MODES name of the row's mode), `format`, `convert_s`,
    `model_mb`, `loop_ttft_ms`, `loop_new_tokens`, `loop_context_tokens`, `prompts`/`loop_rounds`; with `reference` ({"prompts": [[ids]], "loop":
    [[ids]]}, e.g. `fp32_reference(...)`), `agreement` (`lm_agreement`). An engine without its venv,
    or a row whose worker failed, has `skipped: True`, None figures and the reason in `note`."""
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    gguf = Path(gguf).resolve()
    w = lm_work(read_gguf_tokenizer(gguf), workload, threads, quick)
    modes = modes or LM_MODES
    rows = []
    work = Path(work or work_dir(gguf))
    for engine in engines or LM_ENGINES:
        if not venv_ready(engine):
            venv, target = VENVS[engine]
            rows.append(empty_row(engine, None, None, threads,
                                  f"skipped: no {venv.name} (run `bash tools/setup_peers.sh {target}`)"))
            continue
        for precision, mode in modes[engine]:
            spec = worker_spec(gguf, w, engine, precision, mode, work)
            try:
                info = prepared(spec, work / engine, timeout_s)
                row = lm_call(spec, "run", work / engine, timeout_s)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as err:
                rows.append(empty_row(engine, mode, precision, threads, f"failed: {str(err)[-600:]}"))
                continue
            row = {"engine": engine, "precision": precision, "threads": threads, "spec_mode": mode,
                   "weights_from": info.get("weights_from") or FROM_HF, **row,
                   "format": info.get("format"), "convert_s": info.get("convert_s"), "model_mb": info.get("model_mb"),
                   "prompts": len(w.prompts), "loop_rounds": 1 + len(w.loop_turns)}
            row["note"] = "; ".join(n for n in (info.get("note"), row.get("note")) if n)
            if reference is not None:
                row["agreement"] = lm_agreement(row["outputs"], reference)
            rows.append(row)
    return rows


class PeerServer(ServedWorker):
    """One peer row kept running (`bench lm --paired`): its worker in the engine's venv, started once
    with the "serve" step (`common.serve_lm`), answers one prompt per `decode_tokens_per_s` call, so
    that its answers and ours can alternate prompt by prompt."""

    @classmethod
    def start(cls, gguf: Path, workload: dict, threads: int, peer: dict, work: Path | None = None) -> PeerServer:
        """The worker for `peer` (engine, precision, spec_mode) at `threads`, its model prepared first."""
        from sol_control.lm.tokenizer import read_gguf_tokenizer

        gguf = Path(gguf).resolve()
        engine = peer["engine"]
        if not venv_ready(engine):
            raise RuntimeError(f"no venv for {engine} (run `bash tools/setup_peers.sh {VENVS[engine][1]}`)")
        work = Path(work or work_dir(gguf)) / engine
        spec = worker_spec(gguf, lm_work(read_gguf_tokenizer(gguf), workload, threads), engine, peer["precision"],
                           peer["spec_mode"], work.parent)
        prepared(spec, work, 5400)
        tag = f"{engine}-{peer['precision']}-{peer['spec_mode']}-serve-t{threads}"
        return serve_worker(engine, spec, work, tag, threads, cls=cls)

    def decode_tokens_per_s(self, ids: list[int], max_new_tokens: int) -> float | None:
        """The peer's answer to `ids` from an empty cache: decode tokens/s as `time_lm` counts them."""
        r = self.ask({"ids": [int(i) for i in ids], "max_new": max_new_tokens})
        return decode_rate(len(r["tokens"]), r["first_ms"], r["wall_ms"])


# ---- our fp32 reference and agreement ---------------------------------------------------------------

def fp32_reference(gguf: Path, workload: dict, threads: int = 1, quick: bool = False,
                   bundle: Path | None = None, cache: Path | None = None) -> dict:
    """Our fp32 engine's greedy tokens on the same ids: `sol-control import GGUF --out BUNDLE` (fp32
    only; once), then a plain fp32 row through the workload (`lm_rows.run_workload`: each loop round's
    context from its own answers). Cached under `.work/lm/peers/` by the ids' sha256."""
    from sol_control.bundle import Bundle
    from sol_control.cli import main
    from sol_control.decoding import open_decoder
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    from ..lm_rows import Row, run_workload

    gguf = Path(gguf).resolve()
    w = lm_work(read_gguf_tokenizer(gguf), workload, threads, quick)
    key = hashlib.sha256(json.dumps([w.prompts, w.loop_first, w.loop_turns, w.close, w.prompt_new_tokens,
                                     w.loop_new_tokens]).encode()).hexdigest()[:12]
    path = Path(cache or REPO / ".work" / "lm" / "peers") / f"fp32_reference-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    bundle = Path(bundle or REPO / ".work" / "lm" / "peers_ref")
    if (bundle / "manifest.json").is_file():
        source = json.loads((bundle / "manifest.json").read_text())["metrics"]["import"]["target"]
        if source.get("file") != gguf.name:
            raise ValueError(f"{bundle} was imported from {source.get('file')!r}, not {gguf.name!r}: "
                             f"give another bundle folder")
    elif main(["import", str(gguf), "--out", str(bundle)]) != 0:
        raise RuntimeError(f"sol-control import {gguf} failed (see above)")
    target = open_decoder(Bundle.load(bundle), "target", "fp32", threads)
    row = Row("fp32", "fp32", "plain", target, threads=threads)
    run_workload([row], w, 1)
    answers = {part: [[int(t) for t in run.tokens] for run in runs[0]]
               for part, runs in (("prompts", row.prompts), ("loop", row.loops))}
    ref = {**answers, "bundle": str(bundle), "precision": "fp32"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ref))
    return ref


def lm_agreement(outputs: dict, reference: dict) -> dict:
    """Prompts whose tokens equal the reference's (and where the others first differ); loop rounds
    equal before the first round that differs (after it the contexts differ too)."""
    first_diff = [first_difference(got, want) for got, want in zip(outputs["prompts"], reference["prompts"])]
    rounds = 0
    for got, want in zip(outputs["loop"], reference["loop"]):
        if got != want:
            break
        rounds += 1
    return {"prompts_equal": sum(d is None for d in first_diff), "prompts": len(first_diff),
            "first_difference_at": first_diff, "loop_rounds_equal": rounds, "loop_rounds": len(reference["loop"])}


# ---- the table --------------------------------------------------------------------------------------

def print_lm_rows(rows: list[dict]) -> None:
    head = ["engine", "mode", "prec", "format", "decode tok/s", "TTFT ms", "tok/s w/ prefill", "loop s",
            "CPU s/query", "RSS MB", "= fp32 prompts", "= fp32 loop"]
    body = []
    for r in rows:
        if r.get("skipped"):
            continue
        a = r.get("agreement")
        body.append([r["engine"], r["mode"], r["precision"], r.get("format") or "-",
                     _f(r["decode_tokens_per_s"], ".1f"), _f(r["ttft_ms"], ".0f"),
                     _f(r["tokens_per_s_with_prefill"], ".1f"), _f(r["loop_s"], ".1f"),
                     _f(r["cpu_s_per_query"], ".2f"), _f(r["rss_mb"], ".0f"),
                     f"{a['prompts_equal']}/{a['prompts']}" if a else "-",
                     f"{a['loop_rounds_equal']}/{a['loop_rounds']}" if a else "-"])
    print(table(head, body))
    for r in rows:
        if r.get("skipped"):
            print(f"{r['engine']} {r['mode'] or ''} {r['precision'] or ''}: {r['note']}")


def lm_main(args) -> int:
    """`python -m sol_control.bench.peers --gguf G` (the arguments: `peers.main`)."""
    workload = json.loads((args.workload or WORKLOAD).read_text())
    reference = fp32_reference(args.gguf, workload, args.threads, args.quick) if args.reference else None
    rows = run_lm_peers(args.gguf, workload, args.threads, args.engines, args.quick, reference=reference)
    print(f"{args.gguf.name}, {args.threads} thread(s), {'quick' if args.quick else 'full'} workload")
    print_lm_rows(rows)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "reference": reference, "threads": args.threads,
                                         "quick": args.quick, "loadavg": os.getloadavg()}, indent=1))
    return 0 if any(not r.get("skipped") for r in rows) else 1
