"""`python tools/onnx_to_hf.py --bundle B --out DIR [--check]`: a bundle's decoders as Hugging Face
folders (sol_control.lm.hf_from_onnx), and with `--check` transformers against ONNX Runtime on
the same weights: logits within 1e-4 on a few prefixes, identical greedy outputs. `--check` needs
torch, transformers and onnxruntime (`.venv-peers`).

    .venv-peers/bin/python tools/onnx_to_hf.py --bundle models/grasp --out /tmp/grasp_hf --check
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sol_control.lm.hf_from_onnx import convert_bundle  # noqa: E402  (numpy + onnx only)

LOGIT_TOL = 1e-4


# ---- check (torch + transformers + onnxruntime) ---------------------------------------------------

def check(hf_dir: Path, onnx_path: Path, prefixes: list[np.ndarray], n_new: int = 16) -> dict:
    """Max |logits| difference, transformers (one full forward) vs ONNX Runtime (prefill, then one
    token at a time through the KV cache), and whether both greedy continuations are identical."""
    import torch
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(REPO / "tools"))
    from export import ort_logits_incremental, ort_session, torch_greedy, torch_logits

    torch.set_num_threads(1)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    sess = ort_session(onnx_path)
    worst, same = 0.0, True
    for prefix in prefixes:
        ours = torch_greedy(model, prefix, n_new)
        ids = np.concatenate([prefix, ours])
        chunks = [len(prefix)] + [1] * n_new
        ort = ort_logits_incremental(sess, ids, chunks)
        worst = max(worst, float(np.abs(ort - torch_logits(model, ids)).max()))
        ort_greedy = ort[len(prefix) - 1:-1].argmax(-1)
        same &= bool((ort_greedy == ours).all())
    return {"max_abs_logit_diff": worst, "greedy_identical": same, "prefixes": len(prefixes)}


def check_prefixes(manifest: dict, n: int = 4, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lo, hi = manifest["vocab"]["observation"]
    lengths = [1, 5, 17, min(40, manifest["max_context"] // 2)][:n]
    return [np.concatenate([[manifest["vocab"]["bos"]], rng.integers(lo, hi, L - 1)]).astype(np.int64) for L in lengths]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="writes OUT/target and OUT/draft")
    ap.add_argument("--check", action="store_true", help="compare with ONNX Runtime (needs torch, transformers)")
    args = ap.parse_args(argv)
    folders = convert_bundle(args.bundle, args.out)
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    ok = True
    for role, folder in folders.items():
        print(f"{role}: {folder}")
        if args.check:
            onnx_path = args.bundle / manifest[role]["files"]["fp32"]
            n_new = min(16, manifest["max_context"] // 3)
            res = check(folder, onnx_path, check_prefixes(manifest), n_new)
            good = res["max_abs_logit_diff"] <= LOGIT_TOL and res["greedy_identical"]
            ok &= good
            print(f"  check: max |logits transformers - ORT| {res['max_abs_logit_diff']:.2e} (tolerance {LOGIT_TOL:g}), "
                  f"greedy identical: {res['greedy_identical']} over {res['prefixes']} prefixes -> {'ok' if good else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
