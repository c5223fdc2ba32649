"""The per-class policy ("full precision where it matters"): the rules on decoded answers, and the
deadline guard routing covered fast answers to the real fp32 planner (tests/fixtures/tiny, real
ONNX Runtime) with time from a ManualClock, so every budget outcome is exact."""
import math

import pytest

from sol_control.actions import GraspDecision, QCVerdict
from sol_control.bundle import Bundle
from sol_control.budget import ManualClock
from sol_control.config import LimitsConfig, PolicyConfig, from_flat
from sol_control.decision import Failure
from sol_control.decoding import greedy
from sol_control.policy import near_xy_limit, overruled, policy_failure
from tests.conftest import FIXTURES
from tests.test_guard import PREFIX, Cfg, budget, make_guard

LIMITS = LimitsConfig()  # x, y in [-0.12, 0.12] m


def qc(defect: str, severity: float = 0.5) -> QCVerdict:
    return QCVerdict(defect, "pass" if defect == "ok" else "reject", 0.5, 0.5, severity, 0.9)


def grasp(x_m: float = 0.0, y_m: float = 0.0, force_n: float = 10.0,
          approach=((0.0, 0.0, 0.2), (0.0, 0.0, 0.1), (0.0, 0.0, 0.05))) -> GraspDecision:
    return GraspDecision(x_m, y_m, 0.02, 0.3, 0.05, force_n, approach, 0.9)


# -- the rules ----------------------------------------------------------------------------------
def test_policy_is_off_by_default():
    off = PolicyConfig()
    assert not off.active
    for action in (qc("crack", 1.0), qc("ok"), grasp(0.119, 0.0, 80.0)):
        assert policy_failure(action, off, LIMITS) is None


def test_qc_class_and_severity_rules():
    p = PolicyConfig(full_precision_qc_classes="crack, missing_hole", full_precision_qc_min_severity=0.7)
    assert p.full_precision_qc_classes == "crack,missing_hole" and p.active
    assert policy_failure(qc("crack", 0.1), p, LIMITS) == Failure("policy_qc_class", "crack")
    assert policy_failure(qc("missing_hole", 1.0), p, LIMITS) == Failure("policy_qc_class", "missing_hole")
    assert policy_failure(qc("scratch", 0.75), p, LIMITS) == Failure("policy_qc_severity", "0.75")
    assert policy_failure(qc("scratch", 0.69), p, LIMITS) is None
    assert policy_failure(qc("ok", 0.9), p, LIMITS) is None  # severity applies to rejects only
    # a safe default is never routed
    assert policy_failure(QCVerdict("unknown", "uncertain", math.nan, math.nan, math.nan, 0.0), p, LIMITS) is None


def test_grasp_force_and_workspace_margin_rules():
    p = PolicyConfig(full_precision_grasp_min_force_n=30.0, full_precision_workspace_margin_m=0.02)
    assert policy_failure(grasp(force_n=30.0), p, LIMITS) == Failure("policy_grasp_force", "30.0N")
    assert policy_failure(grasp(force_n=29.9), p, LIMITS) is None
    assert policy_failure(grasp(x_m=0.101), p, LIMITS) == Failure("policy_workspace_margin", "grasp")
    assert policy_failure(grasp(y_m=-0.099), p, LIMITS) is None
    near = ((0.0, 0.0, 0.2), (0.0, -0.11, 0.1), (0.0, 0.0, 0.05))
    assert policy_failure(grasp(approach=near), p, LIMITS) == Failure("policy_workspace_margin", "approach2")
    hold = GraspDecision(math.nan, math.nan, math.nan, math.nan, math.nan, 0.0, (), 0.0, hold=True)
    assert policy_failure(hold, p, LIMITS) is None
    assert near_xy_limit(0.13, 0.0, LIMITS, 0.01)  # outside the workspace counts as near


def test_bad_class_names_are_refused_with_the_field_and_value():
    with pytest.raises(ValueError, match=r"policy.full_precision_qc_classes.*Crack;scratch"):
        from_flat({"policy.full_precision_qc_classes": "Crack;scratch"})


def test_overruled_uses_the_audit_agreement():
    assert not overruled(qc("crack"), qc("crack", 0.2))
    assert overruled(qc("crack"), qc("scratch"))
    assert overruled(grasp(x_m=0.0), grasp(x_m=0.02)) and not overruled(grasp(x_m=0.0), grasp(x_m=0.005))


# -- the guard ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundle():
    return Bundle.load(FIXTURES / "tiny")


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()


BASE = {"qc.min_confidence": 0.0, "grasp.min_confidence": 0.0, "deadline.qc_ms": 5000.0,
        "deadline.grasp_ms": 5000.0}


def test_covered_fast_answer_is_decided_at_full_precision(bundle, clock):
    cfg = Cfg(**BASE)
    g = make_guard(bundle, "qc", cfg, clock)
    fast = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert fast.source == "fast" and fast.policy_rule == ""  # policy off: the fast answer stands
    cls = fast.action.defect
    cfg.value = from_flat({"policy.full_precision_qc_classes": cls}, base=cfg.value)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=2)
    assert d.source == "full_precision" and d.reason == f"policy_qc_class:{cls}"
    assert d.policy_rule == "policy_qc_class" and d.deadline_met
    assert list(d.tokens) == greedy(g.full.target, PREFIX, 4).tokens  # the real fp32 answer
    assert d.policy_overruled == overruled(fast.action, d.action)
    # another class listed: this answer is not covered
    cfg.value = from_flat({"policy.full_precision_qc_classes": "no_such_class"}, base=cfg.value)
    assert g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=3).source == "fast"


def test_covered_answer_without_time_for_fp32_is_a_labelled_safe_default(bundle, clock):
    cfg = Cfg(**BASE, **{"fault_injection.full_delay_ms": 500.0})
    g = make_guard(bundle, "qc", cfg, clock)  # fp32 measured at 500 ms (x 1.2 safety)
    cfg.value = from_flat({"fault_injection.full_delay_ms": 0.0, "deadline.qc_ms": 100.0}, base=cfg.value)
    fast = g.decide(PREFIX, budget(clock, 100.0), stamp_ns=1)
    assert fast.source == "fast"
    cfg.value = from_flat({"policy.full_precision_qc_classes": fast.action.defect}, base=cfg.value)
    calls = g.full.target.calls
    d = g.decide(PREFIX, budget(clock, 100.0), stamp_ns=2)
    assert d.source == "safe_default" and d.action.verdict == "uncertain" and d.deadline_met
    assert d.reason == f"policy_qc_class:{fast.action.defect}>full_precision_would_miss"
    assert d.policy_rule == "policy_qc_class" and g.full.target.calls == calls  # fp32 never started


def test_grasp_rules_route_through_the_guard(bundle, clock):
    # the fixture's decoded grasp values lie in [0, 0.04]: 0.08 m from the default x/y limits at least
    cfg = Cfg(**BASE)
    g = make_guard(bundle, "grasp", cfg, clock)
    fast = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert fast.source == "fast"
    cfg.value = from_flat({"policy.full_precision_workspace_margin_m": 0.075}, base=cfg.value)
    assert g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=2).source == "fast"
    cfg.value = from_flat({"policy.full_precision_workspace_margin_m": 0.2}, base=cfg.value)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=3)
    assert d.source == "full_precision" and d.reason == "policy_workspace_margin:grasp"
    cfg.value = from_flat({"policy.full_precision_workspace_margin_m": 0.0,
                           "policy.full_precision_grasp_min_force_n": fast.action.force_n}, base=cfg.value)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=4)
    assert d.source == "full_precision" and d.reason == f"policy_grasp_force:{fast.action.force_n:.1f}N"


def test_fast_failures_keep_their_own_reason_under_a_policy(bundle, clock):
    cfg = Cfg(**BASE, **{"fault_injection.fast_raise": True, "policy.full_precision_qc_classes": "ok"})
    g = make_guard(bundle, "qc", cfg, clock)
    d = g.decide(PREFIX, budget(clock, 5000.0), stamp_ns=1)
    assert d.source == "full_precision" and d.reason == "fast_error:InjectedFault" and d.policy_rule == ""
    assert not d.policy_overruled


def test_policy_route_cpu_time_and_overrule_survive_the_published_record():
    import rclpy  # noqa: F401  (a runtime pin: missing is a failure, not a skip)
    from sol_control.decision import Decision
    from sol_control.ros.convert import decision_from_status, decision_to_status

    d = Decision("qc", qc("scratch"), "full_precision", 9.0, 20.0, True, 7, "qc_camera", cpu_ms=8.5,
                 fast_failure=Failure("policy_qc_class", "crack"), policy_overruled=True)
    kv = {v.key: v.value for v in decision_to_status(d).values}
    assert kv["reason"] == "policy_qc_class:crack" and kv["policy_overruled"] == "true" and kv["cpu_ms"] == "8.5000"
    back = decision_from_status(decision_to_status(d))
    assert back.policy_rule == "policy_qc_class" and back.policy_overruled and back.cpu_ms == 8.5
