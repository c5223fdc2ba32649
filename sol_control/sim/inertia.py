"""Mass properties of description geoms and bodies (what MuJoCo computes at compile time, written
out for SDF, which needs an explicit <inertial> per link).

Shapes at uniform density: box, cylinder, capsule and closed triangle meshes (signed tetrahedra).
A body's properties sum its geoms: mass (kg), centre of mass [3] (m, body frame) and the inertia
tensor [3, 3] (kg m^2) about the centre of mass, in the body frame. tests/test_gazebo_world.py
checks them against MuJoCo's compiled model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sol_control.sim.description import Body, Geom, Mesh

DEFAULT_DENSITY = 1000.0     # kg/m^3, MuJoCo's default


@dataclass(frozen=True)
class MassProps:
    mass_kg: float
    com_m: np.ndarray          # [3]
    inertia: np.ndarray        # [3, 3] about com_m

    def __add__(self, other: "MassProps") -> "MassProps":
        m = self.mass_kg + other.mass_kg
        if m <= 0.0:
            return self
        com = (self.mass_kg * self.com_m + other.mass_kg * other.com_m) / m
        return MassProps(m, com, _shift(self, com) + _shift(other, com))


def _shift(p: MassProps, point: np.ndarray) -> np.ndarray:
    """Inertia of p about `point` (parallel-axis theorem)."""
    d = p.com_m - point
    return p.inertia + p.mass_kg * (float(d @ d) * np.eye(3) - np.outer(d, d))


def _box(half: np.ndarray, density: float) -> tuple[float, np.ndarray]:
    a, b, c = half
    m = density * 8.0 * a * b * c
    return m, m / 3.0 * np.diag([b * b + c * c, a * a + c * c, a * a + b * b])


def _cylinder(r: float, half_h: float, density: float) -> tuple[float, np.ndarray]:
    m = density * math.pi * r * r * 2.0 * half_h
    i_xy = m * (3.0 * r * r + 4.0 * half_h * half_h) / 12.0
    return m, np.diag([i_xy, i_xy, m * r * r / 2.0])


def _capsule(r: float, half_h: float, density: float) -> tuple[float, np.ndarray]:
    """Cylinder of half height half_h along z plus two hemispherical caps."""
    m_cyl = density * math.pi * r * r * 2.0 * half_h
    m_sph = density * 4.0 / 3.0 * math.pi * r ** 3
    i_z = m_cyl * r * r / 2.0 + m_sph * 2.0 * r * r / 5.0
    # each cap: 2/5 m r^2 about its flat face's centre, its centre of mass 3r/8 from that face
    i_xy = m_cyl * (3.0 * r * r + 4.0 * half_h * half_h) / 12.0
    i_xy += m_sph * (2.0 * r * r / 5.0 + half_h * half_h + 0.75 * half_h * r)
    return m_cyl + m_sph, np.diag([i_xy, i_xy, i_z])


def mesh_props(mesh: Mesh, density: float) -> MassProps:
    """Closed mesh, outward (counter-clockwise) faces: volume integrals over signed tetrahedra."""
    v = mesh.vertices_m[mesh.faces]                       # [M, 3 corners, 3]
    a, b, c = v[:, 0], v[:, 1], v[:, 2]
    vol6 = np.einsum("ij,ij->i", a, np.cross(b, c))       # [M] 6 x signed volume
    volume = vol6.sum() / 6.0
    if volume <= 0.0:
        raise ValueError(f"mesh {mesh.name!r}: volume {volume} <= 0 (open mesh or inward faces)")
    com = (vol6[:, None] * (a + b + c)).sum(axis=0) / (24.0 * volume)
    # second moments  integral(x_i x_j dV) over each tetrahedron (origin, a, b, c)
    s = a + b + c
    second = (np.einsum("m,mi,mj->ij", vol6, s, s)
              + np.einsum("m,mi,mj->ij", vol6, a, a) + np.einsum("m,mi,mj->ij", vol6, b, b)
              + np.einsum("m,mi,mj->ij", vol6, c, c)) / 120.0           # [3, 3]
    m = density * volume
    inertia_origin = density * (np.trace(second) * np.eye(3) - second)
    # about the centre of mass: remove the parallel-axis term
    return MassProps(m, com, inertia_origin - m * (float(com @ com) * np.eye(3) - np.outer(com, com)))


def rotation_z_to(d: np.ndarray) -> np.ndarray:
    """[3, 3] rotation taking +z onto the unit vector d."""
    z = np.array([0.0, 0.0, 1.0])
    axis = np.cross(z, d)
    s, c = float(np.linalg.norm(axis)), float(z @ d)
    if s < 1e-12:
        return np.eye(3) if c > 0 else np.diag([1.0, -1.0, -1.0])
    k = axis / s
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + s * kx + (1 - c) * kx @ kx


def geom_props(g: Geom, meshes: dict[str, Mesh]) -> MassProps:
    """Mass properties of one geom in its body's frame (density 0 → massless)."""
    density = DEFAULT_DENSITY if g.density is None else g.density
    pos = np.asarray(g.pos, float)
    if density == 0.0:
        return MassProps(0.0, pos, np.zeros((3, 3)))
    if g.kind == "mesh":
        p = mesh_props(meshes[g.mesh], density)
        return MassProps(p.mass_kg, p.com_m + pos, p.inertia)
    if g.kind == "capsule":
        p0, p1 = np.asarray(g.fromto[:3], float), np.asarray(g.fromto[3:], float)
        length = float(np.linalg.norm(p1 - p0))
        m, inertia = _capsule(g.size[0], length / 2.0, density)
        rot = rotation_z_to((p1 - p0) / length)
        return MassProps(m, (p0 + p1) / 2.0, rot @ inertia @ rot.T)
    m, inertia = (_box(np.asarray(g.size, float), density) if g.kind == "box"
                  else _cylinder(g.size[0], g.size[1], density))
    return MassProps(m, pos, inertia)


def body_props(body: Body, meshes: dict[str, Mesh] | None = None) -> MassProps:
    """Sum of the body's own geoms (not its children), in the body frame."""
    total = MassProps(0.0, np.zeros(3), np.zeros((3, 3)))
    for g in body.geoms:
        total = total + geom_props(g, meshes or {})
    return total
