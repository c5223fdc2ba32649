"""What one `sol-control train` run hands from stage to stage: its log, its inputs, the trained target."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from sol_control.tasks import labelled_folder as F


class Log:
    """Stage lines with the run's elapsed time."""

    def __init__(self):
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, msg: str) -> None:
        print(f"[train {self.elapsed():6.0f} s] {msg}", flush=True)


@dataclass
class Inputs:
    """The folder through perception, and the split (indices into `enc`)."""

    folder: F.LabelledFolder
    enc: F.Encoded
    train: np.ndarray  # images perception found a part in
    val: np.ndarray  # all the validation images (a missing part counts as a wrong answer)

    def prefixes(self, idx: np.ndarray) -> np.ndarray:
        rows = [self.enc.prefixes[i] for i in idx if self.enc.prefixes[i] is not None]
        if not rows:
            raise ValueError(f"folder {self.folder.root}: perception finds no part in any image of this split")
        return np.stack(rows)

    def labels(self, idx: np.ndarray, usable_only: bool = True) -> list[dict]:
        return [self.enc.labels[i] for i in idx if self.enc.prefixes[i] is not None or not usable_only]


@dataclass
class Trained:
    """What training hands to the bundle writer."""

    inputs: Inputs
    lay: dict
    model: object  # transformers LlamaForCausalLM
    heads: dict  # w1, w2 arrays
    k: int
    records: dict  # training, heads
    timing: dict
    val_answers: np.ndarray  # [N, A] the trained target's greedy answers to the usable validation images
