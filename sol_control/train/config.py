"""`sol-control train`'s typed configuration and its recipes (imports no torch)."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

FINETUNE = {"epochs": 20, "lr": 1e-3}  # from the shipped target
SCRATCH = {"epochs": 30, "lr": 3e-3}  # a new target (the shipped recipe's lr); 60 overfit 800 images
HEADS_STEPS = 600  # draft heads on the finished (frozen) target


class TrainConfig(BaseModel):
    """Everything one run reads. Invalid values raise ValueError naming the field and the value."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    folder: Path | None = None  # labelled images; or, from a recording: mcap + labels
    out: Path
    mcap: Path | None = None  # a rosbag2 folder whose QC camera frames are labelled by `labels`
    labels: Path | None = None  # CSV stamp_ns,label[,u,v]
    topic: str = "qc/camera/image_raw"
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
        if (self.folder is None) == (self.mcap is None):
            raise ValueError("give the images as --folder DIR, or as --mcap BAG --labels CSV (one of the two)")
        if (self.mcap is None) != (self.labels is None):
            raise ValueError("--mcap BAG needs --labels CSV (stamp_ns,label[,u,v]), and --labels needs --mcap")
        if self.out.exists() and not self.overwrite:
            raise ValueError(f"out: {self.out} exists; pick another folder or pass --overwrite")
        if self.folder is None:
            return self
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
