"""Writing the bundle of a `sol-control train` run: ONNX graphs, validation, the quantization check,
answer guesses, decision time, manifest and report, into a temp folder that becomes OUT in one rename.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
import numpy as np

from sol_control.bundle import Bundle, write_manifest
from sol_control.config import shipped_bundle

from .config import TrainConfig
from .run import Inputs, Log, Trained

TARGET_FP32 = "target_fp32.onnx"
REFERENCE = "reference.npz"
N_CALIBRATION = 256  # training images the int8 graph's activation scales are calibrated on
N_REF = 3  # reference sequences (the node's warm-up prefixes)


def export_graphs(model, arrays: dict, lo: int, out: Path, calib: np.ndarray, n_act: int) -> dict:
    """The Optimum fp32 export, the fused fp32 / int4 graphs with the heads, the int8 one with
    static activations calibrated on `calib` (training prefixes + the target's greedy answers), and
    reference.npz (the node's warm-up prefixes). A record for the manifest."""
    from sol_control.train.calibrate import SMOOTH_ALPHA, static_int8
    from sol_control.graph.from_onnx import read_decoder
    from sol_control.graph.weights import DraftHeads

    from .export import FUSED, build_fused, build_static_int8, export_decoder, fused_parity, torch_logits
    from .model import greedy_batch

    max_context = model.config.max_position_embeddings
    export_decoder(model, out / TARGET_FP32, opset=23, max_context=max_context)
    weights = read_decoder(out / TARGET_FP32, max_context)
    weights.heads = DraftHeads(arrays["w1"], arrays["w2"], lo)
    build_fused(weights, out, ("fp32", "int4"))
    answers = greedy_batch(model, calib, n_act)
    sequences = [(np.concatenate([p, a]), len(p)) for p, a in zip(calib, answers)]
    build_static_int8(static_int8(weights, sequences), out)
    ids = np.concatenate([calib[:N_REF], answers[:N_REF]], axis=1)
    np.savez(out / REFERENCE, ids=ids, target_logits=np.stack([torch_logits(model, row) for row in ids]),
             prefix_len=np.int64(calib.shape[1]))
    return {"parity_max_abs_fused_fp32": fused_parity(model, out / FUSED["fp32"]),
            "int8": {"activations": "static", "calibration": f"{len(sequences)} training images",
                     "smooth_alpha": SMOOTH_ALPHA}}


def bundle_name(cfg: TrainConfig) -> str:
    return cfg.name or f"sol_control-qc-{source(cfg).resolve().name}"


def source(cfg: TrainConfig) -> Path:
    """Where the images came from: the folder, or the recording its frames were taken from."""
    return cfg.mcap or cfg.folder


def how_trained(cfg: TrainConfig) -> str:
    return "trained from scratch" if cfg.from_scratch else f"fine-tuned from {cfg.bundle or shipped_bundle('qc')}"


def manifest_dict(cfg: TrainConfig, lay: dict, model, k: int, precisions: tuple[str, ...], metrics: dict,
                  guesses: bool = False) -> dict:
    from .export import FUSED, spec
    from .guess import GUESSES

    files = [TARGET_FP32, *(FUSED[p] for p in precisions), REFERENCE] + [GUESSES] * guesses
    return {"name": bundle_name(cfg), "task": "qc",
            "description": f"Belt QC ({', '.join(lay['actions'][0]['labels'])}), {how_trained(cfg)} on the images "
                           f"of {source(cfg).resolve().name} (sol-control train).",
            "max_context": lay["max_context"], "vocab": lay["vocab"], "opset": 23,
            "target": spec(model, {"fp32": TARGET_FP32}, fused={p: FUSED[p] for p in precisions}, draft_heads=k,
                           **({"guesses": GUESSES} if guesses else {})),
            "observation": lay["observation"], "actions": lay["actions"], "files": {f: {} for f in files},
            "metrics": metrics}


def trained_agreement(out: Path, prefixes: np.ndarray, answers: np.ndarray) -> dict:
    """How many answers of the bundle's fp32 graph equal the trained model's (`answers`, torch
    greedy), token for token: the export check before any quantization."""
    from sol_control.decoding import greedy, open_decoder

    sess = open_decoder(Bundle.load(out), "target", "fp32")
    same = 0
    for prefix, answer in zip(prefixes, answers):
        sess.reset()
        same += greedy(sess, prefix, len(answer)).tokens == answer.tolist()
    return {"answers": len(answers), "identical": int(same)}


def validate(out: Path, inputs: Inputs) -> dict[str, dict]:
    """Every graph of the bundle in `out` (plain and with its heads) on the validation images,
    scored as `sol-control eval --folder` scores them."""
    from sol_control.eval import score_variants

    classes = inputs.folder.classes
    prefixes = [inputs.enc.prefixes[i] for i in inputs.val]
    return score_variants(Bundle.load(out), prefixes, inputs.labels(inputs.val, usable_only=False),
                          ("fp32", "int8", "int4"), located=classes[1:], classes=classes)


def before(cfg: TrainConfig, inputs: Inputs) -> dict | None:
    """The starting bundle's fp32 graph on the same validation images (a fine-tune's "before"; None
    from scratch, whose classes it may not have)."""
    from sol_control.actions import ActionTokenizer
    from sol_control.eval import run_variant, score

    if cfg.from_scratch:
        return None
    bundle = Bundle.load(cfg.bundle or shipped_bundle("qc"))
    acts = ActionTokenizer.from_manifest(bundle.manifest)
    prefixes = [inputs.enc.prefixes[i] for i in inputs.val]
    _, decisions, _ = run_variant(bundle, "fp32", prefixes, acts.n_tokens, acts)
    return score("qc", bundle.manifest, decisions, inputs.labels(inputs.val, usable_only=False),
                 located=inputs.folder.classes[1:])


def check_quantized(rows: dict[str, dict], n: int, out: Path) -> dict[str, dict]:
    """report.quantized_verdict for int8 and int4; a refused graph's file is deleted from `out`
    and its rows are marked."""
    from .layout import FUSED
    from .report import quantized_verdict

    verdicts = {}
    for p in ("int8", "int4"):
        keep, why = quantized_verdict(rows["fp32"], rows[p], n)
        verdicts[p] = {"written": keep, "reason": why}
        if not keep:
            (out / FUSED[p]).unlink()
            for name, row in rows.items():
                if name.split("+")[0] == p:
                    row["refused"] = True
    return verdicts


def decision_time(out: Path, prefixes: np.ndarray, precision: str | None, n: int) -> dict:
    """Median and p99 ms of `n` warm decisions the way the node makes them: the fast path's planner
    on `precision` with the node's default decoding settings (or, with no quantized graph, the
    full-precision planner), as `sol-control doctor` times them."""
    from sol_control.bench.common import pct, progress
    from sol_control.config import DecodingConfig
    from sol_control.decoding.native import NativeDecoderSession
    from sol_control.doctor import time_planner
    from sol_control.planners import FastPlanner, FullPrecisionPlanner

    bundle = Bundle.load(out)
    n_tokens = len(bundle.manifest.actions)
    dec = DecodingConfig(fast_precision=precision or "int8")
    planner = FastPlanner(bundle, n_tokens, dec) if precision else FullPrecisionPlanner(bundle, n_tokens, dec)
    ms = time_planner(planner, list(prefixes), n, dec.warmup_runs, "decision time")
    progress("", end="\n")
    return {"path": "fast" if precision else "full_precision", "precision": precision or "fp32",
            "speculation": getattr(planner, "mode", "none"),
            "backend": "native" if isinstance(planner.target, NativeDecoderSession) else "onnxruntime",
            "decision_ms_p50": pct(ms, 50), "decision_ms_p99": pct(ms, 99), "decisions": n}


def partial_dir(out: Path) -> Path:
    """A fresh temp folder next to `out` (the same file system, so the end is one rename); stale
    ones of runs that were killed are removed."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    return tmp


def finish(tmp: Path, out: Path) -> None:
    """`tmp` becomes `out` in one rename (an existing `out`, --overwrite: moved aside first)."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old)


def write_bundle(cfg: TrainConfig, t: Trained, out: Path, log: Log) -> dict:
    """Export, validate, check, fit the guesses, time decisions and write manifest + report into `out`."""
    from .guess import GUESS_POSITIONS, write_guesses

    t0 = time.monotonic()
    train_prefix = t.inputs.prefixes(t.inputs.train)
    log("export: ONNX fp32, fused fp32 / int4 graphs, int8 calibrated on training images")
    export = export_graphs(t.model, t.heads, t.lay["vocab"]["action"][0], out, train_prefix[:N_CALIBRATION],
                           len(t.lay["actions"]))
    write_manifest(out, manifest_dict(cfg, t.lay, t.model, t.k, ("fp32", "int8", "int4"), {}))
    export["fp32_graph_vs_trained"] = trained_agreement(out, t.inputs.prefixes(t.inputs.val), t.val_answers)
    t.timing["export_s"] = round(time.monotonic() - t0, 1)
    log(f"validation: every graph on {len(t.inputs.val)} images")
    rows = validate(out, t.inputs)
    quantized = check_quantized(rows, len(t.inputs.val), out)
    precisions = ("fp32", *(p for p in ("int8", "int4") if quantized[p]["written"]))
    fast = next((p for p in precisions if p != "fp32"), None)
    write_manifest(out, manifest_dict(cfg, t.lay, t.model, t.k, precisions, {}))
    if fast:
        export["guesses"] = write_guesses(Bundle.load(out), list(train_prefix), GUESS_POSITIONS["qc"], fast)
        write_manifest(out, manifest_dict(cfg, t.lay, t.model, t.k, precisions, {}, guesses=True))
        rows = {**rows, **validate(out, t.inputs)}  # the graphs as they ship (guesses: acceptance, ms)
    t.timing["validate_s"] = round(time.monotonic() - t0 - t.timing["export_s"], 1)
    log("decision time on this host")
    timed = decision_time(out, t.inputs.prefixes(t.inputs.val), fast, cfg.decisions)
    report = assemble_report(cfg, t, rows, quantized, export, timed, log)
    metrics = {k: report[k] for k in ("data", "training", "heads", "export", "validation", "before", "quantized",
                                      "fast_path", "timing")}
    write_manifest(out, manifest_dict(cfg, t.lay, t.model, t.k, precisions, metrics, guesses=bool(fast)))
    Bundle.load(out)  # every sha256 checked
    return report


def data_record(cfg: TrainConfig, inputs: Inputs) -> dict:
    enc, folder = inputs.enc, inputs.folder
    recording = {"mcap": str(cfg.mcap), "labels": str(cfg.labels), "topic": cfg.topic} if cfg.mcap else {}
    return {"folder": str(cfg.folder), **recording, "images": len(enc.items),
            "per_class": {c: folder.count(c) for c in folder.classes},
            "with_position": sum(math.isfinite(lab["u"]) for lab in enc.labels),
            "positions": str(folder.positions) if folder.positions else None,
            "no_part_found": len(enc.unusable()), "no_part_found_files": enc.unusable()[:20],
            "ignored_files": folder.ignored[:20], "train": len(inputs.train), "validation": len(inputs.val),
            "val_fraction": cfg.val_fraction, "seed": cfg.seed}


def assemble_report(cfg: TrainConfig, t: Trained, rows: dict, quantized: dict, export: dict, timed: dict,
                    log: Log) -> dict:
    from .report import fast_path_advice

    refused = [p for p, v in quantized.items() if not v["written"]]
    heads = {**t.records["heads"], "acceptance": rows.get(f"{timed['precision']}+heads", {}).get("acceptance")}
    return {"name": bundle_name(cfg), "bundle": str(cfg.out), "task": "qc", "mode": how_trained(cfg),
            "classes": list(t.lay["actions"][0]["labels"]), "data": data_record(cfg, t.inputs),
            "training": t.records["training"], "heads": heads, "export": export, "validation": rows,
            "before": before(cfg, t.inputs),
            "quantized": quantized, "advice": fast_path_advice({p: v["written"] for p, v in quantized.items()}),
            "fast_path": timed, "timing": {**t.timing, "total_s": round(log.elapsed(), 1)},
            "verdict": "ok" if not refused else f"refused {', '.join(refused)}"}


def summary(report: dict) -> list[str]:
    rows, f = report["validation"], report["fast_path"]
    acc = ", ".join(f"{p} {rows[p]['accuracy']:.3f}" for p in ("fp32", "int8", "int4") if p in rows)
    lines = [f"wrote {report['bundle']} in {report['timing']['total_s']:.0f} s: validation accuracy {acc}; "
             f"a decision takes {f['decision_ms_p50']:.2f} ms (median, {f['path']} path, {f['precision']}) here"]
    same, parity = report["export"]["fp32_graph_vs_trained"], report["export"]["parity_max_abs_fused_fp32"]
    if same["identical"] < same["answers"]:
        lines.append(f"the fp32 graph differs from the trained model on {same['answers'] - same['identical']} of "
                     f"{same['answers']} validation answers (logits within {parity:.1e})")
    lines += [f"{p}: {v['reason']}" for p, v in report["quantized"].items() if not v["written"]]
    if report["advice"]:
        lines.append(f"the node: {report['advice']}")
    return lines + [f"report: {Path(report['bundle']) / 'train_report.md'}"]
