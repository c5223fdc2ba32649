"""`sol-control bench lm` (`make bench-lm`): a real pretrained LM, standard vs quantized vs speculative.

Rows, at each thread count: `standard` (fp32, plain greedy), `int8 plain`, `int4 plain`, and
`fp32 / int8 / int4 + draft` (the bundle's draft model or the target's own draft heads; skipped with
a note when it has neither) and `int8 / int4 + draft + lookup` (heads and prompt lookup); imported
from a GGUF, also `int4-symmetric plain / + lookup` on a second import, without heads, in ONNX
Runtime GenAI's int4 recipe (`lm_rows.SYMMETRIC`; `--no-symmetric` leaves it out), and
`int4-symmetric + draft + lookup` on a third, the symmetric one with heads trained for it
(`--symmetric-heads`; by default models/lm/smollm2_symmetric_heads*.npz for SmolLM2).
Workload (`bench/data/lm_workload.json`, shared with the peers): 20 chat
prompts, each a new conversation (cold cache, <= 128 new tokens), and a 20-round agent loop whose KV
cache is kept across rounds; `--rounds` repeats everything. Measuring: `lm_rows`.

This module: the bundle (imported from the GGUF once, again when a source's sha256 changes), the
verify-cost table behind `ceiling_tokens`, the peers (`bench.peers.lm`, when it is there), and
resident memory, from a fresh process per precision (and draft) that loads the sessions and
answers the first prompt (`row.probe_rss`). Figures, tables and plots: `lm_report`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..energy import EnergyMeter
from ..lm.cache import sha256_of
from ..lm.generate import load_tokenizer
from . import lm_report
from .common import REPO
from .lm_rows import (LOOKUP, PROMPT_NEW_TOKENS, QUICK_LOOP_ROUNDS, QUICK_PROMPTS, Row, load_workload, make_rows,
                      run_workload, say)
from .peers.lm import LM_MODES, lm_work, run_lm_peers
from .row import call_ms, probe_rss

DEFAULT_IMPORT_DIR = Path(".work/lm/bench_bundle")
HEADS_GLOB = "smollm2_heads*.npz"
SYMMETRIC_HEADS_GLOB = "smollm2_symmetric_heads*.npz"  # trained on the symmetric graph's own answers
VERIFY_TOKENS = (1, 2, 5, 9)


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--bundle", type=Path, default=None, help="an LM bundle (default: import --gguf)")
    src.add_argument("--gguf", type=Path, default=None, help="GGUF to import (default: the `make lm-model` SmolLM2)")
    p.add_argument("--heads", type=Path, default=None, help=f"draft heads to attach (default with the SmolLM2 GGUF and no --draft: models/lm/{HEADS_GLOB})")
    p.add_argument("--symmetric-heads", type=Path, default=None,
                   help=f"draft heads for the int4-symmetric import (default with the SmolLM2 GGUF and no --draft: "
                        f"models/lm/{SYMMETRIC_HEADS_GLOB}); a third import, its '+ draft + lookup' row")
    p.add_argument("--draft", type=Path, default=None, help="a draft model (GGUF) imported with the target")
    p.add_argument("--import-dir", type=Path, default=DEFAULT_IMPORT_DIR, help="where the imported bundle is kept")
    p.add_argument("--threads", default="1,2", help="ONNX Runtime intra-op threads, comma separated")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_PROMPTS} prompts, {QUICK_LOOP_ROUNDS} loop rounds")
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole workload N times")
    p.add_argument("--max-new-tokens", type=int, default=None, help="cap every answer (default: the workload's)")
    p.add_argument("--prompts", type=int, default=None, help="only the first N prompts")
    p.add_argument("--loop-rounds", type=int, default=None, help="only the first N agent-loop rounds")
    p.add_argument("--out", type=Path, default=Path("bench_report/lm"), help="output folder")
    p.add_argument("--no-peers", action="store_true", help="leave out the peer engines")
    p.add_argument("--no-symmetric", action="store_true",
                   help="leave out the int4-symmetric rows (a second import in ONNX Runtime GenAI's int4 recipe)")
    p.add_argument("--peer-precisions", default="fp32,int8,int4",
                   help="the peers' rows at these precisions only (e.g. int8,int4: their fp32 rows take longest)")
    p.add_argument("--paired", type=int, default=3, metavar="N",
                   help="then N rounds alternating the best peer row and our fastest row (vs_best_peer_paired; 0: off)")
    p.add_argument("--note", action="append", default=[], help="a note for the report (repeatable)")


# ---- the bundle: imported once, again when the GGUF, heads or draft change ----------------------

def find_heads(explicit: Path | None, smollm2: bool, glob: str = HEADS_GLOB, option: str = "--heads") -> Path | None:
    """`option`'s file, else the newest shipped SmolLM2 heads matching `glob` when the GGUF is
    `make lm-model`'s SmolLM2 (they fit no other model)."""
    if explicit is not None:
        if not explicit.is_file():
            raise ValueError(f"{option} {explicit}: no such file")
        return explicit
    found = sorted((REPO / "models" / "lm").glob(glob)) if smollm2 else []
    return found[-1] if found else None


def builder_digest() -> str:
    """sha256 over the source of what writes the graphs (graph builder, GGUF reader, importer): a
    bundle imported by other code is imported again."""
    pkg = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*(pkg / "graph").glob("*.py"), *(pkg / "lm").glob("*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def ensure_bundle(gguf: Path, out: Path, heads: Path | None = None, draft: Path | None = None,
                  int4_mode: str = "fast") -> Path:
    """The bundle imported from `gguf` (int8, int4 in `int4_mode`; heads and draft when given) at
    `out`, reused while the key (the sources' sha256, the options, the builder's code) is unchanged."""
    from ..cli import main

    key = {"gguf_sha256": sha256_of(gguf), "heads_sha256": heads and sha256_of(heads),
           "draft_sha256": draft and sha256_of(draft), "quantize": "int8,int4", "int4_mode": int4_mode,
           "builder_sha256": builder_digest()}
    key_file = out.with_name(out.name + ".key.json")
    if (out / "manifest.json").is_file() and key_file.is_file() and json.loads(key_file.read_text()) == key:
        return out
    shutil.rmtree(out, ignore_errors=True)
    key_file.unlink(missing_ok=True)
    argv = ["import", str(gguf), "--out", str(out), "--quantize", key["quantize"], "--int4-mode", int4_mode]
    argv += ["--heads", str(heads)] * (heads is not None) + ["--draft", str(draft)] * (draft is not None)
    say(f"importing {gguf} into {out} (once; kept while the sources' sha256 match)")
    if main(argv) != 0:
        raise ValueError(f"importing {gguf} failed (see the line above)")
    key_file.write_text(json.dumps(key, indent=1) + "\n")
    return out


# ---- verify costs: what a perfect draft could gain -----------------------------------------------

def verify_costs(sessions: dict, context: list[int], sizes, repeats: int) -> dict:
    """{key: {T: median ms of one target call with T tokens after `context`}}: every session and T
    interleaved in each repeat, so load changes hit them alike. The sessions are left empty."""
    ids = np.resize(np.asarray(context, np.int64), max(sizes))
    times = {key: {T: [] for T in sizes} for key in sessions}
    for _ in range(repeats):
        for key, sess in sessions.items():
            for T, ms in call_ms(sess, context, ids, sizes).items():
                times[key][T].append(ms)
    for sess in sessions.values():
        sess.reset()
    return {key: {T: float(np.median(v)) for T, v in per.items()} for key, per in times.items()}


# ---- resident memory: one fresh process per precision (and draft) --------------------------------

def measure_rss(rows: list[Row], ids: list[int]) -> dict[tuple[str, str], dict]:
    """{(row precision, mode): {rss_mb, rss_delta_mb}}: a fresh process per precision label answering
    the first prompt in each of its rows' modes, on the row's own bundle and precision (`Row.source`)."""
    specs: dict[str, dict] = {}
    for r in rows:
        spec = specs.setdefault(r.precision, {
            "bundle": r.source[0], "role": "target", "precision": r.source[1], "modes": ["plain"], "ids": ids,
            "max_new": PROMPT_NEW_TOKENS, "lookup": LOOKUP})
        if r.mode not in spec["modes"]:
            spec["modes"].append(r.mode)
    out = {}
    for label, got in probe_rss(specs).items():
        for mode, rss in got["after"].items():
            out[label, mode] = {"rss_mb": rss / 1e6, "rss_delta_mb": (rss - got["before"]) / 1e6}
    return out


# ---- the run ------------------------------------------------------------------------------------

def _threads(text: str) -> list[int]:
    try:
        threads = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ValueError(f"--threads takes comma-separated integers, got {text!r}") from None
    if not threads or threads[0] < 1:
        raise ValueError(f"--threads must be positive integers, got {text!r}")
    return threads


def _peer_modes(precisions: str) -> dict:
    """LM_MODES with only the given precisions (ValueError naming an unknown one)."""
    wanted = {p.strip() for p in precisions.split(",") if p.strip()}
    if not wanted or wanted - {"fp32", "int8", "int4"}:
        raise ValueError(f"--peer-precisions takes fp32, int8 and int4, comma separated, got {precisions!r}")
    return {engine: [(p, m) for p, m in modes if p in wanted] for engine, modes in LM_MODES.items()}


def _peers(gguf: Path | None, workload: dict, threads: list[int], precisions: str) -> dict:
    if gguf is None:
        return {"rows": [], "note": "no GGUF for the peers (a --bundle without --gguf, and no `make lm-model` file)"}
    rows = []
    for t in threads:
        say(f"peers at {t} thread(s)")
        rows += run_lm_peers(gguf, workload, t, modes=_peer_modes(precisions))
    return {"rows": rows, "note": "" if rows else "no peer engine ran (see tools/setup_peers.sh)"}


def _sources(args: argparse.Namespace) -> tuple[Path, list[Bundle | None], Path | None]:
    """(the bundle folder, [the symmetric import, the symmetric import with heads], each or None,
    the GGUF the peers get): without --bundle, the GGUF (default: `make lm-model`'s) imported as it
    is and, unless --no-symmetric, again in `--int4-mode symmetric` without heads and, when there
    are symmetric heads, with them."""
    gguf = args.gguf
    if args.bundle is not None:
        if gguf is None:
            from ..lm.cache import DEFAULT_DIR, SMOLLM2_GGUF

            gguf = DEFAULT_DIR / SMOLLM2_GGUF if (DEFAULT_DIR / SMOLLM2_GGUF).is_file() else None
        return args.bundle, [None, None], gguf
    smollm2 = gguf is None and args.draft is None  # the default model, which the shipped heads are for
    if gguf is None:
        from ..lm.cache import smollm2_gguf

        gguf = smollm2_gguf()
    heads = find_heads(args.heads, smollm2)
    root = ensure_bundle(gguf, args.import_dir, heads, args.draft)
    if args.no_symmetric:
        return root, [None, None], gguf
    folder = args.import_dir.with_name(args.import_dir.name + "_symmetric")
    symmetric = [Bundle.load(ensure_bundle(gguf, folder, None, args.draft, "symmetric")), None]
    sym_heads = find_heads(args.symmetric_heads, smollm2, SYMMETRIC_HEADS_GLOB, "--symmetric-heads")
    if sym_heads is not None:
        folder = args.import_dir.with_name(args.import_dir.name + "_symmetric_heads")
        symmetric[1] = Bundle.load(ensure_bundle(gguf, folder, sym_heads, None, "symmetric"))  # heads, no draft
    return root, symmetric, gguf


def run(args: argparse.Namespace) -> int:
    threads = _threads(args.threads)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be positive, got {args.rounds}")
    load_start, t_start = os.getloadavg(), time.monotonic()
    notes = list(args.note)
    if load_start[0] >= 0.5 * (os.cpu_count() or 1):
        notes.append(f"the machine was busy: load average {load_start[0]:.1f} on {os.cpu_count()} cores at the start; "
                     "absolute figures are noisy, ratios compare rows interleaved in this run")
    root, symmetric, gguf = _sources(args)
    bundle = Bundle.load(root)
    tok = load_tokenizer(bundle)
    if tok is None or not tok.chat_template:
        raise ValueError(f"bundle {root}: no tokenizer or chat template (an LM bundle from `sol-control import`)")
    workload = load_workload(args.quick, args.max_new_tokens, args.prompts, args.loop_rounds)
    rows, skipped = make_rows(bundle, threads, *symmetric)
    for s in skipped:
        say(f"skipped {s['name']} @{s['threads']}t: {s['note']}")
    meter = EnergyMeter()
    w = lm_work(tok, workload)  # the workload as ids, as the peers get it
    run_workload(rows, w, args.rounds)
    meter.update()
    k, k_source = lm_report.draft_length(bundle, rows)
    sizes = sorted(set(VERIFY_TOKENS) | {k + 1})
    say(f"verify costs, T = {sizes}")
    plain = {(r.threads, r.precision): r.target for r in rows if r.mode == "plain"}
    verify = {}
    for (t, prec), ms in verify_costs(plain, w.prompts[0], sizes, 5 if args.quick else 15).items():
        verify.setdefault(t, {})[prec] = ms
        say(f"verify costs {prec} @{t}t: " + ", ".join(f"T={T} {v:.1f} ms" for T, v in ms.items()))
    say("resident memory (a fresh process per precision)")
    rss = measure_rss(rows, w.prompts[0])
    peers = ({"rows": [], "note": "--no-peers"} if args.no_peers
             else _peers(gguf, workload, threads, args.peer_precisions))
    command = "sol-control bench lm " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "lm"] else [])
    summary = lm_report.summarise(
        bundle=bundle, rows=rows, skipped=skipped, verify=verify, k=(k, k_source), rss=rss, peers=peers, meter=meter,
        workload=workload, reps=args.rounds, threads=threads, gguf=gguf, notes=notes, command=command.strip(),
        load_start=load_start, seconds=time.monotonic() - t_start)
    summary.update(lm_report.paired_summary(summary, rows, tok, workload, gguf, args.paired))
    lm_report.write(summary, args.out)
    print(lm_report.markdown(summary))
    print(f"wrote {args.out}/summary.json, {args.out}/README.md and plots")
    if summary["lossless"] is False:
        say("LOSSLESS CHECK FAILED: speculative tokens differ from plain greedy (see lossless_detail)")
        return 1
    return 0

