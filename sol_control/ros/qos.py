"""QoS profiles of the node's topics.

Inputs use sensor-data QoS (best effort, keep last 1, volatile) with a lifespan equal to
`max_staleness_ms`, so DDS itself drops samples that waited too long; the node's latest-value
slots drop the rest. Decision outputs are reliable with a QoS deadline: subscribers get
requested-deadline-missed events and the node counts its offered-deadline misses.
"""
from __future__ import annotations

from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy


def _ms(ms: float) -> Duration:
    return Duration(nanoseconds=int(ms * 1_000_000))


def sensor_qos(lifespan_ms: float) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.VOLATILE, lifespan=_ms(lifespan_ms))


def decision_qos(deadline_ms: float) -> QoSProfile:
    qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.VOLATILE)
    if deadline_ms > 0:
        qos.deadline = _ms(deadline_ms)
    return qos


def diagnostics_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)
