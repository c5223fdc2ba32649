"""`sol-control bundle DIR`: verify a bundle (sha256 + decoder signatures) and describe it, with the
backend each decoder runs on here and the times that chose it (`decoding.backend_choice`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..bundle import Bundle
from ..decoding import open_decoder
from .common import table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, help="bundle folder with manifest.json")


def _ms(times: dict) -> str:
    """"native / onnxruntime" ms per call, "-" where not measured."""
    if not times:
        return "-"
    return " / ".join(f"{times[b]:.3f}" for b in ("native", "onnxruntime"))


def backend_cells(info: dict) -> list[str]:
    """A session's `backend_info` as table cells: backend (and kernel variant), step ms, verify ms, prefill."""
    backend = f"native ({info['variant']})" if info["backend"] == "native" and info["variant"] else info["backend"]
    prefill = info["prefill"] + (f" ({_ms(info['prefill_ms'])})" if info.get("prefill_ms") else "")
    return [backend, _ms(info["step_ms"]), _ms(info["verify_ms"]), prefill]


def run(args: argparse.Namespace) -> int:
    bundle = Bundle.load(args.bundle)
    m = bundle.manifest
    print(f"{m.name} ({m.task}): {m.description}")
    print(f"vocab {m.vocab.size}, observation {m.vocab.observation}, action {m.vocab.action}, "
          f"max_context {m.max_context}, {len(m.actions)} action tokens")
    rows, reasons = [], []
    for role, spec in (("target", m.target), ("draft", m.draft)):
        for prec in (spec.precisions if spec else ()):
            sess = open_decoder(bundle, role, prec)
            name = (spec.fused if bundle.decoder_layout(role, prec) == "fused" else spec.files)[prec]
            size = bundle.path(name).stat().st_size
            rows.append([f"{role} {prec}", name, f"{spec.params / 1e6:.2f}M",
                         f"{sess.n_layers}x{sess.n_heads}x{sess.head_dim}", f"{size / 1e6:.1f} MB",
                         *backend_cells(sess.backend_info)])
            info = sess.backend_info
            reasons.append(f"  {role} {prec}: {info['reason']}{' (cached for this host)' if info['cached'] else ''}")
    print(table(["decoder", "file", "params", "layers x kv heads x dim", "size", "backend",
                 "step ms native / ORT", "verify ms native / ORT", "prefill"], rows))
    print("backend choice:\n" + "\n".join(reasons))
    print(f"all {len(m.files)} files match their sha256")
    return 0
