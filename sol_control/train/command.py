"""`sol-control train`: the command line and its typed configuration (imports no torch; the run does).

    sol-control train --folder DIR --out BUNDLE [--bundle models/qc | --from-scratch] [--epochs N]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

FINETUNE = {"epochs": 20, "lr": 1e-3}  # from the shipped target
SCRATCH = {"epochs": 30, "lr": 3e-3}  # a new target (the shipped recipe's lr); 60 overfit 800 images
HEADS_STEPS = 600  # draft heads on the finished (frozen) target


class TrainConfig(BaseModel):
    """Everything one run reads. Invalid values raise ValueError naming the field and the value."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    folder: Path
    out: Path
    bundle: Path | None = None  # the starting (or, --from-scratch, template) bundle; None = the shipped QC one
    positions: Path | None = None  # None: FOLDER/positions.csv when it exists
    from_scratch: bool = False
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    epochs: int | None = Field(None, ge=1, le=10000)  # None: FINETUNE or SCRATCH
    lr: float | None = Field(None, gt=0.0, le=0.1)
    batch: int = Field(64, ge=1, le=4096)
    val_fraction: float = Field(0.2, gt=0.0, le=0.5)
    seed: int = Field(0, ge=0)
    heads_weight: float = Field(0.5, ge=0.0, le=10.0)
    heads_steps: int = Field(HEADS_STEPS, ge=0, le=100000)
    decisions: int = Field(20, ge=1, le=10000)
    work: Path | None = None  # None: OUT.work next to the bundle
    overwrite: bool = False

    @model_validator(mode="after")
    def _out(self) -> "TrainConfig":
        if self.out.exists() and not self.overwrite:
            raise ValueError(f"out: {self.out} exists; pick another folder or pass --overwrite")
        if self.out.resolve() == self.folder.resolve() or self.folder.resolve() in self.out.resolve().parents:
            raise ValueError(f"out: {self.out} must not lie inside the image folder {self.folder}")
        return self

    @property
    def recipe(self) -> dict:
        base = SCRATCH if self.from_scratch else FINETUNE
        return {"epochs": self.epochs or base["epochs"], "lr": self.lr or base["lr"]}

    @property
    def work_dir(self) -> Path:
        return self.work or self.out.with_name(self.out.name + ".work")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--folder", required=True, type=Path,
                   help="labelled images: good/, defect/<kind>/, optional positions.csv (docs/TRAINING.md)")
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
    fields = set(TrainConfig.model_fields)
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})


def run(args: argparse.Namespace) -> int:
    cfg = config_from(args)
    try:
        from .pipeline import train_bundle
    except ModuleNotFoundError as e:
        raise ValueError(f"sol-control train needs the training extra ({e.name} is missing): "
                         f"make venv-train, or pip install -e '.[train]'") from None
    report = train_bundle(cfg)
    return 0 if report["verdict"] == "ok" else 1
