"""Write a Gazebo run of the cell: the world and the parts and scenes the MuJoCo cell would draw.

    python -m sol_control.sim.gazebo_world --out gz_run --seed 1 [--duration 60] [--scenes 20]
    GZ_SIM_RESOURCE_PATH=gz_run/models gz sim gz_run/world.sdf

gz_run/world.sdf         the cell (sim/sdf_cell.py), including the first QC part and pick scene
gz_run/models/<name>/    one model per QC part and pick object (sim/sdf_models.py)
gz_run/spawn_plan.json   the rest, in order: when to spawn each part (and its truth), each scene's
                         objects, with a ready `gz service .../create` request per model

Same seed and conveyor settings ⇒ the same parts at the same sim times and the same pick scenes as
`Cell(CellConfig(seed=...))` (tests/test_gazebo_world.py compares them).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from sol_control.sim import scene, sdf_cell, sdf_models
from sol_control.sim.appearance import QCPart, sample_pick_scene, sample_qc_part, teacher_label
from sol_control.sim.config import ConveyorConfig
from sol_control.sim.conveyor import END_X_M, SPAWN_X_M
from sol_control.sim.description import CellLayout
from sol_control.sim.sdf_cell import Include


def qc_schedule(seed: int, cfg: ConveyorConfig, duration_s: float,
                timestep_s: float = 0.002) -> list[tuple[float, QCPart]]:
    """(spawn time s, part) for every part spawned before duration_s, drawn as sim/conveyor.py draws
    them (same generator stream, same spawn test on the step grid; the slot limit counts parts as
    leaving at the belt's end, which only matters when PART_SLOTS parts are on the belt at once)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])
    life_s = (END_X_M - SPAWN_X_M) / cfg.belt_speed_mps       # unpushed parts leave at the belt's end
    out: list[tuple[float, QCPart]] = []
    next_spawn_s, n = 0.0, 0
    while True:
        n = max(n, math.floor(next_spawn_s / timestep_s) - 1)
        while n * timestep_s < next_spawn_s or sum(t + life_s > n * timestep_s for t, _ in out) >= scene.PART_SLOTS:
            n += 1
        t = n * timestep_s
        if t >= duration_s:
            return out
        out.append((t, sample_qc_part(rng, cfg.defect_rate, cfg.families)))
        gap = cfg.part_pitch_m + rng.uniform(-cfg.pitch_jitter_m, cfg.pitch_jitter_m)
        next_spawn_s = t + gap / cfg.belt_speed_mps


def pick_scenes(seed: int, n_scenes: int) -> list:
    """The first n_scenes scenes the pick station lays out (tasks.grasp.GraspScene)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
    return [sample_pick_scene(rng) for _ in range(n_scenes)]


def _quat_yaw(yaw_rad: float) -> tuple[float, float, float, float]:
    return (math.cos(yaw_rad / 2), 0.0, 0.0, math.sin(yaw_rad / 2))


def _create_request(world: str, name: str, pos, quat) -> str:
    """The `gz service -s /world/<world>/create` call that spawns model://<name> at a world pose."""
    w, x, y, z = quat
    req = (f'sdf_filename: "model://{name}" name: "{name}" pose: {{position: {{x: {pos[0]:.6f} y: {pos[1]:.6f} '
           f'z: {pos[2]:.6f}}} orientation: {{x: {x:.9f} y: {y:.9f} z: {z:.9f} w: {w:.9f}}}}}')
    return (f"gz service -s /world/{world}/create --reqtype gz.msgs.EntityFactory --reptype gz.msgs.Boolean "
            f"--timeout 2000 --req '{req}'")


def _parts(cell: CellLayout, models: Path, schedule) -> list[dict]:
    out = []
    for k, (t_s, part) in enumerate(schedule):
        name = f"qc_part_{k:04d}"
        sdf_models.write_part_model(models, name, part)
        pos, quat = (SPAWN_X_M, 0.0, scene.PART_HALF_HEIGHT_M), _quat_yaw(part.yaw_rad)
        out.append({"model": name, "spawn_t_s": round(t_s, 6), "pos_world_m": pos, "quat_wxyz": quat,
                    "family": part.spec.family, "defect": part.defect, "severity": round(part.spec.severity, 4),
                    "size_m": part.size_m, "create": _create_request(cell.world_name, name, pos, quat)})
    return out


def _scenes(cell: CellLayout, models: Path, scenes) -> list[dict]:
    out = []
    for s, sc in enumerate(scenes):
        target, label = teacher_label(sc)
        objects = []
        for i, ob in enumerate(sc.objects):
            name = f"pick_s{s:03d}_obj{i}"
            po = scene.pick_object(i, ob)
            sdf_models.write_object_model(models, name, po, np.asarray(ob.footprint_m, float), ob.height_m)
            pos, quat = po.body.pos, tuple(float(q) for q in po.body.quat)
            objects.append({"model": name, "shape": ob.shape, "pos_pick_table_m": [float(p) for p in pos],
                            "quat_wxyz": quat, "create": _create_request(
                                cell.world_name, name, sdf_cell.pose_in_world(cell, pos), quat)})
        out.append({"scene_id": s, "objects": objects, "target_index": target,
                    "teacher": {k: round(float(v), 5) for k, v in label.items() if len(k) <= 5}})
    return out


def write_run(out: Path, seed: int, duration_s: float = 60.0, n_scenes: int | None = None,
              conveyor: ConveyorConfig | None = None, timestep_s: float = 0.002) -> dict:
    """world.sdf, models/ and spawn_plan.json under `out`; returns the plan."""
    cfg = conveyor or ConveyorConfig()
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    n_scenes = max(1, math.ceil(duration_s / 3.5)) if n_scenes is None else n_scenes
    if n_scenes < 1:
        raise ValueError(f"n_scenes must be at least 1, got {n_scenes}")
    cell = scene.cell(cfg.camera_to_ejector_m, cfg.belt_speed_mps, cfg.pusher_stroke_s, timestep_s=timestep_s)
    models = Path(out) / "models"
    parts = _parts(cell, models, qc_schedule(seed, cfg, duration_s, timestep_s))
    scenes = _scenes(cell, models, pick_scenes(seed, n_scenes))
    first = [Include(parts[0]["model"], parts[0]["pos_world_m"], parts[0]["quat_wxyz"])]
    first += [Include(o["model"], o["pos_pick_table_m"], o["quat_wxyz"], "pick_table") for o in scenes[0]["objects"]]
    Path(out, "world.sdf").write_text(sdf_cell.world_xml(cell, tuple(first)))
    plan = {"world": cell.world_name, "sdf_version": "1.9", "seed": seed, "duration_s": duration_s,
            "conveyor": cfg.model_dump(), "spawn_x_m": SPAWN_X_M, "remove_at_x_m": END_X_M,
            "pick_table_in_world_m": list(cell.pick_table_in_world_m),
            "in_world_file": [i.name for i in first], "qc_parts": parts, "pick_scenes": scenes}
    Path(out, "spawn_plan.json").write_text(json.dumps(plan, indent=1))
    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for world.sdf, models/ and spawn_plan.json")
    ap.add_argument("--seed", type=int, default=1, help="cell seed (the MuJoCo cell's --seed)")
    ap.add_argument("--duration", type=float, default=60.0, help="sim seconds of QC parts to write")
    ap.add_argument("--scenes", type=int, default=None, help="pick scenes to write (default: duration / 3.5 s)")
    ap.add_argument("--belt-speed", type=float, default=ConveyorConfig().belt_speed_mps)
    ap.add_argument("--camera-to-ejector", type=float, default=ConveyorConfig().camera_to_ejector_m)
    args = ap.parse_args(argv)
    cfg = ConveyorConfig(belt_speed_mps=args.belt_speed, camera_to_ejector_m=args.camera_to_ejector)
    t0 = time.perf_counter()
    plan = write_run(args.out, args.seed, args.duration, args.scenes, cfg)
    n_obj = sum(len(s["objects"]) for s in plan["pick_scenes"])
    print(f"wrote {args.out}/world.sdf, {len(plan['qc_parts'])} QC parts and {len(plan['pick_scenes'])} pick scenes "
          f"({n_obj} objects) in {time.perf_counter() - t0:.2f} s; run: GZ_SIM_RESOURCE_PATH={args.out}/models "
          f"gz sim {args.out}/world.sdf")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
