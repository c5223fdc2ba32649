"""Peer engines on the same weights and the same token workloads (benchmark only).

Two halves, two venvs:
- `run_all(bundle)` runs in our venv: it builds the workload (the bundle's decision prefixes),
  decodes it with our fp32 target (plain greedy, the "standard" outputs), then runs every peer in
  `.venv-peers` (`bash tools/setup_peers.sh`) as `python -m sol_control.bench.peers worker` and
  returns one row per engine and mode, with agreement against the standard outputs.
- the worker runs inside `.venv-peers`: ONNX Runtime GenAI (plain and its speculative mode) and
  Hugging Face transformers (plain and assisted generation). The peer libraries (and, through
  transformers, torch) are imported inside the runner functions only, so importing this module
  in the runtime venv never pulls them in.

Every peer decodes exactly `new_tokens` tokens, greedy, with the same thread count as ours. Peers
stop on EOS/pad by default; we disable that (transformers) or resume after the stop token
(ORT GenAI), since our decisions are fixed-length.

    python -m sol_control.bench.peers --bundle models/grasp [--quick] [--json peers.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import hashlib
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..bundle import sha256_file
from .common import REPO, pct, table

PEERS_VENV = REPO / ".venv-peers"
ENGINES = ("ort-genai", "transformers")


@dataclass
class Workload:
    prefixes: list[list[int]]
    new_tokens: int
    rounds: int = 5
    threads: int = 1
    k: int = 8  # draft tokens per speculative step (fixed, the peers' usual knob)


# ---- timing (shared by every runner) ------------------------------------------------------------

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


# ---- ONNX Runtime GenAI -------------------------------------------------------------------------

def add_word_tokenizer(hf_dir: Path, vocab_size: int) -> None:
    """The GenAI builder insists on a tokenizer; token-id workloads never use it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(hf_dir)


def genai_convert(hf_dir: Path, out_dir: Path, precision: str, threads: int) -> Path:
    """`onnxruntime_genai.models.builder` HF folder -> GenAI folder (fp32 or its own int4)."""
    if not (out_dir / "genai_config.json").is_file():
        src = out_dir.parent / f"{out_dir.name}-hf"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(hf_dir, src)
        if not (src / "tokenizer.json").is_file():
            add_word_tokenizer(src, json.loads((src / "config.json").read_text())["vocab_size"])
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

    def decide(prefix: list[int]):
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prefix) + new_tokens, do_sample=False)
        gen = og.Generator(model, params)
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


def run_genai(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
              precisions=("fp32", "int4")) -> list[dict]:
    rows = []
    draft = genai_convert(hf_draft, work / "genai-draft-fp32", "fp32", w.threads) if hf_draft else None
    for prec in precisions:
        target = genai_convert(hf_target, work / f"genai-target-{prec}", prec, w.threads)
        rows.append({"engine": "ort-genai", "mode": "plain", "precision": prec,
                     **time_decisions(genai_decide(target, w.new_tokens), w)})
        if draft is not None:
            spec = genai_speculative_folder(target, draft, work / f"genai-spec-{prec}", w.k)
            rows.append({"engine": "ort-genai", "mode": f"speculative k={w.k}", "precision": prec,
                         **time_decisions(genai_decide(spec, w.new_tokens), w)})
    return rows


# ---- Hugging Face transformers ------------------------------------------------------------------

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


# ---- worker (peers venv) and orchestration (our venv) -------------------------------------------

def worker(spec_path: Path, out_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    w = Workload(**spec["workload"])
    hf_target, hf_draft = Path(spec["hf_target"]), spec.get("hf_draft") and Path(spec["hf_draft"])
    if spec["engine"] == "ort-genai":
        rows = run_genai(hf_target, hf_draft, w, Path(spec["work"]), tuple(spec.get("precisions", ("fp32", "int4"))))
    elif spec["engine"] == "transformers":
        rows = run_transformers(hf_target, hf_draft, w)
    else:
        raise ValueError(f"engine must be one of {ENGINES}, got {spec['engine']!r}")
    out_path.write_text(json.dumps({"rows": rows}))


def run_peer(engine: str, hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
             python: Path, precisions=("fp32", "int4"), timeout_s: float = 1800) -> list[dict]:
    """Run one engine's worker in the peers venv; its rows (with outputs)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = {"engine": engine, "hf_target": str(hf_target), "hf_draft": str(hf_draft) if hf_draft else None,
            "workload": asdict(w), "work": str(work), "precisions": list(precisions)}
    spec_path, out_path = work / f"{engine}-spec.json", work / f"{engine}-rows.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(w.threads)}
    proc = subprocess.run([str(python), "-m", "sol_control.bench.peers", "worker", str(spec_path), str(out_path)],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"peer {engine} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(out_path.read_text())["rows"]


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    same = [a == b for a, b in zip(outputs, reference)]
    tokens = [x == y for a, b in zip(outputs, reference) for x, y in zip(a, b)]
    return {"match_standard": float(np.mean(same)) if same else 0.0,
            "token_agreement": float(np.mean(tokens)) if tokens else 0.0}


def hf_folders(bundle) -> tuple[Path | None, Path | None]:
    """HF folders holding the bundle's weights: .work/<task>/{target,draft} after `make models`,
    tests/fixtures/tiny_hf{,_draft} for the fixture bundle."""
    m = bundle.manifest
    if m.task == "fixture":
        base = REPO / "tests" / "fixtures"
        return base / f"{m.name}_hf", base / f"{m.name}_hf_draft"
    work = REPO / ".work" / m.task
    return work / "target", work / "draft"


def weights_digest(*folders: Path | None) -> str:
    """Short sha256 over the weight files: converted peer models are cached under it."""
    h = hashlib.sha256()
    for folder in folders:
        for f in sorted(folder.glob("*.safetensors")) if folder else ():
            h.update(sha256_file(f).encode())
    return h.hexdigest()[:12]


def standard_outputs(bundle, prefixes: list[list[int]], new_tokens: int, threads: int) -> list[list[int]]:
    from ..decoding import greedy, open_decoder

    target = open_decoder(bundle, "target", "fp32", threads)
    return [greedy(target, np.asarray(p, np.int64), new_tokens).tokens for p in prefixes]


def run_all(bundle, quick: bool = False, engines=ENGINES, python: Path | None = None,
            hf_target: Path | None = None, hf_draft: Path | None = None, threads: int = 1,
            k: int = 8, work: Path | None = None, precisions=("fp32", "int4")) -> dict:
    """Rows for every peer engine and mode on the bundle's decision workload (see module doc)."""
    from . import decode_bench

    python = Path(python or PEERS_VENV / "bin" / "python")
    default_target, default_draft = hf_folders(bundle)
    hf_target, hf_draft = hf_target or default_target, hf_draft or default_draft
    if not python.exists():
        return {"note": f"no peers venv at {python.parent.parent}: run `bash tools/setup_peers.sh`", "rows": []}
    if not (hf_target / "config.json").is_file():
        return {"note": f"no HF folder with the bundle's weights at {hf_target} (run `make models`)", "rows": []}
    if hf_draft is not None and not (hf_draft / "config.json").is_file():
        hf_draft = None
    m = bundle.manifest
    new_tokens = len(m.actions) or 16
    prefixes = [p.tolist() for p in decode_bench.decision_prefixes(bundle, 4 if quick else 16)]
    w = Workload(prefixes, new_tokens, rounds=2 if quick else 5, threads=threads, k=k)
    reference = standard_outputs(bundle, prefixes, new_tokens, threads)
    work = Path(work or REPO / ".work" / "peers" / f"{m.name}-{weights_digest(hf_target, hf_draft)}")
    rows, errors = [], {}
    for engine in engines:
        try:
            for row in run_peer(engine, hf_target, hf_draft, w, work / engine, python, precisions):
                row.update(agreement(row.pop("outputs"), reference))
                rows.append(row)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            errors[engine] = str(e)[-500:]
    return {"rows": rows, "errors": errors, "new_tokens": new_tokens, "decisions": len(prefixes),
            "rounds": w.rounds, "threads": threads, "k": k, "hf_target": str(hf_target),
            "hf_draft": str(hf_draft) if hf_draft else None}


def print_rows(result: dict) -> None:
    head = ["engine", "mode", "prec", "tok/s", "min-max", "decode tok/s", "ms/decision", "TTFT ms", "accept", "= std"]
    body = [[r["engine"], r["mode"], r["precision"], f"{r['tokens_per_s']:.0f}",
             f"{r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}", f"{r['decode_tokens_per_s']:.0f}",
             f"{r['decision_ms_p50']:.2f}", f"{r['ttft_ms_p50']:.2f}",
             "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}", f"{r['match_standard']:.0%}"]
            for r in result["rows"]]
    print(table(head, body))
    for engine, err in result.get("errors", {}).items():
        print(f"{engine}: FAILED {err}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        worker(Path(argv[1]), Path(argv[2]))
        return 0
    from ..bundle import Bundle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--hf-target", type=Path, default=None)
    ap.add_argument("--hf-draft", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = run_all(Bundle.load(args.bundle), args.quick, tuple(args.engines), hf_target=args.hf_target,
                     hf_draft=args.hf_draft, threads=args.threads, k=args.k)
    if result.get("note"):
        print(result["note"])
    print_rows(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["rows"] and not result.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
