"""`sol-control train` (QC) and `sol-control eval --folder`: a labelled folder rendered by the QC
scene generator (tasks.qc, the scenes `sol-control eval` scores), a short fine-tune of the shipped
target through the whole pipeline, the bundle and report it writes, and the errors for bad input."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from sol_control.bundle import Bundle
from sol_control.cli import main as cli
from sol_control.eval import evaluate
from sol_control.tasks import qc
from sol_control.tasks import labelled_folder as F
from sol_control.train.report import quantized_verdict

CLASSES = ("ok", "scratch", "crack")
PER_CLASS = 8  # = folder.MIN_PER_CLASS
PAD_PX = 16  # one image padded with belt rows to 128 x 160: perception crops it back to the square


def _save(path: Path, rgb: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def render_folder(root: Path, classes=CLASSES, per_class: int = PER_CLASS, split: str = "test") -> list[str]:
    """good/ and defect/<kind>/ PNGs of generated scenes, positions.csv for every defect (image
    coordinates; the first scratch padded, its position moved with the padding). CSV rows."""
    count, rows = dict.fromkeys(classes, 0), ["file,u,v"]
    for i in range(2000):
        s = qc.make_sample(split, i)
        c = s.label["defect"]
        if c not in count or count[c] >= per_class:
            continue
        rel = f"good/{i:04d}.png" if c == "ok" else f"defect/{c}/{i:04d}.png"
        image, v = s.image, s.label["v"]
        if c == "scratch" and count[c] == 0:
            image = np.concatenate([np.repeat(s.image[:1], PAD_PX, 0), s.image, np.repeat(s.image[-1:], PAD_PX, 0)])
            v = (v * 128 + PAD_PX) / image.shape[0]
        _save(root / rel, image)
        if c != "ok":
            rows.append(f"{rel},{s.label['u']:.5f},{v:.5f}")
        count[c] += 1
        if min(count.values()) >= per_class:
            break
    assert min(count.values()) == per_class, count
    (root / F.POSITIONS).write_text("\n".join(rows) + "\n")
    return rows[1:]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("parts")
    return root, render_folder(root)


@pytest.fixture(scope="module")
def trained(labelled, tmp_path_factory) -> tuple[Path, int]:
    folder, _ = labelled
    out = tmp_path_factory.mktemp("bundles") / "my_qc"
    code = cli(["train", "--folder", str(folder), "--out", str(out), "--epochs", "2", "--heads-steps", "20",
                "--decisions", "3"])
    return out, code


@pytest.mark.slow  # trains a bundle (module fixture, ~30 s)
def test_train_writes_a_verified_bundle_and_its_report(labelled, trained):
    folder, rows = labelled
    out, code = trained
    assert code == 0
    m = Bundle.load(out).manifest  # every sha256 checked
    assert set(m.target.fused) == {"fp32", "int8", "int4"} and m.target.draft_heads == 3 and m.target.guesses
    assert m.actions[0].labels == ("ok", "scratch", "crack", "missing_hole", "discoloration", "deformed")
    report = json.loads((out / "train_report.json").read_text())
    assert report["verdict"] == "ok" and report["task"] == "qc"
    assert report["data"]["images"] == len(CLASSES) * PER_CLASS and report["data"]["with_position"] == len(rows)
    assert report["data"]["validation"] == len(CLASSES) * round(0.2 * PER_CLASS)
    for p in ("fp32", "int8", "int4", "int8+heads"):
        row = report["validation"][p]
        assert 0.0 <= row["accuracy"] <= 1.0 and row["n"] == report["data"]["validation"]
        assert sum(map(sum, row["confusion"]["counts"])) == row["n"]
    assert report["validation"]["int8+heads"]["acceptance"] is not None
    assert report["before"]["n"] == report["data"]["validation"]  # the shipped fp32 on the same images
    assert report["export"]["fp32_graph_vs_trained"]["answers"] == report["data"]["validation"]
    assert report["quantized"]["int8"]["reason"].startswith("written, not judged")  # < 100 validation images
    fast = report["fast_path"]
    assert fast["path"] == "fast" and fast["precision"] == "int8" and fast["speculation"] == "heads"
    assert 0 < fast["decision_ms_p50"] < 1000 and report["timing"]["total_s"] > 0
    assert report["training"]["epochs"] == 2 and len(report["training"]["history"]) == 2
    assert (out / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| int4 |" in (out / "train_report.md").read_text()
    assert (out.parent / "my_qc.work" / "checkpoint.pt").is_file()
    assert not list(out.parent.glob(".my_qc.*"))  # no temp folder left


@pytest.mark.slow  # trains a bundle (module fixture, ~30 s)
def test_eval_scores_the_bundle_on_a_folder(labelled, trained, capsys):
    folder, rows = labelled
    out, _ = trained
    rep = evaluate(out, folder=folder, precisions=("fp32", "int4"), quiet=True)
    assert rep["n"] == len(CLASSES) * PER_CLASS and set(rep["precisions"]) >= {"fp32", "int4", "int4+heads"}
    conf = rep["precisions"]["fp32"]["confusion"]
    assert conf["rows"] == ["ok", "crack", "scratch"] and conf["cols"][-1] == "none"  # ok, then kinds by name
    assert [sum(r) for r in conf["counts"]] == [PER_CLASS] * len(CLASSES)
    correct = sum(conf["counts"][i][conf["cols"].index(c)] for i, c in enumerate(conf["rows"]))
    assert rep["precisions"]["fp32"]["accuracy"] == pytest.approx(correct / rep["n"])
    loc = rep["precisions"]["fp32"]["location_err_p50"]
    assert loc is not None and loc < 0.2  # the shipped target already finds scratches and cracks
    assert cli(["eval", "--bundle", str(out), "--folder", str(folder), "--precisions", "int8"]) == 0
    assert "true class (rows)" in capsys.readouterr().out


def _small_folder(root: Path, labelled: tuple[Path, list[str]]) -> Path:
    """ok and scratch images of the rendered folder (no positions)."""
    src, _ = labelled
    for rel in ("good", "defect/scratch"):
        shutil.copytree(src / rel, root / rel)
    return root


def _empty_class(root: Path) -> None:
    (root / "defect" / "crack").mkdir()


def _unknown_class(root: Path) -> None:
    shutil.copytree(root / "defect" / "scratch", root / "defect" / "dent")


def _tiny_image(root: Path) -> None:
    _save(root / "good" / "tiny.png", np.full((40, 40, 3), 128, np.uint8))


def _unreadable_image(root: Path) -> None:
    (root / "good" / "broken.png").write_bytes(b"not a png")


def _missing_file_row(root: Path) -> None:
    (root / F.POSITIONS).write_text("file,u,v\ndefect/scratch/nowhere.png,0.5,0.5\n")


def _too_few(root: Path) -> None:
    for p in sorted((root / "good").glob("*.png"))[:2]:
        p.unlink()


BAD = {
    "empty class": (_empty_class, "defect/crack/ holds no PNG or JPEG images (an empty class)"),
    "unknown class": (_unknown_class, "defect/dent/ is not one of the bundle's defect classes"),
    "tiny image": (_tiny_image, "good/tiny.png (40x40 pixels, smaller than 64 px on a side)"),
    "unreadable image": (_unreadable_image, "good/broken.png (not a readable PNG/JPEG)"),
    "CSV row for a missing file": (_missing_file_row, "line 2: no image 'defect/scratch/nowhere.png'"),
    "too few images": (_too_few, "good/ holds 6 images; training needs at least 8 per class"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_named_and_leaves_no_bundle(case, labelled, tmp_path, capsys):
    spoil, message = BAD[case]
    folder = _small_folder(tmp_path / "parts", labelled)
    spoil(folder)
    out = tmp_path / "bundle"
    assert cli(["train", "--folder", str(folder), "--out", str(out), "--epochs", "1"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".bundle.*"))


def test_an_existing_bundle_is_replaced_only_when_asked(labelled, tmp_path):
    from sol_control.train.config import TrainConfig

    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="b exists; pick another folder or pass --overwrite"):
        TrainConfig(folder=labelled[0], out=tmp_path / "b")
    assert TrainConfig(folder=labelled[0], out=tmp_path / "b", overwrite=True).overwrite


def test_new_classes_need_from_scratch_which_takes_them_from_the_folders(labelled, tmp_path):
    from sol_control.train.config import TrainConfig
    from sol_control.train.pipeline import bundle_layout

    folder = _small_folder(tmp_path / "parts", labelled)
    _unknown_class(folder)
    labelled_folder = F.read_folder(folder)
    start = Bundle.load(Path(__file__).resolve().parents[1] / "models" / "qc", verify=False)
    cfg = TrainConfig(folder=folder, out=tmp_path / "b", from_scratch=True)
    lay = bundle_layout(cfg, start, labelled_folder)
    assert lay["actions"][0]["labels"] == ["ok", "dent", "scratch"]
    assert lay["vocab"]["action"][1] - lay["vocab"]["action"][0] == 3 + 256


def test_quantized_graph_refused_below_fp32_by_half_a_point_and_two_images():
    fp32 = {"accuracy": 0.990}
    assert quantized_verdict(fp32, {"accuracy": 0.985}, 200)[0]  # 1 image, 0.5 points: kept
    keep, why = quantized_verdict(fp32, {"accuracy": 0.980}, 200)  # 2 images, 1.0 point
    assert not keep and why.startswith("refused") and "1.0 points (2 of 200 images) below fp32" in why
    assert quantized_verdict(fp32, {"accuracy": 0.986}, 500)[0]  # 2 images but 0.4 points: kept
    keep, why = quantized_verdict(fp32, {"accuracy": 0.90}, 50)  # too few images to judge
    assert keep and "not judged" in why


def test_refused_graph_is_not_written(tmp_path):
    from sol_control.train.layout import FUSED
    from sol_control.train.write import check_quantized

    for name in FUSED.values():
        (tmp_path / name).write_bytes(b"graph")
    rows = {"fp32": {"accuracy": 0.99}, "int8": {"accuracy": 0.95}, "int4": {"accuracy": 0.99},
            "int8+heads": {"accuracy": 0.95}}
    verdicts = check_quantized(rows, 200, tmp_path)
    assert not verdicts["int8"]["written"] and verdicts["int4"]["written"]
    assert not (tmp_path / FUSED["int8"]).exists() and (tmp_path / FUSED["int4"]).exists()
    assert rows["int8+heads"]["refused"] and "refused" not in rows["int4"]


def test_validation_split_is_stratified_and_seeded():
    classes = ["ok"] * 50 + ["scratch"] * 10 + ["crack"] * 3
    train, val = F.stratified_split(classes, 0.2, seed=3)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(classes)))
    assert [sum(classes[i] == c for i in val) for c in ("ok", "scratch", "crack")] == [10, 2, 1]
    assert np.array_equal(val, F.stratified_split(classes, 0.2, seed=3)[1])
    assert not np.array_equal(val, F.stratified_split(classes, 0.2, seed=4)[1])


@pytest.mark.slow  # imports torch and transformers (~5 s on 2 cores)
def test_unknown_answer_tokens_are_filled_within_their_fields():
    from sol_control.train.data import UNKNOWN, action_targets, known_tokens
    from sol_control.train.layout import action_tokenizer
    from sol_control.train.model import make_model

    acts = action_tokenizer("qc")
    nan = math.nan
    labels = [{"defect": "ok", "u": nan, "v": nan, "severity": nan},
              {"defect": "crack", "u": 0.25, "v": 0.75, "severity": nan},
              {"defect": "scratch", "u": nan, "v": nan, "severity": nan}]
    c0, bins = acts.field_range(0)[0], acts.field_range(1)[0]
    known = known_tokens(labels, acts, fill_unknown=False)
    assert known.tolist() == [[c0, UNKNOWN, UNKNOWN, UNKNOWN], [c0 + 2, bins + 64, bins + 192, UNKNOWN],
                              [c0 + 1, UNKNOWN, UNKNOWN, UNKNOWN]]
    scratch = known_tokens(labels, acts, fill_unknown=True)  # the generator's conventions
    assert scratch.tolist() == [[c0, bins + 128, bins + 128, bins], [c0 + 2, bins + 64, bins + 192, bins + 128],
                                [c0 + 1, bins + 128, bins + 128, bins + 128]]
    model = make_model("qc", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16))
    prefix = np.random.default_rng(0).integers(4, 675, (3, 23))
    filled = action_targets(labels, prefix, acts, model)
    assert np.array_equal(filled[known != UNKNOWN], known[known != UNKNOWN])
    for j in range(4):
        lo, hi = acts.field_range(j)
        assert ((filled[:, j] >= lo) & (filled[:, j] < hi)).all()


def test_positions_move_into_the_square_perception_keeps():
    assert F.in_square(0.5, 0.5, 200, 100) == (0.5, 0.5)
    assert F.in_square(0.25, 0.1, 200, 100) == pytest.approx(((50 - 50) / 100, 0.1))
    u, v = F.in_square(math.nan, math.nan, 200, 100)
    assert math.isnan(u) and math.isnan(v)


@pytest.mark.slow  # imports torch and transformers (~5 s on 2 cores)
def test_a_run_goes_on_from_its_checkpoint_as_if_it_had_not_stopped(tmp_path):
    import torch

    from sol_control.train.heads import Heads
    from sol_control.train.loop import Trainer, load_checkpoint, save_checkpoint
    from sol_control.train.model import make_model

    arch = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16)
    rng = np.random.default_rng(0)
    data = {"prefix": rng.integers(4, 600, (20, 23)), "actions": np.stack([rng.integers(675, 681, 20)] +
                                                                          [rng.integers(681, 937, 20)] * 3, 1)}

    def trainer():
        model = make_model("qc", arch)
        return Trainer(model, data, 4, 3e-3, 8, Heads(model.lm_head.weight.detach().numpy()[675:937], 2), 0.5, 675)

    straight, resumed = trainer(), trainer()
    straight.next()
    save_checkpoint(straight, tmp_path / "c.pt")
    load_checkpoint(resumed, tmp_path / "c.pt")
    assert resumed.step == 1
    assert straight.next() == resumed.next()
    for a, b in zip(straight.params, resumed.params):
        assert torch.equal(a, b)
