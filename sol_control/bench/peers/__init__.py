"""Peer engines on the same weights and the same token workloads (benchmark only).

Two halves, several venvs:
- `run_all(bundle)` runs in our venv: it builds the workload (the bundle's decision prefixes),
  decodes it with our fp32 target (plain greedy, the "standard" outputs), then runs every peer
  engine in its own venv (`bash tools/setup_peers.sh`) as `python -m sol_control.bench.peers
  worker` and returns one row per engine, mode and precision, with agreement against the standard
  outputs. An engine whose venv is missing is skipped with a note.
- the worker (`common.worker`: one step of these rows or of `peers.lm`'s) runs in the engine's venv:
    ort-genai     .venv-peers  ONNX Runtime GenAI, plain and speculative (fp32, its own int4)
    transformers  .venv-peers  Hugging Face transformers, plain and assisted generation (fp32)
    openvino      .venv-ov     OpenVINO GenAI, plain and speculative (fp32, its own int8/int4)
    llama.cpp     .venv-llama  llama-cpp-python, plain and draft-model speculative (F32, Q8_0, Q4_0)
  The peer libraries (and, through them, torch) are imported inside the runner functions only, so
  importing this module in the runtime venv never pulls them in.

Weights: Hugging Face folders rebuilt from the bundle's own fp32 ONNX files by
`sol_control.lm.hf_from_onnx` (bit-identical tensors, cached under `.work/peers/hf/`), so every
engine runs exactly the weights we ship; each row says so (`weights_from`).

Every peer decodes exactly `new_tokens` tokens, greedy, with the same thread count as ours. Peers
stop on EOS/pad by default; we disable that (transformers, OpenVINO `ignore_eos`, llama.cpp by
taking tokens from its generator ourselves) or resume after the stop token (ORT GenAI), since our
decisions are fixed-length.

    python -m sol_control.bench.peers --bundle models/grasp [--quick] [--json peers.json]
    python -m sol_control.bench.peers --gguf G [--reference]    # the LM workload: peers.lm
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..common import REPO, equal_share, table, token_share
from .common import (ENGINES, PRECISIONS, VENVS, WEIGHTS_FROM, ServedWorker, Workload, build_once,
                     call_worker, serve_worker, worker)


def venv_python(engine: str) -> Path:
    return VENVS[engine][0] / "bin" / "python"


def decision_spec(engine: str, hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
                  precisions=None, mode: str | None = None) -> dict:
    """What a decision worker is told: the HF folders, the workload, the precisions of `precisions`
    the engine runs (default: all it runs), and for serving, the row's mode."""
    wanted = PRECISIONS.get(engine, ("fp32",))
    return {"engine": engine, "step": "run", "mode": mode, "hf_target": str(hf_target),
            "hf_draft": str(hf_draft) if hf_draft else None, "workload": asdict(w), "work": str(work),
            "precisions": [p for p in (precisions or wanted) if p in wanted]}


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    return {"match_standard": equal_share(outputs, reference), "token_agreement": token_share(outputs, reference)}


def hf_folders(bundle, cache: Path | None = None) -> tuple[Path, Path | None]:
    """HF folders holding exactly the bundle's weights: rebuilt from its fp32 ONNX files by
    `lm.hf_from_onnx.convert_bundle` (onnx + numpy, no torch) and cached under
    `.work/peers/hf/<bundle name>-<sha256 prefix of those files>/{target,draft}`.

    Always from the bundle, never from `.work/<task>/` (what `make models` trains): that folder
    can hold other weights than the shipped ones (it did for the qc draft, retrained later), and a
    fresh clone does not have it."""
    from ...lm.hf_from_onnx import convert_bundle

    m = bundle.manifest
    roles = {"target": m.target} | ({"draft": m.draft} if m.draft is not None and "fp32" in m.draft.files else {})
    digest = hashlib.sha256("".join(m.files[spec.files["fp32"]].sha256 for spec in roles.values()).encode())
    folder = Path(cache or REPO / ".work" / "peers" / "hf") / f"{m.name}-{digest.hexdigest()[:12]}"
    if not all((folder / role / "config.json").is_file() for role in roles):
        for spec in roles.values():
            bundle.path(spec.files["fp32"])  # sha256 checked
        build_once(folder, lambda tmp: convert_bundle(bundle.root, tmp))
    return folder / "target", (folder / "draft" if "draft" in roles else None)


def weights_digest(*folders: Path | None) -> str:
    """Short sha256 over the weight files: converted peer models are cached under it."""
    from ...bundle import sha256_file  # here, not at the top: workers run in venvs without pydantic

    h = hashlib.sha256()
    for folder in folders:
        for f in sorted(folder.glob("*.safetensors")) if folder else ():
            h.update(sha256_file(f).encode())
    return h.hexdigest()[:12]


def standard_outputs(bundle, prefixes: list[list[int]], new_tokens: int, threads: int) -> list[list[int]]:
    from ...decoding import greedy, open_decoder

    target = open_decoder(bundle, "target", "fp32", threads)
    return [greedy(target, np.asarray(p, np.int64), new_tokens).tokens for p in prefixes]


def decision_workload(bundle, quick: bool = False, threads: int = 1, k: int = 8) -> Workload:
    """The bundle's decision prefixes (test split; 16, or 4 with `quick`) and its action count."""
    from .. import decode_bench

    prefixes = [p.tolist() for p in decode_bench.decision_prefixes(bundle, 4 if quick else 16)]
    return Workload(prefixes, len(bundle.manifest.actions) or 16, rounds=2 if quick else 5, threads=threads, k=k)


def peers_work(bundle, hf_target: Path, hf_draft: Path | None) -> Path:
    """Where the peers' converted models for these weights live (git-ignored)."""
    return REPO / ".work" / "peers" / f"{bundle.manifest.name}-{weights_digest(hf_target, hf_draft)}"


def serve_row(bundle, row: dict, threads: int = 1, timeout_s: float = 600) -> ServedWorker:
    """The peer row `row` (engine, precision, mode, as `run_all` names them) kept running: its worker
    serves one decision per `ask({"prefix": [...]})`, replied `{"tokens": [...], "ms": ...}`."""
    engine = row["engine"]
    if not venv_python(engine).exists():
        raise RuntimeError(f"no venv for {engine}: run `bash tools/setup_peers.sh {VENVS[engine][1]}`")
    hf_target, hf_draft = hf_folders(bundle)
    work = peers_work(bundle, hf_target, hf_draft) / engine
    precision = row["precision"].split()[0]  # llama.cpp's rows say "int4 (Q4_0)"
    w = decision_workload(bundle, threads=threads)
    spec = decision_spec(engine, hf_target, hf_draft, w, work, [precision], row["mode"])
    return serve_worker(engine, spec, work, f"{engine}-serve", threads, timeout_s)


def run_all(bundle, quick: bool = False, engines=ENGINES, python: Path | None = None,
            hf_target: Path | None = None, hf_draft: Path | None = None, threads: int = 1,
            k: int = 8, work: Path | None = None, precisions=None) -> dict:
    """Rows for every peer engine, mode and precision on the bundle's decision workload (see the
    module doc). `python` forces one interpreter for every engine (default: each engine's venv);
    `precisions` narrows every engine to these (default: each engine's own list)."""
    available = [e for e in engines if Path(python or venv_python(e)).exists()]
    skipped = {e: f"no venv at {VENVS[e][0]}: run `bash tools/setup_peers.sh {VENVS[e][1]}`"
               for e in engines if e not in available}
    if not available:
        return {"note": "no peer venv: run `bash tools/setup_peers.sh`", "rows": [], "skipped": skipped}
    weights_from = WEIGHTS_FROM
    if hf_target is None:
        hf_target, default_draft = hf_folders(bundle, work and Path(work) / "hf")
        hf_draft = hf_draft or default_draft
    else:
        weights_from = f"HF folder {hf_target}"
    if not (hf_target / "config.json").is_file():
        return {"note": f"no HF folder with the bundle's weights at {hf_target}", "rows": [], "skipped": skipped}
    if hf_draft is not None and not (hf_draft / "config.json").is_file():
        hf_draft = None
    w = decision_workload(bundle, quick, threads, k)
    prefixes, new_tokens = w.prefixes, w.new_tokens
    reference = standard_outputs(bundle, prefixes, new_tokens, threads)
    work = Path(work or peers_work(bundle, hf_target, hf_draft))
    rows, errors = [], {}
    for engine in available:
        try:
            spec = decision_spec(engine, hf_target, hf_draft, w, work / engine, precisions)
            for row in call_worker(engine, spec, work / engine, engine, threads, 3600, python)["rows"]:
                row.update(agreement(row.pop("outputs"), reference), weights_from=weights_from)
                rows.append(row)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            errors[engine] = str(e)[-1500:]
    return {"rows": rows, "errors": errors, "skipped": skipped, "new_tokens": new_tokens,
            "decisions": len(prefixes), "rounds": w.rounds, "threads": threads, "k": k,
            "weights_from": weights_from, "hf_target": str(hf_target),
            "hf_draft": str(hf_draft) if hf_draft else None}


def rows_table(rows: list[dict]) -> str:
    head = ["engine", "mode", "prec", "tok/s", "min-max", "decode tok/s", "ms/decision", "TTFT ms", "accept", "= std"]
    return table(head, [[r["engine"], r["mode"], r["precision"], f"{r['tokens_per_s']:.0f}",
                         f"{r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}", f"{r['decode_tokens_per_s']:.0f}",
                         f"{r['decision_ms_p50']:.2f}", f"{r['ttft_ms_p50']:.2f}",
                         "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}", f"{r['match_standard']:.0%}"]
                        for r in rows])


def print_rows(result: dict) -> None:
    print(rows_table(result["rows"]))
    for engine, note in result.get("skipped", {}).items():
        print(f"{engine}: skipped, {note}")
    for engine, err in result.get("errors", {}).items():
        print(f"{engine}: FAILED {err}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        worker(Path(argv[1]), Path(argv[2]))
        return 0
    from ...bundle import Bundle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle", type=Path, help="the bundle's decision workload, on its own weights")
    src.add_argument("--gguf", type=Path, help="the LM workload (`peers.lm`), on a Llama GGUF's weights")
    ap.add_argument("--quick", action="store_true", help="fewer decisions, rounds, prompts")
    ap.add_argument("--engines", nargs="*", default=None, choices=ENGINES, help="default: every engine")
    ap.add_argument("--hf-target", type=Path, default=None)
    ap.add_argument("--hf-draft", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--precisions", nargs="*", default=None, choices=("fp32", "int8", "int4"),
                    help="only these (default: each engine's own list)")
    ap.add_argument("--workload", type=Path, default=None, help="LM: default lm_workload.json")
    ap.add_argument("--reference", action="store_true", help="LM: tokens against our fp32 engine's")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads must be positive, got {args.threads}")
    if args.gguf is not None:
        from .lm import lm_main

        return lm_main(args)
    result = run_all(Bundle.load(args.bundle), args.quick, tuple(args.engines or ENGINES), hf_target=args.hf_target,
                     hf_draft=args.hf_draft, threads=args.threads, k=args.k, precisions=args.precisions)
    if result.get("note"):
        print(result["note"])
    if result.get("weights_from"):
        print(f"weights: {result['weights_from']} ({result['hf_target']})")
    print_rows(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["rows"] and not result.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
