"""Action tokenizer: bins <-> SI units, categorical labels, limits and safe defaults."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sol_control.actions import ActionTokenizer, GraspDecision, QCVerdict, limit_violations, safe_default
from sol_control.bundle import Manifest
from sol_control.config import LimitsConfig
from sol_control.tasks.common import ACTION_BINS, GRASP_FIELDS, GRASP_RANGES, QC_DEFECTS, QC_RANGES
from tests.conftest import MODELS

SHA = "0" * 64


def task_manifest(task: str) -> Manifest:
    """A manifest with the shipped vocabulary layout: labels, then 256 shared bins."""
    obs = (4, 100)
    labels_at = obs[1]
    bins_at = labels_at + (len(QC_DEFECTS) if task == "qc" else 0)
    actions = []
    if task == "qc":
        actions.append({"name": "defect", "kind": "categorical", "token_offset": labels_at,
                        "size": len(QC_DEFECTS), "labels": list(QC_DEFECTS)})
        ranges = QC_RANGES
        names = ("u", "v", "severity")
    else:
        ranges, names = GRASP_RANGES, GRASP_FIELDS
    for n in names:
        unit, lo, hi, tol = ranges[n]
        actions.append({"name": n, "kind": "bins", "token_offset": bins_at, "size": ACTION_BINS,
                        "unit": unit, "low": lo, "high": hi, "tolerance": tol})
    size = bins_at + ACTION_BINS
    dec = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 4, "hidden_size": 4, "params": 1, "files": {"fp32": "t.onnx"}}
    return Manifest.model_validate({
        "name": f"test-{task}", "task": task, "max_context": 64,
        "vocab": {"size": size, "observation": list(obs), "action": [labels_at, size]},
        "target": dec, "actions": actions, "files": {"t.onnx": {"sha256": SHA, "size_bytes": 1}}})


@pytest.fixture(scope="module")
def qc():
    return ActionTokenizer.from_manifest(task_manifest("qc"), uncertain_below=0.4)


@pytest.fixture(scope="module")
def grasp():
    return ActionTokenizer.from_manifest(task_manifest("grasp"))


def test_layout(qc, grasp):
    assert qc.task == "qc" and qc.n_tokens == 4
    assert grasp.task == "grasp" and grasp.n_tokens == 15
    assert qc.bin_range == (106, 106 + 256) and grasp.bin_range == (100, 356)
    assert qc.field_range(0) == (100, 106)


def test_qc_decode_verdicts(qc):
    ok = qc.decode([100, 106 + 128, 106 + 64, 106], [0.9, 0.8, 0.95, 0.7])
    assert ok == QCVerdict("ok", "pass", (128.5) / 256, 64.5 / 256, 0.5 / 256, 0.9)
    crack = qc.decode([102, 106, 106, 106 + 255], [0.9] * 4)
    assert crack.defect == "crack" and crack.verdict == "reject"
    # QC confidence is the defect class's probability: low bin probabilities do not make it unsure
    assert qc.decode([101, 106, 106, 106], [0.9, 0.3, 0.02, 0.9]).confidence == pytest.approx(0.9)
    unsure = qc.decode([101, 106, 106, 106], [0.3, 0.9, 0.9, 0.9])
    assert unsure.verdict == "uncertain" and unsure.confidence == pytest.approx(0.3)


def test_out_of_range_and_wrong_length_raise(qc, grasp):
    with pytest.raises(ValueError, match="defect"):
        qc.decode([106, 106, 106, 106])  # a bin token where a label belongs
    with pytest.raises(ValueError, match="'u'"):
        qc.decode([100, 99, 106, 106])
    with pytest.raises(ValueError, match="expected 15"):
        grasp.decode([100] * 14)
    with pytest.raises(ValueError, match="unknown label"):
        qc.encode({"defect": "rust", "u": 0.1, "v": 0.1, "severity": 0.1})
    with pytest.raises(ValueError, match="finite"):
        qc.encode({"defect": "ok", "u": math.nan, "v": 0.1, "severity": 0.1})


def test_mismatched_fields_are_refused():
    m = task_manifest("qc")
    with pytest.raises(ValueError, match="task 'qc' needs the action fields"):
        ActionTokenizer.from_manifest(m.model_copy(update={"actions": m.actions[:2]}))


def test_a_generic_task_decodes_its_own_fields():
    """A user's task (any name but qc / grasp) keeps its own action fields; they decode to values."""
    m = task_manifest("qc")
    tok = ActionTokenizer.from_manifest(m.model_copy(update={"task": "sorter", "actions": m.actions[:2]}))
    out = tok.decode([m.actions[0].token_offset + 2, m.actions[1].token_offset + 128], [0.9, 0.8])
    assert out.values == {"defect": m.actions[0].labels[2], "u": pytest.approx(128.5 / 256)}
    assert out.confidence == 0.9  # the categorical field's probability
    with pytest.raises(ValueError, match="no action fields"):
        ActionTokenizer.from_manifest(m.model_copy(update={"task": "lm", "actions": ()}))


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=10)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=15, max_size=15))
def test_grasp_round_trip_within_half_a_bin(values):
    tok = ActionTokenizer.from_manifest(task_manifest("grasp"))
    labels = dict(zip(GRASP_FIELDS, values))
    tokens = tok.encode(labels)
    assert all(100 <= t < 356 for t in tokens)
    decoded = tok.decode(tokens).to_labels()
    for name in GRASP_FIELDS:
        _, lo, hi, _ = GRASP_RANGES[name]
        clipped = min(max(labels[name], lo), hi)
        assert abs(decoded[name] - clipped) <= (hi - lo) / 256 / 2 + 1e-9, name
    assert tok.encode(tok.decode(tokens)) == tokens  # tokens -> decision -> tokens is exact


def test_grasp_decision_fields(grasp):
    g = grasp.decode(grasp.encode({n: 0.05 for n in GRASP_FIELDS}), [0.5] * 14 + [0.25])
    assert isinstance(g, GraspDecision) and len(g.approach_m) == 3 and not g.hold
    assert g.x_m == pytest.approx(0.05, abs=0.0006) and g.confidence == 0.25  # all bins: min over all


def test_limits():
    lim = LimitsConfig()
    ok = GraspDecision(0.0, 0.0, 0.03, 0.1, 0.05, 20.0, ((0, 0, 0.15), (0, 0, 0.09), (0, 0, 0.05)), 0.9)
    assert limit_violations(ok, lim) == []
    far = GraspDecision(0.2, 0.0, 0.03, 0.1, 0.05, 20.0, ((0, 0, 0.15),), 0.9)
    assert limit_violations(far, lim) == ["grasp_outside_workspace_xy"]
    wide = GraspDecision(0.0, 0.0, 0.03, 0.1, 0.5, 200.0, ((0, 0, 0.9),), 0.9)
    assert limit_violations(wide, lim) == ["approach1_outside_workspace_z", "width", "force"]
    assert limit_violations(QCVerdict("ok", "pass", 0.5, 0.5, 0.0, 1.0), lim) == []


def test_safe_defaults():
    hold = safe_default("grasp")
    assert hold.hold and hold.confidence == 0.0 and limit_violations(hold, LimitsConfig()) == []
    divert = safe_default("qc")
    assert divert.verdict == "uncertain" and divert.confidence == 0.0


@pytest.mark.parametrize("task", ["qc", "grasp"])
def test_shipped_manifests_fit_the_contract(task):
    from sol_control.bundle import Bundle

    m = Bundle.load(MODELS / task, verify=False).manifest
    tok = ActionTokenizer.from_manifest(m)
    assert tok.task == task
    lo, hi = tok.bin_range
    assert hi - lo == 256
