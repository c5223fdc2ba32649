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
