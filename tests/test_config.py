"""The typed config is the single source of truth: ROS parameters, YAML and CLI all go through it."""
import math

import pytest
import yaml

from sol_control.config import (STRUCTURAL, NodeConfig, apply_overrides, from_flat, load_yaml, param_specs,
                                render_yaml, to_flat, validate)
from tests.conftest import REPO


def test_defaults_file_matches_pydantic_defaults():
    assert load_yaml(REPO / "config" / "sol_control.yaml") == NodeConfig()


def test_defaults_file_is_generated_from_the_config():
    """config/sol_control.yaml is `python -m sol_control.config` output: regenerate it when the config
    changes (descriptions, ranges and defaults included)."""
    assert (REPO / "config" / "sol_control.yaml").read_text() == render_yaml()


def test_the_documented_parameter_table_is_generated_from_the_config():
    """docs/ROS_INTERFACE.md holds `python -m sol_control.config --markdown` between its markers."""
    from sol_control.config import render_markdown

    text = (REPO / "docs" / "ROS_INTERFACE.md").read_text()
    table = text.split("<!-- params:begin", 1)[1].split("-->", 1)[1].split("<!-- params:end -->", 1)[0]
    assert table.strip() == render_markdown().strip()


def test_advertised_ranges_admit_only_valid_values():
    """ROS ranges are inclusive: both advertised ends must be values the config accepts, and an
    exclusive bound is moved to the nearest valid value (and said so in the description)."""
    for s in param_specs():
        if s.kind not in (int, float):
            continue
        for end in (s.low, s.high):
            flat = {s.name: s.kind(end)}
            if s.name.startswith("limits."):  # a bound alone; its pair follows (they must stay ordered)
                pair = s.name.replace("_min_", "_max_") if "_min_" in s.name else s.name.replace("_max_", "_min_")
                flat[pair] = s.kind(end)
            assert from_flat(flat).model_dump() is not None, s.name
    qc = {s.name: s for s in param_specs()}["deadline.qc_ms"]
    assert 0.0 < qc.low < 1e-300 and qc.range_text == "(0.0, 60000.0]"
    with pytest.raises(ValueError, match="deadline.qc_ms"):
        from_flat({"deadline.qc_ms": 0.0})


def test_structural_fields_are_marked_on_the_field():
    assert {"mode", "decoding.fast_precision", "deadline.output_deadline_ms"} <= set(STRUCTURAL)
    assert "qc.bundle" not in STRUCTURAL  # swapped in between two frames (tests/test_bundle_swap.py)
    assert "deadline.qc_ms" not in STRUCTURAL and all(s in {p.name for p in param_specs()} for s in STRUCTURAL)


def test_every_leaf_field_is_a_described_parameter_with_range():
    specs = {s.name: s for s in param_specs()}
    assert set(specs) == set(to_flat(NodeConfig()))
    for s in specs.values():
        assert s.description, s.name
        if s.kind in (int, float):
            assert s.low is not None and s.high is not None and s.low <= s.high, s.name
            assert s.low <= s.default <= s.high, s.name
    assert specs["mode"].choices == ("qc", "grasp", "both")
    assert specs["deadline.qc_ms"].kind is float and specs["decoding.k"].kind is int


@pytest.mark.parametrize("key,value,field", [
    ("deadline.qc_ms", -1.0, "deadline.qc_ms"),
    ("deadline.qc_ms", 0.0, "deadline.qc_ms"),
    ("audit_rate", 1.5, "audit_rate"),
    ("mode", "fast", "mode"),
    ("decoding.fast_precision", "fp16", "decoding.fast_precision"),
    ("decoding.k", 99, "decoding.k"),
    ("limits.width_min_m", 0.5, "limits"),
])
def test_invalid_values_name_the_field_and_the_value(key, value, field):
    with pytest.raises(ValueError) as e:
        from_flat({key: value})
    assert field in str(e.value) and repr(value) in str(e.value)


def test_unknown_keys_are_refused():
    with pytest.raises(ValueError, match="deadline.qc_mss"):
        from_flat({"deadline.qc_mss": 5.0})


def test_flat_round_trip_and_base():
    cfg = from_flat({"deadline.grasp_ms": 7.5, "mode": "grasp"})
    assert cfg.deadline.grasp_ms == 7.5 and cfg.tasks == ("grasp",)
    assert from_flat(to_flat(cfg)) == cfg
    cfg2 = from_flat({"audit_rate": 0.0}, base=cfg)
    assert cfg2.deadline.grasp_ms == 7.5 and cfg2.audit_rate == 0.0


def test_cli_overrides():
    cfg = apply_overrides(NodeConfig(), ["deadline.qc_ms=8", "mode=qc", "fault_injection.fast_raise=true"])
    assert cfg.deadline.qc_ms == 8.0 and cfg.mode == "qc" and cfg.fault_injection.fast_raise
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_overrides(NodeConfig(), ["nonsense=1"])
    with pytest.raises(ValueError, match="deadline.qc_ms"):
        apply_overrides(NodeConfig(), ["deadline.qc_ms=-3"])


def test_yaml_wildcard_section_and_errors(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"deadline": {"qc_ms": 4.0}, "mode": "qc"}}}))
    cfg = load_yaml(p)
    assert cfg.deadline.qc_ms == 4.0 and cfg.mode == "qc"
    p.write_text(yaml.safe_dump({"other_node": {"ros__parameters": {"mode": "qc"}}}))
    with pytest.raises(ValueError, match="ros__parameters"):
        load_yaml(p)
    p.write_text(yaml.safe_dump({"sol_control": {"ros__parameters": {"qc": {"min_confidence": 2.0}}}}))
    with pytest.raises(ValueError, match="qc.min_confidence"):
        load_yaml(p)


def test_fault_injection_is_off_by_default():
    f = NodeConfig().fault_injection
    assert f.fast_delay_ms == 0.0 and not f.fast_raise and f.full_delay_ms == 0.0


def test_validate_accepts_nested_dicts():
    cfg = validate({"qc": {"camera_to_ejector_m": 1.25}})
    assert math.isclose(cfg.qc.camera_to_ejector_m, 1.25)
