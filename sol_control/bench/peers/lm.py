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
- the worker (`python -m sol_control.bench.peers.lm worker SPEC OUT`) imports its engine only:
    llama.cpp     the GGUF itself (Q4_1), and F32 / Q8_0 GGUFs from the HF folder (its converter
                  and quantizer); plain and prompt lookup (`LlamaPromptLookupDecoding`)
    ort-genai     the builder on the HF folder, fp32 / int8 / int4; plain and n-gram drafting
    openvino      optimum-cli export, fp32 / int8 / int4; plain and prompt lookup
    transformers  fp32; plain and `prompt_lookup_num_tokens`

Every engine gets the same ids, decodes greedily and stops at a stop id (kept) or max new tokens
(prompts 128, loop 64). The agent loop keeps each engine's own cache across rounds where its API
allows it (the row's `note` says how); round r's context is round r-1's + its answer + `close`
+ the next tool result's user turn (`common.next_loop_context`), so each engine follows its own
answers. `fp32_reference` gives our engine's fp32 greedy tokens (`sol-control generate`) on the
same procedure; `lm_agreement` compares.

    python -m sol_control.bench.peers.lm --gguf G --threads 1 [--quick] [--reference] [--json out.json]
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..common import REPO, fmt as _f, table
from ..stats import first_difference
from .common import (VENVS, LMWork, ServedWorker, decode_rate, next_loop_context, serve_lm, time_lm,
                     worker_env)

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
# the worker imports one engine module: the others may not even install in its venv
LM_RUNNERS = {"llama.cpp": ("llamacpp", "prepare_llama_lm", "run_llama_lm"),
              "ort-genai": ("ort_genai", "prepare_genai_lm", "run_genai_lm"),
              "openvino": ("ov_genai", "prepare_ov_lm", "run_openvino_lm"),
              "transformers": ("hf_transformers", "prepare_transformers_lm", "run_transformers_lm")}
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
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.monotonic_ns()
        gguf_to_hf(gguf, tmp)
        (tmp / "sol_control.json").write_text(json.dumps({"from": gguf.name, "sha256_prefix": file_digest(gguf),
                                                          "write_s": round((time.monotonic_ns() - t0) / 1e9, 2)}))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    return folder


# ---- the worker (inside the engine's venv) ----------------------------------------------------------

def worker(spec_path: Path, out_path: Path) -> None:
    import importlib

    spec = json.loads(spec_path.read_text())
    engine = spec["engine"]
    module, prepare, run = LM_RUNNERS[engine]
    mod = importlib.import_module(f"{__package__}.{module}")
    w = LMWork(**spec["work_ids"])
    src = Path(spec["gguf"] if spec.get("native") else spec["hf_dir"])
    if spec["step"] == "prepare":
        out = getattr(mod, prepare)(src, Path(spec["work"]), spec["precision"], w.threads)
    else:
        timer = {"run": time_lm, "serve": serve_lm}[spec["step"]]
        out = getattr(mod, run)(src, w, Path(spec["work"]), spec["precision"], spec["mode"], timer=timer)
    out_path.write_text(json.dumps(out))


def venv_ready(engine: str) -> bool:
    """The venv's stamp file: `tools/setup_peers.sh` writes it last, after every install step."""
    return (VENVS[engine][0] / ".peers-installed").is_file()


def worker_argv(engine: str, spec_path: Path, out_path: Path | str) -> list[str]:
    """The command of one worker step, in the engine's venv."""
    return [str(VENVS[engine][0] / "bin" / "python"), "-m", "sol_control.bench.peers.lm", "worker", str(spec_path),
            str(out_path)]


def call_worker(engine: str, spec: dict, work: Path, timeout_s: float) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    tag = f"{engine}-{spec['precision']}-{spec.get('mode', '')}-{spec['step']}-t{spec['work_ids']['threads']}"
    spec_path, out_path = work / f"{tag}.spec.json", work / f"{tag}.out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    proc = subprocess.run(worker_argv(engine, spec_path, out_path), env=worker_env(spec["work_ids"]["threads"]),
                          capture_output=True, text=True, timeout=timeout_s)
    (work / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out_path.is_file():
        raise RuntimeError(f"{engine} {spec['step']} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return json.loads(out_path.read_text())


def prepared(engine: str, spec: dict, work: Path, timeout_s: float) -> dict:
    """The engine's model at `precision` (the worker converts it when it is not there yet) and its
    format, size and notes; the first conversion's time is recorded next to it, so runs on the
    cached model still report it (`convert_s`, the worker process's wall time)."""
    record = work / f"{engine}-{spec['precision']}.convert.json"
    t0 = time.monotonic_ns()
    info = call_worker(engine, {**spec, "step": "prepare"}, work, timeout_s)
    if not record.is_file():
        record.write_text(json.dumps({"convert_s": round((time.monotonic_ns() - t0) / 1e9, 1)}))
    return {**info, "convert_s": json.loads(record.read_text())["convert_s"]}


def empty_row(engine: str, mode: str | None, precision: str | None, threads: int, note: str) -> dict:
    return {"engine": engine, "mode": mode, "precision": precision, "threads": threads, "weights_from": None,
            "decode_tokens_per_s": None, "ttft_ms": None, "tokens_per_s_with_prefill": None, "loop_s": None,
            "cpu_s_per_query": None, "rss_mb": None, "outputs": None, "note": note, "skipped": True}


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
                info = prepared(engine, spec, work / engine, timeout_s)
                row = call_worker(engine, {**spec, "step": "run"}, work / engine, timeout_s)
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
        prepared(engine, spec, work, 5400)
        spec_path = work / f"{engine}-{peer['precision']}-{peer['spec_mode']}-serve-t{threads}.spec.json"
        spec_path.write_text(json.dumps({**spec, "step": "serve"}))
        return cls(worker_argv(engine, spec_path, os.devnull), worker_env(threads), spec_path.with_suffix(".log"))

    def decode_tokens_per_s(self, ids: list[int], max_new_tokens: int) -> float | None:
        """The peer's answer to `ids` from an empty cache: decode tokens/s as `time_lm` counts them."""
        r = self.ask({"ids": [int(i) for i in ids], "max_new": max_new_tokens})
        return decode_rate(len(r["tokens"]), r["first_ms"], r["wall_ms"])


# ---- our fp32 reference and agreement ---------------------------------------------------------------

def _sol_control() -> list[str]:
    exe = Path(sys.executable).with_name("sol-control")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "sol_control.cli"]


def _our_greedy(bundle: Path, ids: list[int], max_new_tokens: int, threads: int, out: Path) -> list[int]:
    cmd = [*_sol_control(), "generate", "--bundle", str(bundle), "--precision", "fp32", "--no-draft",
           "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(max_new_tokens),
           "--threads", str(threads), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if proc.returncode != 0:
        raise RuntimeError(f"sol-control generate failed: {proc.stderr[-1000:]}")
    return json.loads(out.read_text())["tokens"]


def fp32_reference(gguf: Path, workload: dict, threads: int = 1, quick: bool = False,
                   bundle: Path | None = None, cache: Path | None = None) -> dict:
    """Our fp32 engine's greedy tokens on the same ids: `sol-control import GGUF --out BUNDLE`
    (fp32 only; once), then `sol-control generate --precision fp32 --prompt-ids ...` per prompt and
    per loop round (each round's context from our own answers, prefilled whole: greedy tokens do
    not depend on a kept cache). Cached under `.work/lm/peers/` by the ids' sha256."""
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    gguf = Path(gguf).resolve()
    bundle = Path(bundle or REPO / ".work" / "lm" / "peers_ref")
    w = lm_work(read_gguf_tokenizer(gguf), workload, threads, quick)
    key = hashlib.sha256(json.dumps([w.prompts, w.loop_first, w.loop_turns, w.close, w.prompt_new_tokens,
                                     w.loop_new_tokens]).encode()).hexdigest()[:12]
    path = Path(cache or REPO / ".work" / "lm" / "peers") / f"fp32_reference-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    if (bundle / "manifest.json").is_file():
        source = json.loads((bundle / "manifest.json").read_text())["metrics"]["import"]["target"]
        if source.get("file") != gguf.name:
            raise ValueError(f"{bundle} was imported from {source.get('file')!r}, not {gguf.name!r}: "
                             f"give another bundle folder")
    else:
        proc = subprocess.run([*_sol_control(), "import", str(gguf), "--out", str(bundle)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"sol-control import failed: {proc.stderr[-1000:]}")
    tmp = path.with_suffix(".tmp.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    prompts = [_our_greedy(bundle, ids, w.prompt_new_tokens, threads, tmp) for ids in w.prompts]
    loop, context = [], list(w.loop_first)
    for r in range(1 + len(w.loop_turns)):
        loop.append(_our_greedy(bundle, context, w.loop_new_tokens, threads, tmp))
        if r < len(w.loop_turns):
            context = next_loop_context(context, loop[-1], w.loop_turns[r], w.close, w.stop_ids)
    tmp.unlink(missing_ok=True)
    ref = {"prompts": prompts, "loop": loop, "bundle": str(bundle), "precision": "fp32"}
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        worker(Path(argv[1]), Path(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="3 prompts and 3 loop rounds")
    ap.add_argument("--engines", nargs="*", default=list(LM_ENGINES), choices=LM_ENGINES)
    ap.add_argument("--workload", type=Path, default=WORKLOAD)
    ap.add_argument("--reference", action="store_true",
                    help="compare every row's tokens with our fp32 engine's (sol-control generate)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads must be positive, got {args.threads}")
    workload = json.loads(args.workload.read_text())
    reference = fp32_reference(args.gguf, workload, args.threads, args.quick) if args.reference else None
    rows = run_lm_peers(args.gguf, workload, args.threads, args.engines, args.quick, reference=reference)
    print(f"{args.gguf.name}, {args.threads} thread(s), {'quick' if args.quick else 'full'} workload")
    print_lm_rows(rows)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "reference": reference, "threads": args.threads,
                                         "quick": args.quick, "loadavg": os.getloadavg()}, indent=1))
    return 0 if any(not r.get("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
