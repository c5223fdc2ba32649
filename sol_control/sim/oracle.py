"""An analytic controller that reads the cell's ground truth: the upper bound the models aim at.

Used to test the cell without models (clearly labelled: it is not the coprocessor) and as the demo's
`--oracle` baseline. Same decision types as the coprocessor: QC verdict + eject time, grasp pose +
width + force + approach waypoints (the generator's teacher label for the scene).
"""
from __future__ import annotations

from sol_control.sim.cell import Cell
from sol_control.sim.pick import GraspCommand


def qc_decision(cell: Cell, part_id: int, stamp_s: float) -> tuple[str, float]:
    """(verdict, eject_time_s) for the part that triggered the camera at stamp_s."""
    part = next(bp.part for bp in cell.conveyor.parts if bp.part_id == part_id)
    return ("reject" if part.defective else "pass"), cell.eject_time_s(stamp_s)


def grasp_decision(cell: Cell) -> GraspCommand:
    label = cell.pick.label
    approach = tuple((label[f"a{k}_x"], label[f"a{k}_y"], label[f"a{k}_z"]) for k in (1, 2, 3))
    return GraspCommand(label["x"], label["y"], label["z"], label["yaw"], label["width"], label["force"],
                        approach, {"source": "oracle"})


def run(cell: Cell, duration_s: float, on_image=None) -> None:
    """Lock-step loop: every trigger renders its image (passed to on_image) and is decided at once."""
    while cell.time_s < duration_s:
        for e in cell.step_until_event(duration_s - cell.time_s):
            if e["type"] == "qc_trigger":
                img = cell.render_qc() if cell.render_enabled else None
                if on_image is not None:
                    on_image("qc", e, img)
                verdict, eject_s = qc_decision(cell, e["part_id"], e["t_s"])
                cell.apply_qc_verdict(verdict, eject_s, e["t_s"], {"source": "oracle"})
            elif e["type"] == "pick_trigger":
                img = cell.render_pick() if cell.render_enabled else None
                if on_image is not None:
                    on_image("pick", e, img)
                cell.apply_grasp(grasp_decision(cell))
