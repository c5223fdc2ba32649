"""A labelled image folder (anomalib's layout) -> labelled observation prefixes (numpy + OpenCV).

    DIR/good/*.png|jpg|jpeg            parts without a defect (class "ok")
    DIR/defect/<kind>/*.png|jpg|jpeg   parts with the defect <kind> (a bundle class, or a new one
                                       with `sol-control train --from-scratch`)
    DIR/positions.csv (optional)       file,u,v: where the defect is, in the image's normalized
                                       coordinates (u right, v down, 0..1); file relative to DIR
                                       (or a file name found once in DIR)

Images are read with OpenCV and tokenized by the node's own perception (`ObservationTokenizer`):
centre-cropped to a square, resized to the camera size, measured, binned. So a position is moved
into that square here, as the QC action's u, v are (actions.QCVerdict); one outside it is an
error. Without a position the defect's place is unknown (NaN) and not scored. The validation split
is stratified by class and seeded. Torch-free: `sol-control eval --folder` reads folders with it too.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import cv2
import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
POSITIONS = "positions.csv"
MIN_SIDE_PX = 64  # half the QC camera's 128 px: smaller images carry too little for the features
MIN_PER_CLASS = 8  # training: images per class (the validation split takes a fifth of them)
MAX_LISTED = 5  # files named in one error message


@dataclass(frozen=True)
class Item:
    path: Path
    rel: str  # relative to the folder, "/"-separated
    label: str  # "ok" or the defect kind
    u: float = math.nan  # the defect's position (NaN: unknown): in the image as given, then in the square
    v: float = math.nan


@dataclass
class LabelledFolder:
    root: Path
    items: list[Item]
    classes: tuple[str, ...]  # "ok" first, then the defect kinds in name order
    positions: Path | None = None
    ignored: list[str] = field(default_factory=list)  # files that are not PNG/JPEG

    def count(self, label: str) -> int:
        return sum(i.label == label for i in self.items)


def _listing(names: list[str]) -> str:
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


def _class_dirs(root: Path) -> dict[str, Path]:
    """label -> its folder: good/ is "ok", defect/<kind>/ is <kind>."""
    if not root.is_dir():
        raise ValueError(f"folder {root} does not exist")
    if not (root / "good").is_dir():
        raise ValueError(f"folder {root}: no good/ folder (images of parts without a defect)")
    defect = root / "defect"
    kinds = sorted(p for p in defect.glob("*") if p.is_dir() and not p.name.startswith(".")) if defect.is_dir() else []
    if not kinds:
        raise ValueError(f"folder {root}: no defect/<kind>/ folders (images of defective parts, one folder a kind)")
    if any(p.name == "ok" for p in kinds):
        raise ValueError(f"folder {root}: defect/ok/: \"ok\" is the class of good/, not a defect")
    return {"ok": root / "good", **{p.name: p for p in kinds}}


def scan(root: Path, min_per_class: int = 0) -> LabelledFolder:
    """Every PNG/JPEG under good/ and defect/<kind>/ (sorted), labelled by its folder. ValueError on a
    missing good/ or defect/, an empty class, or (`min_per_class`) too few images in a class."""
    items, ignored = [], []
    dirs = _class_dirs(root)
    for label, folder in dirs.items():
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
        ignored += [p.relative_to(root).as_posix() for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
        where = folder.relative_to(root).as_posix()
        if not images:
            raise ValueError(f"folder {root}: {where}/ holds no PNG or JPEG images (an empty class)")
        if len(images) < min_per_class:
            raise ValueError(f"folder {root}: {where}/ holds {len(images)} images; training needs at least "
                             f"{min_per_class} per class")
        items += [Item(p, p.relative_to(root).as_posix(), label) for p in images]
    return LabelledFolder(root, items, tuple(dirs), None, ignored)


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _match(name: str, by_rel: dict[str, Item], by_file: dict[str, list[Item]]) -> Item | None:
    name = name.replace("\\", "/")
    name = name[2:] if name.startswith("./") else name
    if name in by_rel:
        return by_rel[name]
    found = by_file.get(name, [])
    return found[0] if len(found) == 1 else None


def _csv_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, {file, u, v}) of every row (a spreadsheet's byte order mark is fine)."""
    if not path.is_file():
        raise ValueError(f"positions: {path} does not exist")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        cols = {c.strip().lower(): c for c in reader.fieldnames or []}
        if not {"file", "u", "v"} <= set(cols):
            raise ValueError(f"{path}: needs the columns file, u, v; has {list(cols)}")
        return [(reader.line_num, {k: (row[cols[k]] or "").strip() for k in ("file", "u", "v")}) for row in reader]


def read_positions(folder: LabelledFolder, path: Path) -> LabelledFolder:
    """`folder` with the CSV's defect positions on its items. ValueError naming the line when a row's
    file is not in the folder (or is a good part), appears twice, or u, v are not numbers in 0..1."""
    by_rel = {i.rel: i for i in folder.items}
    by_file: dict[str, list[Item]] = {}
    for i in folder.items:
        by_file.setdefault(i.path.name, []).append(i)
    placed: dict[str, tuple[float, float]] = {}
    for line, row in _csv_rows(path):
        item = _match(row["file"], by_rel, by_file)
        u, v = _number(row["u"]), _number(row["v"])
        if item is None:
            raise ValueError(f"{path} line {line}: no image {row['file']!r} in {folder.root} (or the name is "
                             f"not unique there: give the path relative to the folder)")
        if item.label == "ok":
            raise ValueError(f"{path} line {line}: {item.rel} is a good part; positions are for defects")
        if item.rel in placed:
            raise ValueError(f"{path} line {line}: a second position for {item.rel}")
        if not (0.0 <= u <= 1.0 and 0.0 <= v <= 1.0):
            raise ValueError(f"{path} line {line}: u and v must be numbers in 0..1, got {row['u']!r}, {row['v']!r}")
        placed[item.rel] = (u, v)
    items = [replace(i, u=placed[i.rel][0], v=placed[i.rel][1]) if i.rel in placed else i for i in folder.items]
    return replace(folder, items=items, positions=path)


def read_folder(root: Path, positions: Path | None = None, min_per_class: int = 0) -> LabelledFolder:
    """The folder's labelled images, with the defect positions of `positions` (default:
    DIR/positions.csv when it exists)."""
    root = Path(root)
    folder = scan(root, min_per_class)
    if positions is None and (root / POSITIONS).is_file():
        positions = root / POSITIONS
    return read_positions(folder, Path(positions)) if positions is not None else folder


def check_classes(folder: LabelledFolder, labels: tuple[str, ...]) -> None:
    """ValueError when a defect/<kind>/ is not one of a bundle's classes `labels`."""
    unknown = [c for c in folder.classes if c not in labels]
    if unknown:
        kinds = ", ".join(c for c in labels if c != "ok")
        raise ValueError(f"folder {folder.root}: defect/{unknown[0]}/ is not one of the bundle's defect classes "
                         f"({kinds}); new classes need --from-scratch, which takes the classes from the folders")


def read_image(path: Path) -> np.ndarray:
    """[H, W, 3] uint8 RGB. ValueError when OpenCV cannot read it or it is smaller than MIN_SIDE_PX."""
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError("not a readable PNG/JPEG")
    h, w = image.shape[:2]
    if min(h, w) < MIN_SIDE_PX:
        raise ValueError(f"{w}x{h} pixels, smaller than {MIN_SIDE_PX} px on a side")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def in_square(u: float, v: float, width: int, height: int) -> tuple[float, float]:
    """A position in the image's normalized coordinates -> in the centre square perception keeps
    (perception.square_resize); NaN stays NaN."""
    s = min(width, height)
    x0, y0 = (width - s) // 2, (height - s) // 2
    return (u * width - x0) / s, (v * height - y0) / s


@dataclass
class Encoded:
    """A folder through the node's perception, item by item."""

    items: list[Item]
    prefixes: list[np.ndarray | None]  # None: perception found no part in the image
    labels: list[dict]  # defect, u, v (in the square; NaN unknown), severity (NaN: never known)

    def unusable(self) -> list[str]:
        return [i.rel for i, p in zip(self.items, self.prefixes) if p is None]


def _prefix(obs, image: np.ndarray) -> np.ndarray | None:
    try:
        return obs.encode(image)
    except ValueError:  # no part found: the node would publish its safe default
        return None


def encode_folder(folder: LabelledFolder, obs, progress=None) -> Encoded:
    """Every image read (OpenCV) and tokenized by `obs` (perception.ObservationTokenizer), its
    position moved into the square perception keeps. ValueError listing the images that cannot be
    read, are too small, or whose position lies outside that square."""
    bad, outside, prefixes, labels = [], [], [], []
    for n, item in enumerate(folder.items):
        if progress is not None:
            progress(f"reading images {n + 1}/{len(folder.items)}")
        try:
            image = read_image(item.path)
        except ValueError as e:
            bad.append(f"{item.rel} ({e})")
            continue
        u, v = in_square(item.u, item.v, image.shape[1], image.shape[0])
        if not (math.isnan(u) or (0.0 <= u <= 1.0 and 0.0 <= v <= 1.0)):
            outside.append(item.rel)
        prefixes.append(_prefix(obs, image))
        labels.append({"defect": item.label, "u": u, "v": v, "severity": math.nan})
    if bad:
        raise ValueError(f"folder {folder.root}: {len(bad)} images cannot be used: {_listing(bad)}")
    if outside:
        raise ValueError(f"folder {folder.root}: the defect position of {_listing(outside)} lies outside the "
                         f"centre square the node sees (images that are not square are centre-cropped)")
    return Encoded(list(folder.items), prefixes, labels)


def stratified_split(classes: list[str], val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices: per class a seeded shuffle, round(fraction x n) (at least 1, and
    at least 1 left to train on) to validation."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for c in sorted(set(classes)):
        idx = np.array([i for i, x in enumerate(classes) if x == c])
        rng.shuffle(idx)
        n_val = min(max(1, round(val_fraction * len(idx))), len(idx) - 1)
        val += idx[:n_val].tolist()
        train += idx[n_val:].tolist()
    return np.array(sorted(train), np.int64), np.array(sorted(val), np.int64)
