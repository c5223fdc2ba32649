"""`sol-control train`: the command line and its typed configuration (imports no torch; the run does).

    sol-control train --folder DIR --out BUNDLE [--bundle models/qc | --from-scratch] [--epochs N]
    sol-control train --mcap BAG --labels CSV --out BUNDLE ...   (frames of a recorded line, by stamp)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from .config import FINETUNE, HEADS_STEPS, SCRATCH, TrainConfig

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--folder", type=Path, default=None,
                   help="labelled images: good/, defect/<kind>/, optional positions.csv (docs/TRAINING.md)")
    p.add_argument("--mcap", type=Path, default=None,
                   help="or a recording (rosbag2 folder, MCAP or sqlite3) whose QC camera frames --labels labels")
    p.add_argument("--labels", type=Path, default=None, help="with --mcap: CSV stamp_ns,label[,u,v]")
    p.add_argument("--topic", default="qc/camera/image_raw", help="with --mcap: the QC camera's image topic")
    p.add_argument("--out", required=True, type=Path, help="the bundle folder to write")
    p.add_argument("--bundle", type=Path, default=None,
                   help="start from this QC bundle's fp32 target (default: the shipped models/qc)")
    p.add_argument("--from-scratch", action="store_true",
                   help="a new target whose classes are the folder's (good + defect/<kind>)")
    p.add_argument("--positions", type=Path, default=None, help="CSV file,u,v (default FOLDER/positions.csv)")
    p.add_argument("--name", default=None, help="the bundle's name in its manifest")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"default {FINETUNE['epochs']} (fine-tune) or {SCRATCH['epochs']} (--from-scratch)")
    p.add_argument("--lr", type=float, default=None,
                   help=f"peak learning rate; default {FINETUNE['lr']} (fine-tune) or {SCRATCH['lr']}")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--val-fraction", type=float, default=0.2, help="validation share of each class")
    p.add_argument("--seed", type=int, default=0, help="the validation split's seed")
    p.add_argument("--heads-steps", type=int, default=HEADS_STEPS,
                   help="draft heads trained on the finished target (0: keep the ones trained with it)")
    p.add_argument("--decisions", type=int, default=20, help="timed decisions for the decision time")
    p.add_argument("--work", type=Path, default=None, help="checkpoints and caches (default OUT.work)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT when it exists")


def config_from(args: argparse.Namespace) -> TrainConfig:
    """The typed configuration; ValueError with pydantic's messages alone (field: what is wrong)."""
    fields = set(TrainConfig.model_fields)
    try:
        return TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    except ValidationError as e:
        raise ValueError("; ".join((f"{'.'.join(map(str, err['loc']))}: " if err["loc"] else "")
                                   + err["msg"].removeprefix("Value error, ") for err in e.errors())) from None


def run(args: argparse.Namespace) -> int:
    cfg = config_from(args)
    try:
        from .pipeline import train_bundle
    except ModuleNotFoundError as e:
        raise ValueError(f"sol-control train needs the training extra ({e.name} is missing): "
                         f"make venv-train, or pip install -e '.[train]'") from None
    report = train_bundle(cfg)
    return 0 if report["verdict"] == "ok" else 1
