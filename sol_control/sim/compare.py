"""Sim renders next to the training generator's images of the same parts and scenes.

    python -m sol_control.sim.compare OUT_DIR [--seed N] [--n 4]

writes sim_vs_generator_qc.png and sim_vs_generator_pick.png (rows: sim | generator | 4x |diff|)
and prints the mean absolute pixel difference per image. The generator is rendered with neutral
lighting (its training images add random gain, tint, blur and noise on top).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from sol_control.sim.cell import Cell
from sol_control.sim.config import CellConfig
from sol_control.tasks import grasp as grasp_task
from sol_control.tasks import qc as qc_task


def pairs(seed: int, n: int) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """{"qc": [(sim, generator), ...], "pick": [...]}, n of each."""
    cell = Cell(CellConfig(seed=seed, pick={"max_holds": 1}))     # a hold moves on to the next scene
    out: dict[str, list] = {"qc": [], "pick": []}
    while len(out["qc"]) < n or len(out["pick"]) < n:
        for e in cell.step_until_event(10.0):
            if e["type"] == "qc_trigger":
                bp = next(b for b in cell.conveyor.parts if b.part_id == e["part_id"])
                if len(out["qc"]) < n:
                    gen, _ = qc_task.compose(bp.part.spec, (bp.x_m, bp.y_m), bp.part.yaw_rad, qc_task.Lighting(),
                                             np.random.default_rng(0))
                    out["qc"].append((cell.render_qc(), gen))
                cell.apply_qc_verdict("pass", cell.eject_time_s(e["t_s"]))
            elif e["type"] == "pick_trigger":
                if len(out["pick"]) < n:
                    scene = dataclasses.replace(cell.pick.scene, light=qc_task.Lighting())
                    out["pick"].append((cell.render_pick(), grasp_task.render(scene, np.random.default_rng(0))))
                cell.apply_grasp_hold()
    cell.close()
    return out


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def sheet(rows: list[tuple[np.ndarray, np.ndarray]], scale: int) -> np.ndarray:
    import cv2

    lines = []
    for sim, gen in rows:
        diff = np.clip(np.abs(sim.astype(np.int16) - gen.astype(np.int16)) * 4, 0, 255).astype(np.uint8)
        lines.append(np.hstack([sim, gen, diff]))
    img = np.vstack(lines)
    return cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST)


def main(argv: list[str] | None = None) -> int:
    import cv2

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--n", type=int, default=4)
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for cam, rows in pairs(args.seed, args.n).items():
        path = out / f"sim_vs_generator_{cam}.png"
        cv2.imwrite(str(path), sheet(rows, 3 if cam == "qc" else 2)[..., ::-1])
        print(f"{path}: mean |sim - generator| per image:", [round(mean_abs_diff(s, g), 2) for s, g in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
