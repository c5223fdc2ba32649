"""A user's labelled images -> token arrays to train on (torch for the fill below).

Each image's answer is the QC action: class, u, v, severity. The class always comes from its folder;
u, v from positions.csv where a row gives them; severity never (a folder has no magnitudes). Tokens
of unknown values are filled so that every trained token is a valid one:
- fine-tuning: the starting target's own greedy choice given the known tokens before it (restricted
  to the field's tokens), so it keeps answering as it did where the user's data says nothing;
- from scratch: the shipped generator's conventions (tasks.qc): ok -> u = v = 0.5, severity 0; a
  defect without a position -> the image centre (0.5, 0.5), severity 0.5.
Unknown values stay NaN in the labels, so scoring ignores them.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from sol_control.actions import ActionTokenizer

UNKNOWN = -1
OK_CONVENTION = {"u": 0.5, "v": 0.5, "severity": 0.0}  # tasks.qc.make_sample's "ok" label
DEFECT_FILL = {"u": 0.5, "v": 0.5, "severity": 0.5}


def known_tokens(labels: list[dict], acts: ActionTokenizer, fill_unknown: bool) -> np.ndarray:
    """[N, A] action tokens of the labels' known values; unknown ones UNKNOWN, or with
    `fill_unknown` the from-scratch conventions (module docstring)."""
    rows = []
    for lab in labels:
        fill = OK_CONVENTION if lab["defect"] == "ok" else DEFECT_FILL
        values = {k: (lab[k] if math.isfinite(lab[k]) else fill[k]) for k in ("u", "v", "severity")}
        tokens = acts.encode({"defect": lab["defect"], **values})
        if not fill_unknown:
            tokens = [t if f.kind == "categorical" or math.isfinite(lab[f.name]) else UNKNOWN
                      for f, t in zip(acts.fields, tokens)]
        rows.append(tokens)
    return np.asarray(rows, np.int64)


def fill_from_model(model, prefix: np.ndarray, tokens: np.ndarray, acts: ActionTokenizer) -> np.ndarray:
    """`tokens` [N, A] with every UNKNOWN replaced by `model`'s greedy token given the prefix and
    the tokens before it, chosen among its field's tokens."""
    out = tokens.copy()
    for j in range(out.shape[1]):
        rows = np.nonzero(out[:, j] == UNKNOWN)[0]
        if not len(rows):
            continue
        lo, hi = acts.field_range(j)
        seq = torch.from_numpy(np.concatenate([prefix[rows], out[rows, :j]], axis=1))  # [n, P + j]
        with torch.no_grad():
            logits = model(input_ids=seq).logits[:, -1, lo:hi]  # [n, field size]
        out[rows, j] = logits.argmax(-1).numpy() + lo
    return out


def action_targets(labels: list[dict], prefix: np.ndarray, acts: ActionTokenizer, model=None) -> np.ndarray:
    """[N, A] tokens to train on: known values, the rest from `model` (fine-tuning) or, without
    one (from scratch), the conventions."""
    if model is None:
        return known_tokens(labels, acts, fill_unknown=True)
    model.eval()
    return fill_from_model(model, prefix, known_tokens(labels, acts, fill_unknown=False), acts)
