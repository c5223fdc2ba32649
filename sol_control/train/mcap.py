"""`sol-control train --mcap BAG --labels CSV`: a recorded line's QC camera frames, labelled by their
stamp, as the labelled folder the rest of the run reads (torch-free; rosbags, no rclpy).

    BAG          a rosbag2 folder (MCAP or sqlite3): `ros2 bag record`, or `sol-control demo --record`
    CSV          stamp_ns,label[,u,v]: the image header's stamp in nanoseconds, "ok" (or "good") or a
                 defect kind, and optionally where the defect is (0..1, u right, v down)

Frames whose stamp has no label are left out (counted); a label whose stamp has no frame is an
error. The folder is written under the run's work dir (frames/), one PNG per labelled frame.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import cv2

from sol_control.tasks.labelled_folder import POSITIONS

QC_CAMERA = "qc/camera/image_raw"
MAX_LISTED = 5


def _number(text: str, what: str, row: int, path: Path) -> float:
    try:
        return float(text) if text.strip() else math.nan
    except ValueError:
        raise ValueError(f"{path}: row {row}: {what} must be a number, got {text!r}") from None


def read_labels(path: Path) -> dict[int, tuple[str, float, float]]:
    """stamp_ns -> (label, u, v); ValueError naming the row for anything malformed."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or [c.strip() for c in rows[0][:2]] != ["stamp_ns", "label"]:
        raise ValueError(f"{path}: the first row must be the header stamp_ns,label[,u,v]")
    out: dict[int, tuple[str, float, float]] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if not row[0].strip().isdigit():
            raise ValueError(f"{path}: row {n}: stamp_ns must be a whole number of nanoseconds, got {row[0]!r}")
        label = row[1].strip() if len(row) > 1 else ""
        if not label:
            raise ValueError(f"{path}: row {n}: no label")
        u, v = (_number(row[i], "uv"[i - 2], n, path) if len(row) > i else math.nan for i in (2, 3))
        stamp = int(row[0])
        if stamp in out:
            raise ValueError(f"{path}: row {n}: stamp {stamp} is labelled twice")
        out[stamp] = ("ok" if label == "good" else label, u, v)
    if not out:
        raise ValueError(f"{path}: no labels")
    return out


def _frames(bag: Path, topic: str):
    """(stamp_ns, rgb image) of every image on `topic`."""
    from rosbags.rosbag2 import Reader
    from rosbags.typesys import Stores, get_typestore

    from sol_control.sim.replay import deserialize_cdr, image_rgb

    store = get_typestore(Stores.LATEST)
    with Reader(bag) as reader:
        conns = [c for c in reader.connections if c.topic.lstrip("/") == topic.lstrip("/")]
        if not conns:
            topics = sorted({c.topic for c in reader.connections})
            raise ValueError(f"bag {bag}: no topic {topic!r} (it has {', '.join(topics) or 'none'}); "
                             f"pass the QC camera's topic with --topic")
        for conn, _, raw in reader.messages(connections=conns):
            msg = deserialize_cdr(store, raw, conn.msgtype)
            yield int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec), image_rgb(msg)


def frames_to_folder(bag: Path, labels_csv: Path, out: Path, topic: str = QC_CAMERA) -> dict:
    """Write the labelled frames of `bag` into `out` (good/, defect/<kind>/, positions.csv).
    Returns the counts: frames, labelled, unlabelled."""
    if not Path(bag).is_dir():
        raise ValueError(f"bag {bag}: not a rosbag2 folder")
    labels = read_labels(Path(labels_csv))
    seen, rows, unlabelled = set(), ["file,u,v"], 0
    for stamp, rgb in _frames(Path(bag), topic):
        if stamp not in labels or stamp in seen:
            unlabelled += stamp not in labels
            continue
        seen.add(stamp)
        label, u, v = labels[stamp]
        rel = f"good/{stamp}.png" if label == "ok" else f"defect/{label}/{stamp}.png"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(out / rel), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
            raise OSError(f"could not write {out / rel}")
        if label != "ok" and math.isfinite(u) and math.isfinite(v):
            rows.append(f"{rel},{u:.6f},{v:.6f}")
    missing = sorted(set(labels) - seen)
    if missing:
        shown = ", ".join(str(s) for s in missing[:MAX_LISTED]) + (" ..." if len(missing) > MAX_LISTED else "")
        raise ValueError(f"{labels_csv}: {len(missing)} labelled stamps have no frame on {topic!r} in {bag}: {shown}")
    (out / POSITIONS).write_text("\n".join(rows) + "\n")
    return {"frames": len(seen) + unlabelled, "labelled": len(seen), "unlabelled": unlabelled}
