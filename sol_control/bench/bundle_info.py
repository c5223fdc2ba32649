"""`sol-control bundle DIR`: verify a bundle (sha256 + decoder signatures) and describe it."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..bundle import Bundle
from ..decoding import open_decoder
from .common import table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, help="bundle folder with manifest.json")


def run(args: argparse.Namespace) -> int:
    bundle = Bundle.load(args.bundle)
    m = bundle.manifest
    print(f"{m.name} ({m.task}): {m.description}")
    print(f"vocab {m.vocab.size}, observation {m.vocab.observation}, action {m.vocab.action}, "
          f"max_context {m.max_context}, {len(m.actions)} action tokens")
    rows = []
    for role, spec in (("target", m.target), ("draft", m.draft)):
        for prec in (spec.files if spec else {}):
            sess = open_decoder(bundle, role, prec)
            size = bundle.path(spec.files[prec]).stat().st_size
            rows.append([f"{role} {prec}", spec.files[prec], f"{spec.params / 1e6:.2f}M",
                         f"{sess.n_layers}x{sess.n_heads}x{sess.head_dim}", f"{size / 1e6:.1f} MB"])
    print(table(["decoder", "file", "params", "layers x kv heads x dim", "size"], rows))
    print(f"all {len(m.files)} files match their sha256")
    return 0
