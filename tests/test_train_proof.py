"""The proof a user wants, small: a part family the shipped QC policy never saw (hexnut), its accuracy
before, `sol-control train` on a few images of it, and the new bundle's accuracy on unseen images of
the same family (docs/TRAINING.md, "A part family it never saw", has the full-size run)."""
import json

import pytest

from sol_control.cli import main
from sol_control.tasks.parts import write_folder
from tests.conftest import MODELS

pytestmark = pytest.mark.slow  # trains a bundle (~1 min on 2 cores)

FAMILY = "hexnut"


def _accuracy(bundle, folder, out) -> dict:
    assert main(["eval", "--bundle", str(bundle), "--folder", str(folder), "--precisions", "fp32,int8",
                 "--json", str(out)]) == 0
    return json.loads(out.read_text())["precisions"]


def test_training_on_a_new_family_makes_its_unseen_images_right(tmp_path):
    write_folder(tmp_path / "train", "train", 240, FAMILY)
    write_folder(tmp_path / "unseen", "test", 120, FAMILY)  # other seeds: never trained on
    before = _accuracy(MODELS / "qc", tmp_path / "unseen", tmp_path / "before.json")
    assert main(["train", "--folder", str(tmp_path / "train"), "--out", str(tmp_path / "mine"),
                 "--epochs", "12", "--heads-steps", "100", "--decisions", "5"]) == 0
    after = _accuracy(tmp_path / "mine", tmp_path / "unseen", tmp_path / "after.json")
    assert before["fp32"]["false_reject_rate"] > 0.2  # the shipped policy rejects good hex nuts ...
    for p in ("fp32", "int8"):  # ... the trained one passes them and still catches the defects
        assert after[p]["accuracy"] >= 0.95, (p, after[p])
        assert after[p]["defect_recall"] >= 0.95, (p, after[p])
        assert after[p]["false_reject_rate"] <= 0.05, (p, after[p])
        assert after[p]["accuracy"] >= before["fp32"]["accuracy"] + 0.04
