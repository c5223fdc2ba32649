"""Rebuild the shipped bundles models/qc and models/grasp (dev-only, torch): generate data, train
the target with its draft heads, distil the draft, export (the Optimum fp32 reference and the
engine's fused fp32 / int8 / int4 graphs with the heads inside), store parity references, evaluate,
and write manifest.json. Each stage reuses its .work/ output when present (delete .work/ to start over).

    python tools/make_models.py [--tasks qc,grasp] [--steps 1800] [--draft-steps N] [--out models]
    python tools/make_models.py --refresh-graphs     # the fused graphs again, from the bundles (builder changes)
    python tools/make_models.py --refresh-graphs --tasks grasp --heads .work/grasp/heads.npz   # new heads
    python tools/make_models.py --refresh-guesses    # the answer guessers again (decoding.prefill_guesses), re-evaluated
    python tools/make_models.py --refresh-metrics    # re-evaluate the bundles as they are (a decoding change)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import train as T  # noqa: E402

from sol_control.bundle import write_manifest  # noqa: E402
from sol_control.train.export import FUSED, build_fused, fused_parity, spec  # noqa: E402
from sol_control.train.guess import GUESS_POSITIONS, GUESSES, write_guesses  # noqa: E402

N_REF = 3  # parity reference sequences per bundle
N_TRAIN = {"qc": 16000, "grasp": 16000}
# draft distillation per task: extra training-split scenes labelled by the target, and steps. QC's
# fine u / v / severity bins are harder to imitate: 24 000 extra scenes took int8 acceptance from
# 79.6 % (12 000, 3 000 steps) to 81.0 %
DRAFT_RECIPE = {"qc": {"distill_extra": 24000, "draft_steps": 4500},
                "grasp": {"distill_extra": 12000, "draft_steps": 3000}}
DESCRIPTIONS = {
    "qc": "Belt QC: part class (ok / 5 defects), defect location (u, v) and severity from binned "
          "image features. Synthetic data, analytic labels.",
    "grasp": "Top-down grasp: x, y, z, yaw, width, force and 3 approach waypoints (256 bins each) "
             "from binned image features of the largest object + joint state. Analytic teacher.",
}


def stage(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def export_bundle(task: str, out: Path, work: Path) -> dict:
    """The target's Optimum export (the fp32 reference; the peers' weights are read back from it),
    the draft's, and the engine's fused graphs (fp32, int8, int4) with the draft heads inside."""
    import torch
    from export import export_decoder, parity

    from sol_control.graph.from_onnx import read_decoder
    from sol_control.graph.weights import DraftHeads

    target, draft = T.load_model(work / "target"), T.load_model(work / "draft")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.onnx*"):
        old.unlink()
    stage(f"{task}: export")
    export_decoder(target, out / "target_fp32.onnx", opset=23, max_context=T.MAX_CONTEXT)
    export_decoder(draft, out / "draft_fp32.onnx", opset=23, max_context=T.MAX_CONTEXT)
    weights = read_decoder(out / "target_fp32.onnx", T.MAX_CONTEXT)
    weights.heads = DraftHeads.load(work / "heads.npz")
    build_fused(weights, out, tuple(FUSED))  # int4 byte for byte what tools/quantize.py made before
    info = {"parity_max_abs_fp32": parity(target, out / "target_fp32.onnx"),
            "parity_max_abs_fused_fp32": fused_parity(target, out / FUSED["fp32"]),
            "parity_max_abs_draft": parity(draft, out / "draft_fp32.onnx")}
    # parity references: real test prefixes + the target's greedy actions, torch logits at every position
    test = T.build_split(task, "test", 64, workers=1)
    ids = np.concatenate([test["prefix"][:N_REF], T.greedy_batch(target, test["prefix"][:N_REF],
                                                                 test["actions"].shape[1])], axis=1)
    with torch.no_grad():
        logits = target(torch.from_numpy(ids)).logits.float().numpy()  # [R, L, V]
        dlogits = draft(torch.from_numpy(ids)).logits.float().numpy()
    np.savez(out / "reference.npz", ids=ids, target_logits=logits, draft_logits=dlogits,
             prefix_len=np.int64(test["prefix"].shape[1]))
    return info


def build_static_int8(out: Path) -> dict:
    """The bundle's int8 fused graph again, its activations on static scales calibrated on its own
    answers to training scenes (train.calibrate; 15-19 % less a decision than per-row scales).
    The manifest must exist, and has to be written again afterwards (sha256)."""
    from sol_control.bundle import Bundle
    from sol_control.train.calibrate import bundle_static_int8
    from sol_control.train.export import build_static_int8 as write_static_int8

    weights, record = bundle_static_int8(Bundle.load(out))
    write_static_int8(weights, out)
    return record


N_GUESS_TRAIN = 6000  # training scenes the answer guesser learns from (sol_control.train.guess)


def fit_guesses(task: str, out: Path) -> dict:
    """The bundle's answer guesser (guesses.npz): a softmax regression per answer position from
    the observation tokens to the int8 target's greedy answers on training scenes (numpy, ~3
    minutes; sol_control.train.guess). The manifest must list it afterwards (`target.guesses`, sha256)."""
    from sol_control.bundle import Bundle
    from sol_control.eval import encode_scenes, scenes
    from sol_control.perception import ObservationTokenizer

    bundle = Bundle.load(out)
    n_pos = GUESS_POSITIONS[task]
    stage(f"{task}: answer guesses for {n_pos} tokens ({N_GUESS_TRAIN} training scenes)")
    prefixes, _ = encode_scenes(ObservationTokenizer.from_bundle(bundle), scenes(task, "train", N_GUESS_TRAIN))
    return write_guesses(bundle, [p for p in prefixes if p is not None], n_pos)


def manifest_dict(task: str, out: Path, work: Path, metrics: dict) -> dict:
    lay = T.layout(task)
    target, draft = T.load_model(work / "target"), T.load_model(work / "draft")
    files = ["target_fp32.onnx", *FUSED.values(), "draft_fp32.onnx", "reference.npz"]
    guesses = {"guesses": GUESSES} if (out / GUESSES).exists() and task in GUESS_POSITIONS else {}
    files += list(guesses.values())
    return {"name": f"sol_control-{task}", "task": task, "description": DESCRIPTIONS[task],
            "max_context": T.MAX_CONTEXT, "vocab": lay["vocab"], "opset": 23,
            "target": spec(target, {"fp32": "target_fp32.onnx"}, fused=FUSED, draft_heads=HEADS[task], **guesses),
            "draft": spec(draft, {"fp32": "draft_fp32.onnx"}),
            "observation": lay["observation"], "actions": lay["actions"],
            "files": {f: {} for f in files}, "metrics": metrics}


HEADS = {"qc": 3, "grasp": 4}  # draft heads per task (QC decides 4 tokens, grasp 15)
# tasks whose heads are trained again, Medusa style, on the finished (frozen) target's own greedy
# answers (steps): QC's then accept 45 % of their guesses instead of 35 % (its fine u / v bins);
# grasp's joint heads do better than frozen ones (tools/train_heads.py)
HEADS_ON_FROZEN_TARGET = {"qc": 4000}


def train_target(task: str, data: dict, args, work: Path) -> None:
    """The target and its draft heads, trained together (multi-token prediction): work/target and
    work/heads.npz (for HEADS_ON_FROZEN_TARGET, heads then trained again on the saved target)."""
    import train_heads as H

    lo, hi = T.layout(task)["vocab"]["action"]
    start = f"from {args.init_from / task}" if args.init_from else "from scratch"
    stage(f"{task}: train target + {HEADS[task]} draft heads ({args.steps} steps, {start})")
    model, heads = starting_target(task, args.init_from, work, lo, hi)
    info = T.train(model, data, args.steps, args.lr, args.batch, T.WORK / "train.log", work / "target",
                   f"{task}/target", heads=heads, heads_weight=args.heads_weight, action_offset=lo)
    np.savez(work / "heads.npz", **heads.arrays(), token_offset=np.int64(lo))
    (work / "target_train.json").write_text(json.dumps(info, indent=2))
    if task in HEADS_ON_FROZEN_TARGET:
        steps = args.frozen_heads_steps or HEADS_ON_FROZEN_TARGET[task]
        stage(f"{task}: {HEADS[task]} draft heads again, on the frozen target ({steps} steps)")
        H.fit_heads(task, T.load_model(work / "target"), work, HEADS[task], steps,
                    args.n_train or N_TRAIN[task])  # rewrites heads.npz


def starting_target(task: str, init_from: Path | None, work: Path, lo: int, hi: int):
    """(target, heads): new ones, or (`--init-from`) a built bundle's fp32 target and heads, so a
    change of the labels or features fine-tunes the shipped policy instead of starting over."""
    import train_heads as H

    from sol_control.graph.from_onnx import read_heads
    from sol_control.train.model import target_from_bundle

    if init_from is None:
        model = T.make_model(task, T.TARGET_ARCH)
        return model, H.Heads(model.lm_head.weight.detach().numpy()[lo:hi].copy(), HEADS[task])
    bundle = init_from / task
    model = target_from_bundle(bundle, work / "init")
    old = read_heads(bundle / FUSED["fp32"])
    return model, H.Heads.from_arrays(old.w1, old.w2)


def starting_draft(task: str, args, work: Path):
    if args.init_from is None:
        return T.make_model(task, T.DRAFT_ARCH, seed=1)
    return T.load_model(work / "init" / "hf_from_bundle" / "draft")


def distil_draft(task: str, data: dict, args, work: Path, n_train: int) -> None:
    recipe = DRAFT_RECIPE[task]
    distill_extra = args.distill_extra if args.distill_extra is not None else recipe["distill_extra"]
    draft_steps = args.draft_steps if args.draft_steps is not None else recipe["draft_steps"]
    stage(f"{task}: distil draft ({draft_steps} steps, {distill_extra} extra scenes)")
    target = T.load_model(work / "target")
    # more prefixes than the target saw (the next training indices): the draft imitates the
    # target's greedy choices, and more of them make it generalise better (acceptance)
    prefix = np.concatenate([data["prefix"], T.extra_prefixes(task, n_train, distill_extra, args.workers)])
    acts = T.greedy_batch(target, prefix, data["actions"].shape[1])
    np.save(work / "target_greedy.npy", acts)
    draft = starting_draft(task, args, work)
    info = T.train(draft, {"prefix": prefix, "actions": acts}, draft_steps, args.lr,
                   args.batch, T.WORK / "train.log", work / "draft", f"{task}/draft")
    info["target_teacher_token_agreement"] = float((acts[:len(data["actions"])] == data["actions"]).mean())
    info["distillation_prefixes"] = len(prefix)
    (work / "draft_train.json").write_text(json.dumps(info, indent=2))


def build(task: str, args) -> dict:
    work = T.WORK / task
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / task
    t0 = time.monotonic()
    n_train = args.n_train or N_TRAIN[task]
    stage(f"{task}: data ({n_train} training scenes)")
    data = T.build_split(task, "train", n_train, args.workers)
    timing = {}
    if not (work / "target" / "config.json").exists() or not (work / "heads.npz").exists():
        train_target(task, data, args, work)
    if not (work / "draft" / "config.json").exists():
        distil_draft(task, data, args, work, n_train)
    timing["train_s"] = round(time.monotonic() - t0, 1)
    if args.train_only:
        return {"timing": timing}
    export_info = export_bundle(task, out, work)
    # write a first manifest (sha256) so the engine can load the bundle, then evaluate and rewrite
    write_manifest(out, manifest_dict(task, out, work, {}))
    stage(f"{task}: int8 with static activations (calibrated on training scenes)")
    export_info["int8"] = build_static_int8(out)
    write_manifest(out, manifest_dict(task, out, work, {}))
    if task in GUESS_POSITIONS:
        export_info["guesses"] = fit_guesses(task, out)
        write_manifest(out, manifest_dict(task, out, work, {}))
    from sol_control.eval import evaluate

    metrics = {"export": export_info, "training": {}}
    for name in ("target_train.json", "draft_train.json"):
        if (work / name).exists():
            metrics["training"][name.split("_")[0]] = json.loads((work / name).read_text())
    for split, n in (("test", args.n_test), ("heldout", args.n_heldout)):
        stage(f"{task}: eval {split} ({n} scenes)")
        rep = evaluate(out, split, n=n, quiet=False)
        metrics[split] = rep["precisions"]
    timing["total_s"] = round(time.monotonic() - t0, 1)
    metrics["timing"] = timing
    write_manifest(out, manifest_dict(task, out, work, metrics))
    stage(f"{task}: done in {timing['total_s']:.0f} s")
    return metrics


def refresh_graphs(task: str, args) -> None:
    """Rebuild a shipped bundle's fused graphs from the bundle alone (its Optimum fp32 target and the
    heads read back from its fused fp32 graph), re-evaluate, rewrite sha256 and metrics: for a
    change of the graph builder, without .work/ and without retraining (the fp32 graph comes out
    byte for byte the same)."""
    from sol_control.bundle import Bundle
    from sol_control.graph.from_onnx import read_decoder, read_heads
    from sol_control.graph.weights import DraftHeads

    out = Path(args.out) / task
    m = Bundle.load(out).manifest
    weights = read_decoder(out / m.target.files["fp32"], m.max_context)
    weights.heads = DraftHeads.load(args.heads) if args.heads else read_heads(out / m.target.fused["fp32"])
    stage(f"{task}: rebuild {', '.join(FUSED)} fused graphs ({weights.heads.k} draft heads)")
    build_fused(weights, out, ("fp32", "int4"))  # int8: build_static_int8 below, from the fp32 graph just rebuilt
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["target"]["draft_heads"] = weights.heads.k
    write_manifest(out, manifest)  # new sha256, so the engine loads the new files
    stage(f"{task}: int8 with static activations (calibrated on training scenes)")
    manifest["metrics"].setdefault("export", {})["int8"] = build_static_int8(out)
    write_manifest(out, manifest)
    refresh_guesses(task, out, manifest)
    reevaluate(task, out, manifest, args)


def reevaluate(task: str, out: Path, manifest: dict, args) -> None:
    """Evaluate the bundle on its test and held-out scenes again and write the metrics into
    `manifest` (after new graphs or guesses: the fast rows' acceptance and decode ms move)."""
    from sol_control.eval import evaluate

    for split, n in (("test", args.n_test), ("heldout", args.n_heldout)):
        stage(f"{task}: eval {split} ({n} scenes)")
        manifest["metrics"][split] = evaluate(out, split, n=n, quiet=False)["precisions"]
    write_manifest(out, manifest)


def refresh_guesses(task: str, out: Path, manifest: dict) -> None:
    """The answer guesser again, on the bundle's own int8 target (`--refresh-graphs` after a new
    graph, `--refresh-guesses` alone); writes `manifest` with it listed."""
    if task not in GUESS_POSITIONS:
        return
    manifest.setdefault("metrics", {}).setdefault("export", {})["guesses"] = fit_guesses(task, out)
    manifest["target"]["guesses"] = GUESSES
    manifest["files"][GUESSES] = {}
    write_manifest(out, manifest)


def _train_minutes(met: dict) -> str:
    """'target 23 min, draft 8 min' from the training records (stages reused from .work/ keep theirs)."""
    parts = [f"{name} {info['train_s'] / 60:.0f} min" for name, info in met.get("training", {}).items()
             if "train_s" in info]
    return ", ".join(parts) or "time not recorded"


def metrics_table(models: Path) -> str:
    """Markdown tables of the metrics stored in the bundles' manifests."""
    lines = []
    for task, keys in (("qc", ("accuracy", "defect_recall", "false_reject_rate")),
                       ("grasp", ("success_rate", "pos_err_mm_p95", "yaw_err_deg_p95", "width_err_mm_p95"))):
        mpath = models / task / "manifest.json"
        if not mpath.exists():
            continue
        m = json.loads(mpath.read_text())
        met = m["metrics"]
        size_mb = sum(f["size_bytes"] for f in m["files"].values()) / 1e6
        t, d = m["target"], m["draft"]
        prefix_len = m["observation"]["prefix_len"]
        lines += [f"**{task}** bundle: {size_mb:.1f} MB; target {t['n_layers']} layers x {t['hidden_size']} "
                  f"({t['params'] / 1e6:.2f} M params), draft {d['n_layers']} x {d['hidden_size']} "
                  f"({d['params'] / 1e6:.2f} M); prefix {prefix_len} tokens, {len(m['actions'])} action tokens; "
                  f"fp32 export parity max |ort - torch| = {met['export']['parity_max_abs_fp32']:.1e}; "
                  f"training {_train_minutes(met)}.", ""]
        n = {split: next(iter(met[split].values()))["n"] for split in ("test", "heldout") if split in met}
        lines += [f"**{task}** (test {n.get('test')} scenes, held-out {n.get('heldout')} scenes; "
                  f"decode = engine decode time per decision, prefill included, 1 thread)", "",
                  "| variant | " + " | ".join(f"{k} test" for k in keys) + " | " +
                  " | ".join(f"{k} held-out" for k in keys) + " | acceptance test | acceptance held-out "
                  "| agreement w/ fp32 (test) | decode ms p50 (test) |",
                  "|---" * (2 * len(keys) + 5) + "|"]
        for variant, row in met.get("test", {}).items():
            held = met.get("heldout", {}).get(variant, {})
            fmt = lambda v: "–" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
            lines.append(f"| {variant} | " + " | ".join(fmt(row.get(k)) for k in keys) + " | " +
                         " | ".join(fmt(held.get(k)) for k in keys) + " | " + fmt(row.get("acceptance")) +
                         " | " + fmt(held.get("acceptance")) + " | " + fmt(row.get("agreement_with_fp32")) +
                         " | " + fmt(row.get("decode_ms_p50")) + " |")
        lines.append("")
    return "\n".join(lines)


def update_model_card(models: Path) -> None:
    card = models / "README.md"
    if not card.exists():
        return
    text = card.read_text()
    begin, end = "<!-- metrics:begin -->", "<!-- metrics:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        card.write_text(head + begin + "\n" + metrics_table(models) + end + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="qc,grasp")
    ap.add_argument("--n-train", type=int, default=None, help="default: 16000 per task")
    ap.add_argument("--out", default=str(ROOT / "models"), help="where the bundles go")
    ap.add_argument("--work", default=str(T.WORK), help="cache folder for data and checkpoints")
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--n-heldout", type=int, default=500)
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--draft-steps", type=int, default=None, help="default: per task (DRAFT_RECIPE)")
    ap.add_argument("--distill-extra", type=int, default=None,
                    help="extra scenes for draft distillation; default: per task (DRAFT_RECIPE)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--heads-weight", type=float, default=0.5,
                    help="weight of the draft heads' loss next to the target's (multi-token prediction)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--train-only", action="store_true", help="data and training only (no export)")
    ap.add_argument("--frozen-heads-steps", type=int, default=None,
                    help=f"steps of the heads trained again on the frozen target (default {HEADS_ON_FROZEN_TARGET})")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start the target, its heads and the draft from the bundles in this folder "
                         "(a copy: --out may overwrite them); fine-tuning after a change of labels or features")
    ap.add_argument("--refresh-graphs", action="store_true",
                    help="rebuild the shipped bundles' fused graphs from the bundles themselves and re-evaluate")
    ap.add_argument("--heads", type=Path, default=None,
                    help="with --refresh-graphs (one task): the draft heads from this .npz "
                         "(tools/train_heads.py), not the bundle's own")
    ap.add_argument("--refresh-guesses", action="store_true",
                    help="only the answer guesser (guesses.npz) again, on the bundles' own int8 targets, "
                         "and re-evaluate")
    ap.add_argument("--refresh-metrics", action="store_true",
                    help="only re-evaluate the shipped bundles and rewrite their metrics (a decoding change)")
    args = ap.parse_args(argv)
    if args.heads and not (args.refresh_graphs and "," not in args.tasks):
        ap.error("--heads goes with --refresh-graphs and one task")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    T.WORK = Path(args.work)
    for task in args.tasks.split(","):
        out = Path(args.out) / task
        if args.refresh_guesses or args.refresh_metrics:
            manifest = json.loads((out / "manifest.json").read_text())
            if args.refresh_guesses:
                refresh_guesses(task, out, manifest)
            reevaluate(task, out, manifest, args)
        else:
            refresh_graphs(task, args) if args.refresh_graphs else build(task, args)
    if not args.train_only:
        update_model_card(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
