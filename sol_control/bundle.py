"""Model bundles: a folder with `manifest.json` and ONNX files, checked (sha256) before loading.

A bundle is what a user brings: decoders in the decoder-with-past layout (Hugging Face Optimum),
a vocabulary layout, the observation tokenizer and the action tokenizer. Nothing in a bundle is
executed or unpickled: ONNX graphs run in ONNX Runtime with no custom-op libraries, arrays load with
`allow_pickle=False`, everything else is JSON.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MANIFEST = "manifest.json"
REFERENCE = "reference.npz"
FORMAT = "sol_control.bundle/1"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
Precision = Literal["fp32", "int8", "int4"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(Strict):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=0)


class Vocab(Strict):
    """Token id layout. Ranges are half-open [start, stop)."""

    size: int = Field(gt=4)
    pad: int = 0
    bos: int = 1
    eos: int = 2
    sep: int = 3
    stop_ids: tuple[int, ...] = ()  # generation stops at any of these (a language model's end tokens)
    observation: tuple[int, int] | None = None  # observation tokens (policies; absent for a plain LM)
    action: tuple[int, int] | None = None  # action tokens (policies)

    @model_validator(mode="after")
    def _ranges(self) -> "Vocab":
        for name in ("pad", "bos", "eos", "sep"):
            if not 0 <= getattr(self, name) < self.size:
                raise ValueError(f"vocab.{name} must lie in [0, {self.size}), got {getattr(self, name)}")
        for t in self.stop_ids:
            if not 0 <= t < self.size:
                raise ValueError(f"vocab.stop_ids must lie in [0, {self.size}), got {t}")
        for name in ("observation", "action"):
            if getattr(self, name) is None:
                continue
            lo, hi = getattr(self, name)
            if not 0 <= lo < hi <= self.size:
                raise ValueError(f"vocab.{name} range must lie inside [0, {self.size}), got [{lo}, {hi})")
        return self


class ActionField(Strict):
    """One output token. `bins`: a value in [low, high] quantized to `size` bins (OpenVLA style);
    `categorical`: one of `labels`. Token id = token_offset + bin (or label index)."""

    name: str
    kind: Literal["bins", "categorical"]
    token_offset: int = Field(ge=0)
    size: int = Field(gt=0)
    unit: str = ""
    low: float | None = None
    high: float | None = None
    labels: tuple[str, ...] | None = None
    tolerance: float | None = None  # success criterion used by `sol-control eval`, in `unit`
    # bins only: the token says value - (this observation feature as the prefix measured it), so
    # the answer moves with what perception measured (grasp width = the object's extent + a margin)
    relative_to: str | None = None

    @model_validator(mode="after")
    def _kind(self) -> "ActionField":
        if self.relative_to is not None and self.kind != "bins":
            raise ValueError(f"action field {self.name!r}: relative_to needs kind 'bins'")
        if self.kind == "bins":
            if self.low is None or self.high is None or not self.low < self.high:
                raise ValueError(f"action field {self.name!r}: bins need low < high, got {self.low}, {self.high}")
        elif self.labels is None or len(self.labels) != self.size:
            raise ValueError(f"action field {self.name!r}: categorical needs {self.size} labels")
        return self


class DecoderSpec(Strict):
    """One decoder (target or draft): its shape and its ONNX files per precision, in the
    decoder-with-past layout Optimum exports (`files`) and/or the fused layout sol_control's graph
    builder writes (`fused`, with `draft_heads` guessing heads inside). The engine prefers `fused`."""

    n_layers: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    params: int | None = Field(None, gt=0)
    files: dict[Precision, str] = Field(default_factory=dict)  # precision -> file (Optimum layout)
    fused: dict[Precision, str] = Field(default_factory=dict)  # precision -> file (sol_control.fused/2)
    draft_heads: int = Field(0, ge=0, le=16)  # guessing heads in the fused graphs (0 = none)
    guesses: str | None = None  # .npz of an AnswerGuesser: the answer's first tokens, checked by the prefill

    @model_validator(mode="after")
    def _nonempty(self) -> "DecoderSpec":
        if not self.files and not self.fused:
            raise ValueError("a decoder needs at least one file (files or fused)")
        if self.draft_heads and not self.fused:
            raise ValueError("draft_heads live in the fused graphs: list them under fused")
        return self

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(p for p in ("fp32", "int8", "int4") if p in self.files or p in self.fused)


class TokenizerSpec(Strict):
    """The text side of a language model bundle: a Hugging Face `tokenizer.json` (read with
    `tokenizers`) and, optionally, a chat template (jinja2, rendered in a sandbox)."""

    file: str = "tokenizer.json"
    chat_template: str | None = None  # file name of the template text (e.g. chat_template.jinja)
    bos_token: str | None = None  # the template's `bos_token` / `eos_token` variables
    eos_token: str | None = None


class Manifest(Strict):
    format: Literal["sol_control.bundle/1"] = FORMAT
    name: str
    # "qc" / "grasp": the node's decisions (action fields as actions.py defines them); any other
    # name is a generic bundle for decoding and benchmarks: "lm" (a plain language model) or a
    # user's task with its own action fields
    task: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    max_context: int = Field(gt=0, le=1 << 20)
    vocab: Vocab
    target: DecoderSpec
    draft: DecoderSpec | None = None
    observation: dict[str, Any] = Field(default_factory=dict)  # read by sol_control.perception
    actions: tuple[ActionField, ...] = ()
    tokenizer: TokenizerSpec | None = None  # a language model's text tokenizer (absent for policies)
    files: dict[str, FileEntry]
    metrics: dict[str, Any] = Field(default_factory=dict)
    opset: int | None = None

    @field_validator("files")
    @classmethod
    def _safe_names(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in v:
            p = Path(name)
            if p.is_absolute() or ".." in p.parts or name.startswith("~") or "\\" in name:
                raise ValueError(f"bundle file names must be plain relative paths, got {name!r}")
        return v

    @model_validator(mode="after")
    def _listed(self) -> "Manifest":
        for role, spec in (("target", self.target), ("draft", self.draft)):
            listed = [*spec.files.items(), *spec.fused.items()] if spec else []
            if spec is not None and spec.guesses is not None:
                listed.append(("guesses", spec.guesses))
            for prec, fname in listed:
                if fname not in self.files:
                    raise ValueError(f"{role}.{prec} file {fname!r} is not listed in files (no sha256)")
        if self.tokenizer is not None:
            for name in (self.tokenizer.file, self.tokenizer.chat_template):
                if name is not None and name not in self.files:
                    raise ValueError(f"tokenizer file {name!r} is not listed in files (no sha256)")
        if self.actions and self.vocab.action is None:
            raise ValueError("action fields need a vocab.action range")
        for f in self.actions:
            hi = f.token_offset + f.size
            lo_a, hi_a = self.vocab.action
            if not (lo_a <= f.token_offset and hi <= hi_a):
                raise ValueError(f"action field {f.name!r} tokens [{f.token_offset}, {hi}) outside vocab.action")
        return self


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class Bundle:
    """A verified bundle folder. `path(name)` only hands out files whose sha256 was checked."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root = root
        self.manifest = manifest
        self._verified: set[str] = set()

    @classmethod
    def load(cls, root: str | Path, verify: bool = True) -> "Bundle":
        root = Path(root).resolve()
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise ValueError(f"bundle {root}: no {MANIFEST}")
        if mpath.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"bundle {root}: {MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            manifest = Manifest.model_validate(json.loads(mpath.read_text()))
        except (json.JSONDecodeError, ValidationError) as e:
            raise ValueError(f"bundle {root}: invalid {MANIFEST}: {e}") from None
        bundle = cls(root, manifest)
        if verify:
            for name in manifest.files:
                bundle.verify(name)
        return bundle

    def resolve(self, name: str) -> Path:
        if name not in self.manifest.files:
            raise ValueError(f"bundle {self.root}: {name!r} is not listed in {MANIFEST}")
        p = (self.root / name).resolve()
        if self.root not in p.parents:
            raise ValueError(f"bundle {self.root}: {name!r} resolves outside the bundle ({p})")
        return p

    def verify(self, name: str) -> Path:
        p = self.resolve(name)
        entry = self.manifest.files[name]
        if not p.is_file():
            raise ValueError(f"bundle {self.root}: missing file {name!r}")
        size = p.stat().st_size
        if size != entry.size_bytes:
            raise ValueError(f"bundle {self.root}: {name!r} is {size} bytes, manifest says {entry.size_bytes}")
        digest = sha256_file(p)
        if digest != entry.sha256:
            raise ValueError(f"bundle {self.root}: sha256 mismatch for {name!r}: "
                             f"file {digest[:12]}…, manifest {entry.sha256[:12]}…")
        self._verified.add(name)
        return p

    def path(self, name: str) -> Path:
        return self.resolve(name) if name in self._verified else self.verify(name)

    def decoder_path(self, role: Literal["target", "draft"], precision: Precision,
                     layout: Literal["optimum", "fused"] = "optimum") -> Path:
        """The verified file of a decoder in one layout (`decoder_layout` says which one to use)."""
        spec = self.manifest.target if role == "target" else self.manifest.draft
        files = (spec.fused if layout == "fused" else spec.files) if spec else {}
        if precision not in files:
            have = list(spec.precisions) if spec else []
            raise ValueError(f"bundle {self.root}: no {role} decoder in {precision} ({layout} layout; has {have})")
        return self.path(files[precision])

    def decoder_layout(self, role: Literal["target", "draft"], precision: Precision) -> str:
        """"fused" when the bundle has that decoder in the fused layout (the engine's own), else "optimum"."""
        spec = self.manifest.target if role == "target" else self.manifest.draft
        return "fused" if spec is not None and precision in spec.fused else "optimum"

    def load_array(self, name: str):
        import numpy as np

        return np.load(self.path(name), allow_pickle=False)

    def reference_prefixes(self) -> list:
        """The observation prefixes stored with the bundle's parity references (`reference.npz`:
        ids [N, L] int64 and prefix_len), [] when the bundle has none."""
        if REFERENCE not in self.manifest.files:
            return []
        with self.load_array(REFERENCE) as z:
            if "ids" not in z.files or "prefix_len" not in z.files:
                return []
            n = int(z["prefix_len"])
            return [row[:n].astype("int64") for row in z["ids"]]


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> Manifest:
    """Fill `files` with sha256/size of every listed file, validate, and write manifest.json."""
    root = Path(root)
    files = {}
    for name in manifest.get("files", {}):
        p = root / name
        files[name] = {"sha256": sha256_file(p), "size_bytes": p.stat().st_size}
    manifest = {**manifest, "files": files}
    m = Manifest.model_validate(manifest)
    (root / MANIFEST).write_text(json.dumps(m.model_dump(mode="json", exclude_none=True), indent=2) + "\n")
    return m
