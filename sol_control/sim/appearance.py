"""What parts and objects look like: the task families of `sol_control.tasks`, seen by the sim.

The task modules own the families, so the training generator and the simulator draw the same
parts: QC parts carry the generator's own top texture (`tasks.qc.render_part`), pick scenes come
from `tasks.grasp.sample_scene` and are built as real geometry in `scene.build_pick_mjcf`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from sol_control.tasks import grasp as grasp_task
from sol_control.tasks import qc as qc_task
from sol_control.tasks.common import QC_DEFECTS, QC_PART_FAMILIES


@dataclass(frozen=True)
class QCPart:
    spec: qc_task.PartSpec
    rgba: np.ndarray            # [N, N, 4] uint8 top texture, alpha = footprint (holes transparent)
    size_m: float               # side of the square texture, metres
    yaw_rad: float

    @property
    def defect(self) -> str:
        return self.spec.defect

    @property
    def defective(self) -> bool:
        return self.spec.defect != "ok"


def sample_qc_part(rng: np.random.Generator, defect_rate: float,
                   families: tuple[str, ...] = QC_PART_FAMILIES) -> QCPart:
    """A training-distribution part of one of `families` whose defect is drawn at the line's `defect_rate`."""
    spec = qc_task.sample_spec(rng, heldout=False, families=families)
    if rng.random() >= defect_rate:
        spec = dataclasses.replace(spec, defect="ok", severity=0.0)
    else:
        defect = QC_DEFECTS[1 + int(rng.integers(len(QC_DEFECTS) - 1))]
        spec = dataclasses.replace(spec, defect=defect, severity=float(rng.uniform(0.0, 1.0)))
    rgba, side_m = qc_task.render_part(spec)
    return QCPart(spec=spec, rgba=rgba, size_m=float(side_m), yaw_rad=float(rng.uniform(0, 2 * math.pi)))


def sample_pick_scene(rng: np.random.Generator) -> grasp_task.GraspScene:
    """1-4 objects on the table (training distribution); the teacher's target is the largest."""
    return grasp_task.sample_scene(rng, heldout=False)


def teacher_label(scene: grasp_task.GraspScene) -> tuple[int, dict]:
    """The generator's analytic grasp for a scene: (target index, label dict in SI units)."""
    return grasp_task.teacher(scene)
