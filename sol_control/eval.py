"""`sol-control eval`: a bundle's accuracy on generated test or held-out scenes, or on a labelled
image folder, per precision.

Scenes are regenerated from their seeds (`sol_control.tasks`), tokenized with the bundle's own
observation tokenizer, decoded with the engine (plain greedy per target precision; speculative
greedy with the target's own draft heads and with the draft model, whose outputs must equal plain
greedy), and scored against the analytic labels. QC: `accuracy` (class exact), `defect_recall` (defective parts not passed),
`false_reject_rate`. Grasp: `success_rate` (position <= x tolerance, |yaw| <= yaw tolerance modulo
pi, width <= width tolerance, all from the manifest) plus per-dimension errors. Speculative
variants add `acceptance` (accepted / proposed guesses) and `tokens_per_target_pass`.

A QC folder (`--folder DIR`: good/ and defect/<kind>/ images, optional positions.csv; the layout of
`sol-control train`, sol_control/tasks/labelled_folder.py) is read with OpenCV and the node's perception, and
scored the same way, plus a confusion matrix (rows: the folder's classes; columns: the bundle's,
then "none" for no valid decision); a defect's position is scored where the CSV gives it.

    sol-control eval --bundle models/qc [--split test|heldout|novel] [--n 500] [--json PATH]
    sol-control eval --bundle my_bundle --folder DIR [--positions CSV] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from .actions import ActionTokenizer
from .bundle import Bundle
from .decoding import greedy, open_decoder, speculate, speculate_heads
from .perception import ObservationTokenizer

DEFAULT_N = {"test": 500, "heldout": 500, "novel": 500}  # novel: families no bundle is trained on
LOCATED = ("scratch", "crack", "discoloration")  # scene classes whose u, v mark the defect itself (scored)


def scenes(task: str, split: str, n: int, start: int = 0) -> list:
    from .tasks import grasp, qc

    gen = qc if task == "qc" else grasp
    return [gen.make_sample(split, i) for i in range(start, start + n)]


def encode_scenes(obs: ObservationTokenizer, samples: list) -> tuple[list[np.ndarray], list[dict]]:
    prefixes, labels = [], []
    for s in samples:
        try:
            prefixes.append(obs.encode(s.image, getattr(s, "joints_rad", None)))
        except ValueError:
            prefixes.append(None)  # unusable image: counted as a wrong answer
        labels.append(s.label)
    return prefixes, labels


def _yaw_err(a: float, b: float) -> float:
    return abs((a - b + math.pi / 2) % math.pi - math.pi / 2)


def score(task: str, manifest, decisions: list, labels: list[dict], located: tuple[str, ...] = LOCATED) -> dict:
    """Metrics of decoded decisions (None = no decision) against labels. QC positions are scored for
    the `located` classes where the label has one (u not NaN) and the class is right."""
    n = len(labels)
    if task == "qc":
        correct = sum(d is not None and d.defect == lab["defect"] for d, lab in zip(decisions, labels))
        bad = [(d, lab) for d, lab in zip(decisions, labels) if lab["defect"] != "ok"]
        good = [(d, lab) for d, lab in zip(decisions, labels) if lab["defect"] == "ok"]
        caught = sum(d is None or d.defect != "ok" for d, _ in bad)
        false_rej = sum(d is None or d.defect != "ok" for d, _ in good)
        loc = [math.hypot(d.u - lab["u"], d.v - lab["v"]) for d, lab in bad
               if d is not None and lab["defect"] in located and d.defect == lab["defect"] and math.isfinite(lab["u"])]
        return {"accuracy": correct / n, "defect_recall": caught / max(len(bad), 1),
                "false_reject_rate": false_rej / max(len(good), 1),
                "location_err_p50": float(np.median(loc)) if loc else None, "n": n}
    tol = {f.name: f.tolerance for f in manifest.actions}
    ok, pos, yaw, width = 0, [], [], []
    for d, lab in zip(decisions, labels):
        if d is None:
            continue
        dp = math.sqrt((d.x_m - lab["x"]) ** 2 + (d.y_m - lab["y"]) ** 2 + (d.z_m - lab["z"]) ** 2)
        dy = _yaw_err(d.yaw_rad, lab["yaw"])
        dw = abs(d.width_m - lab["width"])
        pos.append(dp), yaw.append(dy), width.append(dw)
        ok += dp <= tol["x"] and dy <= tol["yaw"] and dw <= tol["width"]
    pct = lambda xs, q, k: float(np.percentile(xs, q) * k) if xs else None  # noqa: E731
    return {"success_rate": ok / n, "n": n,
            "pos_within_tol": float(np.mean(np.array(pos) <= tol["x"])) if pos else 0.0,
            "yaw_within_tol": float(np.mean(np.array(yaw) <= tol["yaw"])) if yaw else 0.0,
            "width_within_tol": float(np.mean(np.array(width) <= tol["width"])) if width else 0.0,
            "pos_err_mm_p50": pct(pos, 50, 1e3), "pos_err_mm_p95": pct(pos, 95, 1e3),
            "yaw_err_deg_p50": pct(yaw, 50, 180 / math.pi), "yaw_err_deg_p95": pct(yaw, 95, 180 / math.pi),
            "width_err_mm_p50": pct(width, 50, 1e3), "width_err_mm_p95": pct(width, 95, 1e3)}


def _decode(target, draft, prefix, n_act: int, acts: ActionTokenizer, mode: str, k: int, relax_delta: int):
    if mode == "heads":
        return speculate_heads(target, prefix, n_act)
    if mode == "draft":
        return speculate(draft, target, prefix, n_act, k=k, relax_delta=relax_delta,
                         relax_range=acts.bin_range if relax_delta else None)
    return greedy(target, prefix, n_act)


def run_variant(bundle: Bundle, precision: str, prefixes: list, n_act: int, acts: ActionTokenizer,
                draft_precision: str | None = None, k: int = 4, relax_delta: int = 0,
                mode: str = "plain") -> tuple[list, list, dict]:
    """Decode every prefix with one target precision: plain, with the target's own draft heads
    (mode "heads") or with the draft model (a `draft_precision`)."""
    target = open_decoder(bundle, "target", precision)
    draft = open_decoder(bundle, "draft", draft_precision) if draft_precision else None
    mode = "draft" if draft is not None else mode
    tokens, decisions, wall, proposed, accepted, passes = [], [], [], 0, 0, 0
    for prefix in prefixes:
        if prefix is None:
            tokens.append(None), decisions.append(None)
            continue
        res = _decode(target, draft, prefix, n_act, acts, mode, k, relax_delta)
        proposed, accepted, passes = (proposed + res.stats.proposed, accepted + res.stats.accepted,
                                      passes + res.stats.verify_passes)
        wall.append(res.stats.wall_ms)
        tokens.append(list(res.tokens))
        try:
            decisions.append(acts.decode(res.tokens, res.probs, prefix))
        except ValueError:
            decisions.append(None)  # a token outside its field: no valid decision
    extra = {"decode_ms_p50": float(np.median(wall)) if wall else None,
             "decode_ms_p99": float(np.percentile(wall, 99)) if wall else None}
    if mode != "plain":
        extra.update(acceptance=accepted / max(proposed, 1), proposed=proposed, accepted=accepted,
                     tokens_per_target_pass=(len(wall) * (n_act - 1)) / max(passes, 1))
        if mode == "draft":
            extra["k"] = k
        if relax_delta:
            extra["relax_delta_bins"] = relax_delta
    return tokens, decisions, extra


def variants(bundle: Bundle, precisions: tuple[str, ...], relax_delta: int = 0) -> list[tuple]:
    """(name, target precision, draft precision or None, relax_delta, mode) to evaluate."""
    m = bundle.manifest
    have = [p for p in precisions if p in m.target.precisions]
    out = [(p, p, None, 0, "plain") for p in have]
    if m.target.draft_heads:
        out += [(f"{p}+heads", p, None, 0, "heads") for p in have]
    if m.draft is not None:
        dp = "fp32" if "fp32" in m.draft.files else sorted(m.draft.files)[0]
        out += [(f"{p}+draft", p, dp, 0, "draft") for p in have if p != "fp32"]
        out += [("fp32+draft", "fp32", dp, 0, "draft")] * ("fp32" in have)
        if relax_delta:  # lossy: a draft bin within relax_delta of the target's is accepted
            out += [(f"{p}+draft~{relax_delta}", p, dp, relax_delta, "draft") for p in have if p != "fp32"]
    return out


def confusion(decisions: list, labels: list[dict], rows: tuple[str, ...], cols: tuple[str, ...]) -> dict:
    """QC counts: rows = the true classes `rows`, columns = the predicted classes `cols` then "none"
    (no valid decision)."""
    counts = np.zeros((len(rows), len(cols) + 1), np.int64)
    for d, lab in zip(decisions, labels):
        counts[rows.index(lab["defect"]), len(cols) if d is None else cols.index(d.defect)] += 1
    return {"rows": list(rows), "cols": [*cols, "none"], "counts": counts.tolist()}


def score_variants(bundle: Bundle, prefixes: list, labels: list[dict],
                   precisions: tuple[str, ...] = ("fp32", "int8", "int4"), k: int = 4, relax_delta: int = 0,
                   quiet: bool = True, located: tuple[str, ...] = LOCATED,
                   classes: tuple[str, ...] | None = None) -> dict[str, dict]:
    """Every variant of `bundle` (`variants`) decoded on `prefixes` (None: no observation) and scored
    against `labels`, by variant name; with `classes` (the true QC classes) a confusion matrix a row."""
    m = bundle.manifest
    acts = ActionTokenizer.from_manifest(m)
    t0, rows, ref_tokens = time.monotonic(), {}, None
    for name, prec, draft_prec, relax, mode in variants(bundle, precisions, relax_delta):
        tokens, decisions, extra = run_variant(bundle, prec, prefixes, acts.n_tokens, acts, draft_prec, k, relax,
                                               mode)
        metrics = score(m.task, m, decisions, labels, located) | extra
        if ref_tokens is None and name == "fp32":
            ref_tokens = tokens
        if ref_tokens is not None:
            same = [a == b for a, b in zip(tokens, ref_tokens) if a is not None and b is not None]
            metrics["agreement_with_fp32"] = float(np.mean(same)) if same else None
        if classes is not None:
            metrics["confusion"] = confusion(decisions, labels, classes, acts.fields[0].labels)
        rows[name] = metrics
        if not quiet:
            print(f"  {name:12s} done ({time.monotonic() - t0:.0f} s)", flush=True)
    return rows


def folder_inputs(bundle: Bundle, folder: str | Path, positions: str | Path | None = None):
    """A labelled QC folder through the bundle's perception: (tasks.labelled_folder.Encoded, its classes).
    ValueError for a grasp bundle, a bad folder, or a class the bundle does not have."""
    from .tasks.labelled_folder import check_classes, encode_folder, read_folder

    m = bundle.manifest
    if m.task != "qc":
        raise ValueError(f"bundle {bundle.root}: --folder scores QC bundles; this one is {m.task!r}")
    labelled = read_folder(Path(folder), Path(positions) if positions else None)
    check_classes(labelled, ActionTokenizer.from_manifest(m).fields[0].labels)
    return encode_folder(labelled, ObservationTokenizer.from_bundle(bundle)), labelled.classes


def evaluate(bundle_dir: str | Path, split: str = "test", precisions: tuple[str, ...] = ("fp32", "int8", "int4"),
             json_path: str | Path | None = None, n: int | None = None, k: int = 4, quiet: bool = False,
             relax_delta: int = 0, folder: str | Path | None = None, positions: str | Path | None = None) -> dict:
    """The bundle on `n` scenes of `split`, or on a labelled QC `folder` (`positions`: its CSV)."""
    if split not in DEFAULT_N:
        raise ValueError(f"split must be one of {sorted(DEFAULT_N)}, got {split!r}")
    bundle = Bundle.load(bundle_dir)
    m = bundle.manifest
    if m.task not in ("qc", "grasp"):
        raise ValueError(f"bundle {bundle_dir}: task {m.task!r} has no evaluation scenes")
    t0 = time.monotonic()
    if folder is None:
        obs = ObservationTokenizer.from_bundle(bundle)
        prefixes, labels = encode_scenes(obs, scenes(m.task, split, n or DEFAULT_N[split]))
        report = {"bundle": m.name, "task": m.task, "split": split, "n": len(labels)}
        report["precisions"] = score_variants(bundle, prefixes, labels, precisions, k, relax_delta, quiet)
    else:
        enc, classes = folder_inputs(bundle, folder, positions)
        report = {"bundle": m.name, "task": m.task, "split": f"folder {folder}", "n": len(enc.labels),
                  "no_part_found": enc.unusable()}
        report["precisions"] = score_variants(bundle, enc.prefixes, enc.labels, precisions, k, relax_delta, quiet,
                                              located=classes[1:], classes=classes)
    report["eval_s"] = round(time.monotonic() - t0, 1)
    if not quiet:
        print(format_table(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report


def format_table(report: dict) -> str:
    if report["task"] == "qc":
        cols = ["accuracy", "defect_recall", "false_reject_rate", "acceptance", "agreement_with_fp32", "decode_ms_p50"]
    else:
        cols = ["success_rate", "pos_err_mm_p95", "yaw_err_deg_p95", "width_err_mm_p95", "acceptance",
                "agreement_with_fp32", "decode_ms_p50"]
    unit = "images" if report["split"].startswith("folder") else "scenes"
    lines = [f"{report['bundle']} ({report['task']}), split {report['split']}, {report['n']} {unit}",
             f"{'variant':12s} " + " ".join(f"{c:>20s}" for c in cols)]
    for name, met in report["precisions"].items():
        cells = []
        for c in cols:
            v = met.get(c)
            cells.append(f"{'-':>20s}" if v is None else f"{v:20.4f}")
        lines.append(f"{name:12s} " + " ".join(cells))
    for name, met in report["precisions"].items():
        if "confusion" in met and "+" not in name:  # speculative rows decide as their plain row
            lines += ["", f"{name}: true class (rows) x decided class (columns)", format_confusion(met["confusion"])]
    return "\n".join(lines)


def format_confusion(conf: dict) -> str:
    width = max(len(c) for c in conf["rows"] + conf["cols"]) + 1
    lines = [" " * width + "".join(f"{c:>{width}s}" for c in conf["cols"])]
    lines += [f"{r:>{width}s}" + "".join(f"{n:>{width}d}" for n in row) for r, row in zip(conf["rows"], conf["counts"])]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", required=True, help="bundle folder, e.g. models/qc")
    p.add_argument("--split", default="test", choices=sorted(DEFAULT_N))
    p.add_argument("--n", type=int, default=None, help="number of scenes (default 500)")
    p.add_argument("--precisions", default="fp32,int8,int4")
    p.add_argument("--k", type=int, default=4, help="draft tokens per speculative step")
    p.add_argument("--relax-delta", type=int, default=0,
                   help="also evaluate lossy relaxed speculation (draft bin within N bins accepted)")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--folder", default=None,
                   help="score on a labelled QC image folder instead (good/, defect/<kind>/; docs/TRAINING.md)")
    p.add_argument("--positions", default=None,
                   help="with --folder: CSV of defect positions (file,u,v); default FOLDER/positions.csv if present")


def run(args: argparse.Namespace) -> int:
    if args.positions and not args.folder:
        raise ValueError("--positions goes with --folder")
    evaluate(args.bundle, args.split, tuple(args.precisions.split(",")), args.json_path, args.n, args.k,
             relax_delta=args.relax_delta, folder=args.folder, positions=args.positions)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sol-control eval", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
