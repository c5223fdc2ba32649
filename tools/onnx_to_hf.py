"""Rebuild Hugging Face `LlamaForCausalLM` folders from a bundle's fp32 ONNX decoders.

Peer engines (ORT GenAI, transformers, OpenVINO, llama.cpp) load Hugging Face folders, and the
ones `make models` leaves in `.work/<task>/` are not shipped. The shipped fp32 ONNX files hold
every weight, so we read them back: the result is the bundle's weights bit for bit, not a retrained
look-alike, and a peer benchmark on a fresh clone compares engines on provably the same weights.

The graphs come from `tools/export.py` (dynamo, opset 23). Projections become anonymous MatMul
inputs (`val_44`, stored as W^T: [in, out]) and identical initializers are merged (two all-ones
norms share one weight, named after the first), so names cannot be trusted and every weight is
identified by the graph around it: a norm followed by three projections is input_layernorm, q/k/v
by the Attention input they reach (0/1/2), o_proj as the first MatMul after Attention; a norm
followed by two is post_attention_layernorm, gate_proj the one feeding a Sigmoid (SiLU = x *
sigmoid(x)), down_proj the MatMul after the gate; the last norm feeds lm_head. The config comes
from shapes, node attributes (RMS epsilon, attention scale) and the rotary `inv_freq` table
(rope_theta), cross-checked with the manifest.

Conversion needs only `onnx` and numpy (our runtime venv has both; the safetensors file is written
here, it is a JSON header plus raw little-endian arrays). `--check` needs torch, transformers and
onnxruntime (`.venv-peers`): logits on a few prefixes within 1e-4 of ONNX Runtime's, identical
greedy outputs.

    python tools/onnx_to_hf.py --bundle models/grasp --out /tmp/grasp_hf       # -> target/, draft/
    .venv-peers/bin/python tools/onnx_to_hf.py --bundle models/grasp --out /tmp/grasp_hf --check
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from collections import defaultdict, deque
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = "model.safetensors"
LOGIT_TOL = 1e-4


# ---- safetensors without the safetensors package -------------------------------------------------

_DTYPES = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("int64"): "I64"}


def save_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    """The safetensors layout: u64 header size, JSON header (dtype, shape, byte offsets), raw data."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<"), copy=False)
        blobs.append(a.tobytes())
        header[name] = {"dtype": _DTYPES[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blobs[-1])]}
        offset += len(blobs[-1])
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format wants the data 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for blob in blobs:
            fh.write(blob)


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    names = {v: k for k, v in _DTYPES.items()}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + lo:8 + n + hi], names[e["dtype"]].newbyteorder("<")).reshape(e["shape"])
    return out


# ---- graph reading --------------------------------------------------------------------------------

class Graph:
    def __init__(self, path: Path):
        import onnx
        from onnx import numpy_helper

        self.model = onnx.load(str(path))
        g = self.model.graph
        self.nodes = list(g.node)  # exporters write them in topological order
        self.init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)

    @staticmethod
    def attr(node, name, default=None):
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def const(self, name: str) -> np.ndarray | None:
        """An initializer, also through Transpose/Identity (a tied lm_head is the embedding transposed)."""
        if name in self.init:
            return self.init[name]
        node = self.producer.get(name)
        if node is not None and node.op_type == "Identity":
            return self.const(node.input[0])
        if node is not None and node.op_type == "Transpose":
            inner = self.const(node.input[0])
            return None if inner is None else np.transpose(inner, self.attr(node, "perm"))
        return None

    def source(self, name: str) -> str:
        """Name of the initializer behind `name` (through Transpose/Identity), for tie detection."""
        node = self.producer.get(name)
        return self.source(node.input[0]) if node is not None and node.op_type in ("Identity", "Transpose") else name

    def matmuls_after(self, tensor: str) -> list:
        return [n for n in self.consumers[tensor] if n.op_type in ("MatMul", "Gemm")]

    def first_forward(self, tensor: str, op_type: str):
        """Breadth-first from `tensor`: the first node of `op_type` and the input slot it is reached on."""
        seen, queue = set(), deque([tensor])
        while queue:
            t = queue.popleft()
            for n in self.consumers[t]:
                if n.op_type == op_type:
                    return n, list(n.input).index(t)
                if id(n) not in seen:
                    seen.add(id(n))
                    queue.extend(n.output)
        return None, None

    def reaches(self, tensor: str, op_type: str, within: int = 2) -> bool:
        frontier = [tensor]
        for _ in range(within):
            nxt = []
            for t in frontier:
                for n in self.consumers[t]:
                    if n.op_type == op_type:
                        return True
                    nxt.extend(n.output)
            frontier = nxt
        return False


def weight(g: Graph, matmul) -> np.ndarray:
    """HF nn.Linear weight [out, in] from a MatMul's right input [in, out] (or a Gemm's B)."""
    w = g.const(matmul.input[1])
    if w is None:
        raise ValueError(f"{matmul.name}: weight input {matmul.input[1]!r} is not a constant")
    if matmul.op_type == "Gemm" and g.attr(matmul, "transB", 0):
        return w
    return np.ascontiguousarray(w.T)


def rope_theta(inv_freq: np.ndarray, head_dim: int) -> float:
    """Invert inv_freq[i] = theta ** (-2i / head_dim), then check by recomputing it as
    transformers does (float32); a mismatch means scaled RoPE, which we do not rebuild."""
    est = float(np.exp(-np.log(inv_freq[1:].astype(np.float64)) / (np.arange(2, head_dim, 2) / head_dim)).mean())
    for theta in (float(round(est)), float(f"{est:.6g}"), est):
        redo = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
        if np.allclose(redo.astype(np.float32), inv_freq, rtol=1e-6, atol=0):
            return theta
    raise ValueError(f"rotary inv_freq is not plain RoPE (estimated theta {est:.6g}); scaled RoPE is not supported")


def convert_decoder(onnx_path: Path, spec: dict, vocab: dict, max_context: int) -> tuple[dict, dict]:
    """(HF config dict, {HF parameter name: array}) for one decoder-with-past ONNX file."""
    g = Graph(onnx_path)
    params: dict[str, np.ndarray] = {}
    embed_name = next(n for n in g.init if n.endswith("embed_tokens.weight"))
    params["model.embed_tokens.weight"] = g.init[embed_name]
    vocab_size, hidden = params["model.embed_tokens.weight"].shape

    norms = [n for n in g.nodes if n.op_type in ("RMSNormalization", "SimplifiedLayerNormalization")]
    eps = {float(g.attr(n, "epsilon", 1e-5)) for n in norms}
    if len(eps) != 1:
        raise ValueError(f"{onnx_path}: RMS norms disagree on epsilon: {eps}")
    # Norms are told apart by what follows them, not by their weight's name: the exporter merges
    # identical initializers, so two norms that both hold ones share one (named after the first).
    n_layers, n_heads, n_kv, intermediate, scale = 0, None, None, None, None
    final_norm = None
    for norm in norms:
        w = g.init[norm.input[1]]
        mms = g.matmuls_after(norm.output[0])
        if len(mms) == 3:  # input_layernorm -> q, k, v
            i, n_layers = n_layers, n_layers + 1
            prefix = f"model.layers.{i}"
            params[f"{prefix}.input_layernorm.weight"] = w
            slots = {}
            for mm in mms:
                attn, slot = g.first_forward(mm.output[0], "Attention")
                if attn is None:
                    raise ValueError(f"{onnx_path}: layer {i}: projection {mm.name} reaches no Attention node")
                slots[slot] = mm
            if sorted(slots) != [0, 1, 2]:
                raise ValueError(f"{onnx_path}: layer {i}: q/k/v projections not found (Attention slots {sorted(slots)})")
            for slot, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                params[f"{prefix}.self_attn.{proj}.weight"] = weight(g, slots[slot])
            out = g.first_forward(slots[0].output[0], "Attention")[0]
            scale = g.attr(out, "scale", scale)
            o_proj, _ = g.first_forward(out.output[0], "MatMul")
            params[f"{prefix}.self_attn.o_proj.weight"] = weight(g, o_proj)
            q_rows = params[f"{prefix}.self_attn.q_proj.weight"].shape[0]
            kv_rows = params[f"{prefix}.self_attn.k_proj.weight"].shape[0]
            n_heads, n_kv = q_rows // spec["head_dim"], kv_rows // spec["head_dim"]
        elif len(mms) == 2 and n_layers:  # post_attention_layernorm -> gate (SiLU), up
            prefix = f"model.layers.{n_layers - 1}"
            params[f"{prefix}.post_attention_layernorm.weight"] = w
            gates = [mm for mm in mms if g.reaches(mm.output[0], "Sigmoid", within=1)]
            ups = [mm for mm in mms if mm not in gates]
            if len(gates) != 1 or len(ups) != 1:
                raise ValueError(f"{onnx_path}: {prefix}: gate/up projections not found")
            down, _ = g.first_forward(gates[0].output[0], "MatMul")
            params[f"{prefix}.mlp.gate_proj.weight"] = weight(g, gates[0])
            params[f"{prefix}.mlp.up_proj.weight"] = weight(g, ups[0])
            params[f"{prefix}.mlp.down_proj.weight"] = weight(g, down)
            intermediate = params[f"{prefix}.mlp.gate_proj.weight"].shape[0]
        elif len(mms) == 1 and norm is norms[-1]:  # final norm -> lm_head
            params["model.norm.weight"] = w
            final_norm = norm
        else:
            raise ValueError(f"{onnx_path}: norm {norm.name} is followed by {len(mms)} projections; not a Llama layout")
    if final_norm is None:
        raise ValueError(f"{onnx_path}: no final norm")
    (lm_head,) = g.matmuls_after(final_norm.output[0])
    tied = g.source(lm_head.input[1]) == embed_name
    if not tied:
        params["lm_head.weight"] = weight(g, lm_head)

    head_dim = spec["head_dim"]
    expect = {"n_layers": n_layers, "n_kv_heads": n_kv, "head_dim": head_dim, "hidden_size": hidden}
    for key, got in expect.items():
        if spec[key] != got:
            raise ValueError(f"{onnx_path}: manifest says {key}={spec[key]}, the graph has {got}")
    if scale is not None and abs(scale - head_dim ** -0.5) > 1e-6:
        raise ValueError(f"{onnx_path}: attention scale {scale} is not 1/sqrt(head_dim={head_dim})")
    inv_freq = next((a for n, a in g.init.items() if n.endswith("rotary_emb.inv_freq")), None)
    if inv_freq is None:
        raise ValueError(f"{onnx_path}: no rotary inv_freq table")
    theta = rope_theta(inv_freq, head_dim)
    if vocab_size != vocab["size"]:
        raise ValueError(f"{onnx_path}: vocab {vocab_size}, manifest {vocab['size']}")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "float32",
        "vocab_size": int(vocab_size), "hidden_size": int(hidden), "intermediate_size": int(intermediate),
        "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv,
        "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": max_context,
        # float32 epsilon read back as the short decimal it came from (9.9999997e-06 -> 1e-05)
        "rms_norm_eps": float(str(np.float32(eps.pop()))),
        # both spellings: transformers 5 reads rope_parameters, older readers (optimum-intel's
        # exporter, llama.cpp's converter) read rope_theta
        "rope_theta": theta, "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "tie_word_embeddings": bool(tied), "use_cache": True,
        "bos_token_id": vocab["bos"], "eos_token_id": vocab["eos"], "pad_token_id": vocab["pad"],
    }
    n_expected = 2 + 9 * n_layers + (0 if tied else 1)
    if len(params) != n_expected:
        raise ValueError(f"{onnx_path}: found {len(params)} parameters, expected {n_expected}")
    return config, params


def write_hf(out_dir: Path, config: dict, params: dict[str, np.ndarray]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(params, out_dir / WEIGHTS)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out_dir


def convert_bundle(bundle_dir: Path, out_dir: Path) -> dict[str, Path]:
    """{role: HF folder} for the bundle's fp32 target and (if any) fp32 draft. Reads the manifest
    as plain JSON and checks each ONNX file's sha256 against it (no sol_control import needed)."""
    import hashlib

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    out = {}
    for role in ("target", "draft"):
        spec = manifest.get(role)
        if not spec or "fp32" not in spec.get("files", {}):
            continue
        fname = spec["files"]["fp32"]
        path = bundle_dir / fname
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != manifest["files"][fname]["sha256"]:
            raise ValueError(f"{path}: sha256 does not match the manifest")
        config, params = convert_decoder(path, spec, manifest["vocab"], manifest["max_context"])
        config["sol_control"] = {"from": f"{manifest['name']}/{fname}", "sha256": digest}
        out[role] = write_hf(out_dir / role, config, params)
    return out


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
