"""Observation tokenizer: camera image (+ joints) -> a short prefix of token ids, BOS ... SEP.

Prefill dominates a decision's latency, so the prefix is short (~20 tokens) and made of binned,
engineered features instead of image patches:
1. segment the part/object from the background (QC: the median colour of the image border, the
   belt; grasp: a plane fitted per channel to the border, which absorbs lighting gradients);
2. measure it: sub-pixel centroid and principal axis from (soft-coverage) image moments, extents,
   area (QC: the outline's compactness instead, scale-free), min-area-rect fill, solidity, hole
   count; QC also line evidence (morphological black/top hat: scratches, cracks) and chroma
   deviation (discoloration), with their locations;
3. bin every feature (token = offset + clip(floor((f - low) / (high - low) * size), 0, size - 1),
   `log` features are binned on log(f)). The bins live in the bundle manifest's `observation` dict;
   each feature has its own token range so a token says what it measures.
Images of another size are centre-cropped to square and resized to the task's camera resolution
(the camera is assumed to cover the same field of view).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import cv2
import numpy as np

# name, size, low, high, scale. Integer-valued features use low=-0.5, high=size-0.5.
QC_FEATURES = (
    ("holes", 8, -0.5, 7.5, "linear"),
    ("compactness", 16, 1.0, 3.0, "linear"),  # outline length^2 / (4 pi area): 1 for a disc, scale-free
    ("aspect", 48, 1.0, 2.2, "linear"),  # principal-axis ratio from second moments
    ("rect_aspect", 48, 1.0, 2.2, "linear"),  # min-area-rect long / short side (brackets, plates)
    ("fill", 24, 0.40, 1.0, "linear"),  # filled area / min-area-rect area
    ("solidity", 16, 0.50, 1.0, "linear"),
    ("hole_frac", 16, 0.0, 0.40, "linear"),
    ("line_polarity", 3, -0.5, 2.5, "linear"),  # 0 none, 1 dark, 2 bright
    ("line_len", 24, 0.0, 0.9, "linear"),  # longest line / part size
    ("line_contrast", 16, 0.0, 0.8, "linear"),  # relative to the part's brightness
    ("line_width", 12, 0.0, 3.0, "linear"),  # pixels
    ("line_rim", 8, 0.0, 8.0, "linear"),  # distance of the line to the part's rim, px
    ("dark_len", 16, 0.005, 0.6, "log"),  # pixels darker than the belt (crack cores) / part size
    ("stain_frac", 16, 0.001, 0.3, "log"),  # share of the surface with chroma deviation
    ("stain_max", 16, 0.0, 0.24, "linear"),
    ("line_u", 64, 0.0, 1.0, "linear"), ("line_v", 64, 0.0, 1.0, "linear"),
    ("stain_u", 64, 0.0, 1.0, "linear"), ("stain_v", 64, 0.0, 1.0, "linear"),
    ("part_u", 64, 0.0, 1.0, "linear"), ("part_v", 64, 0.0, 1.0, "linear"),
)
# observation kinds -> perception version: 2 looks for stains nearer the rim and through one clipped
# channel (held-out parts of 40 mm and under strong light); 3 fills the flattened rim and hole edges
# with the surface's local brightness, not its median (no false line on a thin web under a lighting
# gradient). A bundle keeps the version it was made with.
KINDS = {"binned_features/1": 1, "binned_features/2": 2, "binned_features/3": 3}
LATEST = max(KINDS.values())
# Measured too, for bundles made before a feature was replaced: the absolute part area (image
# shares) tied decisions to the sizes trained on; `compactness` took its place
QC_LEGACY_FEATURES = ("area",)
# Static first: the arm's joints lead the grasp prefix. The pick camera fires with the arm parked,
# so these tokens repeat frame after frame and their KV cache is kept (exact prefix reuse). Joint
# bins are centred on multiples of pi/8, so a parked joint at 0 or -pi/2 sits mid-bin, not on an edge.
GRASP_FEATURES = tuple((f"joint{i}", 16, -math.pi - math.pi / 16, math.pi - math.pi / 16, "linear")
                       for i in range(6)) + (  # 6 arm joints
    ("n_objects", 6, 0.5, 6.5, "linear"),
    ("x", 256, -0.128, 0.128, "linear"),  # metres, pick_table (the grasp x grid)
    ("y", 256, -0.128, 0.128, "linear"),
    ("axis", 256, -math.pi / 2, math.pi / 2, "linear"),  # long-axis angle, rad
    ("aspect", 32, 1.0, 3.0, "linear"),
    ("minor_m", 256, 0.0, 0.128, "linear"),  # extent across the long axis
    ("major_m", 64, 0.0, 0.128, "linear"),
    ("area_m2", 32, 4e-4, 8e-3, "log"),
    ("rect_fill", 16, 0.6, 1.0, "linear"),
    ("solidity", 16, 0.7, 1.0, "linear"),
)


def square_resize(image: np.ndarray, size_px: int) -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be an [H, W, 3] uint8 array, got "
                         f"{getattr(image, 'shape', None)} {getattr(image, 'dtype', type(image).__name__)}")
    h, w = image.shape[:2]
    if min(h, w) < 16:
        raise ValueError(f"image must be at least 16x16 pixels, got {h}x{w}")
    if h != w:
        s = min(h, w)
        image = image[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    if image.shape[0] != size_px:
        interp = cv2.INTER_AREA if image.shape[0] > size_px else cv2.INTER_LINEAR
        image = cv2.resize(image, (size_px, size_px), interpolation=interp)
    return image


# numpy reduces a trailing axis of 3 one pixel at a time (~0.3 ms per call on a 128 x 128 image);
# elementwise ops over the channel planes do the same arithmetic in the same order, bit for bit.
def _channel_max(a: np.ndarray) -> np.ndarray:
    return np.maximum(np.maximum(a[..., 0], a[..., 1]), a[..., 2])


def _channel_sum(a: np.ndarray) -> np.ndarray:
    return a[..., 0] + a[..., 1] + a[..., 2]


def _max_abs_difference(img: np.ndarray, ref) -> np.ndarray:
    """max over the channels of |img - ref(c)|, img [n, n, 3], ref(c) channel c's reference (a
    number or an [n, n] plane): one channel plane at a time, the same float32 operations as over
    [n, n, 3] (bit for bit) without its temporaries (~4x faster)."""
    diff = [np.abs(img[..., c] - ref(c)) for c in range(3)]
    return np.maximum(np.maximum(diff[0], diff[1]), diff[2])


def _border(img: np.ndarray, k: int = 3) -> np.ndarray:
    return np.concatenate([img[:k].reshape(-1, 3), img[-k:].reshape(-1, 3),
                           img[:, :k].reshape(-1, 3), img[:, -k:].reshape(-1, 3)])


def _components(mask: np.ndarray, connectivity: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(labels + 1 for the background, label image, pixels per label): OpenCV's labels and a
    bincount, the areas connectedComponentsWithStats gives in ~2x the time on these small images."""
    n, labels = cv2.connectedComponents(mask, connectivity=connectivity)
    return n, labels, np.bincount(labels.ravel(), minlength=n)


def _ellipse(k: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (k, k))


def _qc_part(img: np.ndarray, gray: np.ndarray, bg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(part mask, its outer contour, the part with holes filled) [n, n] uint8, from the belt colour `bg`."""
    diff = _max_abs_difference(img, lambda c: bg[c])
    raw = ((diff > 30) | (gray < bg.mean() - 20)).astype(np.uint8)
    raw = cv2.morphologyEx(raw, cv2.MORPH_CLOSE, _ellipse(3))
    n_lab, lab, area = _components(raw, 8)
    if n_lab < 2 or area[1:].max() < 60:
        raise ValueError("qc image: no part found (nothing differs from the belt colour)")
    part = (lab == 1 + int(np.argmax(area[1:]))).astype(np.uint8)
    # second pass at half the belt-to-part contrast: edges and small holes at their true size
    contrast = float(np.median(diff[cv2.erode(part, _ellipse(5)) > 0])) if part.sum() > 60 else 60.0
    half = max(0.5 * contrast, 20.0)
    raw = ((diff > half) | (gray < bg.mean() - 20)).astype(np.uint8) & cv2.dilate(part, _ellipse(5))
    part = cv2.morphologyEx(raw, cv2.MORPH_CLOSE, _ellipse(3))
    contours, _ = cv2.findContours(part, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    outer = max(contours, key=cv2.contourArea)
    filled = np.zeros_like(part)
    cv2.drawContours(filled, [outer], -1, 1, -1)
    return part, outer, filled


def _count_holes(holes_mask: np.ndarray) -> int:
    """Roughly round, compact holes of at least 5 px."""
    n_h, _, hst, _ = cv2.connectedComponentsWithStats(holes_mask, connectivity=4)
    holes = 0
    for i in range(1, n_h):
        a, w, h = hst[i, cv2.CC_STAT_AREA], hst[i, cv2.CC_STAT_WIDTH], hst[i, cv2.CC_STAT_HEIGHT]
        if a >= 5 and max(w, h) <= 2 * min(w, h) and a >= 0.5 * w * h:
            holes += 1
    return holes


def _qc_shape(outer: np.ndarray, filled: np.ndarray, holes_mask: np.ndarray, n: int) -> tuple[dict, float]:
    """Shape features and the part's size in pixels (its min-area rectangle's long side)."""
    area = float(filled.sum())
    (_, _), (rw, rh), _ = cv2.minAreaRect(outer)
    hull = cv2.contourArea(cv2.convexHull(outer))
    m = cv2.moments(filled, binaryImage=True)
    pu, pv = m["m10"] / m["m00"] / n, m["m01"] / m["m00"] / n
    mu20, mu02, mu11 = m["mu20"] / m["m00"], m["mu02"] / m["m00"], m["mu11"] / m["m00"]
    common = math.sqrt(((mu20 - mu02) / 2) ** 2 + mu11 ** 2)
    l1, l2 = (mu20 + mu02) / 2 + common, max((mu20 + mu02) / 2 - common, 1e-6)
    f = {"holes": _count_holes(holes_mask), "area": area / (n * n), "aspect": math.sqrt(l1 / l2),  # moment axes
         "compactness": cv2.arcLength(outer, True) ** 2 / (4 * math.pi * max(area, 1.0)),
         "rect_aspect": max(rw, rh) / max(min(rw, rh), 1.0),
         "fill": area / max(rw * rh, 1.0), "solidity": area / max(hull, 1.0),
         "hole_frac": float(holes_mask.sum()) / area, "part_u": pu, "part_v": pv}
    return f, max(rw, rh, 1.0)


def _longest_line(flat: np.ndarray, inner: np.ndarray, ref: float):
    """(length px, polarity 1 dark / 2 bright, responses, xs, ys) of the longest line-like blob in
    the black-hat (dark) or top-hat (bright) response of the flattened surface, or None."""
    black = cv2.morphologyEx(flat, cv2.MORPH_BLACKHAT, _ellipse(7)) / max(ref, 1.0)
    top = cv2.morphologyEx(flat, cv2.MORPH_TOPHAT, _ellipse(7)) / max(ref, 1.0)
    best = None
    for polarity, resp in ((1, black), (2, top)):
        lm = ((resp > 0.12) & (inner > 0)).astype(np.uint8)
        k, ll, area = _components(lm, 8)
        for i in range(1, k):
            if area[i] < 4:
                continue
            ys, xs = np.nonzero(ll == i)
            (_, _), (a, b), _ = cv2.minAreaRect(np.stack([xs, ys], 1).astype(np.float32))
            length = max(a, b) + 1.0
            if best is None or length > best[0]:
                best = (length, polarity, resp[ys, xs], xs, ys)
    return best


def _surface_fill(gray: np.ndarray, inner: np.ndarray, ref: float, version: int) -> np.ndarray:
    """The surface with rim and hole edges flattened away: filled with the median `ref` (version
    < 3), or (version 3) with the surface's own local brightness, so a thin web between a hole and
    the rim under a lighting gradient does not stand out from its fill as a line."""
    if version < 3 or not inner.any():
        return np.where(inner > 0, gray, ref).astype(np.float32)
    w = inner.astype(np.float32)
    num = cv2.GaussianBlur(gray * w, (0, 0), 4.0)
    den = cv2.GaussianBlur(w, (0, 0), 4.0)
    local = np.where(den > 1e-3, num / np.maximum(den, 1e-3), ref)
    return np.where(inner > 0, gray, local).astype(np.float32)


def _qc_lines(f: dict, gray: np.ndarray, bg: np.ndarray, part, filled, inner, size_px: float, n: int,
              version: int) -> None:
    """Line evidence (scratch, crack) on the part surface away from rim and holes, into `f`."""
    ref = float(np.median(gray[inner > 0])) if inner.any() else float(gray[part > 0].mean())
    flat = _surface_fill(gray, inner, ref, version)
    f.update(line_polarity=0, line_len=0.0, line_contrast=0.0, line_width=0.0, line_rim=8.0,
             line_u=f["part_u"], line_v=f["part_v"])
    best = _longest_line(flat, inner, ref)
    if best is not None and best[0] >= 4:
        length, polarity, vals, xs, ys = best
        dist = cv2.distanceTransform(filled, cv2.DIST_L2, 3)
        f.update(line_polarity=polarity, line_len=length / size_px, line_contrast=float(vals.mean()),
                 line_width=len(xs) / length, line_rim=float(dist[ys, xs].min()),
                 line_u=float(xs.mean() + 0.5) / n, line_v=float(ys.mean() + 0.5) / n)
    dark = (filled > 0) & (gray < bg.mean() - 20)
    f["dark_len"] = float(dark.sum()) / size_px
    if best is None and dark.sum() >= 2:
        ys, xs = np.nonzero(dark)
        f["line_u"], f["line_v"] = float(xs.mean() + 0.5) / n, float(ys.mean() + 0.5) / n


def _channel_min(a: np.ndarray) -> np.ndarray:
    return np.minimum(np.minimum(a[..., 0], a[..., 1]), a[..., 2])


def _stain_core(img: np.ndarray, filled: np.ndarray, holes_mask: np.ndarray, version: int) -> np.ndarray:
    """Where a stain is looked for. Version 2 (`binned_features/2`): the part without a 1-px rim and
    hole edges (a stain on a small part sits near them), and a pixel clipped in every channel has no
    chroma, while one clipped channel (a bright part under strong light) is clipped all over the part,
    so its chroma still compares. Version 1 (bundles made before): 2 px off, no channel clipped."""
    k, clipped = (3, _channel_min) if version >= 2 else (5, _channel_max)
    surface = cv2.erode(filled, _ellipse(k)) & (1 - cv2.dilate(holes_mask, _ellipse(k)))
    return (surface > 0) & (clipped(img) < 250)


def _qc_stain(f: dict, img: np.ndarray, core: np.ndarray, n: int) -> None:
    """Chroma deviation (discoloration) on `core` into `f`; lighting gain and gradients do not
    change chroma."""
    total = np.maximum(_channel_sum(img), 1.0)
    chroma = [img[..., c] / total for c in range(3)]  # planes: img / total[..., None], bit for bit
    f.update(stain_frac=0.0, stain_max=0.0, stain_u=f["part_u"], stain_v=f["part_v"])
    if core.sum() < 20:
        return
    med = [np.median(plane[core]) for plane in chroma]
    dev = cv2.blur(np.abs(chroma[0] - med[0]) + np.abs(chroma[1] - med[1]) + np.abs(chroma[2] - med[2]), (3, 3))
    dev = np.where(core, dev, 0.0)
    hot = dev > 0.04
    f["stain_frac"] = float(hot.sum()) / float(core.sum())
    f["stain_max"] = float(dev.max())
    if hot.sum() >= 3:
        ys, xs = np.nonzero(hot)
        wts = dev[ys, xs]
        f["stain_u"] = float((xs + 0.5) @ wts / wts.sum()) / n
        f["stain_v"] = float((ys + 0.5) @ wts / wts.sum()) / n


def qc_features(image: np.ndarray, version: int = LATEST) -> dict[str, float]:
    """Engineered features of the (largest) part in a QC image [128, 128, 3] uint8; `version`: the
    bundle's observation kind (`binned_features/<version>`)."""
    img = image.astype(np.float32)
    n = img.shape[0]
    bg = np.median(_border(img), axis=0)  # [3] belt colour under this lighting
    gray = _channel_sum(img) / np.float32(3)
    part, outer, filled = _qc_part(img, gray, bg)
    holes_mask = (filled & (1 - part)).astype(np.uint8)
    f, size_px = _qc_shape(outer, filled, holes_mask, n)
    inner = cv2.erode(filled, _ellipse(5)) & (1 - cv2.dilate(holes_mask, _ellipse(5)))
    _qc_lines(f, gray, bg, part, filled, inner, size_px, n, version)
    _qc_stain(f, img, _stain_core(img, filled, holes_mask, version), n)
    return f


@functools.lru_cache(maxsize=4)
def _plane_grids(n: int) -> tuple[np.ndarray, ...]:
    """For an n x n image: pixel grids (x, y), x/n and y/n [n, n, 1], the 3-px border mask and the
    border's design matrix [B, 3] of a plane fit. The same arrays every call: computed once."""
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float32)
    k = 3
    bmask = np.zeros((n, n), bool)
    bmask[:k], bmask[-k:], bmask[:, :k], bmask[:, -k:] = True, True, True, True
    design = np.stack([xx[bmask] / n, yy[bmask] / n, np.ones(bmask.sum(), np.float32)], 1)  # [B, 3]
    return xx, yy, xx[..., None] / n, yy[..., None] / n, bmask, design


def _table_difference(img: np.ndarray) -> np.ndarray:
    """Per-pixel max channel difference from the table: a plane fitted per channel to the border
    (absorbs lighting gradients). img [n, n, 3] float32 -> [n, n]."""
    _, _, xn, yn, bmask, design = _plane_grids(img.shape[0])
    coef, *_ = np.linalg.lstsq(design, img[bmask], rcond=None)  # [3, 3] plane per channel
    x, y = xn[..., 0], yn[..., 0]
    return _max_abs_difference(img, lambda c: x * coef[0, c] + y * coef[1, c] + coef[2, c])


def _largest_object(diff: np.ndarray) -> tuple[np.ndarray, int]:
    """Mask [n, n] uint8 of the largest object and the number of objects (>= 40 px each)."""
    mask = cv2.morphologyEx((diff > 40).astype(np.uint8), cv2.MORPH_OPEN, _ellipse(3))
    _, lab, area = _components(mask, 8)
    keep = [i + 1 for i, a in enumerate(area[1:]) if a >= 40]
    if not keep:
        raise ValueError("grasp image: no object found (nothing differs from the table colour)")
    target = max(keep, key=lambda i: area[i])
    return (lab == target).astype(np.uint8), len(keep)


def grasp_features(image: np.ndarray, joints_rad: np.ndarray | None, px_per_m: float,
                   n_joints: int) -> dict[str, float]:
    """Engineered features of the largest object on the pick table [n, n, 3] uint8 + joints.
    Orthographic top-down camera: the image centre is the table frame's origin, x = +u, y = -v,
    `px_per_m` pixels per metre."""
    img = image.astype(np.float32)
    n = img.shape[0]
    diff = _table_difference(img)
    obj, n_objects = _largest_object(diff)
    xx, yy = _plane_grids(n)[:2]
    region = cv2.dilate(obj, _ellipse(5)) > 0
    contrast = float(np.median(diff[obj > 0]))
    w = np.where(region, np.clip(diff / max(contrast, 1.0), 0.0, 1.0), 0.0)  # soft coverage
    m00 = float(w.sum())
    cu, cv_ = float((w * (xx + 0.5)).sum() / m00), float((w * (yy + 0.5)).sum() / m00)
    du, dv = xx + 0.5 - cu, yy + 0.5 - cv_
    mu20, mu02, mu11 = (w * du * du).sum() / m00, (w * dv * dv).sum() / m00, (w * du * dv).sum() / m00
    # image v points down: the axis angle in the table frame (y up) flips sign
    axis_img = 0.5 * math.atan2(2 * mu11, mu20 - mu02)
    common = math.sqrt(max(((mu20 - mu02) / 2) ** 2 + mu11 ** 2, 0.0))
    l1, l2 = (mu20 + mu02) / 2 + common, (mu20 + mu02) / 2 - common
    contours, _ = cv2.findContours(obj, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    outer = max(contours, key=cv2.contourArea).reshape(-1, 2).astype(np.float32)
    ca, sa = math.cos(axis_img), math.sin(axis_img)
    rel = outer + 0.5 - np.array([cu, cv_], np.float32)
    minor_px = float(np.ptp(rel @ np.array([-sa, ca], np.float32))) - 0.5
    major_px = float(np.ptp(rel @ np.array([ca, sa], np.float32))) - 0.5
    (_, _), (rw, rh), _ = cv2.minAreaRect(outer)
    hull = cv2.contourArea(cv2.convexHull(outer))
    f = {"n_objects": n_objects, "x": (cu - n / 2) / px_per_m, "y": (n / 2 - cv_) / px_per_m,
         "axis": wrap_half_pi(-axis_img), "aspect": math.sqrt(max(l1, 1e-9) / max(l2, 1e-9)),
         "minor_m": minor_px / px_per_m, "major_m": major_px / px_per_m,
         "area_m2": m00 / px_per_m ** 2, "rect_fill": m00 / max(rw * rh, 1.0),
         "solidity": cv2.contourArea(outer) / max(hull, 1.0)}
    f.update(_joint_features(joints_rad, n_joints))
    return f


def _joint_features(joints_rad: np.ndarray | None, n_joints: int) -> dict[str, float]:
    joints = np.zeros(n_joints) if joints_rad is None else np.asarray(joints_rad, np.float64).reshape(-1)
    if joints.shape[0] != n_joints or not np.all(np.isfinite(joints)):
        raise ValueError(f"joints_rad must be {n_joints} finite values, got {joints.tolist()}")
    return {f"joint{i}": float((joints[i] + math.pi) % (2 * math.pi) - math.pi) for i in range(n_joints)}


def wrap_half_pi(angle_rad: float) -> float:
    """Wrap an axis angle (pi-periodic) to [-pi/2, pi/2)."""
    return (angle_rad + math.pi / 2) % math.pi - math.pi / 2


def bin_feature(value: float, spec: dict) -> int:
    low, high, size = spec["low"], spec["high"], spec["size"]
    if spec.get("scale") == "log":
        value, low, high = math.log(max(value, low)), math.log(low), math.log(high)
    if not math.isfinite(value):
        raise ValueError(f"feature {spec['name']!r} is not finite: {value}")
    b = int(math.floor((value - low) / (high - low) * size))
    return spec["offset"] + min(max(b, 0), size - 1)


class ObservationTokenizer:
    """Image (+ joints) -> prefix ids [BOS, static..., f_1 .. f_n, SEP] (int64), n fixed per bundle.

    Everything comes from the bundle: the feature set and bins (`observation`), the camera
    calibration (`observation.camera.px_per_m`: orthographic, image centre = the task frame's
    origin), the tokens that never change between frames (`observation.static_prefix`, placed first
    so their KV cache is reused across frames) and the special ids (`vocab.bos`, `vocab.sep`)."""

    def __init__(self, config: dict[str, Any], bos: int, sep: int):
        if config.get("kind") not in KINDS or config.get("task") not in ("qc", "grasp"):
            raise ValueError(f"observation config: unsupported kind/task "
                             f"{config.get('kind')!r}/{config.get('task')!r}")
        self.config = config
        self.version = KINDS[config["kind"]]
        self.task = config["task"]
        self.image_px = int(config["image_px"])
        self.features = list(config["features"])
        known = {s[0] for s in (QC_FEATURES if self.task == "qc" else GRASP_FEATURES)}
        known |= set(QC_LEGACY_FEATURES if self.task == "qc" else ())
        for spec in self.features:
            if spec["name"] not in known:
                raise ValueError(f"observation config: unknown {self.task} feature {spec['name']!r}")
        self.px_per_m = float(config.get("camera", {}).get("px_per_m", 0.0))
        if self.task == "grasp" and not self.px_per_m > 0:
            raise ValueError(f"observation config: camera.px_per_m must be positive, got {config.get('camera')!r}")
        self.n_joints = sum(1 for spec in self.features if spec["name"].startswith("joint"))
        self.head = [int(bos)] + [int(t) for t in config.get("static_prefix", ())]
        self.sep = int(sep)
        self.prefix_len = len(self.head) + len(self.features) + 1

    @classmethod
    def from_bundle(cls, bundle) -> ObservationTokenizer:
        m = bundle.manifest
        return cls(m.observation, m.vocab.bos, m.vocab.sep)

    def measure(self, image_rgb: np.ndarray, joints_rad: np.ndarray | None = None) -> dict[str, float]:
        img = square_resize(image_rgb, self.image_px)
        if self.task == "qc":
            return qc_features(img, self.version)
        return grasp_features(img, joints_rad, self.px_per_m, self.n_joints)

    def tokens_from_features(self, f: dict[str, float]) -> np.ndarray:
        ids = self.head + [bin_feature(float(f[s["name"]]), s) for s in self.features] + [self.sep]
        return np.asarray(ids, np.int64)

    def encode(self, image_rgb: np.ndarray, joints_rad: np.ndarray | None = None) -> np.ndarray:
        return self.tokens_from_features(self.measure(image_rgb, joints_rad))
