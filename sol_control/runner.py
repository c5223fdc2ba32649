"""One task's worker loop, ROS-free: the node, the soak and replay all decide frames through it.

    slot (newest telemetry snapshot only) ─► stale? rejected ─► watchdog armed for the deadline
        ─► Coprocessor.step ─► on_time_or_safe ─► publish(decision)
    no usable frame for sensor_timeout_ms ─► safe default (sensor_timeout), once per timeout

Between two frames the worker runs what `at_boundary` handed it (the node's bundle swap installs
a new pipeline that way), so no frame is decided half on one thing and half on another.

Exactly one decision per decided frame leaves through `publish`: the worker's, or the watchdog's
safe default when the worker is still running at the deadline (its late answer is then dropped).
Every decision is labelled here, once, right before it leaves (`on_time_or_safe` with the publish
margin): its latency is measured again and a late answer goes out as a labelled safe default.
The runner calls down into the coprocessor (`step`, `config`, `gate`), which knows nothing of it.
The host (ROS node, soak, replay) builds the telemetry snapshot (frame + side streams) and supplies
`RunnerHooks`: counting rejections and errors, the sensor-timeout state, the ROS clock.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable

from sol_control.budget import MONOTONIC, NS_PER_MS, Clock
from sol_control.decision import Decision, Failure, on_time_or_safe, safe_decision
from sol_control.telemetry import Frame, InputRejected, LatestSlot, Telemetry

if TYPE_CHECKING:
    from sol_control.coprocessor import Coprocessor

log = logging.getLogger(__name__)
TAKE_TIMEOUT_S = 0.02  # how often an idle worker checks the sensor timeout and its stop flag


class RunnerHooks:
    """What a runner reports to its host (the ROS node implements these). The defaults log."""

    def reject(self, reason: str, detail: str) -> None:
        """A frame that cannot be decided on (counted by the host; nothing is published)."""
        log.info("rejected input: %s", detail)

    def error(self, key: str, text: str) -> None:
        """A failure the runner answered with a safe default (counted and logged by the host)."""
        log.warning("%s: %s", key, text)

    def sensor_timeout(self, active: bool) -> None:
        """Called with True when the timeout starts publishing safe defaults, False when frames return."""

    def ros_now_ns(self) -> int:
        return MONOTONIC.now_ns()


class CountingHooks(RunnerHooks):
    """Counts rejections and errors (soak, replay)."""

    def __init__(self) -> None:
        self.rejected: dict[str, int] = {}
        self.errors = 0

    def reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def error(self, key: str, text: str) -> None:
        self.errors += 1
        super().error(key, text)


class WatchJob:
    __slots__ = ("task", "fire_at_ns", "payload", "fired", "finished")

    def __init__(self, task: str, fire_at_ns: int, payload):
        self.task, self.fire_at_ns, self.payload = task, fire_at_ns, payload
        self.fired = self.finished = False


class Watchdog:
    """Answers for a decision still running at its deadline: an ONNX Runtime call cannot be
    interrupted, but it is no longer waited for. At `fire_at_ns` `on_expire(job)` publishes the
    safe default; exactly one answer per job goes out - whichever of the worker (`finish` returns
    True) and the watchdog comes first; the late one is dropped and counted (`discarded`).
    With `thread=False` nothing fires by itself: call `fire_due()` (tests, with a ManualClock)."""

    def __init__(self, on_expire: Callable[[WatchJob], None], clock: Clock = MONOTONIC, thread: bool = True):
        self._on_expire = on_expire
        self._clock = clock
        self._cv = threading.Condition()
        self._jobs: list[WatchJob] = []
        self._stop = False
        self.fired = self.discarded = self.errors = 0
        self._thread = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="sol_control-watchdog", daemon=True)
            self._thread.start()

    def begin(self, task: str, fire_at_ns: int, payload=None) -> WatchJob:
        job = WatchJob(task, fire_at_ns, payload)
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()
        return job

    def finish(self, job: WatchJob) -> bool:
        """True: the caller publishes its answer. False: the watchdog already answered."""
        with self._cv:
            if job in self._jobs:
                self._jobs.remove(job)
            job.finished = True
            if job.fired:
                self.discarded += 1
                return False
            return True

    def fire_due(self) -> int:
        """Answer every job whose time has come; returns how many fired."""
        with self._cv:
            now = self._clock.now_ns()
            due = [j for j in self._jobs if j.fire_at_ns <= now]
            for j in due:
                self._jobs.remove(j)
                j.fired = True
                self.fired += 1
        for j in due:  # outside the lock: publishing must not block begin/finish
            try:
                self._on_expire(j)
            except Exception as e:  # noqa: BLE001 - the watchdog itself must never die: count, log
                self.errors += 1
                log.error("watchdog answer for %s failed: %s: %s", j.task, type(e).__name__, e)
        return len(due)

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._stop:
                    return
                now = self._clock.now_ns()
                wait_ns = min((j.fire_at_ns - now for j in self._jobs), default=100 * NS_PER_MS)
                if wait_ns > 0:
                    self._cv.wait(timeout=wait_ns / 1e9)
                    continue
            self.fire_due()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


class TaskRunner:
    """Decides one task's frames: `offer` the newest snapshot (executor side), the worker decides it."""

    def __init__(self, task: str, cop: Coprocessor, publish: Callable[[Decision], None],
                 hooks: RunnerHooks | None = None, clock: Clock = MONOTONIC):
        self.task = task
        self.cop = cop  # its live config is the runner's
        self.gate = cop.gate  # decisions are marked on it; the coprocessor's audits wait for it
        self.hooks = hooks or CountingHooks()
        self.clock = clock
        self.frames: LatestSlot[Telemetry] = LatestSlot(clock)
        self._publish_cb = publish
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watchdog: Watchdog | None = None
        self._last_good_ns = self._last_timeout_ns = clock.now_ns()
        self._timed_out = False
        self._boundary_lock = threading.Lock()
        self._boundary: list[tuple[Callable[[], None], threading.Event]] = []  # run between frames

    # -- lifecycle -------------------------------------------------------------------------------
    def arm(self, watchdog_thread: bool = True) -> None:
        """Create the watchdog (without its thread, only `watchdog.fire_due()` fires it)."""
        self._last_good_ns = self._last_timeout_ns = self.clock.now_ns()
        self.watchdog = Watchdog(self._on_watchdog, self.clock, thread=watchdog_thread)

    def start(self) -> None:
        """Arm the watchdog and start the worker thread."""
        self._stop.clear()
        self.arm()
        self._thread = threading.Thread(target=self._loop, name=f"sol_control-{self.task}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.frames.wake()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._run_boundary()  # handed over while the worker stopped: no frame runs now either
        if self.watchdog is not None:
            self.watchdog.close()
            self.watchdog = None

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id if self._thread is not None else None

    def offer(self, telemetry: Telemetry) -> None:
        self.frames.put(telemetry)

    # -- the frame boundary ----------------------------------------------------------------------
    def at_boundary(self, fn: Callable[[], None], timeout_s: float = 10.0) -> bool:
        """Run `fn` between two frames: on the worker after the decision in progress (at once when
        no worker runs). True once it has run; False when no boundary came within `timeout_s`
        (a planner stalled past it), and then it never runs. The caller waits, the worker does not."""
        job = (fn, threading.Event())
        with self._boundary_lock:
            running = self._thread is not None
            if running:
                self._boundary.append(job)
        if not running:
            fn()
            return True
        self.frames.wake()  # an idle worker runs it now, not after its take times out
        if job[1].wait(timeout_s):
            return True
        with self._boundary_lock:
            if job in self._boundary:
                self._boundary.remove(job)
                return False
        job[1].wait()  # it is running right now
        return True

    def _run_boundary(self) -> None:
        with self._boundary_lock:
            jobs, self._boundary = self._boundary, []
        for fn, done in jobs:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the worker never dies of a handed-over job
                self.hooks.error("boundary_error", f"between frames: {type(e).__name__}: {e}")
            finally:
                done.set()

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run_boundary()
            telemetry = self.frames.take(timeout_s=TAKE_TIMEOUT_S)
            if telemetry is None:
                self.check_sensor_timeout()
            else:
                self.decide(telemetry)

    def decide(self, telemetry: Telemetry) -> None:
        """Decide one frame and publish the answer (callable without the thread: replay does)."""
        self.gate.enter()
        try:
            self._decide(telemetry)
        finally:
            self.gate.leave()

    def _decide(self, telemetry: Telemetry) -> None:
        frame = telemetry.frame
        cfg = self.cop.config()
        dl = cfg.deadline
        age_ms = (self.clock.now_ns() - frame.start_mono_ns) / NS_PER_MS
        if age_ms > dl.max_staleness_ms:
            self.hooks.reject("stale", f"{age_ms:.1f} ms old when its turn came")
            return
        job = None
        if self.watchdog is not None:
            fire_at_ns = frame.start_mono_ns + int((dl.for_task(self.task) - dl.publish_margin_ms) * NS_PER_MS)
            job = self.watchdog.begin(self.task, fire_at_ns, frame)
        try:
            d = self.cop.step(telemetry, task=self.task)
        except InputRejected as e:
            if job is not None:
                self.watchdog.finish(job)
            self.hooks.reject(e.reason, str(e))
            return
        except Exception as e:  # noqa: BLE001 - labelled safe default, counted, logged
            self.hooks.error("step_error", f"decision failed: {type(e).__name__}: {e}")
            d = self._safe(frame, Failure("internal_error", type(e).__name__))
        if job is None or self.watchdog.finish(job):  # False: the watchdog answered at the deadline
            self.publish(d)
        self._last_good_ns = self.clock.now_ns()
        if self._timed_out:
            self._timed_out = False
            self.hooks.sensor_timeout(False)

    def publish(self, d: Decision) -> None:
        """Relabel at publish time (a late answer becomes the safe default), then hand it over."""
        margin_ms = self.cop.config().deadline.publish_margin_ms
        self._publish_cb(on_time_or_safe(d, now_ns=self.clock.now_ns(), margin_ms=margin_ms))

    def check_sensor_timeout(self) -> None:
        """Without a usable frame for sensor_timeout_ms: a safe default, again every timeout."""
        now = self.clock.now_ns()
        timeout_ns = int(self.cop.config().deadline.sensor_timeout_ms * NS_PER_MS)
        if now - self._last_good_ns < timeout_ns or now - self._last_timeout_ns < timeout_ns:
            return
        self._last_timeout_ns = now
        if not self._timed_out:
            self._timed_out = True
            self.hooks.sensor_timeout(True)
        stamp = self.hooks.ros_now_ns()
        self.publish(safe_decision(self.task, Failure("sensor_timeout"), stamp, "", now, self._deadline_ms(),
                                   now_ns=now))

    def _on_watchdog(self, job: WatchJob) -> None:
        """The decision for `job.payload` (a Frame) is still running at its deadline: safe default now."""
        self.publish(self._safe(job.payload, Failure("watchdog")))

    def _safe(self, frame: Frame, why: Failure) -> Decision:
        return safe_decision(self.task, why, frame.stamp_ns, frame.frame_id, frame.start_mono_ns,
                             self._deadline_ms(), now_ns=self.clock.now_ns())

    def _deadline_ms(self) -> float:
        return self.cop.config().deadline.for_task(self.task)
