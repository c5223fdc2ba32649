"""Per-run Gazebo models: one folder per QC part and per pick object (model.config, model.sdf and
their mesh / texture files), found by `gz sim` as model://<name> through GZ_SIM_RESOURCE_PATH.

- QC part `qc_part_NNNN`: a thin plate (collision = the part's square, sim/scene.qc_part) whose top
  is a textured quad carrying the generator's own top texture over the belt colour, exactly the
  texture MuJoCo uploads (sim/conveyor.part_texture), on the same padded square.
- pick object `pick_sSSS_objI`: the description's body (sim/scene.pick_object); an irregular
  object's visual is its extruded footprint, its collision the convex hull of it (what MuJoCo
  collides).
Meshes are Wavefront OBJ with vertices at 1 µm (as in the MJCF); texture coordinates follow OBJ
(v = 0 at the image's bottom row), so texture row 0 lands on the part's +y edge as in MuJoCo.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np

from sol_control.sim import scene, sdf
from sol_control.sim.appearance import QCPart
from sol_control.sim.conveyor import TEXTURE_PAD, part_texture
from sol_control.sim.description import Body, Mesh, PickObject
from sol_control.sim.sdf import element, pose

TOP_LIFT_M = 0.0001          # the textured quad floats this far above the plate (no z-fighting)


def padded_half_m(size_m: float) -> float:
    """Half side of the textured square: the part plus TEXTURE_PAD of belt colour (sim/conveyor)."""
    inner_px = 2 * int(round(scene.PART_TEXTURE_PX / (1 + 2 * TEXTURE_PAD) / 2))
    return size_m / 2 * scene.PART_TEXTURE_PX / inner_px


def write_obj(path: Path, mesh: Mesh) -> None:
    lines = [f"# {mesh.name}: written by sol_control.sim.sdf_models (metres)"]
    lines += [f"v {x:.6f} {y:.6f} {z:.6f}" for x, y, z in mesh.vertices_m]
    lines += [f"f {a + 1} {b + 1} {c + 1}" for a, b, c in mesh.faces]
    path.write_text("\n".join(lines) + "\n")


def _textured_quad(folder: Path, half_m: float, z_m: float, rgb: np.ndarray) -> None:
    """top.obj + top.mtl + top.png: a square of half side half_m at height z_m, facing +z."""
    cv2.imwrite(str(folder / "top.png"), np.ascontiguousarray(rgb[..., ::-1]))        # [P, P, 3] RGB → BGR file
    folder.joinpath("top.mtl").write_text("newmtl part_top\nKa 1 1 1\nKd 1 1 1\nKs 0 0 0\nmap_Kd top.png\n")
    h = half_m
    folder.joinpath("top.obj").write_text(
        "# textured top of a QC part (metres); texture row 0 = +y edge\nmtllib top.mtl\n"
        f"v {-h:.6f} {-h:.6f} {z_m:.6f}\nv {h:.6f} {-h:.6f} {z_m:.6f}\n"
        f"v {h:.6f} {h:.6f} {z_m:.6f}\nv {-h:.6f} {h:.6f} {z_m:.6f}\n"
        "vt 0 0\nvt 1 0\nvt 1 1\nvt 0 1\nvn 0 0 1\nusemtl part_top\nf 1/1/1 2/2/1 3/3/1 4/4/1\n")


def _model_config(folder: Path, name: str, what: str) -> None:
    folder.joinpath("model.config").write_text(
        f'<?xml version="1.0"?>\n<model>\n  <name>{name}</name>\n  <version>1.0</version>\n'
        f'  <sdf version="{sdf.SDF_VERSION}">model.sdf</sdf>\n  <description>{what}</description>\n</model>\n')


def _model_root(name: str) -> tuple[ET.Element, ET.Element]:
    root = ET.Element("sdf", version=sdf.SDF_VERSION)
    model = element(root, "model", name=name)
    pose(model)
    return root, model


def write_part_model(models_dir: Path, name: str, part: QCPart) -> Path:
    """models_dir/name/: a QC part at its model origin (the include or spawn pose places it)."""
    folder = models_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    root, model = _model_root(name)
    body = scene.qc_part("part", part.size_m)
    ln = sdf.link(model, Body("part", geoms=body.geoms))
    vis = element(ln, "visual", name="top_visual")
    pose(vis)
    element(element(element(vis, "geometry"), "mesh"), "uri", f"model://{name}/top.obj")
    sdf.material(vis, (1.0, 1.0, 1.0, 1.0), albedo_map=f"model://{name}/top.png")
    _textured_quad(folder, padded_half_m(part.size_m), scene.PART_HALF_HEIGHT_M + TOP_LIFT_M,
                   part_texture(part, scene.BELT_RGB))
    folder.joinpath("model.sdf").write_text(sdf.to_xml(root, f"QC part {name}: {part.spec.family}, defect "
                                                             f"{part.defect}; written by sol_control.sim.sdf_models"))
    _model_config(folder, name, f"sol_control QC part ({part.spec.family}, {part.defect})")
    return folder


def convex_hull_2d(points: np.ndarray) -> np.ndarray:
    """[H, 2] counter-clockwise hull of points [N, 2] (Andrew's monotone chain)."""
    pts = sorted(map(tuple, np.asarray(points, float)))

    def turn(o, a, b) -> float:                       # > 0: o → a → b turns left
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def half(seq):
        out: list = []
        for p in seq:
            while len(out) >= 2 and turn(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out[:-1]
    return np.array(half(pts) + half(pts[::-1]))


def write_object_model(models_dir: Path, name: str, ob: PickObject, footprint_m: np.ndarray, height_m: float) -> Path:
    """models_dir/name/: a pick object at its model origin; meshes as OBJ files beside model.sdf."""
    folder = models_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    meshes = {m.name: m for m in ob.meshes}
    hulls = {}
    for m in ob.meshes:
        write_obj(folder / f"{m.name}.obj", m)
    main = next((g.mesh for g in ob.body.geoms if g.kind == "mesh" and g.collides != "none"), None)
    if main is not None:
        hull = convex_hull_2d(footprint_m)           # contains the footprint's centroid, the fan's centre
        write_obj(folder / f"{main}_hull.obj", scene.prism_mesh(f"{main}_hull", hull, height_m))
        hulls[main] = f"model://{name}/{main}_hull.obj"
    root, model = _model_root(name)
    sdf.link(model, Body("object", geoms=ob.body.geoms), meshes=meshes,
             mesh_uri=lambda mesh: f"model://{name}/{mesh}.obj", hull_uri=lambda mesh: hulls[mesh])
    folder.joinpath("model.sdf").write_text(sdf.to_xml(root, f"pick object {name}; written by "
                                                             "sol_control.sim.sdf_models"))
    _model_config(folder, name, "sol_control pick object")
    return folder
