"""Bundles are verified before anything is loaded: sha256, sizes, safe paths, valid manifests."""
from __future__ import annotations

import json
import shutil

import pytest

from sol_control.bundle import Bundle, Manifest
from sol_control.cli import main as cli

from .conftest import FIXTURES


@pytest.fixture()
def copy(tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(FIXTURES / "tiny", dst)
    return dst


def _edit_manifest(root, edit):
    data = json.loads((root / "manifest.json").read_text())
    edit(data)
    (root / "manifest.json").write_text(json.dumps(data))


def test_fixture_bundle_verifies():
    b = Bundle.load(FIXTURES / "tiny")
    assert b.decoder_path("target", "fp32").is_file()
    assert isinstance(b.manifest, Manifest)


def test_corrupted_file_fails_sha256(copy):
    path = copy / "target_int8.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256 mismatch for 'target_int8.onnx'"):
        Bundle.load(copy)


def test_swapped_file_fails(copy):
    shutil.copy(copy / "draft_close.onnx", copy / "target_fp32.onnx")  # same size, other weights
    with pytest.raises(ValueError, match="target_fp32.onnx"):
        Bundle.load(copy)


def test_missing_and_truncated_files(copy):
    (copy / "target_int4.onnx").write_bytes(b"")
    with pytest.raises(ValueError, match="bytes, manifest says"):
        Bundle.load(copy)
    (copy / "target_int4.onnx").unlink()
    with pytest.raises(ValueError, match="missing file 'target_int4.onnx'"):
        Bundle.load(copy)


@pytest.mark.parametrize("name", ["../escape.onnx", "/etc/passwd", "~/x.onnx", "a/../../b.onnx"])
def test_paths_must_stay_inside_the_bundle(copy, name):
    def edit(d):
        d["files"][name] = d["files"]["target_fp32.onnx"]
        d["target"]["files"]["fp32"] = name

    _edit_manifest(copy, edit)
    with pytest.raises(ValueError, match="plain relative paths"):
        Bundle.load(copy)


def test_symlink_out_of_the_bundle_is_refused(copy, tmp_path):
    outside = tmp_path / "outside.onnx"
    shutil.move(copy / "target_fp32.onnx", outside)
    (copy / "target_fp32.onnx").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the bundle"):
        Bundle.load(copy)


def test_manifest_errors_name_the_field(copy):
    _edit_manifest(copy, lambda d: d.update(max_context=0))
    with pytest.raises(ValueError, match="max_context"):
        Bundle.load(copy)
    _edit_manifest(copy, lambda d: d.update(max_context=128, unexpected_key=1))
    with pytest.raises(ValueError, match="unexpected_key"):
        Bundle.load(copy)


def test_unlisted_decoder_file_is_refused(copy):
    _edit_manifest(copy, lambda d: d["target"]["files"].update(int8="not_listed.onnx"))
    with pytest.raises(ValueError, match="not listed in files"):
        Bundle.load(copy)


def test_cli_reports_a_bad_bundle_in_one_line(copy, capsys):
    (copy / "target_fp32.onnx").write_bytes(b"x" * (copy / "target_fp32.onnx").stat().st_size)
    assert cli(["bundle", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "sha256 mismatch" in err and "Traceback" not in err


def test_cli_describes_a_good_bundle(capsys):
    assert cli(["bundle", str(FIXTURES / "tiny")]) == 0
    out = capsys.readouterr().out
    assert "target fp32" in out and "match their sha256" in out


def test_a_plain_language_model_bundle_needs_no_task_fields(copy, tmp_path):
    """A generic bundle (task "lm"): no observation or action vocabulary, no parameter count, stop
    ids instead of one eos. It loads, its decoders open, and the decoding benchmark runs on it."""
    def edit(d):
        d["task"] = "lm"
        d["observation"], d["actions"] = {}, []
        for key in ("observation", "action"):
            d["vocab"].pop(key)
        d["vocab"]["stop_ids"] = [2, 5]
        d["target"].pop("params")
        d["draft"].pop("params")
    _edit_manifest(copy, edit)
    b = Bundle.load(copy)
    assert b.manifest.task == "lm" and b.manifest.vocab.stop_ids == (2, 5) and b.manifest.vocab.action is None
    from sol_control.decoding import greedy, open_decoder

    assert len(greedy(open_decoder(b, "target", "int4"), [1, 7, 9], 5).tokens) == 5
    out = tmp_path / "bench.json"
    assert cli(["bench", "decode", "--bundle", str(copy), "--decisions", "2", "--rounds", "1",
                "--new-tokens", "6", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["task"] == "lm" and rep["speculative_lossless"]


def test_manifest_task_names_and_stop_ids_are_checked(copy):
    for task, err in (("", "task"), ("../x", "task")):
        _edit_manifest(copy, lambda d: d.update(task=task))
        with pytest.raises(ValueError, match=err):
            Bundle.load(copy)
    _edit_manifest(copy, lambda d: d.update(task="lm") or d["vocab"].update(stop_ids=[9999]))
    with pytest.raises(ValueError, match="stop_ids"):
        Bundle.load(copy)
