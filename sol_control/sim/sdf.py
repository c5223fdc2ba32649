"""SDFormat 1.9 (Gazebo) from the cell description (sim/description.py): the static world and the
models spawned per run. docs/GAZEBO.md describes the result; tools/sdf_check.cpp validates it.

Mapping (MuJoCo → Gazebo):
- station frames: the QC line is the world frame; `pick_table` is a world <frame> and every pick
  station model is posed relative to it (MuJoCo runs the two stations as separate models).
- bodies → links posed relative to their parent link; hinge/slide → revolute/prismatic joints at the
  child link's origin, axis in the child frame (MuJoCo's convention); geoms → a visual, plus a
  collision unless the geom is visual-only; mass properties written out (sim/inertia.py);
  gravity-compensated links get <gravity>false</gravity>; position actuators → JointPositionController.
- the belt: a fixed `frame` link whose contact surface moves (TrackController, as gz-sim's conveyor
  example) and a prismatic joint `belt` driven at the belt speed (JointController) that reports the
  belt's position and velocity like an encoder; the pusher is a prismatic joint.
- orthographic cameras: SDF has no parallel projection, so each camera is a pinhole STANDOFF_M
  (100 m) from the station surface on the MuJoCo camera's axis, with focal length
  px_per_m * STANDOFF_M (<lens><intrinsics>) and its near clip at the MuJoCo camera's position:
  the plane z = 0 images exactly as in MuJoCo, a point h above it is off by
  px_per_m * r * h / (STANDOFF_M - h) pixels at r metres from the axis (< 0.1 px for the 7 cm
  objects, even in the image corners).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np

from sol_control.sim.description import Body, Camera, Geom, Mesh
from sol_control.sim.inertia import MassProps, body_props, rotation_z_to

SDF_VERSION = "1.9"
STANDOFF_M = 100.0          # distance from a camera to its station surface in Gazebo
FAR_BELOW_M = 1.0           # far clip: this far below the station surface
# gz-sim system plugins: (library file, class name)
PHYSICS = ("gz-sim-physics-system", "gz::sim::systems::Physics")
USER_COMMANDS = ("gz-sim-user-commands-system", "gz::sim::systems::UserCommands")
SCENE_BROADCASTER = ("gz-sim-scene-broadcaster-system", "gz::sim::systems::SceneBroadcaster")
SENSORS = ("gz-sim-sensors-system", "gz::sim::systems::Sensors")
JOINT_STATE = ("gz-sim-joint-state-publisher-system", "gz::sim::systems::JointStatePublisher")
JOINT_POSITION = ("gz-sim-joint-position-controller-system", "gz::sim::systems::JointPositionController")
JOINT_VELOCITY = ("gz-sim-joint-controller-system", "gz::sim::systems::JointController")
TRACK = ("gz-sim-track-controller-system", "gz::sim::systems::TrackController")
# gz camera axes (x forward, y left, z up) as columns in the MuJoCo camera frame (x right, y up, -z forward)
GZ_FROM_MJ_CAMERA = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])


# ---- XML helpers ------------------------------------------------------------------------------

def element(parent: ET.Element, tag: str, text=None, **attrs) -> ET.Element:
    """A child element; numbers (scalars or sequences) become space-separated %.9g text."""
    e = ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})
    if text is not None:
        e.text = text if isinstance(text, str) else " ".join(f"{v:.9g}" for v in np.atleast_1d(text))
    return e


def plugin(parent: ET.Element, system: tuple[str, str], **params) -> ET.Element:
    """<plugin filename=... name=...> with one child per parameter (a list repeats the element)."""
    p = element(parent, "plugin", filename=system[0], name=system[1])
    for key, value in params.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            element(p, key, v if isinstance(v, str) else f"{v:.9g}" if isinstance(v, float) else str(v))
    return p


def quat_from_matrix(r: np.ndarray) -> np.ndarray:
    """(w, x, y, z) of a [3, 3] rotation matrix."""
    w = np.sqrt(max(0.0, 1.0 + r[0, 0] + r[1, 1] + r[2, 2])) / 2.0
    x = np.copysign(np.sqrt(max(0.0, 1.0 + r[0, 0] - r[1, 1] - r[2, 2])) / 2.0, r[2, 1] - r[1, 2])
    y = np.copysign(np.sqrt(max(0.0, 1.0 - r[0, 0] + r[1, 1] - r[2, 2])) / 2.0, r[0, 2] - r[2, 0])
    z = np.copysign(np.sqrt(max(0.0, 1.0 - r[0, 0] - r[1, 1] + r[2, 2])) / 2.0, r[1, 0] - r[0, 1])
    return np.array([w, x, y, z])


def pose(parent: ET.Element, xyz=(0.0, 0.0, 0.0), quat=None, relative_to: str | None = None) -> ET.Element:
    """<pose>: translation, and a unit quaternion written as x y z w (SDF 1.9 quat_xyzw)."""
    attrs = {"relative_to": relative_to} if relative_to else {}
    if quat is None:
        return element(parent, "pose", np.concatenate([xyz, np.zeros(3)]), **attrs)
    q = np.asarray(quat, float) / np.linalg.norm(quat)
    return element(parent, "pose", np.concatenate([xyz, q[1:], q[:1]]), rotation_format="quat_xyzw", **attrs)


def material(parent: ET.Element, rgba, albedo_map: str | None = None) -> None:
    """Lit by the ambient headlight only (sim/description.Lighting): ambient = diffuse = colour."""
    m = element(parent, "material")
    element(m, "ambient", rgba)
    element(m, "diffuse", rgba)
    element(m, "specular", "0 0 0 1")
    if albedo_map:
        metal = element(element(m, "pbr"), "metal")
        element(metal, "albedo_map", albedo_map)
        element(metal, "metalness", "0")
        element(metal, "roughness", "1")


# ---- geoms, links, joints ---------------------------------------------------------------------

def _geometry(parent: ET.Element, g: Geom, mesh_uri) -> None:
    geo = element(parent, "geometry")
    if g.kind == "box":
        element(element(geo, "box"), "size", 2.0 * np.asarray(g.size))
    elif g.kind == "cylinder":
        cyl = element(geo, "cylinder")
        element(cyl, "radius", g.size[0])
        element(cyl, "length", 2.0 * g.size[1])
    elif g.kind == "capsule":
        cap = element(geo, "capsule")
        element(cap, "radius", g.size[0])
        element(cap, "length", float(np.linalg.norm(np.subtract(g.fromto[3:], g.fromto[:3]))))
    else:
        element(element(geo, "mesh"), "uri", mesh_uri(g.mesh))


def _geom_pose(parent: ET.Element, g: Geom) -> None:
    """Box/cylinder/mesh at g.pos; a capsule (SDF: along its z) at the middle of its fromto."""
    if g.kind != "capsule":
        pose(parent, g.pos)
        return
    p0, p1 = np.asarray(g.fromto[:3], float), np.asarray(g.fromto[3:], float)
    rot = rotation_z_to((p1 - p0) / np.linalg.norm(p1 - p0))
    pose(parent, (p0 + p1) / 2.0, None if np.allclose(rot, np.eye(3)) else quat_from_matrix(rot))


def _surface(parent: ET.Element, g: Geom) -> None:
    if g.contact is None or g.contact.friction is None:
        return
    sliding, torsional, _rolling = g.contact.friction
    friction = element(element(parent, "surface"), "friction")
    element(element(friction, "torsional"), "coefficient", torsional)
    ode = element(friction, "ode")
    element(ode, "mu", sliding)
    element(ode, "mu2", sliding)


def _inertial(parent: ET.Element, p: MassProps) -> None:
    inertial = element(parent, "inertial")
    pose(inertial, p.com_m)
    element(inertial, "mass", p.mass_kg)
    i = element(inertial, "inertia")
    for name, (r, c) in (("ixx", (0, 0)), ("ixy", (0, 1)), ("ixz", (0, 2)), ("iyy", (1, 1)), ("iyz", (1, 2)),
                         ("izz", (2, 2))):
        element(i, name, float(p.inertia[r, c]))


def link_name(body: Body) -> str:
    """SDF links, joints and frames share one namespace; MuJoCo lets a body share its joint's name."""
    return f"{body.name}_link" if body.joint is not None and body.joint.name == body.name else body.name


def link(model: ET.Element, body: Body, relative_to: str | None = None, meshes: dict[str, Mesh] | None = None,
         mesh_uri=None, hull_uri=None, colors: dict | None = None, min_mass_kg: float = 1e-3) -> ET.Element:
    """One link for `body` (its own geoms only), posed relative to `relative_to` (None: the model).
    `mesh_uri(name)` gives a mesh geom's file, `hull_uri(name)` its collision shape (MuJoCo collides
    a mesh's convex hull; default: the mesh itself); `colors` the rgba of named materials."""
    ln = element(model, "link", name=link_name(body))
    pose(ln, body.pos, body.quat, relative_to)
    if body.gravcomp:
        element(ln, "gravity", "false")
    props = body_props(body, meshes or {})
    if props.mass_kg < min_mass_kg:                      # a physics engine needs some mass
        props = MassProps(min_mass_kg, props.com_m, np.eye(3) * 1e-7)
    _inertial(ln, props)
    for k, g in enumerate(body.geoms):
        name = g.name or f"{link_name(body)}_{g.kind}{k}"
        if g.collides != "none":
            col = element(ln, "collision", name=f"{name}_collision")
            _geom_pose(col, g)
            _geometry(col, g, hull_uri or mesh_uri)
            _surface(col, g)
        vis = element(ln, "visual", name=f"{name}_visual")
        _geom_pose(vis, g)
        _geometry(vis, g, mesh_uri)
        material(vis, g.rgba if g.rgba is not None else (colors or {})[g.material])
    return ln


def joint(model: ET.Element, name: str, kind: str, parent: str, child: str, axis=None, limits=None,
          damping: float | None = None) -> ET.Element:
    j = element(model, "joint", name=name, type=kind)
    element(j, "parent", parent)
    element(j, "child", child)
    if axis is not None:
        ax = element(j, "axis")
        element(ax, "xyz", axis)
        lim = element(ax, "limit")
        lo, hi = limits if limits is not None else (-1e16, 1e16)
        element(lim, "lower", lo)
        element(lim, "upper", hi)
        if damping is not None:
            element(element(ax, "dynamics"), "damping", damping)
    return j


# ---- cameras ----------------------------------------------------------------------------------

def camera_rotation(cam: Camera) -> np.ndarray:
    """[3, 3] MuJoCo camera frame (x right, y up, looking along -z) in its station frame."""
    if cam.xyaxes is None:
        return np.eye(3)
    x = np.asarray(cam.xyaxes[:3], float)
    x /= np.linalg.norm(x)
    y = np.asarray(cam.xyaxes[3:], float)
    y -= (y @ x) * x
    y /= np.linalg.norm(y)
    return np.column_stack([x, y, np.cross(x, y)])


@dataclass(frozen=True)
class Pinhole:
    """A Gazebo camera standing in for an orthographic one (see the module docstring)."""
    pos_m: np.ndarray          # [3] in the station frame
    quat: np.ndarray           # (w, x, y, z) of the gz camera frame (x forward, y left, z up)
    fx_px: float               # = fy; pixels per metre on the station surface x STANDOFF_M
    c_px: float                # principal point (cx = cy), continuous pixel coordinates
    near_m: float
    far_m: float
    px_per_m: float


def pinhole(cam: Camera) -> Pinhole:
    if cam.projection != "orthographic" or cam.size_px is None:
        raise ValueError(f"camera {cam.name!r}: only published orthographic cameras go to Gazebo, "
                         f"got projection={cam.projection!r} size_px={cam.size_px}")
    r_mj = camera_rotation(cam)
    forward = r_mj @ np.array([0.0, 0.0, -1.0])
    if forward[2] >= -1e-9:
        raise ValueError(f"camera {cam.name!r}: must look down at the station surface, forward = {forward}")
    focus_m = -cam.pos[2] / forward[2]                 # MuJoCo camera → surface z = 0, along the axis
    pos = np.asarray(cam.pos, float) - forward * (STANDOFF_M - focus_m)
    px_per_m = cam.size_px / cam.fovy
    return Pinhole(pos, quat_from_matrix(r_mj @ GZ_FROM_MJ_CAMERA), px_per_m * STANDOFF_M, cam.size_px / 2.0,
                   STANDOFF_M - focus_m, STANDOFF_M + FAR_BELOW_M, px_per_m)


def camera_model(world: ET.Element, cam: Camera, relative_to: str | None = None) -> ET.Element:
    """A static model `<cam.frame_id>` holding the camera sensor that publishes on cam.topic."""
    ph = pinhole(cam)
    m = element(world, "model", name=cam.frame_id)
    element(m, "static", "true")
    pose(m, ph.pos_m, ph.quat, relative_to)
    sensor = element(element(m, "link", name="link"), "sensor", name=cam.frame_id, type="camera")
    element(sensor, "always_on", "true")
    element(sensor, "update_rate", float(cam.rate_hz))
    element(sensor, "topic", cam.topic)
    c = element(sensor, "camera", name=cam.name)
    c.append(ET.Comment(" overridden by <lens><intrinsics>: an orthographic view of "
                        f"{cam.fovy} m seen from {STANDOFF_M:g} m "))
    element(c, "horizontal_fov", "0.1")
    image = element(c, "image")
    element(image, "width", str(cam.size_px))
    element(image, "height", str(cam.size_px))
    element(image, "format", "R8G8B8")
    clip = element(c, "clip")
    element(clip, "near", ph.near_m)
    element(clip, "far", ph.far_m)
    lens = element(c, "lens")
    element(lens, "type", "gnomonical")
    element(lens, "scale_to_hfov", "false")
    intr = element(lens, "intrinsics")
    for key, value in (("fx", ph.fx_px), ("fy", ph.fx_px), ("cx", ph.c_px), ("cy", ph.c_px), ("s", 0.0)):
        element(intr, key, value)
    return m


def to_xml(root: ET.Element, comment: str) -> str:
    """Indented XML text with a leading comment."""
    ET.indent(root, "  ")
    return f'<?xml version="1.0"?>\n<!-- {comment} -->\n' + ET.tostring(root, encoding="unicode") + "\n"
