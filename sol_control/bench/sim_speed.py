"""Simulator speed: render fps per camera and physics steps per second (MuJoCo, `sol_control.sim`).

    python -m sol_control.bench.sim_speed > speed.json
"""
from __future__ import annotations

import json
import os
import time

from .common import pct


def measure(repeats: int = 5, renders: int = 200, steps: int = 5000) -> dict:
    from ..sim.cell import Cell
    from ..sim.config import CellConfig

    cell = Cell(CellConfig(seed=1))
    cell.step_for(3.0)  # parts on the belt, a scene on the table
    out = {"mujoco_gl": os.environ.get("MUJOCO_GL", "")}
    for name, fn in (("qc_128px_fps", cell.render_qc), ("pick_192px_fps", cell.render_pick)):
        for _ in range(20):
            fn()
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(renders):
                fn()
            rates.append(renders / (time.perf_counter() - t0))
        out[name] = pct(rates, 50)
    t0 = time.perf_counter()
    for _ in range(steps):
        cell.step()
    out["steps_per_s"] = steps / (time.perf_counter() - t0)
    out["realtime_factor"] = out["steps_per_s"] * cell.cfg.timestep_s
    cell.close()
    return out


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
