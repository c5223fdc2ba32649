"""`sol-control train --mcap BAG --labels CSV`: a recorded line's QC frames, labelled by stamp."""
from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from sol_control.sim.record import BagRecorder
from sol_control.tasks import qc
from sol_control.tasks.labelled_folder import read_folder
from sol_control.train.config import TrainConfig
from sol_control.train.mcap import QC_CAMERA, frames_to_folder, read_labels
from sol_control.train.pipeline import recorded_frames
from sol_control.train.run import Log

STORE = get_typestore(Stores.LATEST)
T0 = 1_700_000_000_000_000_000


def _image_cdr(rgb: np.ndarray, stamp_ns: int) -> bytes:
    t = STORE.types
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9,
                                                                               nanosec=stamp_ns % 10**9),
                                      frame_id="qc_camera")
    msg = t["sensor_msgs/msg/Image"](header=header, height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8",
                                     is_bigendian=0, step=rgb.shape[1] * 3, data=rgb.reshape(-1).copy())
    return bytes(STORE.serialize_cdr(msg, "sensor_msgs/msg/Image"))


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> tuple[Path, list]:
    """A rosbag2 MCAP of 12 QC camera frames (stamps 40 ms apart) and their true labels."""
    bag = tmp_path_factory.mktemp("rec") / "bag"
    rec, truth = BagRecorder(bag), []
    for i in range(12):
        s, stamp = qc.make_sample("test", i), T0 + i * 40_000_000
        rec.write(QC_CAMERA, "sensor_msgs/msg/Image", stamp, _image_cdr(s.image, stamp))
        truth.append((stamp, s))
    rec.close()
    return bag, truth


def _labels(path: Path, truth, keep=lambda i: True, extra: str = "") -> Path:
    rows = ["stamp_ns,label,u,v"] + [f"{stamp},{s.label['defect']},{s.label['u']:.4f},{s.label['v']:.4f}"
                                     for i, (stamp, s) in enumerate(truth) if keep(i)]
    path.write_text("\n".join(rows) + "\n" + extra)
    return path


def test_labelled_frames_become_the_folder_train_reads(recording, tmp_path):
    bag, truth = recording
    labels = _labels(tmp_path / "labels.csv", truth, keep=lambda i: i != 5)  # frame 5: not labelled
    counts = frames_to_folder(bag, labels, tmp_path / "frames")
    assert counts == {"frames": 12, "labelled": 11, "unlabelled": 1}
    folder = read_folder(tmp_path / "frames")
    by_stamp = {int(Path(i.rel).stem): i for i in folder.items}
    assert set(by_stamp) == {stamp for i, (stamp, _) in enumerate(truth) if i != 5}
    for stamp, s in truth:
        if stamp in by_stamp:
            item = by_stamp[stamp]
            assert item.label == s.label["defect"]
            assert np.array_equal(qc.make_sample("test", (stamp - T0) // 40_000_000).image,
                                  __import__("cv2").imread(str(item.path))[..., ::-1])
            if item.label != "ok":
                assert item.u == pytest.approx(s.label["u"], abs=1e-4)


@pytest.mark.parametrize("text, match", [
    ("stamp,label\n1,ok\n", "header stamp_ns,label"),
    ("stamp_ns,label\n12.5,ok\n", "whole number"),
    ("stamp_ns,label\n1,\n", "no label"),
    ("stamp_ns,label,u,v\n1,crack,left,0.2\n", "u must be a number"),
    ("stamp_ns,label\n1,ok\n1,crack\n", "labelled twice"),
    ("stamp_ns,label\n", "no labels"),
])
def test_bad_label_files_are_named(tmp_path, text, match):
    (tmp_path / "l.csv").write_text(text)
    with pytest.raises(ValueError, match=match):
        read_labels(tmp_path / "l.csv")


def test_a_label_without_its_frame_and_a_missing_topic_are_errors(recording, tmp_path):
    bag, truth = recording
    labels = _labels(tmp_path / "labels.csv", truth, extra=f"{T0 + 7},ok\n")
    with pytest.raises(ValueError, match="1 labelled stamps have no frame"):
        frames_to_folder(bag, labels, tmp_path / "f1")
    with pytest.raises(ValueError, match="no topic 'pick/camera/image_raw'.*--topic"):
        frames_to_folder(bag, _labels(tmp_path / "ok.csv", truth), tmp_path / "f2", topic="pick/camera/image_raw")


def test_the_train_command_takes_a_recording_once_and_keeps_its_frames(recording, tmp_path):
    bag, truth = recording
    labels = _labels(tmp_path / "labels.csv", truth)
    with pytest.raises(ValueError, match="needs --labels"):
        TrainConfig(mcap=bag, out=tmp_path / "b")
    with pytest.raises(ValueError, match="one of the two"):
        TrainConfig(folder=tmp_path, mcap=bag, labels=labels, out=tmp_path / "b")
    cfg = TrainConfig(mcap=bag, labels=labels, out=tmp_path / "bundle")
    got = recorded_frames(cfg, Log())
    assert got.folder == cfg.work_dir / "frames" and len(read_folder(got.folder).items) == 12
    first = (got.folder / "good").stat().st_mtime_ns if (got.folder / "good").exists() else None
    again = recorded_frames(cfg, Log())  # the same recording: the frames are kept (a run can resume)
    assert again.folder == got.folder
    assert first is None or (got.folder / "good").stat().st_mtime_ns == first


def test_a_missing_recording_or_label_file_is_named(recording, tmp_path):
    bag, truth = recording
    labels = _labels(tmp_path / "labels.csv", truth)
    with pytest.raises(ValueError, match="not a rosbag2 folder"):
        recorded_frames(TrainConfig(mcap=tmp_path / "nope", labels=labels, out=tmp_path / "b"), Log())
    with pytest.raises(ValueError, match="no such file"):
        recorded_frames(TrainConfig(mcap=bag, labels=tmp_path / "none.csv", out=tmp_path / "b"), Log())
