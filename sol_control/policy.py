"""Full precision where it matters: which fast answers the per-class policy sends to fp32.

    fast answer ─► covered by a `policy.*` rule? ─► no ─► published as `fast`
                                                 └► yes ─► the full-precision planner, if it fits
                                                           (else the labelled safe default)

The rules (config `policy`, each off by default):

    policy_qc_class          a fast QC verdict of a listed defect class (`full_precision_qc_classes`)
    policy_qc_severity       a fast QC reject at or above `full_precision_qc_min_severity`
    policy_grasp_force       a fast grasp at or above `full_precision_grasp_min_force_n`
    policy_workspace_margin  a fast grasp whose grasp point or an approach waypoint lies within
                             `full_precision_workspace_margin_m` of an x/y workspace limit

The first rule that applies becomes the decision's fast failure (`Failure(rule, detail)`), so the
published `reason` names it: `policy_qc_class:crack` when fp32 answered,
`policy_qc_class:crack>full_precision_would_miss` when it could not and the safe default went out.
"""
from __future__ import annotations

from sol_control.actions import Action, GraspDecision, QCVerdict
from sol_control.audit import agrees
from sol_control.config import LimitsConfig, PolicyConfig
from sol_control.decision import Failure


def policy_failure(action: Action, policy: PolicyConfig, limits: LimitsConfig) -> Failure | None:
    """The rule that sends this fast answer to full precision, or None (publish it as it is)."""
    if isinstance(action, QCVerdict):
        return _qc_rule(action, policy)
    if isinstance(action, GraspDecision) and not action.hold:
        return _grasp_rule(action, policy, limits)
    return None


def _qc_rule(v: QCVerdict, policy: PolicyConfig) -> Failure | None:
    if v.defect in policy.qc_classes:
        return Failure("policy_qc_class", v.defect)
    min_sev = policy.full_precision_qc_min_severity
    if min_sev > 0 and v.verdict == "reject" and v.severity >= min_sev:
        return Failure("policy_qc_severity", f"{v.severity:.2f}")
    return None


def _grasp_rule(g: GraspDecision, policy: PolicyConfig, limits: LimitsConfig) -> Failure | None:
    min_force = policy.full_precision_grasp_min_force_n
    if min_force > 0 and g.force_n >= min_force:
        return Failure("policy_grasp_force", f"{g.force_n:.1f}N")
    margin = policy.full_precision_workspace_margin_m
    if margin > 0:
        points = [("grasp", g.x_m, g.y_m)] + [(f"approach{i}", x, y) for i, (x, y, _) in enumerate(g.approach_m, 1)]
        for name, x, y in points:
            if near_xy_limit(x, y, limits, margin):
                return Failure("policy_workspace_margin", name)
    return None


def near_xy_limit(x_m: float, y_m: float, limits: LimitsConfig, margin_m: float) -> bool:
    """True when (x, y) lies within `margin_m` of an x/y workspace limit (inside or outside it)."""
    return min(x_m - limits.x_min_m, limits.x_max_m - x_m, y_m - limits.y_min_m, limits.y_max_m - y_m) < margin_m


def overruled(fast: Action, full: Action) -> bool:
    """The full-precision answer differs from the fast one it replaced (the audit's agreement
    rule: QC class and verdict; grasps within 1 cm, 0.1 rad, 5 mm): what the policy bought."""
    return not agrees(fast, full)
