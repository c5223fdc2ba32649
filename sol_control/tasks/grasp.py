"""Grasp task: top-down images of objects on the pick table, plus the arm's joints, with an analytic
grasp teacher computed from the generated geometry.

Teacher (documented in models/README.md): pick the object with the largest footprint (scenes are
generated so it is at least 15 % larger than the next one); grasp at its footprint's area centroid,
at half the family height; yaw = direction of the footprint's long (principal) axis in pick_table,
wrapped to [-pi/2, pi/2) (0 for cylinders); the fingers close across it, so width = footprint extent
across the long axis + margin; force from family and footprint area; three approach waypoints
straight above the grasp.
"""
from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass

import cv2
import numpy as np

from ..perception import wrap_half_pi
from .common import (GRASP_APPROACH_DZ_M, GRASP_HEIGHT_M, GRASP_IMAGE_PX, GRASP_SHAPES, GRASP_WIDTH_MARGIN_M,
                     N_ARM_JOINTS, NOVEL_GRASP_SHAPES, TABLE_RGB, grasp_m_to_px, rng_for)
from .qc import Lighting, apply_lighting

SUPERSAMPLE = 4
HOME_JOINTS_RAD = (0.0, -1.2, 1.6, -1.97, -1.57, 0.0)
# The pick camera fires with the arm parked at home, as in the cell: test and held-out scenes carry
# encoder noise only, so the prefix's joint tokens repeat frame after frame. Training scenes vary
# the pose widely, so the model learns to read the image, not the arm.
PARKED_NOISE_RAD = 0.01
TRAIN_POSE_NOISE_RAD = 0.4
FORCE_BASE_N = {"box": 15.0, "cylinder": 12.0, "irregular": 8.0, "wedge": 10.0}
FORCE_PER_M2 = 2000.0
TARGET_AREA_RATIO = 1.15
TRAIN_HUES = ((0, 25), (90, 150), (200, 250))
HELDOUT_HUES = ((30, 60), (160, 190), (270, 330))


@dataclass(frozen=True)
class GraspObject:
    shape: str  # box | cylinder | irregular
    footprint_m: np.ndarray  # [K, 2] polygon in the object frame (centred at its area centroid)
    height_m: float
    x_m: float
    y_m: float
    yaw_rad: float
    rgb: tuple[int, int, int]

    def world_polygon(self) -> np.ndarray:  # [K, 2] in pick_table
        c, s = math.cos(self.yaw_rad), math.sin(self.yaw_rad)
        rot = np.array([[c, -s], [s, c]])
        return self.footprint_m @ rot.T + np.array([self.x_m, self.y_m])


@dataclass(frozen=True)
class GraspScene:
    objects: tuple[GraspObject, ...]
    joints_rad: np.ndarray  # [6]
    light: Lighting


@dataclass(frozen=True)
class GraspSample:
    image: np.ndarray  # [192, 192, 3] uint8
    joints_rad: np.ndarray  # [6]
    scene: GraspScene
    target_index: int
    label: dict  # field name -> value (SI units)


def polygon_moments(poly_m: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Area (m^2), area centroid [2] and principal (long) axis angle of a polygon, exactly."""
    m = cv2.moments((poly_m * 1000.0).astype(np.float32))  # millimetres keep float32 exact enough
    area = m["m00"] * 1e-6
    cx, cy = m["m10"] / m["m00"] * 1e-3, m["m01"] / m["m00"] * 1e-3
    angle = 0.5 * math.atan2(2 * m["mu11"], m["mu20"] - m["mu02"])
    return float(area), np.array([cx, cy]), angle


def _footprint(shape: str, rng: np.random.Generator, heldout: bool) -> np.ndarray:
    big = heldout and rng.random() < 0.5
    if shape == "box":
        long = rng.uniform(0.085, 0.095) if big else rng.uniform(0.040, 0.085)
        short = rng.uniform(0.025, min(0.055, long / 1.3))
        return np.array([[-long / 2, -short / 2], [long / 2, -short / 2], [long / 2, short / 2], [-long / 2, short / 2]])
    if shape == "cylinder":
        d = rng.uniform(0.060, 0.066) if big else rng.uniform(0.028, 0.060)
        t = np.linspace(0, 2 * math.pi, 64, endpoint=False)
        return np.stack([d / 2 * np.cos(t), d / 2 * np.sin(t)], axis=1)
    if shape == "irregular":
        n = 24
        t = np.linspace(0, 2 * math.pi, n, endpoint=False)
        a = rng.uniform(0.045, 0.050) if big else rng.uniform(0.025, 0.045)  # semi-major
        b = a / rng.uniform(1.5, 2.2)
        harm = sum(rng.uniform(-0.08, 0.08) * np.cos(k * t + rng.uniform(0, 2 * math.pi)) for k in (2, 3, 5))
        r = 1.0 + harm
        poly = np.stack([a * r * np.cos(t), b * r * np.sin(t)], axis=1)
        _, c, ang = polygon_moments(poly)
        poly = poly - c
        cr, sr = math.cos(-ang), math.sin(-ang)  # align the long axis with +x
        return poly @ np.array([[cr, -sr], [sr, cr]]).T
    if shape == "wedge":  # an isosceles triangle, apex on +x, centred on its centroid
        length = rng.uniform(0.045, 0.085)
        base = length / rng.uniform(1.6, 2.4)
        return np.array([[2 * length / 3, 0.0], [-length / 3, -base / 2], [-length / 3, base / 2]])
    raise ValueError(f"shape must be one of {GRASP_SHAPES + NOVEL_GRASP_SHAPES}, got {shape!r}")


def _colour(rng: np.random.Generator, heldout: bool) -> tuple[int, int, int]:
    bands = HELDOUT_HUES if heldout else TRAIN_HUES
    for _ in range(100):
        lo, hi = bands[int(rng.integers(len(bands)))]
        rgb = np.array(colorsys.hsv_to_rgb(rng.uniform(lo, hi) / 360.0, rng.uniform(0.45, 0.85),
                                           rng.uniform(0.30, 0.75))) * 255
        if np.abs(rgb - np.asarray(TABLE_RGB)).max() >= 80:
            break
    return tuple(int(round(x)) for x in rgb)


def _separated(poly: np.ndarray, placed: list[np.ndarray], gap_m: float) -> bool:
    for other in placed:
        for a, b in ((poly, other), (other, poly)):
            for p in a:
                if cv2.pointPolygonTest(b.astype(np.float32), (float(p[0]), float(p[1])), True) > -gap_m:
                    return False
    return True


def sample_scene(rng: np.random.Generator, heldout: bool, pose_noise_rad: float = PARKED_NOISE_RAD,
                 shapes: tuple[str, ...] = GRASP_SHAPES) -> GraspScene:
    n_obj = int(rng.choice([1, 2, 3, 4], p=[0.3, 0.3, 0.25, 0.15]))
    while True:
        objs: list[GraspObject] = []
        placed: list[np.ndarray] = []
        for _ in range(n_obj):
            for _attempt in range(40):
                shape = shapes[int(rng.integers(len(shapes)))]
                fp = _footprint(shape, rng, heldout)
                ob = GraspObject(shape, fp, GRASP_HEIGHT_M[shape], float(rng.uniform(-0.075, 0.075)),
                                 float(rng.uniform(-0.075, 0.075)), float(rng.uniform(-math.pi, math.pi)),
                                 _colour(rng, heldout))
                wp = ob.world_polygon()
                if np.abs(wp).max() < 0.105 and _separated(wp, placed, 0.012):
                    objs.append(ob)
                    placed.append(wp)
                    break
        areas = sorted((polygon_moments(o.footprint_m)[0] for o in objs), reverse=True)
        if objs and (len(areas) == 1 or areas[0] >= TARGET_AREA_RATIO * areas[1]):
            break
    joints = np.asarray(HOME_JOINTS_RAD) + rng.uniform(-pose_noise_rad, pose_noise_rad, N_ARM_JOINTS)
    light = _lighting(rng, heldout)
    return GraspScene(tuple(objs), joints, light)


def _lighting(rng: np.random.Generator, heldout: bool) -> Lighting:
    if heldout:
        gain = rng.uniform(0.70, 0.80) if rng.random() < 0.5 else rng.uniform(1.08, 1.15)
        grad = rng.uniform(-0.25, 0.25, 2)
    else:
        gain = rng.uniform(0.82, 1.05)
        grad = rng.uniform(-0.12, 0.12, 2)
    tint = 1.0 + rng.uniform(-0.03, 0.03, 3)
    return Lighting(float(gain), (float(grad[0]), float(grad[1])), tuple(float(x) for x in tint),
                    float(rng.uniform(0.0, 0.8)), float(rng.uniform(0.0, 3.0)))


def teacher(scene: GraspScene) -> tuple[int, dict]:
    """Index of the object to pick and the grasp label (SI units, pick_table frame)."""
    areas = [polygon_moments(o.footprint_m)[0] for o in scene.objects]
    i = int(np.argmax(areas))
    ob = scene.objects[i]
    wp = ob.world_polygon()
    area, c, axis = polygon_moments(wp)
    yaw = 0.0 if ob.shape == "cylinder" else wrap_half_pi(axis)
    across = np.array([-math.sin(axis), math.cos(axis)])
    extent = float(np.ptp((wp - c) @ across))
    z = ob.height_m / 2
    label = {"x": float(c[0]), "y": float(c[1]), "z": z, "yaw": yaw, "width": extent + GRASP_WIDTH_MARGIN_M,
             "force": FORCE_BASE_N[ob.shape] + FORCE_PER_M2 * area}
    for k, dz in enumerate(GRASP_APPROACH_DZ_M, start=1):
        label[f"a{k}_x"], label[f"a{k}_y"], label[f"a{k}_z"] = float(c[0]), float(c[1]), z + dz
    return i, label


def render(scene: GraspScene, rng: np.random.Generator) -> np.ndarray:
    """Top-down image [192, 192, 3] uint8: table, object top faces with a thin darker rim."""
    big = GRASP_IMAGE_PX * SUPERSAMPLE
    img = np.empty((big, big, 3), np.float32)
    img[:] = TABLE_RGB
    for ob in scene.objects:
        pts = np.array([grasp_m_to_px(x, y) for x, y in ob.world_polygon()]) * SUPERSAMPLE
        pts = np.round(pts * 16).astype(np.int32)
        rim = tuple(float(0.8 * c) for c in ob.rgb)
        cv2.fillPoly(img, [pts], rim, cv2.LINE_AA, shift=4)
        cv2.polylines(img, [pts], True, tuple(float(c) for c in ob.rgb), 0, cv2.LINE_AA, shift=4)
        inner = _shrink(ob.world_polygon(), 0.0015)
        ipts = np.round(np.array([grasp_m_to_px(x, y) for x, y in inner]) * SUPERSAMPLE * 16).astype(np.int32)
        cv2.fillPoly(img, [ipts], tuple(float(c) for c in ob.rgb), cv2.LINE_AA, shift=4)
    img += rng.normal(0, 2.0, (big, big, 1)).astype(np.float32)
    img = cv2.resize(img, (GRASP_IMAGE_PX, GRASP_IMAGE_PX), interpolation=cv2.INTER_AREA)
    return apply_lighting(img, scene.light, rng)


def _shrink(poly: np.ndarray, d_m: float) -> np.ndarray:
    c = poly.mean(axis=0)
    r = np.linalg.norm(poly - c, axis=1, keepdims=True)
    return c + (poly - c) * np.maximum(r - d_m, 0) / np.maximum(r, 1e-9)


def make_sample(split: str, index: int) -> GraspSample:
    rng = rng_for(split, index)
    scene = sample_scene(rng, split == "heldout", TRAIN_POSE_NOISE_RAD if split == "train" else PARKED_NOISE_RAD,
                         NOVEL_GRASP_SHAPES if split == "novel" else GRASP_SHAPES)
    i, label = teacher(scene)
    image = render(scene, rng)
    return GraspSample(image, scene.joints_rad.copy(), scene, i, label)
