"""A policy bundle's token layout: vocabulary, observation bins and action fields (numpy only).

Observation tokens come first (`tasks.common.feature_config`), then the action tokens. QC: the
class is one categorical token over `labels` (the shipped bundle's six, or a user's own classes
with `sol-control train --from-scratch`), then u, v and severity share one 256-bin range. Grasp: 15
fields share one 256-bin range; width's bins are relative to the measured extent (`GRASP_RELATIVE`). The vocabulary is rounded up to a multiple of 16.
"""
from __future__ import annotations

import math

from sol_control.actions import ActionTokenizer
from sol_control.bundle import ActionField
from sol_control.tasks import common
from sol_control.tasks.common import BOS, EOS, SEP, feature_config


FUSED = {p: f"target_fused_{p}.onnx" for p in ("fp32", "int8", "int4")}  # a bundle's fused graph files


def _qc_fields(a0: int, labels: tuple[str, ...]) -> tuple[list[dict], int]:
    fields = [dict(name="defect", kind="categorical", token_offset=a0, size=len(labels), labels=list(labels))]
    bins0 = a0 + len(labels)
    for name in common.QC_FIELDS[1:]:
        unit, low, high, tol = common.QC_RANGES[name]
        fields.append(dict(name=name, kind="bins", token_offset=bins0, size=common.ACTION_BINS,
                           unit=unit, low=low, high=high, tolerance=tol))
    return fields, bins0 + common.ACTION_BINS


def _grasp_fields(a0: int) -> tuple[list[dict], int]:
    fields = []
    for name in common.GRASP_FIELDS:
        unit, low, high, tol = common.GRASP_RANGES[name]
        extra = {}
        if name in common.GRASP_RELATIVE:
            base, low, high = common.GRASP_RELATIVE[name]
            extra = {"relative_to": base}
        fields.append(dict(name=name, kind="bins", token_offset=a0, size=common.ACTION_BINS,
                           unit=unit, low=low, high=high, tolerance=tol, **extra))
    return fields, a0 + common.ACTION_BINS


def layout(task: str, labels: tuple[str, ...] | None = None) -> dict:
    """Vocabulary, observation config and action fields of a task's bundle. `labels`: the QC
    classes ("ok" first; default the shipped six)."""
    obs = feature_config(task)
    a0 = obs["token_range"][1]
    if task == "qc":
        fields, a1 = _qc_fields(a0, tuple(labels or common.QC_DEFECTS))
    else:
        fields, a1 = _grasp_fields(a0)
    size = int(math.ceil(a1 / 16) * 16)
    vocab = {"size": size, "pad": 0, "bos": BOS, "eos": EOS, "sep": SEP, "observation": list(obs["token_range"]),
             "action": [a0, a1]}
    return {"vocab": vocab, "observation": obs, "actions": fields}


def action_tokenizer(task: str, labels: tuple[str, ...] | None = None) -> ActionTokenizer:
    lay = layout(task, labels)
    return ActionTokenizer(task, tuple(ActionField(**f) for f in lay["actions"]),
                           features=tuple(lay["observation"]["features"]))
