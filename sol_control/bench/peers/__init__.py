"""Peer engines on the same weights and the same token workloads (benchmark only).

Two halves, several venvs:
- `run_all(bundle)` runs in our venv: it builds the workload (the bundle's decision prefixes),
  decodes it with our fp32 target (plain greedy, the "standard" outputs), then runs every peer
  engine in its own venv (`bash tools/setup_peers.sh`) and returns one row per engine, mode and
  precision, with agreement against the standard outputs. An engine whose venv is missing is
  skipped with a note.
- the worker (`python -m sol_control.bench.peers SPEC OUT`, `common.worker`: one step of these
  rows or of `peers.lm`'s) runs in the engine's venv:
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
decisions are fixed-length. `sol-control bench all` runs these rows (its `peers` stage) and pairs
ours with the best of them (`paired`).
"""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..common import REPO, equal_share, table, token_share
from .common import (ENGINES, PRECISIONS, VENVS, WEIGHTS_FROM, ServedWorker, Workload, build_once,
                     call_worker, serve_worker, venv_ready)


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


def decision_workload(bundle, quick: bool = False) -> Workload:
    """The bundle's decision prefixes (test split; 16, or 4 with `quick`) and its action count."""
    from .. import decode_bench

    prefixes = [p.tolist() for p in decode_bench.decision_prefixes(bundle, 4 if quick else 16)]
    return Workload(prefixes, len(bundle.manifest.actions) or 16, rounds=2 if quick else 5)


def serve_row(bundle, row: dict, timeout_s: float = 600) -> ServedWorker:
    """The peer row `row` (engine, precision, mode, as `run_all` names them) kept running: its worker
    serves one decision per `ask({"prefix": [...]})`, replied `{"tokens": [...], "ms": ...}`."""
    engine = row["engine"]
    if not venv_ready(engine):
        raise RuntimeError(f"no venv for {engine}: run `bash tools/setup_peers.sh {VENVS[engine][1]}`")
    hf_target, hf_draft = hf_folders(bundle)
    work = REPO / ".work" / "peers" / hf_target.parent.name / engine
    precision = row["precision"].split()[0]  # llama.cpp's rows say "int4 (Q4_0)"
    w = decision_workload(bundle)
    spec = decision_spec(engine, hf_target, hf_draft, w, work, [precision], row["mode"])
    return serve_worker(engine, spec, work, f"{engine}-serve", w.threads, timeout_s)


def run_all(bundle, quick: bool = False, engines=ENGINES, work: Path | None = None,
            precisions=None) -> dict:
    """Rows for every peer engine, mode and precision on the bundle's decision workload (see the
    module doc), in `work` (default: `.work/peers/<bundle name>-<sha256 prefix of its weights>`);
    `precisions` narrows every engine to these (default: each engine's own list)."""
    from ...decoding import greedy, open_decoder

    available = [e for e in engines if venv_ready(e)]
    skipped = {e: f"no venv at {VENVS[e][0]}: run `bash tools/setup_peers.sh {VENVS[e][1]}`"
               for e in engines if e not in available}
    if not available:
        return {"note": "no peer venv: run `bash tools/setup_peers.sh`", "rows": [], "skipped": skipped}
    hf_target, hf_draft = hf_folders(bundle, work and Path(work) / "hf")
    work = Path(work or REPO / ".work" / "peers" / hf_target.parent.name)
    w = decision_workload(bundle, quick)
    standard = open_decoder(bundle, "target", "fp32", w.threads)  # every peer row is held to it
    reference = [greedy(standard, np.asarray(p, np.int64), w.new_tokens).tokens for p in w.prefixes]
    rows, errors = [], {}
    for engine in available:
        try:
            spec = decision_spec(engine, hf_target, hf_draft, w, work / engine, precisions)
            for row in call_worker(engine, spec, work / engine, engine, w.threads, 3600)["rows"]:
                row.update(agreement(row.pop("outputs"), reference), weights_from=WEIGHTS_FROM)
                rows.append(row)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            errors[engine] = str(e)[-1500:]
    return {"rows": rows, "errors": errors, "skipped": skipped, "new_tokens": w.new_tokens,
            "decisions": len(w.prefixes), "rounds": w.rounds, "threads": w.threads, "k": w.k,
            "weights_from": WEIGHTS_FROM, "hf_target": str(hf_target),
            "hf_draft": str(hf_draft) if hf_draft else None}


def rows_table(rows: list[dict]) -> str:
    head = ["engine", "mode", "prec", "tok/s", "min-max", "decode tok/s", "ms/decision", "TTFT ms", "accept", "= std"]
    return table(head, [[r["engine"], r["mode"], r["precision"], f"{r['tokens_per_s']:.0f}",
                         f"{r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}", f"{r['decode_tokens_per_s']:.0f}",
                         f"{r['decision_ms_p50']:.2f}", f"{r['ttft_ms_p50']:.2f}",
                         "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}", f"{r['match_standard']:.0%}"]
                        for r in rows])
