"""The cell's layout, filled into the shared description (sim/description.py), and its MJCF.

- QC line (`qc_line`, `build_qc_mjcf`): belt, part slots (kinematic mocap bodies with their own top
  texture), reject pusher, reject bin, the QC camera. Nothing in it is dynamic in MuJoCo.
- Pick station (`pick_station(objects)`, `build_pick_mjcf(objects)`): table, camera, a 6-DoF arm
  with a parallel gripper and the current scene's objects; recompiled (~10 ms) whenever a new scene
  is laid out, so every object has its own true geometry (irregular footprints become extruded
  meshes).
- `cell(...)`: both stations, and where `pick_table` sits in a shared world (Gazebo, sim/sdf.py).

World frame: belt along +x with its top surface at z = 0; the QC camera looks straight down at
x = y = 0. Frame `pick_table` is the pick model's world frame (origin on the table surface under
its camera). Both cameras are orthographic: metres map to pixels exactly (tasks.common helpers).
"""
from __future__ import annotations

import numpy as np

from sol_control.sim import mjcf
from sol_control.sim.description import (Body, Camera, CellLayout, Contact, Geom, Joint, Lighting, Material,
                                         Mesh, Physics, PickObject, PickStation, PositionActuator, Pusher, QCLine,
                                         Site)
from sol_control.tasks.common import (BELT_RGB, GRASP_FOV_M, GRASP_IMAGE_PX, GRIPPER_MAX_WIDTH_M,
                                      QC_FOV_M, QC_IMAGE_PX, TABLE_RGB)
from sol_control.tasks.grasp import HOME_JOINTS_RAD

__all__ = ["QC_IMAGE_PX", "GRASP_IMAGE_PX", "QC_FOV_M", "GRASP_FOV_M", "BELT_RGB", "build_qc_mjcf",
           "build_pick_mjcf", "qc_line", "pick_station", "pick_object", "cell"]

BELT_HALF_WIDTH_M = 0.15
BELT_X_RANGE_M = (-0.45, 1.10)
PART_HALF_HEIGHT_M = 0.005
PART_SLOTS = 8                       # QC parts alive at once (pitch >= 0.2 m over 1.55 m of belt)
PART_TEXTURE_PX = 256                # 0.78 mm/px over the largest part; the camera has 1.56 mm/px
QC_PART_DENSITY = 1200.0             # kg/m^3; Gazebo only (MuJoCo moves its parts kinematically)
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
GRIP = Contact(friction=(1.2, 0.01, 0.0002), condim=4, solref=(0.004, 1.0))
LINK_RGBA = (0.55, 0.57, 0.62, 1.0)
QC_CAMERA_HEIGHT_M = 0.6
PICK_CAMERA_HEIGHT_M = 0.8
CAMERA_RATE_HZ = 10.0                # Gazebo only: its SDF 1.9 cameras stream (MuJoCo's are triggered)
PICK_TABLE_IN_WORLD_M = (0.0, -2.0, 0.0)   # Gazebo only: both stations share one world there


def _rgba(rgb255) -> tuple[float, float, float, float]:
    return (*(c / 255.0 for c in rgb255), 1.0)


# ---- QC line ----------------------------------------------------------------------------------

def qc_line(ejector_x_m: float, timestep_s: float = 0.002, belt_speed_mps: float = 0.2,
            pusher_stroke_s: float = 0.12) -> QCLine:
    x0, x1 = BELT_X_RANGE_M
    paddle = Geom("box", size=PUSHER_HALF_M, rgba=(0.9, 0.5, 0.1, 1.0))
    slots = tuple(Body(f"part{i}", pos=(-2.0 - 0.2 * i, -1.0, -0.5), mocap=True,
                       geoms=(Geom("box", size=(0.03, 0.03, PART_HALF_HEIGHT_M), name=f"part_geom{i}",
                                   material=f"part_mat{i}"),))
                  for i in range(PART_SLOTS))
    return QCLine(
        physics=Physics(timestep_s), lighting=Lighting(),
        belt=Geom("box", name="belt", material="belt", pos=((x0 + x1) / 2, 0.0, -0.02),
                  size=((x1 - x0) / 2, BELT_HALF_WIDTH_M, 0.02)),
        belt_material=Material("belt", _rgba(BELT_RGB)),
        belt_speed_mps=belt_speed_mps,
        bins=(Geom("box", name="reject_bin", rgba=(0.45, 0.2, 0.2, 1.0),
                   pos=(ejector_x_m, BELT_HALF_WIDTH_M + 0.16, -0.06), size=(0.2, 0.08, 0.02)),),
        pusher=Pusher(Body("pusher", pos=(ejector_x_m, PUSHER_REST_Y_M, PUSHER_HALF_M[2]), mocap=True,
                           geoms=(paddle,)),
                      axis=(0.0, 1.0, 0.0), travel_m=PUSHER_REACH_Y_M - PUSHER_REST_Y_M, stroke_s=pusher_stroke_s),
        camera=Camera("qc", pos=(0.0, 0.0, QC_CAMERA_HEIGHT_M), projection="orthographic", fovy=QC_FOV_M,
                      size_px=QC_IMAGE_PX, topic="qc_camera/image", frame_id="qc_camera", rate_hz=CAMERA_RATE_HZ),
        overview=Camera("overview", pos=(0.35, -0.42, 0.5), projection="perspective", fovy=70.0,
                        xyaxes=(1.0, 0.0, 0.0, 0.0, 0.766, 0.643)),
        part_slots=slots,
        part_materials=tuple(Material(f"part_mat{i}", _rgba(BELT_RGB), texture_px=PART_TEXTURE_PX)
                             for i in range(PART_SLOTS)),
    )


def qc_part(name: str, size_m: float) -> Body:
    """A spawned QC part as a body of its own (Gazebo): a thin square plate of side size_m.
    MuJoCo reuses `part_slots` instead and draws the part as a texture on a padded plate."""
    return Body(name, free=True, geoms=(Geom("box", size=(size_m / 2, size_m / 2, PART_HALF_HEIGHT_M), name=name,
                                             rgba=_rgba(BELT_RGB), density=QC_PART_DENSITY),))


def build_qc_mjcf(ejector_x_m: float, timestep_s: float = 0.002) -> str:
    return mjcf.qc_line_mjcf(qc_line(ejector_x_m, timestep_s))


# ---- pick station -----------------------------------------------------------------------------

def prism_mesh(name: str, poly_m: np.ndarray, height_m: float) -> Mesh:
    """Extruded star-shaped polygon [K, 2] (centred on its centroid), z from -h/2 to h/2."""
    k = len(poly_m)
    h = height_m / 2
    verts = [(x, y, -h) for x, y in poly_m] + [(x, y, h) for x, y in poly_m] + [(0, 0, -h), (0, 0, h)]
    faces = []
    for i in range(k):
        j = (i + 1) % k
        faces += [(2 * k, j, i), (2 * k + 1, k + i, k + j), (i, j, k + j), (i, k + j, k + i)]
    # vertices at the 1 µm the files are written with, so every writer and the inertia agree exactly
    verts_m = np.array([[float(f"{c:.6f}") for c in v] for v in verts], np.float64)  # [2K+2, 3]
    return Mesh(name, verts_m, np.array(faces, np.int64))                              # faces [4K, 3]


def _shrink(poly_m: np.ndarray, d_m: float) -> np.ndarray:
    c = poly_m.mean(axis=0)
    r = np.linalg.norm(poly_m - c, axis=1, keepdims=True)
    return c + (poly_m - c) * np.maximum(r - d_m, 0) / np.maximum(r, 1e-9)


def pick_object(i: int, ob) -> PickObject:
    """Body `obj{i}` (and its meshes) for one tasks.grasp.GraspObject, in pick_table."""
    h = ob.height_m / 2
    rim = _rgba(tuple(RIM_SHADE * c for c in ob.rgb))
    main = dict(name=f"obj{i}_geom", rgba=rim, density=OBJECT_DENSITY, contact=GRIP)
    top = dict(pos=(0.0, 0.0, h), rgba=_rgba(ob.rgb), collides="none", group=1, density=0.0)
    poly = np.asarray(ob.footprint_m, float)
    meshes: tuple[Mesh, ...] = ()
    if ob.shape == "box":
        sx, sy = np.ptp(poly, axis=0) / 2
        geoms = (Geom("box", size=(sx, sy, h), **main), Geom("box", size=(sx - RIM_M, sy - RIM_M, 0.0002), **top))
    elif ob.shape == "cylinder":
        r = float(np.max(np.linalg.norm(poly, axis=1)))
        geoms = (Geom("cylinder", size=(r, h), **main), Geom("cylinder", size=(r - RIM_M, 0.0002), **top))
    else:
        meshes = (prism_mesh(f"obj{i}_mesh", poly, ob.height_m),
                  prism_mesh(f"obj{i}_top", _shrink(poly, RIM_M), 0.0004))
        geoms = (Geom("mesh", mesh=f"obj{i}_mesh", **main), Geom("mesh", mesh=f"obj{i}_top", **top))
    qw, qz = np.cos(ob.yaw_rad / 2), np.sin(ob.yaw_rad / 2)
    body = Body(f"obj{i}", pos=(ob.x_m, ob.y_m, h + 0.0005), quat=(qw, 0.0, 0.0, qz), free=True, geoms=geoms)
    return PickObject(body, meshes)


def _finger(side: str, sign: float) -> Body:
    """One slide finger at the TCP: a pad (contact) and a web from the flange to the pad."""
    px, pt, ph = PAD_HALF_M
    pad = Geom("box", name=f"pad_{side}", pos=(0.0, sign * pt, 0.0), size=PAD_HALF_M, contact=GRIP,
               rgba=(0.15, 0.15, 0.15, 1.0))
    web = Geom("box", size=(0.004, 0.003, (TCP_FROM_FLANGE_M - ph) / 2), collides="world", rgba=LINK_RGBA,
               pos=(0.0, sign * (2 * pt + 0.003), -(TCP_FROM_FLANGE_M + ph) / 2))
    return Body(f"finger_{side}", pos=(0.0, 0.0, TCP_FROM_FLANGE_M), gravcomp=True, geoms=(pad, web),
                joint=Joint(f"finger_{side}", "slide", (0.0, sign, 0.0), (0.0, FINGER_MAX_M), damping=5.0))


def _link(name: str, pos_z: float, joint: Joint, length_m: float, radius_m: float, children=()) -> Body:
    capsule = Geom("capsule", size=(radius_m,), fromto=(0.0, 0.0, 0.0, 0.0, 0.0, length_m), collides="world",
                   rgba=LINK_RGBA)
    return Body(name, pos=(0.0, 0.0, pos_z), gravcomp=True, joint=joint, geoms=(capsule,), children=tuple(children))


def arm() -> Body:
    """Base (in pick_table) → link1..link5 → flange (j1..j6) → two fingers; TCP site on the flange."""
    z, y = (0.0, 0.0, 1.0), (0.0, 1.0, 0.0)
    flange = Body("flange", pos=(0.0, 0.0, 0.05), gravcomp=True, joint=Joint("j6", axis=z, range=(-3.1, 3.1)),
                  geoms=(Geom("box", size=(0.02, 0.07, 0.008), collides="world", rgba=LINK_RGBA),),
                  sites=(Site("tcp", (0.0, 0.0, TCP_FROM_FLANGE_M), 0.004),),
                  children=(_finger("l", 1.0), _finger("r", -1.0)))
    link5 = _link("link5", 0.05, Joint("j5", axis=y, range=(-2.3, 2.3)), 0.04, 0.025, [flange])
    link4 = _link("link4", 0.26, Joint("j4", axis=z, range=(-3.1, 3.1)), 0.05, 0.028, [link5])
    link3 = _link("link3", 0.30, Joint("j3", axis=y, range=(-2.7, 2.7)), 0.26, 0.03, [link4])
    link2 = _link("link2", 0.10, Joint("j2", axis=y, range=(-2.2, 2.2)), 0.30, 0.035, [link3])
    link1 = _link("link1", 0.06, Joint("j1", axis=z, range=(-3.1, 3.1)), 0.08, 0.045, [link2])
    base = Geom("cylinder", size=(0.06, 0.03), pos=(0.0, 0.0, 0.03), collides="world", rgba=LINK_RGBA)
    return Body("arm_base", pos=ARM_BASE_M, quat=(0.707107, 0.0, 0.0, -0.707107), geoms=(base,), children=(link1,))


def pick_station(objects=(), timestep_s: float = 0.002) -> PickStation:
    """Pick station with `objects` (tasks.grasp.GraspObject, pick_table frame) on the table."""
    actuators = tuple(PositionActuator(j, kp=1500.0, kv=60.0, ctrl_range=(-3.2, 3.2)) for j in ARM_JOINTS)
    actuators += tuple(PositionActuator(f, kp=4000.0, kv=40.0, ctrl_range=(0.0, FINGER_MAX_M), force_limit_n=20.0)
                       for f in FINGER_JOINTS)
    return PickStation(
        physics=Physics(timestep_s), lighting=Lighting(),
        table=Geom("box", name="table", material="table", pos=(0.0, 0.1, -0.02), size=(0.3, 0.36, 0.02),
                   contact=Contact(friction=(0.8, 0.01, 0.0002))),
        table_material=Material("table", _rgba(TABLE_RGB)),
        camera=Camera("pick", pos=(0.0, 0.0, PICK_CAMERA_HEIGHT_M), projection="orthographic", fovy=GRASP_FOV_M,
                      size_px=GRASP_IMAGE_PX, topic="pick_camera/image", frame_id="pick_camera",
                      rate_hz=CAMERA_RATE_HZ),
        overview=Camera("overview", pos=(0.85, -0.6, 0.75), projection="perspective", fovy=50.0,
                        xyaxes=(0.646, 0.763, 0.0, -0.376, 0.318, 0.870)),
        arm=arm(), arm_joints=ARM_JOINTS, finger_joints=FINGER_JOINTS, actuators=actuators,
        contact_excludes=(("link1", "link2"), ("arm_base", "link1")),
        joint_damping=2.0, joint_armature=0.05, arm_home_rad=tuple(HOME_JOINTS_RAD), finger_open_m=FINGER_MAX_M,
        objects=tuple(pick_object(i, ob) for i, ob in enumerate(objects)),
    )


def build_pick_mjcf(objects=(), timestep_s: float = 0.002) -> str:
    """Pick station with `objects` (tasks.grasp.GraspObject, pick_table frame) on the table."""
    return mjcf.pick_station_mjcf(pick_station(objects, timestep_s))


def cell(ejector_x_m: float, belt_speed_mps: float, pusher_stroke_s: float = 0.12, objects=(),
         timestep_s: float = 0.002) -> CellLayout:
    """Both stations; `pick_table` at PICK_TABLE_IN_WORLD_M of the shared (Gazebo) world."""
    return CellLayout(qc_line(ejector_x_m, timestep_s, belt_speed_mps, pusher_stroke_s),
                pick_station(objects, timestep_s), PICK_TABLE_IN_WORLD_M)
