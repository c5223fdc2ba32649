"""The cell's MJCF, as two models stepped on one clock.

- QC line (`build_qc_mjcf`): belt, part slots (kinematic mocap bodies with their own top texture),
  reject pusher, the QC camera. Nothing in it is dynamic.
- Pick station (`build_pick_mjcf(objects)`): table, camera, a 6-DoF arm with a parallel gripper and
  the current scene's objects; recompiled (~10 ms) whenever a new scene is laid out, so every
  object has its own true geometry (irregular footprints become extruded meshes).

World frame: belt along +x with its top surface at z = 0; the QC camera looks straight down at
x = y = 0. Frame `pick_table` is the pick model's world frame (origin on the table surface under
its camera). Both cameras are orthographic: metres map to pixels exactly (tasks.common helpers).
"""
from __future__ import annotations

import numpy as np

from sol_control.tasks.common import (BELT_RGB, GRASP_FOV_M, GRASP_IMAGE_PX, GRIPPER_MAX_WIDTH_M,
                                      QC_FOV_M, QC_IMAGE_PX, TABLE_RGB)

__all__ = ["QC_IMAGE_PX", "GRASP_IMAGE_PX", "build_qc_mjcf", "build_pick_mjcf"]

BELT_HALF_WIDTH_M = 0.15
BELT_X_RANGE_M = (-0.45, 1.10)
PART_HALF_HEIGHT_M = 0.005
PART_SLOTS = 8                       # QC parts alive at once (pitch >= 0.2 m over 1.55 m of belt)
PART_TEXTURE_PX = 256                # 0.78 mm/px over the largest part; the camera has 1.56 mm/px
PUSHER_HALF_M = (0.015, 0.03, 0.02)  # paddle half sizes x, y, z
PUSHER_REST_Y_M = -BELT_HALF_WIDTH_M - 0.05
PUSHER_REACH_Y_M = BELT_HALF_WIDTH_M + 0.07

ARM_BASE_M = (0.0, 0.36, 0.0)        # arm base in pick_table, outside the camera's 0.24 m view
FINGER_MAX_M = GRIPPER_MAX_WIDTH_M / 2
PAD_HALF_M = (0.012, 0.0025, 0.012)   # finger pad half sizes: along tool x, thickness, height
TCP_FROM_FLANGE_M = 0.045            # TCP = centre of the pads
ARM_JOINTS = ("j1", "j2", "j3", "j4", "j5", "j6")
FINGER_JOINTS = ("finger_l", "finger_r")
RIM_M = 0.0015                       # the generator draws a darker 1.5 mm rim round each object
RIM_SHADE = 0.8
OBJECT_DENSITY = 400.0               # kg/m^3
GRIP = 'friction="1.2 0.01 0.0002" condim="4" solref="0.004 1"'
FLAT = 'specular="0" shininess="0" reflectance="0"'
VISUAL = 'contype="0" conaffinity="0" group="1" density="0"'


def _rgb(c) -> str:
    return " ".join(f"{v / 255.0:.6f}" for v in c)


def _header(name: str, timestep_s: float) -> str:
    return f"""<mujoco model="{name}">
  <compiler angle="radian"/>
  <option timestep="{timestep_s}" cone="elliptic" impratio="10" integrator="implicitfast"/>
  <visual>
    <headlight ambient="1 1 1" diffuse="0 0 0" specular="0 0 0"/>
    <map znear="0.01"/>
    <quality shadowsize="0"/>
    <global offwidth="640" offheight="480"/>
  </visual>"""


# ---- QC line ----------------------------------------------------------------------------------

def build_qc_mjcf(ejector_x_m: float, timestep_s: float = 0.002) -> str:
    tex = "\n".join(
        f'<texture name="part_tex{i}" type="2d" builtin="flat" rgb1="{_rgb(BELT_RGB)}" '
        f'width="{PART_TEXTURE_PX}" height="{PART_TEXTURE_PX}"/>'
        f'<material name="part_mat{i}" texture="part_tex{i}" texrepeat="1 1" texuniform="false" {FLAT}/>'
        for i in range(PART_SLOTS))
    parts = "\n".join(
        f'<body name="part{i}" mocap="true" pos="{-2.0 - 0.2 * i} -1 -0.5">'
        f'<geom name="part_geom{i}" type="box" size="0.03 0.03 {PART_HALF_HEIGHT_M}" material="part_mat{i}" '
        f'contype="0" conaffinity="0"/></body>' for i in range(PART_SLOTS))
    x0, x1 = BELT_X_RANGE_M
    return f"""{_header("sol_control_qc_line", timestep_s)}
  <asset>
    <material name="belt" rgba="{_rgb(BELT_RGB)} 1" {FLAT}/>
    {tex}
  </asset>
  <worldbody>
    <geom name="belt" type="box" material="belt" contype="0" conaffinity="0"
          pos="{(x0 + x1) / 2} 0 -0.02" size="{(x1 - x0) / 2} {BELT_HALF_WIDTH_M} 0.02"/>
    <geom name="reject_bin" type="box" rgba="0.45 0.2 0.2 1" contype="0" conaffinity="0"
          pos="{ejector_x_m} {BELT_HALF_WIDTH_M + 0.16} -0.06" size="0.2 0.08 0.02"/>
    <camera name="qc" pos="0 0 0.6" projection="orthographic" fovy="{QC_FOV_M}"/>
    <camera name="overview" pos="0.35 -0.42 0.5" xyaxes="1 0 0 0 0.766 0.643" fovy="70"/>
    <body name="pusher" mocap="true" pos="{ejector_x_m} {PUSHER_REST_Y_M} {PUSHER_HALF_M[2]}">
      <geom type="box" size="{PUSHER_HALF_M[0]} {PUSHER_HALF_M[1]} {PUSHER_HALF_M[2]}" rgba="0.9 0.5 0.1 1"
            contype="0" conaffinity="0"/>
    </body>
    {parts}
  </worldbody>
</mujoco>"""


# ---- pick station -----------------------------------------------------------------------------

def _prism_mesh(name: str, poly_m: np.ndarray, height_m: float) -> str:
    """Extruded star-shaped polygon [K, 2] (centred on its centroid), z from -h/2 to h/2."""
    k = len(poly_m)
    h = height_m / 2
    verts = [(x, y, -h) for x, y in poly_m] + [(x, y, h) for x, y in poly_m] + [(0, 0, -h), (0, 0, h)]
    faces = []
    for i in range(k):
        j = (i + 1) % k
        faces += [(2 * k, j, i), (2 * k + 1, k + i, k + j), (i, j, k + j), (i, k + j, k + i)]
    v = " ".join(f"{a:.6f} {b:.6f} {c:.6f}" for a, b, c in verts)
    f = " ".join(f"{a} {b} {c}" for a, b, c in faces)
    return f'<mesh name="{name}" vertex="{v}" face="{f}"/>'


def _shrink(poly_m: np.ndarray, d_m: float) -> np.ndarray:
    c = poly_m.mean(axis=0)
    r = np.linalg.norm(poly_m - c, axis=1, keepdims=True)
    return c + (poly_m - c) * np.maximum(r - d_m, 0) / np.maximum(r, 1e-9)


def _object(i: int, ob) -> tuple[str, str]:
    """(asset xml, body xml) for one tasks.grasp.GraspObject."""
    h = ob.height_m / 2
    rim = tuple(RIM_SHADE * c for c in ob.rgb)
    top = f'rgba="{_rgb(ob.rgb)} 1" {VISUAL}'
    main = f'name="obj{i}_geom" rgba="{_rgb(rim)} 1" density="{OBJECT_DENSITY}" {GRIP}'
    poly = np.asarray(ob.footprint_m, float)
    asset = ""
    if ob.shape == "box":
        sx, sy = np.ptp(poly, axis=0) / 2
        geoms = (f'<geom type="box" size="{sx} {sy} {h}" {main}/>'
                 f'<geom type="box" size="{sx - RIM_M} {sy - RIM_M} 0.0002" pos="0 0 {h}" {top}/>')
    elif ob.shape == "cylinder":
        r = float(np.max(np.linalg.norm(poly, axis=1)))
        geoms = (f'<geom type="cylinder" size="{r} {h}" {main}/>'
                 f'<geom type="cylinder" size="{r - RIM_M} 0.0002" pos="0 0 {h}" {top}/>')
    else:
        asset = (_prism_mesh(f"obj{i}_mesh", poly, ob.height_m)
                 + _prism_mesh(f"obj{i}_top", _shrink(poly, RIM_M), 0.0004))
        geoms = (f'<geom type="mesh" mesh="obj{i}_mesh" {main}/>'
                 f'<geom type="mesh" mesh="obj{i}_top" pos="0 0 {h}" {top}/>')
    qw, qz = np.cos(ob.yaw_rad / 2), np.sin(ob.yaw_rad / 2)
    body = (f'<body name="obj{i}" pos="{ob.x_m} {ob.y_m} {h + 0.0005}" quat="{qw} 0 0 {qz}">'
            f'<freejoint name="obj{i}_free"/>{geoms}</body>')
    return asset, body


def _arm() -> str:
    bx, by, bz = ARM_BASE_M
    link = 'contype="2" conaffinity="1" rgba="0.55 0.57 0.62 1"'
    px, pt, ph = PAD_HALF_M
    pad = f'type="box" size="{px} {pt} {ph}" {GRIP} rgba="0.15 0.15 0.15 1"'
    web = f'size="0.004 0.003 {(TCP_FROM_FLANGE_M - ph) / 2}"'     # finger from the flange to its pad
    return f"""
    <body name="arm_base" pos="{bx} {by} {bz}" quat="0.707107 0 0 -0.707107">
      <geom type="cylinder" size="0.06 0.03" pos="0 0 0.03" {link}/>
      <body name="link1" pos="0 0 0.06" gravcomp="1">
        <joint name="j1" axis="0 0 1" range="-3.1 3.1"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.08" size="0.045" {link}/>
        <body name="link2" pos="0 0 0.10" gravcomp="1">
          <joint name="j2" axis="0 1 0" range="-2.2 2.2"/>
          <geom type="capsule" fromto="0 0 0 0 0 0.30" size="0.035" {link}/>
          <body name="link3" pos="0 0 0.30" gravcomp="1">
            <joint name="j3" axis="0 1 0" range="-2.7 2.7"/>
            <geom type="capsule" fromto="0 0 0 0 0 0.26" size="0.03" {link}/>
            <body name="link4" pos="0 0 0.26" gravcomp="1">
              <joint name="j4" axis="0 0 1" range="-3.1 3.1"/>
              <geom type="capsule" fromto="0 0 0 0 0 0.05" size="0.028" {link}/>
              <body name="link5" pos="0 0 0.05" gravcomp="1">
                <joint name="j5" axis="0 1 0" range="-2.3 2.3"/>
                <geom type="capsule" fromto="0 0 0 0 0 0.04" size="0.025" {link}/>
                <body name="flange" pos="0 0 0.05" gravcomp="1">
                  <joint name="j6" axis="0 0 1" range="-3.1 3.1"/>
                  <geom type="box" size="0.02 0.07 0.008" pos="0 0 0.0" {link}/>
                  <site name="tcp" pos="0 0 {TCP_FROM_FLANGE_M}" size="0.004"/>
                  <body name="finger_l" pos="0 0 {TCP_FROM_FLANGE_M}" gravcomp="1">
                    <joint name="finger_l" type="slide" axis="0 1 0" range="0 {FINGER_MAX_M}" damping="5"/>
                    <geom name="pad_l" pos="0 {pt} 0" {pad}/>
                    <geom type="box" {web} pos="0 {2 * pt + 0.003} {-(TCP_FROM_FLANGE_M + ph) / 2}" {link}/>
                  </body>
                  <body name="finger_r" pos="0 0 {TCP_FROM_FLANGE_M}" gravcomp="1">
                    <joint name="finger_r" type="slide" axis="0 -1 0" range="0 {FINGER_MAX_M}" damping="5"/>
                    <geom name="pad_r" pos="0 {-pt} 0" {pad}/>
                    <geom type="box" {web} pos="0 {-2 * pt - 0.003} {-(TCP_FROM_FLANGE_M + ph) / 2}" {link}/>
                  </body>
                </body>
              </body>
            </body>
          </body>
        </body>
      </body>
    </body>"""


def build_pick_mjcf(objects=(), timestep_s: float = 0.002) -> str:
    """Pick station with `objects` (tasks.grasp.GraspObject, pick_table frame) on the table."""
    parts = [_object(i, ob) for i, ob in enumerate(objects)]
    arm_act = "\n".join(f'<position name="a_{j}" joint="{j}" kp="1500" kv="60" ctrlrange="-3.2 3.2"/>'
                        for j in ARM_JOINTS)
    finger_act = "\n".join(f'<position name="a_{f}" joint="{f}" kp="4000" kv="40" ctrlrange="0 {FINGER_MAX_M}" '
                           f'forcelimited="true" forcerange="-20 20"/>' for f in FINGER_JOINTS)
    return f"""{_header("sol_control_pick_station", timestep_s)}
  <asset>
    <material name="table" rgba="{_rgb(TABLE_RGB)} 1" {FLAT}/>
    {"".join(a for a, _ in parts)}
  </asset>
  <default><joint damping="2" armature="0.05"/></default>
  <worldbody>
    <geom name="table" type="box" material="table" pos="0 0.1 -0.02" size="0.3 0.36 0.02" friction="0.8 0.01 0.0002"/>
    <camera name="pick" pos="0 0 0.8" projection="orthographic" fovy="{GRASP_FOV_M}"/>
    <camera name="overview" pos="0.85 -0.6 0.75" xyaxes="0.646 0.763 0 -0.376 0.318 0.870" fovy="50"/>
    {"".join(b for _, b in parts)}
    {_arm()}
  </worldbody>
  <contact><exclude body1="link1" body2="link2"/><exclude body1="arm_base" body2="link1"/></contact>
  <actuator>
    {arm_act}
    {finger_act}
  </actuator>
</mujoco>"""
