"""`sol-control import SRC --out BUNDLE`: a user's language model becomes a verified bundle.

Sources (what SRC is, told by its content, never by its name):
- a GGUF file (llama.cpp's format, Llama architecture): read with `sol_control.lm.gguf_reader`
  (numpy + gguf, no torch); the fused decoder graphs are written by `sol_control.graph.llama`, one
  per precision: fp32 always, int8 / int4 on `--quantize`. int4 carries the file's Q4_1 blocks over
  exactly (symmetric blocks + a separate fp32 "mins" term, see docs/LM.md): `--int4-mode fast`
  (default) with int8 activations and an 8-bit head, `exact` with fp32 activations and an fp32
  head (the GGUF's numbers); `symmetric` quantizes the dequantized weights again into symmetric
  blocks with a 4-bit head (ONNX Runtime GenAI's recipe: ~15 % faster, parts from fp32 sooner).
  Tensors in other formats are quantized by round to nearest.
  The tokenizer, stop ids and chat template come from the file's metadata.
- an Optimum / Hugging Face ONNX export folder in the decoder-with-past layout (`model.onnx`,
  `config.json`, `tokenizer.json`, optionally `model.onnx_data`, `generation_config.json`,
  `tokenizer_config.json` with the chat template): the graph is copied as it is (fp32).
- a Hugging Face Llama folder (`config.json` + safetensors, F32/F16/BF16): read with
  `sol_control.lm.hf_reader` (numpy, no torch), then written and quantized (round to nearest) as a
  GGUF's weights are; the text side from the folder's files as for an Optimum export.

Every way the bundle gets `tokenizer.json`, `chat_template.jinja` (when there is one) and a
manifest with task "lm" (fields: docs/BUNDLES.md); every file is listed with its sha256, then the
bundle is loaded back (sha256 checked) and each decoder runs one token in ONNX Runtime.
`--draft D` imports a second source the same way as the bundle's draft (same vocabulary).
`--heads H.npz` (GGUF and Hugging Face sources) writes K draft heads into every fused target graph
(`sol_control.graph.weights.DraftHeads`, e.g. models/lm/smollm2_heads_k3.npz from
tools/train_lm_heads.py), so `sol-control generate` self-speculates; manifest `target.draft_heads` = K.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sol_control.bundle import Bundle, Manifest, write_manifest

GGUF_MAGIC = b"GGUF"
QUANTIZED = ("int8", "int4")
TOKENIZER, CHAT_TEMPLATE = "tokenizer.json", "chat_template.jinja"
OPTIMUM_MODEL = "model.onnx"


@dataclass
class Imported:
    """One decoder written into the bundle, and what its source says about the text side."""

    spec: dict[str, Any]  # a DecoderSpec as a dict (files / fused by precision)
    files: list[str]  # bundle files it wrote
    vocab_size: int
    max_context: int
    tokenizer_json: str | None = None
    chat_template: str | None = None
    stop_ids: tuple[int, ...] = ()
    bos_id: int | None = None
    eos_id: int | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    source: dict[str, Any] = field(default_factory=dict)  # recorded under metrics.import


def source_kind(src: Path) -> str:
    """"gguf", "optimum" or "hf"; ValueError naming what is wrong otherwise."""
    if not src.exists():
        raise ValueError(f"import source {str(src)!r} does not exist")
    if src.is_file():
        with open(src, "rb") as fh:
            magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ValueError(f"import source {str(src)!r} is not a GGUF file (starts with {magic!r}, "
                             f"expected {GGUF_MAGIC!r}); a folder source is an ONNX export")
        return "gguf"
    if (src / OPTIMUM_MODEL).is_file():
        return "optimum"
    if (src / "config.json").is_file() and any(src.glob("*.safetensors")):
        return "hf"
    raise ValueError(f"import source folder {str(src)!r} has no {OPTIMUM_MODEL} (ONNX export) and no "
                     f"config.json + *.safetensors (Hugging Face model)")


def _parse_quantize(text: str) -> tuple[str, ...]:
    wanted = tuple(p.strip() for p in text.split(",") if p.strip())
    for p in wanted:
        if p not in QUANTIZED:
            raise ValueError(f"--quantize takes {', '.join(QUANTIZED)} (comma separated), got {p!r}")
    return tuple(dict.fromkeys(wanted))


# -- GGUF --------------------------------------------------------------------------------------
# A language model's activation rows have too wide a range for 7 bits: rows + residuals (~14 bits, one integer GEMM
# of 2T rows) in every int8 linear, int4 graphs' 8-bit head included (docs/LM.md, "int8 activations").
LM_INT8_ACTIVATIONS = "dual"
INT4_MODES = {  # graph builder options of an int4 graph (docs/LM.md, "int4 modes")
    "fast": {"accuracy_level": 4, "head_bits": 8, "int4_zero_points": "mins"},  # the file's Q4_1 blocks as they are
    "exact": {"accuracy_level": 0, "head_bits": None, "int4_zero_points": "mins"},  # + fp32 activations and head
    # re-quantized to symmetric blocks (ONNX Runtime GenAI's builder recipe), 4-bit head: faster, less faithful
    "symmetric": {"accuracy_level": 4, "head_bits": 4, "symmetric": True},
}
REQUANTIZED = ("symmetric",)  # modes that quantize the dequantized weights again instead of carrying Q4_1 blocks


def graph_inputs(weights, precision: str, context: int, int4_mode: str) -> tuple[Any, dict[str, Any]]:
    """(the weights, the BuildOptions) `sol-control import` builds the `precision` graph from."""
    options = {"max_context": context, "int8_activations": LM_INT8_ACTIVATIONS, "heads_vocab": HEADS_VOCAB}
    if precision != "int4":
        return weights, options
    return _int4_weights(weights, int4_mode), {**options, **INT4_MODES[int4_mode]}


def _int4_weights(weights, int4_mode: str):
    """The weights an int4 graph of `int4_mode` is built from: as read, or with every given Int4Blocks
    dequantized (then quantized again by the graph builder)."""
    from sol_control.graph.weights import LlamaWeights

    if int4_mode not in REQUANTIZED or not weights.int4:
        return weights
    tensors = {**weights.tensors, **{name: b.dequantize() for name, b in weights.int4.items()}}
    return LlamaWeights(weights.config, tensors, {}, weights.heads)


MAX_HEADS = 16  # manifest target.draft_heads
# Heads on the lm_head guess among the first 4096 token ids only (BuildOptions.heads_vocab; 79 % of
# SmolLM2's answer tokens): the same tokens a pass as over 8192 ids or the whole vocabulary, a
# cheaper call (docs/LM.md, "Draft heads").
HEADS_VOCAB = 4096


def read_heads(path: Path):
    """The DraftHeads of an .npz (w1 [K, hidden, hidden], optional w2 or w_prev, token_offset; no pickles);
    ValueError naming the file when it is missing, not an npz, pickled or incomplete."""
    from sol_control.graph.weights import DraftHeads

    if not path.is_file():
        raise ValueError(f"--heads {str(path)!r} does not exist")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"--heads {str(path)!r} is not an .npz file")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = sorted({"w1", "token_offset"} - set(z.files))
        heads = None if missing else DraftHeads.load(path)
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"--heads {str(path)!r} is not a readable .npz: {err}") from None
    except ValueError as err:  # object arrays: np.load does not unpickle them
        raise ValueError(f"--heads {str(path)!r} is not a plain .npz of draft heads: {err}") from None
    if heads is None:
        raise ValueError(f"--heads {str(path)!r} has no {', '.join(missing)} array (a DraftHeads .npz holds "
                         f"w1, token_offset and optionally w2 or w_prev)")
    if heads.w1.ndim != 3 or not 1 <= heads.k <= MAX_HEADS:
        raise ValueError(f"--heads {str(path)!r}: w1 must be [K, hidden, hidden] with K in 1..{MAX_HEADS}, "
                         f"got shape {heads.w1.shape}")
    if not all(np.isfinite(w).all() for w in (heads.w1, heads.w2, heads.w_prev) if w is not None):
        raise ValueError(f"--heads {str(path)!r} holds non-finite weights")
    return heads


def attach_heads(weights, heads, path: Path) -> None:
    """weights.heads = heads, when their shapes fit the model (ValueError naming the file otherwise)."""
    c = weights.config
    if heads.w1.shape[1:] != (c.hidden_size, c.hidden_size):
        raise ValueError(f"--heads {str(path)!r}: w1 has shape {heads.w1.shape}, expected "
                         f"[K, {c.hidden_size}, {c.hidden_size}] for this model (hidden size {c.hidden_size})")
    try:
        heads.validate(c.hidden_size, c.vocab_size)
    except ValueError as err:
        raise ValueError(f"--heads {str(path)!r}: {err}") from None
    weights.heads = heads


def _heads_record(heads, path: Path | None) -> dict[str, Any]:
    if heads is None:
        return {}
    vocab = {"vocab": HEADS_VOCAB} if heads.shared_head else {}
    return {"heads": {"file": path.name, "k": heads.k, "shared_lm_head": heads.shared_head,
                      "chained": heads.w_prev is not None, **vocab,
                      "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}


def write_graphs(weights, out: Path, role: str, quantize: tuple[str, ...], context: int,
                 int4_mode: str) -> tuple[dict[str, Any], list[str], dict[str, float]]:
    """The fused graphs of `weights` (with its draft heads, if any): (DecoderSpec dict, files written,
    seconds per graph)."""
    from sol_control.graph.llama import build_decoder

    if int4_mode not in INT4_MODES:
        raise ValueError(f"--int4-mode must be one of {sorted(INT4_MODES)}, got {int4_mode!r}")
    fused, written, build_s = {}, [], {}
    for precision in ("fp32", *quantize):
        t1 = time.monotonic_ns()
        name = f"{role}_{precision}.onnx"
        source, options = graph_inputs(weights, precision, context, int4_mode)
        build_decoder(source, out / name, precision, **options)
        fused[precision], build_s[precision] = name, round((time.monotonic_ns() - t1) / 1e9, 2)
        written.append(name)
    c = weights.config
    params = sum(int(np.prod(s)) for s in weights.expected_shapes().values())
    spec = {"n_layers": c.n_layers, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
            "hidden_size": c.hidden_size, "params": params, "fused": fused,
            "draft_heads": weights.heads.k if weights.heads is not None else 0}
    return spec, written, build_s


def _quant_record(quantize: tuple[str, ...], int4_mode: str) -> dict[str, Any]:
    """The quantized graphs' builder options for the manifest (none without --quantize)."""
    record = {"int8_activations": LM_INT8_ACTIVATIONS} if quantize else {}
    if "int4" in quantize:
        record.update(int4_mode=int4_mode, int4_options=INT4_MODES[int4_mode])
    return record


def import_gguf(src: Path, out: Path, role: str, quantize: tuple[str, ...], max_context: int | None,
                int4_mode: str = "fast", heads=None, heads_path: Path | None = None) -> Imported:
    """Write the fused decoder graphs of a GGUF file into `out` as `{role}_{precision}.onnx`
    (with `heads`, DraftHeads read from `heads_path`, inside each)."""
    from sol_control.lm.gguf_reader import gguf_field, open_gguf, read_gguf_weights
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    t0 = time.monotonic_ns()
    reader = open_gguf(src)
    weights = read_gguf_weights(reader)
    if heads is not None:
        attach_heads(weights, heads, heads_path)
    tok = read_gguf_tokenizer(reader)
    c = weights.config
    context = min(max_context or c.max_context, c.max_context)
    spec, written, build_s = write_graphs(weights, out, role, quantize, context, int4_mode)
    return Imported(
        spec=spec, files=written, vocab_size=c.vocab_size, max_context=context,
        tokenizer_json=tok.to_json(), chat_template=tok.chat_template, stop_ids=tok.stop_ids,
        bos_id=gguf_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_id=gguf_field(reader, "tokenizer.ggml.eos_token_id", None),
        bos_token=tok.bos_token, eos_token=tok.eos_token,
        source={"kind": "gguf", "file": src.name,
                "int4_linears_exact": len(weights.int4) if "int4" in quantize and int4_mode not in REQUANTIZED else 0,
                **_quant_record(quantize, int4_mode), **_heads_record(heads, heads_path),
                "model_max_context": c.max_context, "build_s": build_s,
                "import_s": round((time.monotonic_ns() - t0) / 1e9, 2)})


# -- Optimum ONNX folder -----------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object")
    return data


def _ids(value: Any) -> tuple[int, ...]:
    """An eos_token_id entry (int, list of ints or null) as a tuple."""
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def _decoder_shape(path: Path) -> tuple[int, int, int, int]:
    """(n_layers, kv_heads, head_dim, vocab) from a decoder-with-past graph's I/O (weights not loaded)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in [*graph.input, *graph.output]}
    past = [n for n in dims if n.startswith("past_key_values.") and n.endswith(".key")]
    if not past or "logits" not in dims or "input_ids" not in dims:
        raise ValueError(f"{str(path)!r} is not a decoder-with-past graph (input_ids, past_key_values.*, logits)")
    key, logits = dims["past_key_values.0.key"], dims["logits"]
    if len(key) != 4 or key[1] is None or key[3] is None or not logits or logits[-1] is None:
        raise ValueError(f"{str(path)!r}: past_key_values.0.key {key} and logits {logits} need static "
                         f"heads, head_dim and vocabulary")
    return len(past), key[1], key[3], logits[-1]


def _folder_text(src: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Tokenizer, chat template and stop ids of a Hugging Face style folder, as Imported fields."""
    generation = _read_json(src / "generation_config.json") if (src / "generation_config.json").is_file() else {}
    tok_config = _read_json(src / "tokenizer_config.json") if (src / "tokenizer_config.json").is_file() else {}
    stops = tuple(dict.fromkeys([*_ids(generation.get("eos_token_id")), *_ids(config.get("eos_token_id"))]))
    template = tok_config.get("chat_template")

    def token(key: str) -> str | None:
        value = tok_config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    return {"tokenizer_json": (src / TOKENIZER).read_text() if (src / TOKENIZER).is_file() else None,
            "chat_template": template if isinstance(template, str) else None, "stop_ids": stops,
            "bos_id": next(iter(_ids(config.get("bos_token_id"))), None), "eos_id": stops[0] if stops else None,
            "bos_token": token("bos_token"), "eos_token": token("eos_token")}


def import_optimum(src: Path, out: Path, role: str, max_context: int | None) -> Imported:
    """Copy an Optimum decoder-with-past export (fp32) into `out` as `{role}_fp32.onnx`."""
    if not (src / "config.json").is_file():
        raise ValueError(f"{str(src)!r} has no config.json (hidden_size, max_position_embeddings)")
    config = _read_json(src / "config.json")
    n_layers, kv_heads, head_dim, vocab = _decoder_shape(src / OPTIMUM_MODEL)
    for key in ("hidden_size", "max_position_embeddings"):
        if not isinstance(config.get(key), int) or config[key] <= 0:
            raise ValueError(f"{str(src / 'config.json')!r}: {key} must be a positive integer, got {config.get(key)!r}")
    name, written = f"{role}_fp32.onnx", []
    shutil.copyfile(src / OPTIMUM_MODEL, out / name)
    written.append(name)
    if (src / f"{OPTIMUM_MODEL}_data").is_file():  # external weights: ORT finds them by their recorded name
        shutil.copyfile(src / f"{OPTIMUM_MODEL}_data", out / f"{OPTIMUM_MODEL}_data")
        written.append(f"{OPTIMUM_MODEL}_data")
    spec = {"n_layers": n_layers, "n_kv_heads": kv_heads, "head_dim": head_dim,
            "hidden_size": config["hidden_size"], "files": {"fp32": name}}
    context = min(max_context or config["max_position_embeddings"], config["max_position_embeddings"])
    return Imported(spec=spec, files=written, vocab_size=vocab, max_context=context, **_folder_text(src, config),
                    source={"kind": "optimum", "folder": src.name,
                            "model_max_context": config["max_position_embeddings"]})


def import_hf(src: Path, out: Path, role: str, quantize: tuple[str, ...], max_context: int | None,
              int4_mode: str = "fast", heads=None, heads_path: Path | None = None) -> Imported:
    """A Hugging Face Llama folder (safetensors, no torch): the fused graphs, like a GGUF's."""
    from sol_control.lm.hf_reader import read_hf_weights

    t0 = time.monotonic_ns()
    weights = read_hf_weights(src)
    if heads is not None:
        attach_heads(weights, heads, heads_path)
    c = weights.config
    context = min(max_context or c.max_context, c.max_context)
    spec, written, build_s = write_graphs(weights, out, role, quantize, context, int4_mode)
    return Imported(spec=spec, files=written, vocab_size=c.vocab_size, max_context=context,
                    **_folder_text(src, _read_json(src / "config.json")),
                    source={"kind": "hf", "folder": src.name, **_quant_record(quantize, int4_mode),
                            **_heads_record(heads, heads_path),
                            "model_max_context": c.max_context, "build_s": build_s,
                            "import_s": round((time.monotonic_ns() - t0) / 1e9, 2)})


# -- the bundle --------------------------------------------------------------------------------
def _import(src: Path, out: Path, role: str, quantize: tuple[str, ...], max_context: int | None,
            int4_mode: str = "fast", heads=None, heads_path: Path | None = None) -> Imported:
    kind = source_kind(src)
    if kind == "gguf":
        return import_gguf(src, out, role, quantize, max_context, int4_mode, heads, heads_path)
    if kind == "hf":
        return import_hf(src, out, role, quantize, max_context, int4_mode, heads, heads_path)
    if heads is not None:
        raise ValueError(f"--heads applies to GGUF and Hugging Face sources; {str(src)!r} is an ONNX export, "
                         f"copied as it is")
    if quantize:
        raise ValueError(f"--quantize applies to GGUF and Hugging Face sources; {str(src)!r} is an ONNX "
                         f"export, copied as fp32")
    return import_optimum(src, out, role, max_context)


def _manifest(name: str, target: Imported, draft: Imported | None) -> dict[str, Any]:
    vocab_size = target.vocab_size
    stops = target.stop_ids or ((target.eos_id,) if target.eos_id is not None else ())
    if not stops:
        raise ValueError("the source names no end-of-sequence token (eos_token_id): generation could not stop")
    eos = target.eos_id if target.eos_id is not None else stops[0]
    files = [*target.files, *(draft.files if draft else [])]
    tokenizer = None
    if target.tokenizer_json is not None:
        files.append(TOKENIZER)
        tokenizer = {"file": TOKENIZER, "bos_token": target.bos_token, "eos_token": target.eos_token}
        if target.chat_template:
            files.append(CHAT_TEMPLATE)
            tokenizer["chat_template"] = CHAT_TEMPLATE
    manifest = {
        "name": name, "task": "lm", "description": f"language model imported from {target.source.get('kind')}",
        "max_context": target.max_context if draft is None else min(target.max_context, draft.max_context),
        "vocab": {"size": vocab_size, "pad": eos, "bos": target.bos_id if target.bos_id is not None else eos,
                  "eos": eos, "sep": eos, "stop_ids": list(stops)},
        "target": target.spec, "files": {f: {} for f in files},
        "metrics": {"import": {"target": target.source, **({"draft": draft.source} if draft else {})}},
    }
    if tokenizer is not None:
        manifest["tokenizer"] = {k: v for k, v in tokenizer.items() if v is not None}
    if draft is not None:
        manifest["draft"] = draft.spec
    return manifest


def smoke_check(bundle: Bundle, threads: int = 1) -> dict[str, bool]:
    """Each decoder of the bundle, opened from its verified file, runs one token to finite logits."""
    from sol_control.decoding import open_decoder

    ok = {}
    for role, spec in (("target", bundle.manifest.target), ("draft", bundle.manifest.draft)):
        for precision in spec.precisions if spec else ():
            sess = open_decoder(bundle, role, precision, threads=threads)
            logits = sess.prefill(np.array([bundle.manifest.vocab.eos], np.int64))
            if not np.isfinite(logits).all():
                raise ValueError(f"{role} {precision}: the imported decoder gives non-finite logits")
            ok[f"{role}_{precision}"] = True
    return ok


def import_model(src: str | Path, out: str | Path, quantize: tuple[str, ...] = (), draft: str | Path | None = None,
                 name: str | None = None, max_context: int | None = None, check: bool = True,
                 int4_mode: str = "fast", heads: str | Path | None = None) -> Manifest:
    """Import `src` (and `draft`, or the draft heads `heads`) into the new bundle folder `out`;
    return its manifest."""
    src, out = Path(src), Path(out)
    source_kind(src)
    if draft is not None:
        source_kind(Path(draft))
    heads_path = Path(heads) if heads is not None else None
    if heads_path is not None and draft is not None:
        raise ValueError("--heads and --draft are two ways to speculate (generate would use the draft); give one")
    draft_heads = read_heads(heads_path) if heads_path is not None else None
    if max_context is not None and max_context <= 0:
        raise ValueError(f"max_context must be positive, got {max_context}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty folder (not overwritten)")
    if int4_mode not in INT4_MODES:
        raise ValueError(f"--int4-mode must be one of {sorted(INT4_MODES)}, got {int4_mode!r}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        target = _import(src, out, "target", quantize, max_context, int4_mode, draft_heads, heads_path)
        drafted = _import(Path(draft), out, "draft", quantize, max_context, int4_mode) if draft is not None else None
        if drafted is not None and drafted.vocab_size != target.vocab_size:
            raise ValueError(f"draft vocabulary {drafted.vocab_size} differs from the target's {target.vocab_size}")
        if target.tokenizer_json is not None:
            (out / TOKENIZER).write_text(target.tokenizer_json)
            if target.chat_template:
                (out / CHAT_TEMPLATE).write_text(target.chat_template)
        manifest = write_manifest(out, _manifest(name or src.stem, target, drafted))
        bundle = Bundle.load(out)  # every sha256 checked
        if check:
            smoke_check(bundle)
    except BaseException:  # no half-written bundle is left behind (the folder was new or empty)
        shutil.rmtree(out, ignore_errors=True)
        raise
    return manifest


def add_arguments(p) -> None:
    p.add_argument("src", help="a GGUF file, a Hugging Face Llama folder (config.json + *.safetensors), "
                   "or an Optimum ONNX decoder-with-past folder")
    p.add_argument("--out", required=True, help="the bundle folder to create (must not exist, or be empty)")
    p.add_argument("--quantize", default="",
                   help="extra precisions for a GGUF or HF source: int8,int4 (an Optimum folder is copied)")
    p.add_argument("--draft", default=None, help="a second source imported as the bundle's draft")
    p.add_argument("--heads", default=None,
                   help="draft heads (.npz: w1 [K, hidden, hidden], tools/train_lm_heads.py) written into every "
                        "fused target graph (GGUF / HF sources)")
    p.add_argument("--name", default=None, help="bundle name (default: the source's file name)")
    p.add_argument("--max-context", type=int, default=None,
                   help="KV cache length (default and upper bound: the model's own context)")
    p.add_argument("--int4-mode", choices=sorted(INT4_MODES), default="fast",
                   help="int4 graphs: fast (a GGUF's Q4_1 blocks as they are, int8 activations, 8-bit head), "
                        "exact (Q4_1 blocks, fp32 activations and head: the GGUF's own numbers) or symmetric "
                        "(re-quantized into symmetric blocks, 4-bit head: faster, parts from fp32 sooner)")
    p.add_argument("--no-check", action="store_true", help="skip running one token through each decoder")


def run(args) -> int:
    t0 = time.monotonic_ns()
    m = import_model(args.src, args.out, _parse_quantize(args.quantize), args.draft, args.name,
                     args.max_context, check=not args.no_check, int4_mode=args.int4_mode, heads=args.heads)
    size_mb = sum(e.size_bytes for e in m.files.values()) / 1e6
    print(f"bundle {args.out}: {m.name}, target {list(m.target.precisions)}"
          f"{', draft ' + str(list(m.draft.precisions)) if m.draft else ''}"
          f"{f', {m.target.draft_heads} draft heads' if m.target.draft_heads else ''}, vocab {m.vocab.size}, "
          f"stop ids {list(m.vocab.stop_ids)}, max_context {m.max_context}, {len(m.files)} files, "
          f"{size_mb:.1f} MB, {(time.monotonic_ns() - t0) / 1e9:.1f} s")
    return 0
