"""What every peer runner shares: the workloads, the timing loops, where the venvs are, and the
worker (one step of a peer row in its engine's venv) with the calls that start it from our venv."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..common import REPO, ms_since, pct, rss_bytes

# engine -> (venv, `tools/setup_peers.sh` target that makes it)
VENVS = {"ort-genai": (REPO / ".venv-peers", "genai"),
         "transformers": (REPO / ".venv-peers", "genai"),
         "openvino": (REPO / ".venv-ov", "ov"), "llama.cpp": (REPO / ".venv-llama", "llama")}
ENGINES = tuple(VENVS)
# precisions each engine runs by default; "int8"/"int4" are the engine's own weight quantization
PRECISIONS = {"ort-genai": ("fp32", "int4"), "transformers": ("fp32",),
              "openvino": ("fp32", "int8", "int4"), "llama.cpp": ("fp32", "int8", "int4")}
WEIGHTS_FROM = "bundle fp32 ONNX"


def venv_ready(engine: str) -> bool:
    """The venv's stamp file: `tools/setup_peers.sh` writes it last, after every install step."""
    return (VENVS[engine][0] / ".peers-installed").is_file()


@dataclass
class Workload:
    prefixes: list[list[int]]
    new_tokens: int
    rounds: int = 5
    threads: int = 1
    k: int = 8  # draft tokens per speculative step (fixed, the peers' usual knob)


# decide(prefix) -> (new tokens, ttft_ms, extra info)
Decide = Callable[[list[int]], tuple[list[int], float, dict]]


def time_decisions(decide: Decide, w: Workload, mode: str | None = None) -> dict:
    """Run every prefix `w.rounds` times; per round tokens/s over all decisions, medians over rounds
    (`mode`, the row's, is for `serve_decisions`)."""
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


# ---- language models (sol_control.bench.peers.lm): chat prompts and an agent loop, as token ids ---

@dataclass
class LMWork:
    """The LM benchmark workload as our tokenizer's ids: every engine decodes exactly these."""
    prompts: list[list[int]]     # chat prompts, each decoded from an empty cache
    loop_first: list[int]        # system prompt + the first tool result + the assistant header
    loop_turns: list[list[int]]  # each later round: the user turn (tool result) + the assistant header
    close: list[int]             # ends an assistant answer (`<|im_end|>\n`) in the conversation
    stop_ids: list[int]
    prompt_new_tokens: int = 128
    loop_new_tokens: int = 64
    threads: int = 1

    @property
    def loop_context_max(self) -> int:
        """Positions the whole agent loop can reach (a KV cache this long holds every round)."""
        rounds = 1 + len(self.loop_turns)
        return len(self.loop_first) + sum(map(len, self.loop_turns)) + rounds * (self.loop_new_tokens + len(self.close))


def next_loop_context(context: list[int], answer: list[int], turn: list[int], close: list[int],
                      stop_ids=()) -> list[int]:
    """The conversation after one round: + the answer + what closes it + the next user turn. An
    answer that ended on the end-of-turn id (close[0]) keeps it and gets the rest of `close`; one
    that ended on another stop id loses that id (the template's text has no place for it); one cut
    at max tokens gets all of `close`. (Our rows' contexts too: `bench.lm_rows.run_workload`.)"""
    if answer and answer[-1] == close[0]:
        return context + answer + close[1:] + turn
    if answer and answer[-1] in stop_ids:
        answer = answer[:-1]
    return context + answer + close + turn


def cut_at_stop(tokens: list[int], stop_ids, max_new_tokens: int) -> list[int]:
    """The answer up to and including its first stop id, at most max_new_tokens (engines that
    verify several draft tokens a step may run past the stop)."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in stop_ids:
            return tokens[:i + 1]
    return tokens[:max_new_tokens]


# generate(ids, max_new_tokens, keep) -> (new tokens with the stop id that ended them, ttft_ms).
# keep=False: from an empty cache. keep=True: `ids` extends the previous call's ids + answer and
# the engine reuses its cache for that part (where its API allows; the row's note says otherwise).
# An engine that reuses a cached prefix by itself sets `generate.reset`: called, untimed, before
# every keep=False call.
LMGenerate = Callable[[list[int], int, bool], tuple[list[int], float]]


def decode_rate(n_tokens: int, first_ms: float, wall_ms: float) -> float | None:
    """Decode tokens/s of one answer: the tokens after the first over the time after it (None for
    an answer of one token)."""
    return (n_tokens - 1) / (wall_ms - first_ms) * 1e3 if n_tokens > 1 and wall_ms > first_ms else None


def timed_answer(generate: LMGenerate, ids: list[int], max_new_tokens: int) -> dict:
    """One answer from an empty cache (`generate.reset` first, untimed): its tokens, ms to the first
    and in all, and this process's CPU seconds (all threads)."""
    getattr(generate, "reset", lambda: None)()
    c0, t0 = time.process_time(), time.monotonic_ns()
    tokens, first_ms = generate(ids, max_new_tokens, False)
    return {"tokens": [int(t) for t in tokens], "first_ms": first_ms, "wall_ms": ms_since(t0),
            "cpu_s": time.process_time() - c0}


def time_lm(generate: LMGenerate, w: LMWork) -> dict:
    """Every prompt once (medians over prompts), then the whole agent loop end to end.

    decode tokens/s = (new tokens - 1) / time after the first token; TTFT = call to first token;
    tokens/s with prefill = new tokens / whole call; cpu_s_per_query = this process's CPU time
    (all threads) per prompt; rss_mb = the process's peak RSS (a fresh worker per row)."""
    timed_answer(generate, w.prompts[0], 4)  # warm-up: first calls allocate
    runs = [timed_answer(generate, ids, w.prompt_new_tokens) for ids in w.prompts]
    decode = [decode_rate(len(r["tokens"]), r["first_ms"], r["wall_ms"]) for r in runs]
    loop_out, loop_ttft, context = [], [], list(w.loop_first)
    getattr(generate, "reset", lambda: None)()
    t0 = time.monotonic_ns()
    for r in range(1 + len(w.loop_turns)):
        tokens, first_ms = generate(context, w.loop_new_tokens, r > 0)
        loop_out.append([int(t) for t in tokens])
        loop_ttft.append(first_ms)
        if r < len(w.loop_turns):
            context = next_loop_context(context, loop_out[-1], w.loop_turns[r], w.close, w.stop_ids)
    loop_s = ms_since(t0) / 1e3
    with_prefill = [len(r["tokens"]) / r["wall_ms"] * 1e3 for r in runs]
    return {"decode_tokens_per_s": pct([d for d in decode if d is not None], 50),
            "ttft_ms": pct([r["first_ms"] for r in runs], 50),
            "tokens_per_s_with_prefill": pct(with_prefill, 50), "loop_s": loop_s,
            "loop_ttft_ms": pct(loop_ttft, 50), "loop_new_tokens": sum(map(len, loop_out)),
            "loop_context_tokens": len(context) + len(loop_out[-1]),
            "cpu_s_per_query": pct([r["cpu_s"] for r in runs], 50),
            "rss_mb": rss_bytes("VmHWM") / 2**20 or float("nan"),  # this worker's peak
            "outputs": {"prompts": [r["tokens"] for r in runs], "loop": loop_out}}


def worker_env(threads: int) -> dict:
    """The environment of a peer worker: our package importable, the engine held to `threads`."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


SERVE_MARK = "@@sol_control "  # starts every reply line of a serving worker (the engine may print too)


def serve(answer: Callable[[dict], dict], warm_up: Callable[[], object]) -> dict:
    """A worker's "serve" step (the paired benchmarks): `warm_up()`, a `{"ready": true}` reply, then
    `answer(request)` for each request line (JSON) until the input ends. Replies are JSON lines
    starting with SERVE_MARK."""
    def reply(obj: dict) -> None:
        sys.stdout.write(SERVE_MARK + json.dumps(obj) + "\n")
        sys.stdout.flush()

    warm_up()  # first calls allocate
    reply({"ready": True})
    served = 0
    for line in sys.stdin:
        reply(answer(json.loads(line)))
        served += 1
    return {"served": served}


def serve_lm(generate: LMGenerate, w: LMWork) -> dict:
    """`serve` for an LM row: a request `{"ids": [...], "max_new": N}` is answered from an empty
    cache and replied as `timed_answer` times it (`tokens`, `first_ms`, `wall_ms`, `cpu_s`)."""
    return serve(lambda req: timed_answer(generate, req["ids"], int(req["max_new"])),
                 lambda: timed_answer(generate, w.prompts[0], 4))


def timed_row(engine: str, mode: str, precision: str, decide: Decide, w: Workload, timer=time_decisions) -> dict:
    """A peer's decision row: what it is, and `timer`'s figures (`time_decisions`, or serving it)."""
    return {"engine": engine, "mode": mode, "precision": precision, **timer(decide, w, mode)}


def serve_decisions(mode: str):
    """A `time_decisions` stand-in that serves the row of `mode` (`serve`: a request `{"prefix":
    [...]}` is one decision, replied as `{"tokens": [...], "ms": ...}`) and skips the engine's other
    rows."""
    def timer(decide: Decide, w: Workload, row_mode: str | None = None) -> dict:
        if row_mode != mode:
            return {"skipped": True}

        def answer(req: dict) -> dict:
            t0 = time.monotonic_ns()
            tokens, _, _ = decide(req["prefix"])
            return {"tokens": [int(t) for t in tokens], "ms": ms_since(t0)}

        return serve(answer, lambda: decide(w.prefixes[0]))

    return timer


class ServedWorker:
    """A peer worker kept running with its "serve" step: `ask(request)` writes one request line and
    reads the reply (lines without SERVE_MARK, the engine's own output, are skipped), with a timeout;
    a worker that stalls is killed. `command` is its argv, stderr goes to `log`."""

    def __init__(self, command: list[str], env: dict, log, timeout_s: float = 600):
        self.timeout_s, self._buf, self._log = timeout_s, b"", open(log, "wb")
        self._proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log)
        try:
            self._reply()  # {"ready": true} after the worker's warm-up
        except RuntimeError:
            self.close()
            raise

    def ask(self, request: dict) -> dict:
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
        self._proc.stdin.flush()
        return self._reply()

    def _reply(self) -> dict:
        deadline, fd = time.monotonic() + self.timeout_s, self._proc.stdout.fileno()
        while True:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self._proc.kill()  # stalled: close() need not wait for it
                    raise RuntimeError(f"peer worker: no reply in {self.timeout_s:.0f} s (log: {self._log.name})")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    code = self._proc.wait()
                    self._log.flush()
                    with open(self._log.name, "rb") as fh:
                        tail = fh.read()[-600:].decode(errors="replace").strip()
                    raise RuntimeError(f"peer worker exited ({code}); {self._log.name}: {tail}")
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            if line.startswith(SERVE_MARK.encode()):
                return json.loads(line[len(SERVE_MARK):])

    def close(self) -> None:
        if self._proc.stdin and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- the worker: one step of a peer row in the engine's venv, and how our side calls it ---------------

# the worker imports its engine's module only: the others may not even install in its venv
MODULES = {"ort-genai": "ort_genai", "transformers": "hf_transformers", "openvino": "ov_genai",
           "llama.cpp": "llamacpp"}


def worker(spec_path: Path, out_path: Path) -> None:
    """`python -m sol_control.bench.peers SPEC OUT`, in the engine's venv: one step of the
    decision rows (`decision_step`) or of an LM row (`lm_step`), its output as JSON in OUT."""
    import importlib

    spec = json.loads(spec_path.read_text())
    engine = importlib.import_module(f"{__package__}.{MODULES[spec['engine']]}")
    step = lm_step if "work_ids" in spec else decision_step
    out_path.write_text(json.dumps(step(engine, spec)))


def decision_step(engine, spec: dict) -> dict:
    """Every decision row of the engine (`run`), or the one of `mode` served (`serve`)."""
    w, serve_mode = Workload(**spec["workload"]), spec["mode"] if spec["step"] == "serve" else None
    precisions = tuple(spec["precisions"] or PRECISIONS[spec["engine"]])
    timer = serve_decisions(serve_mode) if serve_mode else time_decisions
    hf_target, hf_draft = Path(spec["hf_target"]), spec["hf_draft"] and Path(spec["hf_draft"])
    rows = engine.run_decisions(hf_target, hf_draft, w, Path(spec["work"]), precisions, timer=timer)
    if serve_mode and not any("served" in r for r in rows):
        raise ValueError(f"{spec['engine']} has no {serve_mode} row at {list(precisions)}")
    return {"rows": rows}


def lm_step(engine, spec: dict) -> dict:
    """An LM row's step in the engine's venv (`worker`): its model prepared, the row run or served."""
    w = LMWork(**spec["work_ids"])
    src = Path(spec["gguf"] if spec.get("native") else spec["hf_dir"])
    if spec["step"] == "prepare":
        return engine.prepare_lm(src, Path(spec["work"]), spec["precision"], w.threads)
    timer = {"run": time_lm, "serve": serve_lm}[spec["step"]]
    return engine.run_lm(src, w, Path(spec["work"]), spec["precision"], spec["mode"], timer=timer)


def worker_argv(engine: str, spec_path: Path, out_path: Path | str) -> list[str]:
    """The worker's command in the engine's venv."""
    python = VENVS[engine][0] / "bin" / "python"
    return [str(python), "-m", "sol_control.bench.peers", str(spec_path), str(out_path)]


def call_worker(engine: str, spec: dict, work: Path, tag: str, threads: int,
                timeout_s: float) -> dict:
    """One worker step in the engine's venv, its output; the spec, the output and the worker's log
    stay in `work` as `tag`.*."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = work / f"{tag}.spec.json", work / f"{tag}.out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    proc = subprocess.run(worker_argv(engine, spec_path, out_path), env=worker_env(threads),
                          capture_output=True, text=True, timeout=timeout_s)
    (work / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out_path.is_file():
        raise RuntimeError(f"peer {engine} {spec['step']} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return json.loads(out_path.read_text())


def serve_worker(engine: str, spec: dict, work: Path, tag: str, threads: int, timeout_s: float = 600,
                 cls=ServedWorker) -> ServedWorker:
    """The engine's worker kept running with the "serve" step of `spec` (its log: `work`/`tag`.log)."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / f"{tag}.spec.json"
    spec_path.write_text(json.dumps({**spec, "step": "serve"}))
    argv = worker_argv(engine, spec_path, os.devnull)
    return cls(argv, worker_env(threads), work / f"{tag}.log", timeout_s)


def build_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """`folder` made by `build(tmp)` in a temporary folder beside it, then renamed: whole or not at all."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def folder_mb(path) -> float:
    """Size of a model file, or of every file in a model folder, in MB."""
    path = Path(path)
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return round(sum(f.stat().st_size for f in files) / 1e6, 1)
