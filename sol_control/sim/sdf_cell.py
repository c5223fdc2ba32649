"""The Gazebo world of the cell (SDFormat 1.9), written from the description: world settings and
systems, the QC line (`conveyor`, `reject_bin`, `qc_camera`), the pick station (`table`, `arm`,
`pick_camera`, posed relative to the world frame `pick_table`) and <include>s of the per-run models.
Element conventions and the MuJoCo → Gazebo mapping: sim/sdf.py.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np

from sol_control.sim import sdf
from sol_control.sim.description import Body, CellLayout, Geom, Lighting, PickStation, QCLine
from sol_control.sim.sdf import element, plugin, pose

BACKGROUND_RGBA = (0.85, 0.85, 0.85, 1.0)


@dataclass(frozen=True)
class Include:
    """A per-run model the world includes (model://<name>, found through GZ_SIM_RESOURCE_PATH)."""
    name: str
    pos_m: tuple[float, float, float]
    quat: tuple[float, float, float, float] | None = None     # (w, x, y, z)
    relative_to: str | None = None


def _world_settings(w: ET.Element, cell: CellLayout) -> None:
    physics = element(w, "physics", name="cell_step", type="ignored")
    element(physics, "max_step_size", cell.qc.physics.timestep_s)
    element(physics, "real_time_factor", 1.0)
    plugin(w, sdf.PHYSICS)
    plugin(w, sdf.USER_COMMANDS)
    plugin(w, sdf.SCENE_BROADCASTER)
    plugin(w, sdf.SENSORS, render_engine="ogre2")
    element(w, "gravity", "0 0 -9.81")
    _lights(w, cell.qc.lighting)
    pose(element(w, "frame", name="pick_table"), cell.pick_table_in_world_m)


def _lights(w: ET.Element, light: Lighting) -> None:
    """MuJoCo's headlight: ambient light only (no diffuse, no shadows)."""
    scene = element(w, "scene")
    element(scene, "ambient", (*light.ambient, 1.0))
    element(scene, "background", BACKGROUND_RGBA)
    element(scene, "shadows", "false")
    element(scene, "grid", "false")
    sun = element(w, "light", name="headlight", type="directional")
    element(sun, "cast_shadows", "false")
    element(sun, "diffuse", (*light.diffuse, 1.0))
    element(sun, "specular", (*light.specular, 1.0))
    element(sun, "direction", "0 0 -1")


def _static_model(w: ET.Element, name: str, geom: Geom, colors: dict, relative_to: str | None = None) -> None:
    """A static one-link model whose link sits at the geom's position."""
    m = element(w, "model", name=name)
    element(m, "static", "true")
    pose(m, (0.0, 0.0, 0.0), None, relative_to)
    body = Body(name, pos=geom.pos, geoms=(Geom(geom.kind, size=geom.size, name=geom.name, rgba=geom.rgba,
                                                 material=geom.material, contact=geom.contact),))
    sdf.link(m, body, colors=colors)


def conveyor_model(w: ET.Element, line: QCLine) -> None:
    """Links `frame` (the belt body, fixed; TrackController moves its contact surface),
    `belt_encoder` (on prismatic joint `belt`, driven at the belt speed: the belt's position and
    velocity) and `paddle` (on prismatic joint `pusher`)."""
    m = element(w, "model", name="conveyor")
    pose(m)
    belt = line.belt
    frame = Body("frame", pos=belt.pos, geoms=(Geom(belt.kind, size=belt.size, name="belt_surface",
                                                     rgba=line.belt_material.rgba),))
    paddle = line.pusher.body
    sdf.link(m, frame)
    sdf.link(m, Body("belt_encoder", pos=belt.pos))
    sdf.link(m, Body("paddle", pos=paddle.pos, geoms=paddle.geoms))
    sdf.joint(m, "anchor", "fixed", "world", "frame")
    sdf.joint(m, "belt", "prismatic", "frame", "belt_encoder", axis=(1.0, 0.0, 0.0))
    sdf.joint(m, "pusher", "prismatic", "frame", "paddle", axis=line.pusher.axis, limits=(0.0, line.pusher.travel_m))
    stroke_mps = line.pusher.travel_m / line.pusher.stroke_s
    plugin(m, sdf.JOINT_STATE, joint_name="belt")
    plugin(m, sdf.JOINT_VELOCITY, joint_name="belt", initial_velocity=float(line.belt_speed_mps))
    plugin(m, sdf.JOINT_POSITION, joint_name="pusher", use_velocity_commands="true",
           cmd_max=float(stroke_mps), cmd_min=float(-stroke_mps), initial_position=0.0)
    plugin(m, sdf.TRACK, link="frame")


def arm_model(w: ET.Element, st: PickStation, world_name: str) -> None:
    """The arm fixed to the table: links = bodies, revolute j1..j6 and prismatic fingers, position
    controllers with MuJoCo's gains, joint states of the arm and of the gripper on two topics."""
    m = element(w, "model", name="arm")
    base = st.arm
    pose(m, base.pos, base.quat, "pick_table")
    sdf.link(m, Body(base.name, geoms=base.geoms))
    sdf.joint(m, "anchor", "fixed", "world", base.name)
    parents = {c.name: sdf.link_name(b) for b in base.walk() for c in b.children}
    for body in list(base.walk())[1:]:
        sdf.link(m, body, relative_to=parents[body.name])
        j = body.joint
        damping = j.damping if j.damping is not None else st.joint_damping
        sdf.joint(m, j.name, "revolute" if j.kind == "hinge" else "prismatic", parents[body.name],
                  sdf.link_name(body), axis=j.axis, limits=j.range, damping=damping)
    plugin(m, sdf.JOINT_STATE, joint_name=list(st.arm_joints))
    plugin(m, sdf.JOINT_STATE, joint_name=list(st.finger_joints),
           topic=f"/world/{world_name}/model/arm/gripper/joint_state")
    start = dict(zip(st.arm_joints, st.arm_home_rad)) | {f: st.finger_open_m for f in st.finger_joints}
    for a in st.actuators:
        limit = a.force_limit_n if a.force_limit_n is not None else 1000.0   # MuJoCo: unlimited; gz default
        plugin(m, sdf.JOINT_POSITION, joint_name=a.joint, p_gain=float(a.kp), i_gain=0.0, d_gain=float(a.kv),
               cmd_max=float(limit), cmd_min=float(-limit), initial_position=float(start[a.joint]))


def _include(w: ET.Element, inc: Include) -> None:
    e = element(w, "include")
    element(e, "uri", f"model://{inc.name}")
    element(e, "name", inc.name)
    pose(e, inc.pos_m, inc.quat, inc.relative_to)


def world(cell: CellLayout, includes: tuple[Include, ...] = ()) -> ET.Element:
    """<sdf version="1.9"> with world `cell.world_name`."""
    root = ET.Element("sdf", version=sdf.SDF_VERSION)
    w = element(root, "world", name=cell.world_name)
    _world_settings(w, cell)
    qc, pick = cell.qc, cell.pick
    conveyor_model(w, qc)
    for g in qc.bins:
        _static_model(w, g.name, g, {})
    sdf.camera_model(w, qc.camera)
    _static_model(w, "table", pick.table, {pick.table_material.name: pick.table_material.rgba}, "pick_table")
    arm_model(w, pick, cell.world_name)
    sdf.camera_model(w, pick.camera, "pick_table")
    for inc in includes:
        _include(w, inc)
    return root


def world_xml(cell: CellLayout, includes: tuple[Include, ...] = ()) -> str:
    return sdf.to_xml(world(cell, includes), "written by sol_control.sim.sdf_cell from the cell description "
                                             "(sol_control/sim/scene.py); regenerate, do not edit")


def pose_in_world(cell: CellLayout, pos_in_pick_table) -> np.ndarray:
    """A pick_table position in the world frame (the frame has no rotation)."""
    return np.asarray(pos_in_pick_table, float) + np.asarray(cell.pick_table_in_world_m, float)
