"""`sol-control parts`: generated QC scenes written as a labelled image folder, the layout
`sol-control train` and `sol-control eval --folder` read (good/, defect/<kind>/, positions.csv).

A stand-in for photos of a user's own parts: `--family hexnut` makes a part family the shipped
policy has never seen, so a run can show what training on it does (docs/TRAINING.md).

    sol-control parts --family hexnut --split train --n 400 --out parts/hexnut_train
    sol-control parts --family hexnut --split test --n 300 --out parts/hexnut_test
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import cv2

from . import qc
from .common import NOVEL_FAMILIES, QC_PART_FAMILIES, SPLITS
from .labelled_folder import POSITIONS



def write_folder(root: Path, split: str, n: int, family: str | None = None, start: int = 0) -> Counter:
    """Scenes start..start+n-1 of `split` as PNGs under `root`, a positions row for every defect.
    Returns the count per class."""
    rows, count = ["file,u,v"], Counter()
    for i in range(start, start + n):
        s = qc.make_sample(split, i, family)
        c = s.label["defect"]
        rel = f"good/{i:05d}.png" if c == "ok" else f"defect/{c}/{i:05d}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(root / rel), cv2.cvtColor(s.image, cv2.COLOR_RGB2BGR)):
            raise OSError(f"could not write {root / rel}")
        if c != "ok":
            rows.append(f"{rel},{s.label['u']:.5f},{s.label['v']:.5f}")
        count[c] += 1
    (root / POSITIONS).write_text("\n".join(rows) + "\n")
    return count


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the folder to write (must not exist)")
    p.add_argument("--n", type=int, default=400, help="number of images (default 400)")
    p.add_argument("--split", choices=SPLITS, default="train", help="whose seeds (splits never share a scene)")
    p.add_argument("--family", choices=QC_PART_FAMILIES + NOVEL_FAMILIES, default=None,
                   help="one part family (default: the split's families)")
    p.add_argument("--start", type=int, default=0, help="first scene index")


def run(args: argparse.Namespace) -> int:
    if args.out.exists():
        print(f"sol-control parts: {args.out} exists; choose a new folder")
        return 2
    if args.n < 1:
        print(f"sol-control parts: --n must be at least 1, got {args.n}")
        return 2
    count = write_folder(args.out, args.split, args.n, args.family, args.start)
    print(f"{args.out}: {sum(count.values())} images, " + ", ".join(f"{k} {v}" for k, v in sorted(count.items())))
    return 0
