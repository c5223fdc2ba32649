"""QoS profiles of the node's topics.

Inputs use sensor-data QoS (best effort, keep last 1, volatile) with a lifespan equal to
`max_staleness_ms`, so DDS itself drops samples that waited too long; the node's latest-value
slots drop the rest. Decision outputs are reliable with a QoS deadline (subscribers get
requested-deadline-missed events and the node counts its offered-deadline misses) and AUTOMATIC
liveliness with a lease (`qos.liveliness_lease_ms`): Fast DDS asserts it from its own thread, so a
subscriber that requests a lease at least as long gets a liveliness-changed event within the lease
when the node's process dies, and another one when a node is back. A subscriber that requests a
shorter lease than the one offered is incompatible and gets no data at all.
"""
from __future__ import annotations

from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, LivelinessPolicy, QoSProfile, ReliabilityPolicy


def _ms(ms: float) -> Duration:
    return Duration(nanoseconds=int(ms * 1_000_000))


def sensor_qos(lifespan_ms: float) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.VOLATILE, lifespan=_ms(lifespan_ms))


def decision_qos(deadline_ms: float, lease_ms: float = 0.0) -> QoSProfile:
    """What the node offers on its decision topics (deadline and lease 0: none)."""
    qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.VOLATILE)
    if deadline_ms > 0:
        qos.deadline = _ms(deadline_ms)
    if lease_ms > 0:
        qos.liveliness = LivelinessPolicy.AUTOMATIC
        qos.liveliness_lease_duration = _ms(lease_ms)
    return qos


def decision_subscriber_qos(lease_ms: float) -> QoSProfile:
    """What a line controller (the simulated cell, a PLC bridge) requests on a decision topic:
    reliable, keep last 10, AUTOMATIC liveliness with `lease_ms` (>= the node's offered lease)."""
    return decision_qos(0.0, lease_ms)


def diagnostics_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)
