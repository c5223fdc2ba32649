"""`sol-control doctor`: what it reports and what it advises (speed is never asserted)."""
from __future__ import annotations

import json
import math

import pytest

from .conftest import bundle_dir
from sol_control.cli import main
from sol_control.doctor import BACKEND_HINT, holds, needed_ms, recommend

QC = bundle_dir("qc")
needs_qc = pytest.mark.skipif(QC is None, reason="no qc bundle (make models)")


def _doctor(tmp_path, *extra: str) -> dict:
    path = tmp_path / "doctor.json"
    assert main(["doctor", "--bundle", str(QC), "--decisions", "3", "--json", str(path), *extra]) == 0
    return json.loads(path.read_text())


@needs_qc
def test_doctor_reports_the_cpu_and_a_timed_verdict_per_precision(tmp_path, capsys):
    got = _doctor(tmp_path)
    m = got["machine"]
    assert m["cpu"] and m["arch"] and m["variant"] in m["runnable"] and isinstance(m["flags"], list)
    (b,) = got["bundles"]
    assert b["task"] == "qc" and b["deadline_ms"] == 20.0  # the node's default deadline.qc_ms
    assert [r["precision"] for r in b["rows"]] == ["int8", "int4", "fp32"]
    assert [r["path"] for r in b["rows"]] == ["fast", "fast", "full_precision"]
    for r in b["rows"]:
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["decisions"] == 3
        assert r["backend"] in ("native", "onnxruntime") and isinstance(r["holds"], bool)
        assert r["holds"] == (r["needed_ms"] <= r["deadline_ms"])
        assert math.isclose(r["needed_ms"], needed_ms(r["p99_ms"], got["publish_margin_ms"]))
    out = capsys.readouterr().out
    assert m["variant"] in out and "holds" in out and "sol_control-qc" in out


@needs_qc
def test_a_deadline_nothing_meets_gets_measured_alternatives_and_the_deadline_it_needs(tmp_path):
    got = _doctor(tmp_path, "--param", "deadline.qc_ms=0.001")  # 1 us: no decoder decides that fast
    (b,) = got["bundles"]
    by = {r["precision"]: r for r in b["rows"]}
    assert not any(r["holds"] for r in b["rows"])
    assert by["int8"]["alternatives"] and by["fp32"]["alternatives"]  # what the node runs: timed otherwise too
    assert by["int4"]["alternatives"] == {}  # not the configured fast path
    for key in ("int8", "fp32"):
        want = f"raise deadline.qc_ms to {math.ceil(needed_ms(by[key]['p99_ms'], 1.0))} ms"
        assert any(want in a for a in b["advice"]), (want, b["advice"])


def test_a_session_without_backend_info_is_named_by_its_type_and_its_step_not_measured():
    from sol_control.doctor import _backend, _step

    class Plain:  # a decoder opened directly, not by open_decoder: it does not say what it measured
        backend_info = None

    assert _backend(Plain()) == (None, "onnxruntime")
    assert _step({"step_ms": None}) == "not measured" and _step({"step_ms": {}}) == "not measured"
    info = {"backend": "native", "variant": "avx2", "step_ms": {"native": 0.05, "onnxruntime": 0.15}}
    sess = Plain()
    sess.backend_info = info
    assert _backend(sess) == (info, "native")
    assert _step({"step_ms": info["step_ms"]}) == "0.050/0.150" and _step({"step_ms": {"native": 0.2}}) == "0.200/-"


def _rows(int8: float, int4: float, fp32: float, alternatives: dict | None = None) -> list[dict]:
    """Synthetic rows: p99 ms per precision, and {precision: {setting: p99 ms}} measured otherwise."""
    return [{"precision": p, "path": "full_precision" if p == "fp32" else "fast", "p99_ms": ms,
             "alternatives": (alternatives or {}).get(p, {})} for p, ms in (("int8", int8), ("int4", int4), ("fp32", fp32))]


def test_holds_means_p99_times_the_safety_factor_plus_the_margin_fits():
    assert holds(9.5, 20.0, 1.0, 2.0) and not holds(9.6, 20.0, 1.0, 2.0)
    assert needed_ms(9.5, 1.0, 2.0) == 20.0


def test_nothing_to_change_when_both_planners_fit():
    assert recommend("qc", _rows(1.0, 2.0, 4.0), "int8", 20.0, 1.0, 2.0) == []


def test_a_fast_path_over_the_deadline_gets_the_precision_that_fits_or_a_longer_deadline():
    advice = recommend("qc", _rows(6.0, 3.0, 4.0), "int8", 10.0, 1.0, 2.0)  # int8 needs 13 ms, int4 7 ms
    assert len(advice) == 2
    assert "set decoding.fast_precision: int4 (p99 3.00 ms)" in advice[0]
    assert advice[1].endswith("or raise deadline.qc_ms to 13 ms")
    # int4 as configured misses; int8 fits
    advice = recommend("grasp", _rows(3.0, 6.0, 4.0), "int4", 10.0, 1.0, 2.0)
    assert "fast path (int4)" in advice[0] and "set decoding.fast_precision: int8" in advice[0]


def test_a_measured_backend_or_thread_count_that_fits_is_suggested_before_the_deadline():
    alt = {"int8": {BACKEND_HINT["onnxruntime"]: 3.5, "decoding.threads: 2": 4.0}}
    advice = recommend("qc", _rows(6.0, 8.0, 4.0, alt), "int8", 10.0, 1.0, 2.0)
    assert "set decoding.backend: onnxruntime" in advice[0] and "SOL_CONTROL_BACKEND=onnxruntime" in advice[0]
    assert "set decoding.threads: 2 (p99 4.00 ms)" in advice[1]  # both fit, the faster first
    assert "raise deadline.qc_ms to 13 ms" in advice[2]


def test_when_nothing_fits_the_deadline_needed_is_computed_from_the_fastest_option():
    alt = {"int8": {"decoding.threads: 2": 5.0}}
    (advice,) = recommend("qc", _rows(6.0, 7.0, 4.0, alt), "int8", 10.0, 1.0, 2.0)
    assert advice.endswith("raise deadline.qc_ms to 13 ms, or to 11 ms with decoding.threads: 2")
    # an option hardly faster is not worth naming
    (advice,) = recommend("qc", _rows(6.0, 7.0, 4.0, {"int8": {"decoding.threads: 2": 5.9}}), "int8", 10.0, 1.0, 2.0)
    assert advice.endswith("raise deadline.qc_ms to 13 ms")


def test_a_full_precision_planner_over_the_deadline_is_named_as_the_lost_fallback():
    (advice,) = recommend("grasp", _rows(1.0, 2.0, 12.0), "int8", 20.0, 1.0, 2.0)  # fp32 needs 25 ms
    assert "full-precision planner" in advice and "safe default" in advice
    assert advice.endswith("raise deadline.grasp_ms to 25 ms")
