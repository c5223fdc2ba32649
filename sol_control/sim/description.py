"""One description of the robot cell: the data both sim/mjcf.py (MuJoCo) and sim/sdf.py (Gazebo)
are written from. Plain frozen dataclasses, no simulator imports; `sim/scene.py` fills them in.

Conventions (MuJoCo's, so the MJCF writer is a straight transcription and the SDF writer converts):
metres, radians, kg/m^3; sizes are half extents (box: half x, y, z; cylinder: radius, half height;
capsule: radius, with `fromto` end points); quaternions are (w, x, y, z); a body's pose is relative
to its parent body, a station's static geoms and cameras are in the station frame. A camera with no
`xyaxes` looks straight down (-z) with image up = +y, image right = +x.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Vec3 = tuple[float, float, float]
Quat = tuple[float, float, float, float]      # w, x, y, z
Rgba = tuple[float, float, float, float]      # 0..1
ZERO: Vec3 = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Contact:
    """Contact parameters that differ from the simulator defaults (None = default)."""
    friction: tuple[float, float, float] | None = None   # sliding, torsional, rolling
    condim: int | None = None                          # MuJoCo: 3 = sliding, 4 = + torsional
    solref: tuple[float, float] | None = None          # MuJoCo soft-contact time constant, damping ratio


@dataclass(frozen=True)
class Material:
    name: str
    rgba: Rgba
    flat: bool = True                     # no specular highlight: rendered colour = material colour
    texture_px: int | None = None         # a per-run texture of this size (QC part slots, MuJoCo)


@dataclass(frozen=True)
class Mesh:
    """A closed triangle mesh: vertices [N, 3] (m), faces [M, 3] (counter-clockwise seen from outside)."""
    name: str
    vertices_m: np.ndarray
    faces: np.ndarray


@dataclass(frozen=True)
class Geom:
    kind: str                                  # box | cylinder | capsule | mesh
    size: tuple[float, ...] = ()               # see the module docstring
    pos: Vec3 = ZERO
    name: str | None = None
    fromto: tuple[float, ...] | None = None    # capsule end points (x0, y0, z0, x1, y1, z1)
    mesh: str | None = None                    # Mesh.name
    rgba: Rgba | None = None
    material: str | None = None                # Material.name (instead of rgba)
    collides: str = "all"                      # all | none (visual only) | world (not the own arm)
    density: float | None = None               # None: 1000 (MuJoCo's default)
    contact: Contact | None = None
    group: int | None = None                   # MuJoCo visual group (1 = decoration)

    def __post_init__(self):
        if self.kind not in ("box", "cylinder", "capsule", "mesh"):
            raise ValueError(f"Geom.kind must be box|cylinder|capsule|mesh, got {self.kind!r}")
        if self.collides not in ("all", "none", "world"):
            raise ValueError(f"Geom.collides must be all|none|world, got {self.collides!r}")


@dataclass(frozen=True)
class Joint:
    name: str
    kind: str = "hinge"                        # hinge (revolute) | slide (prismatic)
    axis: Vec3 = (0.0, 0.0, 1.0)               # in the body frame
    range: tuple[float, float] | None = None   # rad or m
    damping: float | None = None               # None: the station's joint default


@dataclass(frozen=True)
class Site:
    name: str
    pos: Vec3
    size_m: float


@dataclass(frozen=True)
class Body:
    name: str
    pos: Vec3 = ZERO
    quat: Quat | None = None
    joint: Joint | None = None
    free: bool = False                         # a free-floating object (MuJoCo freejoint)
    mocap: bool = False                        # moved by the cell code, not by physics
    gravcomp: bool = False                     # gravity compensated (the arm's links)
    geoms: tuple[Geom, ...] = ()
    sites: tuple[Site, ...] = ()
    children: tuple["Body", ...] = ()

    def walk(self):
        """This body and every descendant, depth first (parents before children)."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass(frozen=True)
class Camera:
    name: str
    pos: Vec3
    projection: str                            # orthographic | perspective
    fovy: float                                # orthographic: view extent (m); perspective: degrees
    xyaxes: tuple[float, ...] | None = None    # None: looking down, image up = +y
    size_px: int | None = None                 # a published square image (None: a view for people)
    topic: str | None = None                   # Gazebo image topic (gz_bridge.yaml)
    frame_id: str | None = None                # ROS frame of the published image
    rate_hz: float | None = None               # Gazebo update rate (MuJoCo cameras are triggered)


@dataclass(frozen=True)
class Lighting:
    """A headlight: ambient 1 and no diffuse light means a rendered colour equals its material."""
    ambient: tuple[float, float, float] = (1.0, 1.0, 1.0)
    diffuse: tuple[float, float, float] = (0.0, 0.0, 0.0)
    specular: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Physics:
    timestep_s: float = 0.002
    cone: str = "elliptic"
    impratio: float = 10.0
    integrator: str = "implicitfast"


@dataclass(frozen=True)
class PositionActuator:
    joint: str
    kp: float                                  # N/m or N m/rad
    kv: float                                  # N s/m or N m s/rad
    ctrl_range: tuple[float, float]
    force_limit_n: float | None = None         # None: unlimited


@dataclass(frozen=True)
class Pusher:
    body: Body                                 # mocap paddle at rest
    axis: Vec3                                 # stroke direction
    travel_m: float                            # rest → full reach
    stroke_s: float                            # time for one extension


@dataclass(frozen=True)
class QCLine:
    """Station frame `qc_line` = world: belt along +x, its top at z = 0, QC camera at x = y = 0."""
    physics: Physics
    lighting: Lighting
    belt: Geom
    belt_material: Material
    belt_speed_mps: float
    bins: tuple[Geom, ...]
    pusher: Pusher
    camera: Camera
    overview: Camera
    part_slots: tuple[Body, ...]               # MuJoCo: mocap bodies reused by the spawned parts
    part_materials: tuple[Material, ...]


@dataclass(frozen=True)
class PickObject:
    """A pick object spawned per scene (pose in pick_table)."""
    body: Body
    meshes: tuple[Mesh, ...] = ()


@dataclass(frozen=True)
class PickStation:
    """Station frame `pick_table`: origin on the table surface under the pick camera."""
    physics: Physics
    lighting: Lighting
    table: Geom
    table_material: Material
    camera: Camera
    overview: Camera
    arm: Body                                  # base → j1..j6 → flange → fingers
    arm_joints: tuple[str, ...]
    finger_joints: tuple[str, ...]
    actuators: tuple[PositionActuator, ...]
    contact_excludes: tuple[tuple[str, str], ...]
    joint_damping: float
    joint_armature: float
    arm_home_rad: tuple[float, ...]            # where the arm starts (and returns to)
    finger_open_m: float                       # each finger's travel when open
    objects: tuple[PickObject, ...] = ()


@dataclass(frozen=True)
class CellLayout:
    """Both stations and where the pick station's frame sits in a shared (Gazebo) world."""
    qc: QCLine
    pick: PickStation
    pick_table_in_world_m: Vec3                # Gazebo only: MuJoCo runs the stations as two models
    world_name: str = "sol_control_cell"
