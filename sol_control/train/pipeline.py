"""One run of `sol-control train` (QC): a labelled folder -> a verified bundle, its report.

    read the folder (OpenCV + the node's perception) -> stratified validation split
    -> the starting target (the bundle's fp32 weights, or a new one) -> training with the draft
       heads, a checkpoint an epoch in the work dir (a run that stops goes on from there)
    -> the heads again on the finished target -> ONNX: Optimum fp32, fused fp32 / int4 / int8
       (static activations calibrated on training images) -> every graph on the validation images
    -> the quantization check (report.quantized_verdict) -> answer guesses -> decision time
    -> manifest (sha256) + report, all in a temp folder renamed to OUT at the very end.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

from sol_control.actions import ActionTokenizer
from sol_control.bundle import ActionField, Bundle
from sol_control.config import QC_CLASS_NAME, shipped_bundle
from sol_control.perception import ObservationTokenizer
from sol_control.tasks import labelled_folder as F

from .config import TrainConfig
from .layout import layout
from .run import Inputs, Log, Trained

DEFAULT_HEADS = 3  # QC's (tools/make_models.py HEADS)


def bundle_layout(cfg: TrainConfig, start: Bundle, folder: F.LabelledFolder) -> dict:
    """vocab, observation, actions and max_context of the bundle to write: the starting bundle's, or
    (--from-scratch) a new layout over the folder's classes."""
    m = start.manifest
    if m.task != "qc":
        raise ValueError(f"bundle {start.root}: sol-control train makes QC bundles; this one is {m.task!r} "
                         f"(grasp is not done yet)")
    if cfg.from_scratch:
        bad = [c for c in folder.classes if not QC_CLASS_NAME.fullmatch(c)]
        if bad:
            raise ValueError(f"folder {folder.root}: defect/{bad[0]}/: a class name must match "
                             f"{QC_CLASS_NAME.pattern} (the node's policy names classes that way)")
        return {**layout("qc", folder.classes), "max_context": m.max_context}
    F.check_classes(folder, ActionTokenizer.from_manifest(m).fields[0].labels)
    return {"vocab": m.vocab.model_dump(mode="json"), "observation": m.observation, "max_context": m.max_context,
            "actions": [f.model_dump(mode="json", exclude_none=True) for f in m.actions]}


def read_inputs(cfg: TrainConfig, start: Bundle, log: Log) -> tuple[Inputs, dict]:
    """The folder read, checked and split; the layout of the bundle to write."""
    from sol_control.bench.common import progress

    folder = F.read_folder(cfg.folder, cfg.positions, F.MIN_PER_CLASS)
    lay = bundle_layout(cfg, start, folder)
    obs = ObservationTokenizer(lay["observation"], lay["vocab"]["bos"], lay["vocab"]["sep"])
    enc = F.encode_folder(folder, obs, progress)
    progress("", end="\n")
    for c in folder.classes:
        found = sum(lab["defect"] == c and p is not None for lab, p in zip(enc.labels, enc.prefixes))
        if found < F.MIN_PER_CLASS:
            where = "good" if c == "ok" else f"defect/{c}"
            raise ValueError(f"folder {folder.root}: perception finds a part in only {found} of the {folder.count(c)} "
                             f"images in {where}/ (training needs {F.MIN_PER_CLASS} a class): the part must stand out "
                             f"from the belt colour at the image border")
    train, val = F.stratified_split([lab["defect"] for lab in enc.labels], cfg.val_fraction, cfg.seed)
    train = np.array([i for i in train if enc.prefixes[i] is not None], np.int64)
    log(f"{len(enc.items)} images, classes {', '.join(folder.classes)}: {len(train)} to train, {len(val)} to "
        f"validate; no part found in {len(enc.unusable())}")
    return Inputs(folder, enc, train, val), lay


def fingerprint(cfg: TrainConfig, inputs: Inputs, start: Bundle) -> str:
    """What a checkpoint was made from: the images (names, sizes, times), the positions, the
    starting bundle and the training settings."""
    h = hashlib.sha256()
    for item in inputs.folder.items:
        st = item.path.stat()
        h.update(f"{item.rel}|{item.label}|{st.st_size}|{st.st_mtime_ns}|{item.u}|{item.v}\n".encode())
    h.update((start.root / "manifest.json").read_bytes())
    settings = {"from_scratch": cfg.from_scratch, **cfg.recipe, "batch": cfg.batch, "val_fraction": cfg.val_fraction,
                "seed": cfg.seed, "heads_weight": cfg.heads_weight}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


def prepare_work(cfg: TrainConfig, key: str, log: Log) -> Path:
    """The work dir; its checkpoint and caches are dropped when they come from another run."""
    work = cfg.work_dir
    work.mkdir(parents=True, exist_ok=True)
    run = work / "run.json"
    if run.is_file() and json.loads(run.read_text()).get("fingerprint") != key:
        log(f"{work} holds a run of other images or settings: starting over")
        for name in ("checkpoint.pt", "hf_from_bundle"):
            p = work / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    run.write_text(json.dumps({"fingerprint": key}) + "\n")
    return work


def starting_model(cfg: TrainConfig, start: Bundle, lay: dict, work: Path):
    """(transformers target, heads.Heads, K): the starting bundle's fp32 target and its heads, or
    (--from-scratch) a new target and new heads."""
    from sol_control.graph.from_onnx import read_heads

    from .heads import Heads
    from .model import TARGET_ARCH, make_model, target_from_bundle

    m = start.manifest
    lo, hi = lay["vocab"]["action"]
    k = m.target.draft_heads or DEFAULT_HEADS
    if cfg.from_scratch:
        model = make_model("qc", TARGET_ARCH, seed=cfg.seed, labels=tuple(lay["actions"][0]["labels"]))
    elif "fp32" not in m.target.files:
        raise ValueError(f"bundle {start.root}: no fp32 target in the Optimum layout (target.files.fp32) to "
                         f"start from; train --from-scratch instead")
    else:
        model = target_from_bundle(start.root, work)
    old = read_heads(start.path(m.target.fused["fp32"])) if not cfg.from_scratch and "fp32" in m.target.fused else None
    if old is not None and old.w2 is not None and old.token_offset == lo:
        return model, Heads.from_arrays(old.w1, old.w2), old.k
    return model, Heads(model.lm_head.weight.detach().numpy()[lo:hi].copy(), k), k


def class_accuracy(model, prefix: np.ndarray, class_tokens: np.ndarray) -> float:
    """Share of `prefix` rows whose greedy first action token (the class) is right: one forward."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(prefix)).logits[:, -1]  # [N, V]
    return float((logits.argmax(-1).numpy() == class_tokens).mean())


def fit(cfg: TrainConfig, model, heads, data: dict, val: dict, lo: int, work: Path, log: Log) -> dict:
    """The target (and its heads) trained for the recipe's epochs on `data` (an epoch: as many
    samples as training images, drawn with replacement); a checkpoint after every epoch, and a run
    with one in `work` goes on from it. `val`: prefix, actions of the usable validation images."""
    from .loop import Trainer, load_checkpoint, save_checkpoint

    epochs, lr = cfg.recipe["epochs"], cfg.recipe["lr"]
    per_epoch = math.ceil(len(data["prefix"]) / cfg.batch)
    run = Trainer(model, data, epochs * per_epoch, lr, cfg.batch, heads, cfg.heads_weight, lo)
    ckpt, t0 = work / "checkpoint.pt", time.monotonic()
    if ckpt.is_file():
        load_checkpoint(run, ckpt)
        log(f"resuming after epoch {run.step // per_epoch} ({ckpt})")
    resumed = run.step // per_epoch
    while run.step < run.steps:
        steps = [run.next() for _ in range(per_epoch)]
        epoch = run.step // per_epoch
        acc = class_accuracy(model, val["prefix"], val["actions"][:, 0])
        run.hist.append((epoch, float(np.mean([s[0] for s in steps])), float(np.mean([s[1] for s in steps])), acc))
        save_checkpoint(run, ckpt)
        left = (time.monotonic() - t0) / (epoch - resumed) * (epochs - epoch)
        log(f"epoch {epoch}/{epochs}  loss {run.hist[-1][1]:.4f}  token acc {run.hist[-1][2]:.3f}  "
            f"validation class acc {acc:.3f}  (~{left:.0f} s left)")
    model.eval()
    return {"epochs": epochs, "steps": run.steps, "steps_per_epoch": per_epoch, "lr": lr, "batch": cfg.batch,
            "heads_weight": cfg.heads_weight, "resumed_after_epoch": resumed,
            "train_s": round(time.monotonic() - t0, 1),
            "history": [list(h) for h in run.hist]}


def action_tokenizer(lay: dict) -> ActionTokenizer:
    return ActionTokenizer("qc", tuple(ActionField(**f) for f in lay["actions"]))


def training_data(inputs: Inputs, lay: dict, model, from_scratch: bool) -> tuple[dict, dict]:
    """(train, val) arrays: prefix [N, P], actions [N, A] (data.action_targets); val: the usable
    validation images, whose class token is what `fit` checks each epoch."""
    from .data import action_targets, known_tokens

    acts = action_tokenizer(lay)
    prefix = inputs.prefixes(inputs.train)
    train = {"prefix": prefix, "actions": action_targets(inputs.labels(inputs.train), prefix, acts,
                                                         None if from_scratch else model)}
    val = {"prefix": inputs.prefixes(inputs.val), "actions": known_tokens(inputs.labels(inputs.val), acts, True)}
    return train, val


def refresh_heads(cfg: TrainConfig, model, heads, train: dict, val: tuple, k: int, action: tuple[int, int],
                  log: Log) -> tuple[dict, dict]:
    """(w1, w2 arrays, a record): the heads trained again on the finished target's own greedy
    answers to the training images (Medusa style, heads.fit_frozen; QC's shipped recipe), or
    (--heads-steps 0) the ones trained with it. `val`: (prefix, the target's answers)."""
    from .heads import fit_frozen
    from .model import greedy_batch

    if cfg.heads_steps == 0:
        return heads.arrays(), {"how": "trained with the target", "heads": k}
    train_pair = (train["prefix"], greedy_batch(model, train["prefix"], train["actions"].shape[1]))
    log(f"{k} draft heads on the finished target ({cfg.heads_steps} steps)")
    arrays, info = fit_frozen(model, train_pair, val, k, action, cfg.heads_steps, log=lambda m: None)
    info["how"] = f"trained on the finished target's answers ({cfg.heads_steps} steps)"
    info["test_accuracy_is"] = "on the validation images"
    return arrays, info


def train_target(cfg: TrainConfig, start: Bundle, log: Log) -> Trained:
    """Read the folder, train the target and its heads (resuming from the work dir's checkpoint).
    The folder is read and checked before torch is imported, so bad input is named at once."""
    inputs, lay = read_inputs(cfg, start, log)
    timing = {"read_s": round(log.elapsed(), 1)}
    work = prepare_work(cfg, fingerprint(cfg, inputs, start), log)
    model, heads, k = starting_model(cfg, start, lay, work)
    train, val = training_data(inputs, lay, model, cfg.from_scratch)
    log(f"training {'from scratch' if cfg.from_scratch else 'from ' + str(start.root)}: {cfg.recipe['epochs']} "
        f"epochs of {len(train['prefix'])} images, lr {cfg.recipe['lr']}")
    records = {"training": fit(cfg, model, heads, train, val, lay["vocab"]["action"][0], work, log)}
    timing["train_s"] = records["training"]["train_s"]
    t0 = time.monotonic()
    from .model import greedy_batch

    answers = greedy_batch(model, val["prefix"], val["actions"].shape[1])
    arrays, records["heads"] = refresh_heads(cfg, model, heads, train, (val["prefix"], answers), k,
                                             tuple(lay["vocab"]["action"]), log)
    timing["heads_s"] = round(time.monotonic() - t0, 1)
    return Trained(inputs, lay, model, arrays, k, records, timing, answers)


def recorded_frames(cfg: TrainConfig, log: Log) -> TrainConfig:
    """--mcap: the recording's labelled frames as a folder in the work dir, written again only when
    the recording, the labels or the topic changed (so a stopped run still goes on from its checkpoint)."""
    from .mcap import frames_to_folder

    if not cfg.mcap.is_dir():
        raise ValueError(f"--mcap {cfg.mcap}: not a rosbag2 folder")
    if not cfg.labels.is_file():
        raise ValueError(f"--labels {cfg.labels}: no such file")
    frames, h = cfg.work_dir / "frames", hashlib.sha256(cfg.labels.read_bytes())
    for p in sorted(cfg.mcap.rglob("*")):
        st = p.stat()
        h.update(f"{p.relative_to(cfg.mcap)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    h.update(cfg.topic.encode())
    mark = frames / ".source"
    if not (mark.is_file() and mark.read_text() == h.hexdigest()):
        shutil.rmtree(frames, ignore_errors=True)
        counts = frames_to_folder(cfg.mcap, cfg.labels, frames, cfg.topic)
        log(f"{cfg.mcap}: {counts['labelled']} labelled frames of {counts['frames']} on {cfg.topic} -> {frames}")
        mark.write_text(h.hexdigest())
    return cfg.model_copy(update={"folder": frames})


def train_bundle(cfg: TrainConfig) -> dict:
    """The whole run; the bundle appears at cfg.out only when everything in it is written and
    checked. Returns the report (report["verdict"] is "ok" unless a quantized graph was refused)."""
    from .report import write_report
    from .write import finish, partial_dir, summary, write_bundle

    log = Log()
    start = Bundle.load(cfg.bundle or shipped_bundle("qc"))
    if cfg.mcap is not None:
        cfg = recorded_frames(cfg, log)
    trained = train_target(cfg, start, log)
    tmp = partial_dir(cfg.out)
    try:
        report = write_bundle(cfg, trained, tmp, log)
        report["timing"]["total_s"] = round(log.elapsed(), 1)
        write_report(report, tmp)
        finish(tmp, cfg.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for line in summary(report):
        log(line)
    return report
