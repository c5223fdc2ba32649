"""A decision topic watched the way a line controller should: data plus DDS liveliness.

    watch = DecisionWatch(node, DiagnosticStatus, "qc/verdict", on_verdict, lease_ms=500.0,
                          on_change=lambda alive: ...)
    watch.alive      # a node that decides is there

The subscription requests AUTOMATIC liveliness with `lease_ms`, which must be at least the node's
`qos.liveliness_lease_ms` (a shorter request is incompatible: no data at all). A node counts as
there while a decision publisher is matched and DDS has not reported its liveliness lost:

- the node's process dies (or hangs inside DDS): liveliness lost once its lease runs out;
- the node deactivates or shuts down: its publisher goes away at once (unmatched);
- a node activates (e.g. after a respawn): a new publisher is matched, alive.

`lease_ms` 0 requests no lease: then only matching counts. That is for a controller in the same
process as the watch (the oracle): Fast DDS delivers within a process without asserting liveliness,
so a finite lease would be reported lost after every sample. Deadline-missed events are not used:
cameras are triggered, and gaps between parts are normal.
"""
from __future__ import annotations

from typing import Callable

from rclpy.event_handler import QoSLivelinessChangedInfo, QoSSubscriptionMatchedInfo, SubscriptionEventCallbacks
from rclpy.node import Node

from sol_control.ros import qos


class DecisionWatch:
    def __init__(self, node: Node, kind, topic: str, callback, lease_ms: float,
                 on_change: Callable[[bool], None]):
        self.topic = topic
        self.alive = False
        self.lost = self.regained = self.incompatible = 0
        self._matched = 0
        self._live: bool | None = None   # DDS's last liveliness report (None: none yet)
        self._on_change = on_change
        self._log = node.get_logger()
        events = SubscriptionEventCallbacks(liveliness=self._on_liveliness, matched=self._on_matched,
                                            incompatible_qos=self._on_incompatible)
        self.subscription = node.create_subscription(kind, topic, callback, qos.decision_subscriber_qos(lease_ms),
                                                     event_callbacks=events)

    def _on_liveliness(self, info: QoSLivelinessChangedInfo) -> None:
        self._live = info.alive_count > 0
        self._update()

    def _on_matched(self, info: QoSSubscriptionMatchedInfo) -> None:
        self._matched = info.current_count
        if info.current_count_change > 0:
            self._live = None    # a new publisher: alive until DDS says otherwise
        self._update()

    def _update(self) -> None:
        alive = self._matched > 0 and self._live is not False
        if alive == self.alive:
            return
        self.alive = alive
        if alive:
            self.regained += 1
        else:
            self.lost += 1
            self._log.warning(f"{self.topic}: no live decision publisher")
        self._on_change(alive)

    def _on_incompatible(self, info) -> None:
        self.incompatible += 1
        self._log.error(f"{self.topic}: a publisher offers incompatible QoS (policy {info.last_policy_kind}); "
                        "its liveliness lease must not exceed the one requested here")
