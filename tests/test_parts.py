"""Generated part families no bundle was trained on, and `sol-control parts` (a labelled folder of them)."""
import numpy as np
import pytest

from sol_control.cli import main
from sol_control.perception import qc_features
from sol_control.tasks import qc
from sol_control.tasks.common import NOVEL_FAMILIES, QC_PART_FAMILIES
from sol_control.tasks.labelled_folder import read_folder
from sol_control.tasks.parts import write_folder


def test_the_novel_split_draws_only_novel_families_and_a_family_can_be_forced():
    assert not set(NOVEL_FAMILIES) & set(QC_PART_FAMILIES)
    assert {qc.make_sample("novel", i).spec.family for i in range(12)} == set(NOVEL_FAMILIES)
    assert {qc.make_sample("test", i, "hexnut").spec.family for i in range(5)} == {"hexnut"}
    assert {qc.make_sample("train", i).spec.family for i in range(12)} == set(QC_PART_FAMILIES)


@pytest.mark.parametrize("family, holes", [("hexnut", 1), ("tab", 3)])
def test_novel_families_are_measured_like_the_trained_ones(family, holes):
    s = next(s for s in (qc.make_sample("test", i, family) for i in range(50)) if s.label["defect"] == "ok")
    f = qc_features(s.image)
    assert f["holes"] == holes
    gone = next(s for s in (qc.make_sample("test", i, family) for i in range(200))
                if s.label["defect"] == "missing_hole")
    assert qc_features(gone.image)["holes"] == holes - 1


def test_parts_writes_a_folder_train_and_eval_read(tmp_path, capsys):
    out = tmp_path / "hexnut"
    assert main(["parts", "--family", "hexnut", "--split", "test", "--n", "24", "--out", str(out)]) == 0
    assert "24 images" in capsys.readouterr().out
    folder = read_folder(out)
    truth = [qc.make_sample("test", i, "hexnut").label for i in range(24)]
    assert sorted(i.label for i in folder.items) == sorted(t["defect"] for t in truth)
    defects = [t for t in truth if t["defect"] != "ok"]
    located = [i for i in folder.items if i.label != "ok"]
    assert len(located) == len(defects) and all(np.isfinite([i.u, i.v]).all() for i in located)
    assert main(["parts", "--n", "3", "--out", str(out)]) == 2  # never over an existing folder
    assert "exists" in capsys.readouterr().out


def test_write_folder_counts_every_class(tmp_path):
    count = write_folder(tmp_path / "p", "train", 30, "tab", start=100)
    assert sum(count.values()) == 30 and len(list((tmp_path / "p").rglob("*.png"))) == 30


def test_the_grasp_novel_split_is_wedges_the_teacher_and_perception_agree_on():
    import math

    from sol_control.perception import grasp_features
    from sol_control.tasks import grasp
    from sol_control.tasks.common import GRASP_PX_PER_M, N_ARM_JOINTS

    for i in range(6):
        s = grasp.make_sample("novel", i)
        assert {o.shape for o in s.scene.objects} == {"wedge"}
        f = grasp_features(s.image, s.joints_rad, GRASP_PX_PER_M, N_ARM_JOINTS)
        assert math.hypot(f["x"] - s.label["x"], f["y"] - s.label["y"]) < 0.003
        assert abs((f["axis"] - s.label["yaw"] + math.pi / 2) % math.pi - math.pi / 2) < math.radians(5)
