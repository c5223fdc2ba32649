"""The camera subscriptions, waited on by a thread of their own: `ImagePump`.

rclpy's executor rebuilds its wait set from every entity of the node on each wake (a lifecycle
node has about twenty: lifecycle and parameter services, timers, subscriptions), then runs the
callback as a task: Python that holds the GIL before an image is even converted, on the
decision's critical path, while the workers decide the previous frame. The pump waits on one wait
set holding only the camera subscriptions and its stop guard, takes a ready image and hands it to
the node's callback; the executor keeps the services, timers and parameters. The subscriptions sit
in a callback group no executor waits on (`Polled`), so exactly one thread takes their messages.
"""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Callable

from rclpy.guard_condition import GuardCondition
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

from sol_control.budget import NS_PER_S

WAKE_S = 0.1  # how often an idle pump checks that its context is still up


class ImagePump:
    """`subs`: (subscription, callback(msg, message_info)) pairs; `on_error(detail)` counts a
    failed take, callback or wait. `start` once, after the subscriptions exist; `stop` before they
    are destroyed."""

    def __init__(self, context, subs: list[tuple[object, Callable]], on_error: Callable[[str], None],
                 wake_s: float = WAKE_S):
        self._context = context
        self._wake_ns = int(wake_s * NS_PER_S)
        self._subs = subs
        self._on_error = on_error
        self._stop_gc = GuardCondition(None, None, context)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.taken = self.waits = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sol_control-images", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stopping = True
        try:
            self._stop_gc.trigger()
        except Exception:  # noqa: BLE001 - a context already shut down: the pump wakes by WAKE_S
            pass
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
        self._stop_gc.destroy()

    def _run(self) -> None:
        with ExitStack() as held:  # the handles stay valid while the pump waits on them
            for sub, _ in self._subs:
                held.enter_context(sub.handle)
            held.enter_context(self._stop_gc.handle)
            held.enter_context(self._context.handle)
            wait_set = _rclpy.WaitSet(len(self._subs), 1, 0, 0, 0, 0, self._context.handle)
            while not self._stopping and self._context.ok():
                try:
                    self._wait(wait_set)
                except Exception as e:  # noqa: BLE001 - e.g. the context shutting down mid-wait
                    if not self._stopping and self._context.ok():
                        self._on_error(f"wait: {type(e).__name__}: {e}")
                        time.sleep(WAKE_S)  # a wait that keeps failing is reported, not spun on

    def _wait(self, wait_set) -> None:
        wait_set.clear_entities()
        for sub, _ in self._subs:
            wait_set.add_subscription(sub.handle)
        wait_set.add_guard_condition(self._stop_gc.handle)
        self.waits += 1
        wait_set.wait(self._wake_ns)
        if self._stopping:
            return
        ready = wait_set.get_ready_entities("subscription")
        for sub, callback in self._subs:
            if sub.handle.pointer in ready:
                self._take(sub, callback)

    def _take(self, sub, callback: Callable) -> None:
        try:
            taken = sub.handle.take_message(sub.msg_type, sub.raw)
        except Exception as e:  # noqa: BLE001 - an rmw error on one take skips that message
            self._on_error(f"{sub.topic_name}: {type(e).__name__}: {e}")
            return
        if taken is None:
            return
        self.taken += 1
        try:
            callback(*taken)
        except Exception as e:  # noqa: BLE001 - the pump outlives any one message
            self._on_error(f"{sub.topic_name}: {type(e).__name__}: {e}")
