"""Procedural QC and grasp generators: deterministic by seed, geometry and labels consistent."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sol_control.tasks import common, grasp, qc


@pytest.mark.parametrize("gen", [qc, grasp])
def test_same_seed_same_scene(gen):
    a, b = gen.make_sample("test", 7), gen.make_sample("test", 7)
    assert np.array_equal(a.image, b.image)
    assert a.label == b.label
    c = gen.make_sample("test", 8)
    assert not np.array_equal(a.image, c.image)


def test_splits_never_share_seeds():
    seeds = {s: {common.split_seed(s, i) for i in range(1000)} for s in common.SPLITS}
    assert not seeds["train"] & seeds["test"] and not seeds["test"] & seeds["heldout"]
    with pytest.raises(ValueError, match="split"):
        common.split_seed("val", 0)


def test_qc_images_and_labels():
    seen = set()
    for i in range(40):
        s = qc.make_sample("train", i)
        assert s.image.shape == (common.QC_IMAGE_PX, common.QC_IMAGE_PX, 3) and s.image.dtype == np.uint8
        assert s.label["defect"] in common.QC_DEFECTS
        assert 0.0 <= s.label["u"] <= 1.0 and 0.0 <= s.label["v"] <= 1.0
        assert (s.label["severity"] == 0.0) == (s.label["defect"] == "ok")
        seen.add(s.label["defect"])
    assert seen == set(common.QC_DEFECTS)


def test_render_part_holes_are_transparent():
    ring = qc.PartSpec("ring", 0.08, (200, 200, 200))
    rgba, side_m = qc.render_part(ring)
    n = rgba.shape[0]
    assert rgba.shape == (n, n, 4) and rgba.dtype == np.uint8 and side_m >= 0.08
    assert rgba[n // 2, n // 2, 3] == 0  # the ring's hole
    assert rgba[n // 2, int(n * 0.85), 3] == 255  # material between the radii
    disk, _ = qc.render_part(qc.PartSpec("ring", 0.08, (200, 200, 200), "missing_hole", 0.5, 3))
    assert disk[disk.shape[0] // 2, disk.shape[0] // 2, 3] == 255


def test_deformed_parts_change_proportions():
    ok_outer, _, _ = qc.part_geometry(qc.PartSpec("plate", 0.08, (200, 200, 200)))
    bad_outer, _, scale = qc.part_geometry(qc.PartSpec("plate", 0.08, (200, 200, 200), "deformed", 0.5, 11))
    ratio = lambda p: np.ptp(p[:, 0]) / np.ptp(p[:, 1])  # noqa: E731
    assert ratio(ok_outer) == pytest.approx(1.5)
    assert abs(ratio(bad_outer) / 1.5 - 1.0) > 0.15 and scale != (1.0, 1.0)


def test_grasp_teacher_picks_largest_and_labels_in_range():
    for i in range(25):
        s = grasp.make_sample("train", i)
        areas = [grasp.polygon_moments(o.footprint_m)[0] for o in s.scene.objects]
        assert s.target_index == int(np.argmax(areas))
        ob = s.scene.objects[s.target_index]
        lab = s.label
        for name, value in lab.items():
            unit, low, high, _ = common.GRASP_RANGES[name]
            assert low <= value < high, (name, value)
        assert math.hypot(lab["x"] - ob.x_m, lab["y"] - ob.y_m) < 1e-6  # footprint centred at its centroid
        assert lab["z"] == pytest.approx(common.GRASP_HEIGHT_M[ob.shape] / 2)
        assert lab["a1_z"] > lab["a2_z"] > lab["a3_z"] > lab["z"]
        assert lab["width"] <= common.GRIPPER_MAX_WIDTH_M
        if ob.shape == "cylinder":
            assert lab["yaw"] == 0.0


def test_heldout_differs_from_training_distribution():
    train_rgb = {qc.make_sample("train", i).spec.rgb for i in range(30)}
    held_rgb = {qc.make_sample("heldout", i).spec.rgb for i in range(30)}
    assert not train_rgb & held_rgb
    sizes = [qc.make_sample("heldout", i).spec.size_m for i in range(30)]
    assert all(s < 0.045 or s > 0.110 for s in sizes)


def test_bins_round_trip_within_half_a_bin():
    for v in np.linspace(-0.128, 0.1279, 50):
        b = common.value_to_bin(v, -0.128, 0.128)
        assert abs(common.bin_to_value(b, -0.128, 0.128) - v) <= 0.5 * 0.256 / 256 + 1e-12
    assert common.value_to_bin(5.0, 0, 1) == 255 and common.value_to_bin(-5.0, 0, 1) == 0
