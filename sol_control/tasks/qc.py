"""QC task: top-down images of parts on a belt, with analytic labels (class, location, severity).

Part families (nominal geometry is scale-free, so "out of tolerance" is judged on proportions):
- plate: rectangle, aspect 1.5, four holes;  ring: annulus, inner/outer 0.5;  bracket: L, legs equal,
  leg width 0.35 of the side, one hole per leg.
Defects: scratch (thin straight line, bright or dark), crack (dark jagged line from the rim),
missing_hole, discoloration (soft stain, chroma shift), deformed (one axis stretched 18-35 %).

`render_part(spec)` draws the part's top face as an RGBA texture (holes transparent) in the part
frame; the simulator uses the same texture. `make_sample(split, index)` composes the camera image.
"""
from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass

import cv2
import numpy as np

from .common import (BELT_RGB, NOVEL_FAMILIES, QC_DEFECTS, QC_IMAGE_PX, QC_PART_FAMILIES, QC_PX_PER_M, qc_m_to_px,
                     rng_for)

TEX_PX_PER_M = 4 * QC_PX_PER_M  # texture resolution: 4x the camera, for anti-aliasing
SUPERSAMPLE = 4
CIRCLE_VERTS = 72
DEFECT_WEIGHTS = (0.30, 0.14, 0.14, 0.14, 0.14, 0.14)  # ok, then the five defects
TRAIN_HUES = ((0, 20), (45, 70), (100, 140), (205, 240))  # degrees; held-out uses the gaps
HELDOUT_HUES = ((22, 40), (160, 190), (270, 320))


@dataclass(frozen=True)
class PartSpec:
    family: str  # plate | ring | bracket (training), hexnut | tab (NOVEL_FAMILIES)
    size_m: float  # largest extent of the part
    rgb: tuple[int, int, int]
    defect: str = "ok"
    severity: float = 0.0  # 0..1, drives the defect's magnitude
    seed: int = 0  # defect geometry (position, direction, which hole)


@dataclass(frozen=True)
class Lighting:
    gain: float = 1.0
    gradient: tuple[float, float] = (0.0, 0.0)  # relative gain change per image width along u, v
    tint: tuple[float, float, float] = (1.0, 1.0, 1.0)
    blur_px: float = 0.0
    noise: float = 0.0


@dataclass(frozen=True)
class QCSample:
    image: np.ndarray  # [128, 128, 3] uint8 RGB
    spec: PartSpec
    label: dict  # defect, u, v, severity
    center_m: tuple[float, float]
    yaw_rad: float


def _circle(cx: float, cy: float, r: float, n: int = CIRCLE_VERTS) -> np.ndarray:
    t = np.linspace(0.0, 2 * math.pi, n, endpoint=False)
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)  # [n, 2]


def part_geometry(spec: PartSpec) -> tuple[np.ndarray, list[np.ndarray], tuple[float, float]]:
    """Outer polygon, hole polygons (metres, part frame, y up) and the deformation scale (sx, sy)."""
    s = spec.size_m
    if spec.family == "plate":
        length, width = s, s / 1.5
        outer = np.array([[-length / 2, -width / 2], [length / 2, -width / 2],
                          [length / 2, width / 2], [-length / 2, width / 2]])
        r = 0.12 * width
        holes = [_circle(sx * 0.33 * length, sy * 0.22 * width, r) for sx in (-1, 1) for sy in (-1, 1)]
    elif spec.family == "ring":
        outer = _circle(0.0, 0.0, s / 2)
        holes = [_circle(0.0, 0.0, s / 4)]
    elif spec.family == "bracket":
        leg = 0.35 * s
        h = s / 2
        outer = np.array([[-h, -h], [h, -h], [h, -h + leg], [-h + leg, -h + leg], [-h + leg, h], [-h, h]])
        r = 0.075 * s
        holes = [_circle(0.3 * s, -h + leg / 2, r), _circle(-h + leg / 2, 0.3 * s, r)]
    elif spec.family == "hexnut":  # a hexagon, corner to corner s, one round hole
        t = np.arange(6) * math.pi / 3
        outer = np.stack([s / 2 * np.cos(t), s / 2 * np.sin(t)], axis=1)
        holes = [_circle(0.0, 0.0, 0.22 * s)]
    elif spec.family == "tab":  # a slot-ended strip, length s, width s / 2.4, three holes in a row
        w = s / 2.4
        t = np.linspace(-math.pi / 2, math.pi / 2, 16)
        right = np.stack([(s - w) / 2 + w / 2 * np.cos(t), w / 2 * np.sin(t)], axis=1)
        outer = np.concatenate([right, -right])
        holes = [_circle(x * s, 0.0, 0.09 * s) for x in (-0.3, 0.0, 0.3)]
    else:
        raise ValueError(f"family must be one of {QC_PART_FAMILIES + NOVEL_FAMILIES}, got {spec.family!r}")
    scale = (1.0, 1.0)
    rng = np.random.default_rng(spec.seed)
    if spec.defect == "deformed":
        f = 1.18 + 0.17 * spec.severity
        f = f if rng.random() < 0.5 else 1.0 / f
        axis = int(rng.integers(2))
        scale = (f, 1.0) if axis == 0 else (1.0, f)
    sc = np.array(scale)
    outer = outer * sc
    norm = s / float(np.max(np.ptp(outer, axis=0)))  # keep the largest extent at size_m
    # holes move with the deformation but keep their nominal (round) size
    holes = [(h - h.mean(axis=0)) + h.mean(axis=0) * sc * norm for h in holes]
    return outer * norm, holes, scale


def _tex_pts(poly_m: np.ndarray, n_px: int) -> np.ndarray:
    c = n_px / 2.0
    pts = np.stack([c + poly_m[:, 0] * TEX_PX_PER_M, c - poly_m[:, 1] * TEX_PX_PER_M], axis=1)
    return np.round(pts * 16).astype(np.int32)  # 4 fractional bits for cv2 shift=4


def _stain_rgb(rgb: tuple[int, int, int]) -> np.ndarray:
    palette = np.array([[120, 70, 30], [40, 110, 60], [60, 60, 150], [150, 140, 40], [140, 50, 110]], float)
    c = np.asarray(rgb, float)
    chroma = lambda x: x / max(x.sum(), 1.0)  # noqa: E731
    d = [np.abs(chroma(p) - chroma(c)).sum() for p in palette]
    return palette[int(np.argmax(d))]


def render_part(spec: PartSpec) -> tuple[np.ndarray, float]:
    """Top-face texture [N, N, 4] uint8 (RGBA, part centred, +x right, +y up) and its side in metres."""
    rgba, side_m, _ = _render_part(spec)
    return rgba, side_m


def _render_part(spec: PartSpec) -> tuple[np.ndarray, float, tuple[float, float]]:
    """... plus the defect location (x, y) in the part frame, metres."""
    outer, holes, _ = part_geometry(spec)
    if spec.defect == "missing_hole":
        rng = np.random.default_rng(spec.seed + 1)
        gone = int(rng.integers(len(holes)))
        loc = tuple(holes[gone].mean(axis=0))
        holes = [h for i, h in enumerate(holes) if i != gone]
    else:
        loc = (0.0, 0.0)
    side_m = 1.05 * float(np.max(np.abs(outer))) * 2
    n_px = int(math.ceil(side_m * TEX_PX_PER_M))
    alpha = np.zeros((n_px, n_px), np.uint8)
    cv2.fillPoly(alpha, [_tex_pts(outer, n_px)], 255, cv2.LINE_AA, shift=4)
    for h in holes:
        cv2.fillPoly(alpha, [_tex_pts(h, n_px)], 0, cv2.LINE_AA, shift=4)
    rng = np.random.default_rng(spec.seed + 2)
    base = np.asarray(spec.rgb, np.float32)
    # faint low-frequency surface variation (+-3 levels)
    low = cv2.resize(rng.normal(0, 1, (8, 8)).astype(np.float32), (n_px, n_px), interpolation=cv2.INTER_CUBIC)
    col = np.clip(base[None, None, :] + 3.0 * low[..., None], 0, 255)
    solid = alpha > 127
    if spec.defect in ("scratch", "crack", "discoloration"):
        loc = _draw_defect(col, solid, outer, spec, rng, n_px)
    rgba = np.dstack([np.clip(col, 0, 255).astype(np.uint8), alpha])
    return rgba, side_m, loc


def _draw_defect(col: np.ndarray, solid: np.ndarray, outer: np.ndarray, spec: PartSpec,
                 rng: np.random.Generator, n_px: int) -> tuple[float, float]:
    """Draw the spec's scratch, crack or stain into `col`; its centre in metres (part frame)."""
    draw = {"scratch": _draw_scratch, "crack": _draw_crack}.get(spec.defect, _draw_stain)
    return draw(col, solid, outer, spec, rng, n_px)


def _draw_scratch(col: np.ndarray, solid: np.ndarray, outer: np.ndarray, spec: PartSpec,
                  rng: np.random.Generator, n_px: int) -> tuple[float, float]:
    """A straight bright or dark scratch lying on material."""
    s, sev = spec.size_m, spec.severity
    c = n_px / 2.0
    to_px = lambda p: (c + p[0] * TEX_PX_PER_M, c - p[1] * TEX_PX_PER_M)  # noqa: E731
    ys, xs = np.nonzero(solid)
    length_m = (0.30 + 0.35 * sev) * s
    # the whole scratch lies >= 3 camera pixels inside the material (visible, not on the rim)
    interior = cv2.erode(solid.astype(np.uint8), np.ones((25, 25), np.uint8)) > 0
    best = (-1.0, None, None)
    for attempt in range(200):  # a midpoint whose whole segment lies on material
        if attempt in (60, 120):
            length_m *= 0.75
        i = int(rng.integers(len(xs)))
        mid = np.array([(xs[i] - c) / TEX_PX_PER_M, (c - ys[i]) / TEX_PX_PER_M])
        if spec.family == "ring":  # straight chords fit the annulus only tangentially
            th = math.atan2(mid[1], mid[0]) + math.pi / 2 + rng.uniform(-0.25, 0.25)
        else:
            th = rng.uniform(0, math.pi)
        d = np.array([math.cos(th), math.sin(th)]) * length_m / 2
        share = float(np.mean([_on(interior, to_px(mid + t * d)) for t in np.linspace(-1, 1, 17)]))
        if share > best[0]:
            best = (share, mid, d)
        if share == 1.0:
            break
    _, mid, d = best
    p0, p1 = mid - d, mid + d
    layer = np.zeros(solid.shape, np.uint8)
    cv2.line(layer, _i16(to_px(p0)), _i16(to_px(p1)), 255, 4, cv2.LINE_AA, shift=4)
    bright_ok = float(np.mean(spec.rgb)) < 160  # a bright scratch would clip on a bright part
    sign = 1.0 if (bright_ok and rng.random() < 0.5) else -1.0
    delta = 70 + 50 * sev if sign > 0 else -min(70 + 50 * sev, 0.45 * float(np.mean(spec.rgb)))
    col += (layer[..., None] / 255.0 * delta).astype(np.float32)
    return float(mid[0]), float(mid[1])


def _draw_crack(col: np.ndarray, solid: np.ndarray, outer: np.ndarray, spec: PartSpec,
                rng: np.random.Generator, n_px: int) -> tuple[float, float]:
    """A dark jagged crack from the rim towards the centroid."""
    s, sev = spec.size_m, spec.severity
    c = n_px / 2.0
    to_px = lambda p: (c + p[0] * TEX_PX_PER_M, c - p[1] * TEX_PX_PER_M)  # noqa: E731
    ys, xs = np.nonzero(solid)
    # start on the rim, walk towards the material's centroid with jagged turns; redraw until
    # most of the crack lies on material (a crack in thin air would be an invisible defect)
    centroid = np.array([(xs.mean() - c) / TEX_PX_PER_M, (c - ys.mean()) / TEX_PX_PER_M])
    length_m = (0.20 + 0.10 * sev) * s
    for _ in range(30):
        k = int(rng.integers(len(outer)))
        a, b = outer[k], outer[(k + 1) % len(outer)]
        start = a + rng.uniform(0.2, 0.8) * (b - a)
        inward = (centroid - start) / (np.linalg.norm(centroid - start) + 1e-9)
        n_seg = int(rng.integers(4, 7))
        pts = [start - inward * 0.01 * s]
        heading = math.atan2(inward[1], inward[0])
        for _ in range(n_seg):
            h = heading + rng.uniform(-0.7, 0.7)
            pts.append(pts[-1] + length_m / n_seg * np.array([math.cos(h), math.sin(h)]))
        layer = np.zeros(solid.shape, np.uint8)
        poly = np.array([_i16(to_px(p)) for p in pts], np.int32)
        cv2.polylines(layer, [poly], False, 255, 8, cv2.LINE_AA, shift=4)
        if ((layer > 127) & solid).sum() >= 0.8 * 8 * length_m * TEX_PX_PER_M * 0.7:
            break
    mix = (layer[..., None] / 255.0).astype(np.float32) * (0.92 + 0.08 * sev)
    col[:] = col * (1 - mix) + 8.0 * mix
    mid = np.mean(pts, axis=0)
    return float(mid[0]), float(mid[1])


def _draw_stain(col: np.ndarray, solid: np.ndarray, outer: np.ndarray, spec: PartSpec,
                rng: np.random.Generator, n_px: int) -> tuple[float, float]:
    """Discoloration: a soft elliptical stain, chroma shifted towards a contrasting colour."""
    s, sev = spec.size_m, spec.severity
    c = n_px / 2.0
    ys, xs = np.nonzero(solid)
    # discoloration: soft elliptical stain, chroma shifted towards a contrasting stain colour
    i = int(rng.integers(len(xs)))
    centre_px = (float(xs[i]), float(ys[i]))
    r_px = (0.10 + 0.10 * sev) * s * TEX_PX_PER_M
    yy, xx = np.mgrid[0:n_px, 0:n_px].astype(np.float32)
    ang = rng.uniform(0, math.pi)
    du, dv = xx - centre_px[0], yy - centre_px[1]
    e1 = (du * math.cos(ang) + dv * math.sin(ang)) / r_px
    e2 = (-du * math.sin(ang) + dv * math.cos(ang)) / (0.6 * r_px)
    w = np.exp(-0.5 * (e1 ** 2 + e2 ** 2) * 2.0) * (0.55 + 0.35 * sev)
    stain = _stain_rgb(spec.rgb) * (col.mean() / 110.0)
    col[:] = col * (1 - w[..., None]) + stain[None, None, :] * w[..., None]
    return (centre_px[0] - c) / TEX_PX_PER_M, (c - centre_px[1]) / TEX_PX_PER_M


def _i16(p) -> tuple[int, int]:
    return int(round(p[0] * 16)), int(round(p[1] * 16))


def _on(mask: np.ndarray, p) -> bool:
    u, v = int(p[0]), int(p[1])
    return 0 <= v < mask.shape[0] and 0 <= u < mask.shape[1] and bool(mask[v, u])


def compose(spec: PartSpec, center_m: tuple[float, float], yaw_rad: float, light: Lighting,
            rng: np.random.Generator) -> tuple[np.ndarray, tuple[float, float]]:
    """Camera image [128, 128, 3] uint8 and the defect location in image coordinates (u, v in 0..1)."""
    rgba, side_m, loc = _render_part(spec)
    n_tex = rgba.shape[0]
    big = QC_IMAGE_PX * SUPERSAMPLE
    k = SUPERSAMPLE * QC_PX_PER_M / TEX_PX_PER_M  # texture px -> supersampled image px
    cu, cv = qc_m_to_px(*center_m)
    cu, cv = cu * SUPERSAMPLE, cv * SUPERSAMPLE
    # image v points down, part y up: rotating by +yaw in the world is -yaw in image coordinates
    ca, sa = math.cos(yaw_rad) * k, math.sin(yaw_rad) * k
    t = n_tex / 2.0
    m = np.array([[ca, sa, cu - ca * t - sa * t], [-sa, ca, cv + sa * t - ca * t]], np.float32)
    warped = cv2.warpAffine(rgba, m, (big, big), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0, 0))
    belt = np.empty((big, big, 3), np.float32)
    belt[:] = BELT_RGB
    belt += rng.normal(0, 2.5, (big, big, 1)).astype(np.float32)
    a = warped[..., 3:4].astype(np.float32) / 255.0
    img = warped[..., :3].astype(np.float32) * a + belt * (1 - a)
    img = cv2.resize(img, (QC_IMAGE_PX, QC_IMAGE_PX), interpolation=cv2.INTER_AREA)
    img = apply_lighting(img, light, rng)
    # defect location: part frame -> image
    lx, ly = loc
    wx = center_m[0] + lx * math.cos(yaw_rad) - ly * math.sin(yaw_rad)
    wy = center_m[1] + lx * math.sin(yaw_rad) + ly * math.cos(yaw_rad)
    u, v = qc_m_to_px(wx, wy)
    return img, (u / QC_IMAGE_PX, v / QC_IMAGE_PX)


def apply_lighting(img: np.ndarray, light: Lighting, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    g = light.gain * (1 + light.gradient[0] * (xx / w - 0.5) + light.gradient[1] * (yy / h - 0.5))
    out = img * g[..., None] * np.asarray(light.tint, np.float32)[None, None, :]
    if light.blur_px > 0.05:
        out = cv2.GaussianBlur(out, (0, 0), light.blur_px)
    if light.noise > 0:
        out = out + rng.normal(0, light.noise, out.shape).astype(np.float32)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def sample_colour(rng: np.random.Generator, heldout: bool) -> tuple[int, int, int]:
    if rng.random() < 0.3:  # bare metal greys
        v = rng.uniform(0.55, 0.70) if heldout else rng.uniform(0.70, 0.88)
        return tuple(int(round(255 * v)) for _ in range(3))
    bands = HELDOUT_HUES if heldout else TRAIN_HUES
    lo, hi = bands[int(rng.integers(len(bands)))]
    r, g, b = colorsys.hsv_to_rgb(rng.uniform(lo, hi) / 360.0, rng.uniform(0.35, 0.7), rng.uniform(0.65, 0.9))
    return int(round(255 * r)), int(round(255 * g)), int(round(255 * b))


def sample_lighting(rng: np.random.Generator, heldout: bool) -> Lighting:
    if heldout:
        gain = rng.uniform(0.72, 0.82) if rng.random() < 0.5 else rng.uniform(1.15, 1.25)
        grad = tuple(rng.uniform(-0.3, 0.3, 2))
    else:
        gain = rng.uniform(0.85, 1.12)
        grad = tuple(rng.uniform(-0.15, 0.15, 2))
    tint = tuple(1.0 + rng.uniform(-0.03, 0.03, 3))
    return Lighting(float(gain), (float(grad[0]), float(grad[1])), tuple(float(x) for x in tint),
                    float(rng.uniform(0.0, 0.7)), float(rng.uniform(0.0, 3.0)))


def sample_spec(rng: np.random.Generator, heldout: bool, families: tuple[str, ...] = QC_PART_FAMILIES) -> PartSpec:
    family = families[int(rng.integers(len(families)))]
    if heldout:
        size = rng.uniform(0.040, 0.045) if rng.random() < 0.5 else rng.uniform(0.110, 0.120)
    else:
        size = rng.uniform(0.045, 0.110)
    defect = QC_DEFECTS[int(rng.choice(len(QC_DEFECTS), p=DEFECT_WEIGHTS))]
    # severity drives the visible magnitude; a missing hole is all-or-nothing (severity 1)
    severity = {"ok": 0.0, "missing_hole": 1.0}.get(defect, float(rng.uniform(0.0, 1.0)))
    return PartSpec(family, float(size), sample_colour(rng, heldout), defect, severity,
                    int(rng.integers(2**31)))


def make_sample(split: str, index: int, family: str | None = None) -> QCSample:
    """One labelled scene; deterministic in (split, index). `family`: this part family instead of
    the split's (the `novel` split draws from NOVEL_FAMILIES)."""
    rng = rng_for(split, index)
    heldout = split == "heldout"
    families = (family,) if family else NOVEL_FAMILIES if split == "novel" else QC_PART_FAMILIES
    spec = sample_spec(rng, heldout, families)
    center = (float(rng.uniform(-0.005, 0.005)), float(rng.uniform(-0.005, 0.005)))
    yaw = float(rng.uniform(0, 2 * math.pi))
    light = sample_lighting(rng, heldout)
    img, (u, v) = compose(spec, center, yaw, light, rng)
    if spec.defect == "deformed":  # the whole part: its centre
        u, v = qc_m_to_px(*center)
        u, v = u / QC_IMAGE_PX, v / QC_IMAGE_PX
    elif spec.defect == "ok":  # no defect: a fixed, meaningless location
        u, v = 0.5, 0.5
    label = {"defect": spec.defect, "u": float(np.clip(u, 0, 1)), "v": float(np.clip(v, 0, 1)),
             "severity": spec.severity}
    return QCSample(img, spec, label, center, yaw)
