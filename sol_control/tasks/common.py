"""Cell geometry and label vocabulary shared by the task generators, the perception stage and the
simulator. Change a constant here and every consumer (generators, sim, bundles) follows.

Frames (both cameras are top-down orthographic, image row 0 at the top):
- QC camera: image centre = origin of the belt frame, +x along the belt = image +u, +y = image -v.
- Grasp camera: image centre = origin of frame `pick_table`, x right = +u, y up = -v, z up from the
  table surface. Metres everywhere.
"""
from __future__ import annotations

import math

import numpy as np

# --- QC station ---------------------------------------------------------------------------------
QC_IMAGE_PX = 128  # square RGB image
QC_FOV_M = 0.20  # metres of belt covered by the image side
QC_PX_PER_M = QC_IMAGE_PX / QC_FOV_M  # 640 px/m -> 1.5625 mm per pixel
BELT_RGB = (58, 62, 66)
QC_PART_SIZE_M = (0.040, 0.120)  # largest part extent, all splits
QC_PART_FAMILIES = ("plate", "ring", "bracket")
# families the shipped QC policy never saw: the `novel` split, and a user's own parts in the proof
# that `sol-control train` teaches them (docs/TRAINING.md)
NOVEL_FAMILIES = ("hexnut", "tab")
QC_DEFECTS = ("ok", "scratch", "crack", "missing_hole", "discoloration", "deformed")

# --- Pick station -------------------------------------------------------------------------------
GRASP_IMAGE_PX = 192
GRASP_FOV_M = 0.24
GRASP_PX_PER_M = GRASP_IMAGE_PX / GRASP_FOV_M  # 800 px/m -> 1.25 mm per pixel
TABLE_RGB = (205, 200, 190)
GRASP_SHAPES = ("box", "cylinder", "irregular")
# Object height per family (the camera is top-down, so the family fixes the height).
GRASP_HEIGHT_M = {"box": 0.050, "cylinder": 0.070, "irregular": 0.030, "wedge": 0.040}
NOVEL_GRASP_SHAPES = ("wedge",)  # the grasp `novel` split: a triangular prism no bundle is trained on
GRASP_WIDTH_MARGIN_M = 0.020  # gripper opening = object extent across the fingers + margin
GRASP_APPROACH_DZ_M = (0.12, 0.06, 0.02)  # approach waypoints a1..a3 above the grasp point
GRIPPER_MAX_WIDTH_M = 0.110
N_ARM_JOINTS = 6

# --- Action token fields (order = token order; ranges are the manifest defaults) -----------------
ACTION_BINS = 256
QC_FIELDS = ("defect", "u", "v", "severity")
GRASP_FIELDS = ("x", "y", "z", "yaw", "width", "force",
                "a1_x", "a1_y", "a1_z", "a2_x", "a2_y", "a2_z", "a3_x", "a3_y", "a3_z")
# name -> (unit, low, high, tolerance). 256 bins: x/y 1.0 mm, z 1.0 mm, yaw 0.70 deg, width 0.5 mm.
GRASP_RANGES = {
    "x": ("m", -0.128, 0.128, 0.003), "y": ("m", -0.128, 0.128, 0.003),
    "z": ("m", 0.0, 0.256, 0.003), "yaw": ("rad", -math.pi / 2, math.pi / 2, math.radians(5.0)),
    "width": ("m", 0.0, 0.128, 0.003), "force": ("N", 0.0, 64.0, 4.0),
}
# Fields whose token holds value - an observation feature: name -> (feature, low, high). Width is
# the measured extent across the fingers plus a margin of 0.5 mm bins, so an object wider than any in
# training still gets its width (absolute bins it never saw as a target could not be predicted).
GRASP_RELATIVE = {"width": ("minor_m", -0.064, 0.064)}
for _i in (1, 2, 3):
    GRASP_RANGES[f"a{_i}_x"] = ("m", -0.128, 0.128, 0.003)
    GRASP_RANGES[f"a{_i}_y"] = ("m", -0.128, 0.128, 0.003)
    GRASP_RANGES[f"a{_i}_z"] = ("m", 0.0, 0.256, 0.003)
QC_RANGES = {"u": ("", 0.0, 1.0, 0.1), "v": ("", 0.0, 1.0, 0.1), "severity": ("", 0.0, 1.0, 0.2)}

# novel: part families no bundle is trained on (NOVEL_FAMILIES), everything else as in training;
# reported once, never tuned to
SPLITS = ("train", "test", "heldout", "novel")


def grasp_m_to_px(x_m: float, y_m: float) -> tuple[float, float]:
    """pick_table metres -> grasp image pixel coordinates (u right, v down; pixel centres at +0.5)."""
    c = GRASP_IMAGE_PX / 2.0
    return c + x_m * GRASP_PX_PER_M, c - y_m * GRASP_PX_PER_M


def grasp_px_to_m(u_px: float, v_px: float) -> tuple[float, float]:
    c = GRASP_IMAGE_PX / 2.0
    return (u_px - c) / GRASP_PX_PER_M, (c - v_px) / GRASP_PX_PER_M


def qc_m_to_px(x_m: float, y_m: float) -> tuple[float, float]:
    c = QC_IMAGE_PX / 2.0
    return c + x_m * QC_PX_PER_M, c - y_m * QC_PX_PER_M


def value_to_bin(value: float, low: float, high: float, size: int = ACTION_BINS) -> int:
    """OpenVLA-style uniform bins: clip(floor((v - low) / (high - low) * size), 0, size - 1)."""
    b = int(math.floor((value - low) / (high - low) * size))
    return min(max(b, 0), size - 1)


def bin_to_value(b: int, low: float, high: float, size: int = ACTION_BINS) -> float:
    """Bin centre."""
    return low + (b + 0.5) * (high - low) / size


def split_seed(split: str, index: int) -> int:
    """Disjoint, deterministic seeds per split (train/test/heldout never share a scene)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return (SPLITS.index(split) + 1) * 10_000_000 + index


def rng_for(split: str, index: int) -> np.random.Generator:
    return np.random.default_rng(split_seed(split, index))


# --- Our bundles' observation layout (written into each manifest; the runtime reads it from there) --
BOS, EOS, SEP = 1, 2, 3
FIRST_OBS_TOKEN = 4


def feature_config(task: str) -> dict:
    """Default `observation` dict for a bundle manifest (token offsets assigned in order)."""
    from sol_control.perception import GRASP_FEATURES, QC_FEATURES

    specs = QC_FEATURES if task == "qc" else GRASP_FEATURES if task == "grasp" else None
    if specs is None:
        raise ValueError(f"task must be 'qc' or 'grasp', got {task!r}")
    feats, off = [], FIRST_OBS_TOKEN
    for name, size, low, high, scale in specs:
        feats.append({"name": name, "offset": off, "size": size, "low": low, "high": high, "scale": scale})
        off += size
    image_px, px_per_m = (QC_IMAGE_PX, QC_PX_PER_M) if task == "qc" else (GRASP_IMAGE_PX, GRASP_PX_PER_M)
    return {"kind": "binned_features/3", "task": task, "image_px": image_px, "features": feats,
            "camera": {"px_per_m": px_per_m, "projection": "orthographic"},
            "token_range": [FIRST_OBS_TOKEN, off], "prefix_len": len(feats) + 2}

