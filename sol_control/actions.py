"""Action tokens <-> decisions in SI units, limits, and the safe defaults.

The manifest's `actions` list drives everything: each field is one token, `bins` fields quantize a
value in [low, high] into `size` bins (bin centre on decode, OpenVLA style), `categorical` fields
pick one of `labels`. Token id = field.token_offset + index. A `relative_to` field's bins hold the
value minus an observation feature as the decision's prefix measured it (its bin centre), so
decoding and encoding it take that prefix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from sol_control.bundle import ActionField, Manifest
from sol_control.config import LimitsConfig

QC_FIELDS = ("defect", "u", "v", "severity")
GRASP_FIELDS = ("x", "y", "z", "yaw", "width", "force",
                "a1_x", "a1_y", "a1_z", "a2_x", "a2_y", "a2_z", "a3_x", "a3_y", "a3_z")
QC_LABELS = ("ok", "scratch", "crack", "missing_hole", "discoloration", "deformed")


@dataclass(frozen=True)
class GraspDecision:
    x_m: float
    y_m: float
    z_m: float
    yaw_rad: float
    width_m: float
    force_n: float
    approach_m: tuple[tuple[float, float, float], ...]
    confidence: float
    hold: bool = False  # True = safe default: keep the arm still, no grasp

    def to_labels(self) -> dict[str, float]:
        out = {"x": self.x_m, "y": self.y_m, "z": self.z_m, "yaw": self.yaw_rad,
               "width": self.width_m, "force": self.force_n}
        for i, (ax, ay, az) in enumerate(self.approach_m, start=1):
            out.update({f"a{i}_x": ax, f"a{i}_y": ay, f"a{i}_z": az})
        return out


@dataclass(frozen=True)
class QCVerdict:
    defect: str
    verdict: str  # "pass" | "reject" | "uncertain" (route to manual inspection)
    u: float  # defect location in image coordinates 0..1 (NaN when unknown)
    v: float
    severity: float
    confidence: float

    def to_labels(self) -> dict[str, Any]:
        return {"defect": self.defect, "u": self.u, "v": self.v, "severity": self.severity}


@dataclass(frozen=True)
class FieldValues:
    """The decoded action fields of a generic (user) task: bins -> value at the bin centre (in the
    field's unit), categorical -> label. The node publishes only QC and grasp decisions."""

    values: dict[str, Any]
    confidence: float


Action = GraspDecision | QCVerdict


def safe_default(task: str) -> Action:
    """Grasp: hold, no grasp. QC: divert the part to manual inspection."""
    if task == "grasp":
        return GraspDecision(math.nan, math.nan, math.nan, math.nan, math.nan, 0.0, (), 0.0, hold=True)
    return QCVerdict("unknown", "uncertain", math.nan, math.nan, math.nan, 0.0)


@dataclass
class ActionTokenizer:
    task: str  # "qc" | "grasp" | a generic task's name
    fields: tuple[ActionField, ...]
    uncertain_below: float = 0.0  # QC confidence below this -> verdict "uncertain"
    features: tuple[dict, ...] = ()  # the observation's feature bins (a relative_to field's base)
    _by_name: dict[str, ActionField] = field(init=False, repr=False)
    _bases: dict[str, dict] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {f.name: f for f in self.fields}
        specs = {s["name"]: s for s in self.features}
        self._bases = {}
        for f in self.fields:
            if f.relative_to is not None:
                if f.relative_to not in specs:
                    raise ValueError(f"action field {f.name!r}: relative_to {f.relative_to!r} is not an "
                                     f"observation feature ({sorted(specs)})")
                self._bases[f.name] = specs[f.relative_to]

    @classmethod
    def from_manifest(cls, manifest: Manifest, *, uncertain_below: float = 0.0) -> ActionTokenizer:
        """QC and grasp bundles must carry exactly their fields; any other task decodes its own
        fields into FieldValues."""
        names = tuple(f.name for f in manifest.actions)
        if not names:
            raise ValueError(f"bundle {manifest.name!r} (task {manifest.task!r}) has no action fields")
        expected = {"qc": QC_FIELDS, "grasp": GRASP_FIELDS}.get(manifest.task)
        if expected is not None and names != expected:
            raise ValueError(f"bundle {manifest.name!r}: task {manifest.task!r} needs the action fields "
                             f"{expected}, got {names}")
        return cls(manifest.task, tuple(manifest.actions), uncertain_below,
                   tuple(manifest.observation.get("features", ())))

    @property
    def n_tokens(self) -> int:
        return len(self.fields)

    @property
    def bin_range(self) -> tuple[int, int]:
        bins = [f for f in self.fields if f.kind == "bins"]
        if not bins:
            raise ValueError("no bins fields")
        return min(f.token_offset for f in bins), max(f.token_offset + f.size for f in bins)

    def field_range(self, i: int) -> tuple[int, int]:
        """Valid token ids [lo, hi) at action position i."""
        f = self.fields[i]
        return f.token_offset, f.token_offset + f.size

    # -- values <-> indices -----------------------------------------------------------------------
    @staticmethod
    def _bin_value(f: ActionField, index: int) -> float:
        return f.low + (index + 0.5) * (f.high - f.low) / f.size  # bin centre

    @staticmethod
    def _value_bin(f: ActionField, value: float) -> int:
        if not math.isfinite(value):
            raise ValueError(f"action field {f.name!r}: value must be finite, got {value}")
        return min(f.size - 1, max(0, int(math.floor((value - f.low) / (f.high - f.low) * f.size))))

    def _base(self, f: ActionField, prefix: Sequence[int] | None) -> float:
        """A relative_to field's base: its feature's bin centre, from that feature's token in the
        prefix (0.0 for other fields)."""
        spec = self._bases.get(f.name)
        if spec is None:
            return 0.0
        lo = spec["offset"]
        found = [int(t) - lo for t in (() if prefix is None else prefix) if lo <= int(t) < lo + spec["size"]]
        if len(found) != 1:
            raise ValueError(f"action field {f.name!r} is relative to {spec['name']!r}: needs the decision's "
                             f"prefix with one {spec['name']!r} token, got {len(found)}")
        return feature_bin_centre(spec, found[0])

    def _values(self, tokens: Sequence[int], prefix: Sequence[int] | None = None) -> dict[str, Any]:
        if len(tokens) != self.n_tokens:
            raise ValueError(f"expected {self.n_tokens} action tokens, got {len(tokens)}")
        out: dict[str, Any] = {}
        for f, tok in zip(self.fields, tokens):
            index = int(tok) - f.token_offset
            if not 0 <= index < f.size:
                raise ValueError(f"action field {f.name!r}: token {int(tok)} outside "
                                 f"[{f.token_offset}, {f.token_offset + f.size})")
            out[f.name] = (f.labels[index] if f.kind == "categorical"
                           else self._bin_value(f, index) + self._base(f, prefix))
        return out

    # -- public ----------------------------------------------------------------------------------
    def confidence(self, probs: Sequence[float] | None) -> float:
        """The lowest target probability over the decision's categorical tokens (QC: the defect
        class, which decides pass/reject), or over all tokens when every field is bins (grasp).
        A bins token's probability measures one exact bin out of 256 (a QC severity bin is ~0.02
        even when right), so it would drown the class confidence that routes a part."""
        if probs is None or not len(probs):
            return 1.0
        cat = [p for f, p in zip(self.fields, probs) if f.kind == "categorical"]
        return float(min(cat if cat else probs))

    def decode(self, tokens: Sequence[int], probs: Sequence[float] | None = None,
               prefix: Sequence[int] | None = None) -> Action | FieldValues:
        """`prefix`: the observation tokens the decision was made from (needed by relative_to fields)."""
        values = self._values(tokens, prefix)
        confidence = self.confidence(probs)
        if self.task not in ("qc", "grasp"):
            return FieldValues(values, confidence)
        if self.task == "qc":
            defect = values["defect"]
            verdict = "pass" if defect == "ok" else "reject"
            if confidence < self.uncertain_below:
                verdict = "uncertain"
            return QCVerdict(defect, verdict, values["u"], values["v"], values["severity"], confidence)
        approach = tuple((values[f"a{i}_x"], values[f"a{i}_y"], values[f"a{i}_z"]) for i in (1, 2, 3))
        return GraspDecision(values["x"], values["y"], values["z"], values["yaw"], values["width"],
                             values["force"], approach, confidence)

    def encode(self, decision_or_labels: Action | dict[str, Any], prefix: Sequence[int] | None = None) -> list[int]:
        labels = (decision_or_labels.to_labels() if isinstance(decision_or_labels, (GraspDecision, QCVerdict))
                  else decision_or_labels)
        tokens = []
        for f in self.fields:
            if f.name not in labels:
                raise ValueError(f"encode: missing action field {f.name!r}")
            value = labels[f.name]
            if f.kind == "categorical":
                if value not in f.labels:
                    raise ValueError(f"action field {f.name!r}: unknown label {value!r} (labels {f.labels})")
                tokens.append(f.token_offset + f.labels.index(value))
            else:
                tokens.append(f.token_offset + self._value_bin(f, float(value) - self._base(f, prefix)))
        return tokens


def feature_bin_centre(spec: dict, index: int) -> float:
    """The centre of an observation feature's bin `index` (the inverse of perception.bin_feature)."""
    low, high, size = spec["low"], spec["high"], spec["size"]
    if spec.get("scale") == "log":
        return math.exp(math.log(low) + (index + 0.5) * (math.log(high) - math.log(low)) / size)
    return low + (index + 0.5) * (high - low) / size


# -- limits ---------------------------------------------------------------------------------------
def limit_violations(action: Action, limits: LimitsConfig) -> list[str]:
    """Names of the limits a decision breaks (empty = inside the safe envelope). QC has none."""
    if not isinstance(action, GraspDecision) or action.hold:
        return []
    out = []
    points = [("grasp", (action.x_m, action.y_m, action.z_m))]
    points += [(f"approach{i}", p) for i, p in enumerate(action.approach_m, start=1)]
    for name, (x, y, z) in points:
        if not (limits.x_min_m <= x <= limits.x_max_m and limits.y_min_m <= y <= limits.y_max_m):
            out.append(f"{name}_outside_workspace_xy")
        if not limits.z_min_m <= z <= limits.z_max_m:
            out.append(f"{name}_outside_workspace_z")
    if not limits.width_min_m <= action.width_m <= limits.width_max_m:
        out.append("width")
    if not limits.force_min_n <= action.force_n <= limits.force_max_n:
        out.append("force")
    if not math.isfinite(action.yaw_rad):
        out.append("yaw")
    return out
