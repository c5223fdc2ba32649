"""`ros2 run sol_control coprocessor`: the lifecycle node `sol_control`.

    executor thread: image callbacks ─► validate + convert ─► latest-value slots (depth 1)
    worker threads:  one per task (qc, grasp): newest frame ─► take the newest sample of the side
                     stream the task reads ─► Coprocessor.step (perception, guard, planners)
                     ─► publish (a late answer goes out as the safe default)
    side streams:    joint states, wrench, conveyor: never spun; taken by the workers and a timer
    audit thread:    sampled fast decisions recomputed at fp32 (lowest priority)

configure: validate parameters, verify bundles (sha256), build sessions; on failure the node stays
unconfigured and says why (log + /diagnostics). activate: warm up, start the worker, publish.
deactivate stops the worker; cleanup/shutdown release sessions and topics. `autostart` (default
true) does configure + activate at start for users without a lifecycle manager.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PoseArray, PoseStamped, WrenchStamped
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.callback_groups import CallbackGroup
from rclpy.event_handler import PublisherEventCallbacks
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CompressedImage, Image, JointState
from visualization_msgs.msg import MarkerArray

from sol_control.actions import safe_default
from sol_control.config import NODE_NAME, STRUCTURAL, NodeConfig, from_flat, param_specs
from sol_control.guard import Decision, Watchdog, WatchJob, on_time_or_safe
from sol_control.ros import convert, qos
from sol_control.ros.diagnostics import NodeStats
from sol_control.telemetry import Frame, InputRejected, LatestSlot, TelemetrySlots

NS_PER_MS = 1_000_000
LOG_EVERY_S = 5.0
SIDE_POLL_S = 0.1
# the side streams a task's decision reads (coprocessor.py): its worker takes only these (~50 us a
# take); the timer takes them all
SIDE_READS = {"qc": ("conveyor/joint_states",), "grasp": ("joint_states",)}


AUTOGROUP = "/proc/self/autogroup"


def _autogroup_in_effect(path: str = AUTOGROUP) -> bool:
    """sched_autogroup gives this process's session a group of its own only when the file names one:
    it reads empty for a session left in the kernel's default group (a container's init session, whose
    nice cannot be set), and it is missing on kernels without autogroup."""
    try:
        with open(path) as f:
            return bool(f.read().strip())
    except OSError:
        return False


class Polled(CallbackGroup):
    """Subscriptions no executor waits on. The side streams (joint states at 500 Hz, wrench,
    conveyor) are only needed when a frame is decided, so the node takes their newest sample then
    (and on a slow timer) instead of waking the executor for every message: each wake is ~0.4 ms of
    Python holding the GIL the decision workers need."""

    def can_execute(self, entity) -> bool:
        return False

    def beginning_execution(self, entity) -> bool:
        return False

    def ending_execution(self, entity) -> None:
        pass


def _descriptor(spec) -> ParameterDescriptor:
    d = ParameterDescriptor(name=spec.name, description=spec.description)
    if spec.kind is float and spec.low is not None and spec.high is not None:
        d.floating_point_range = [FloatingPointRange(from_value=float(spec.low), to_value=float(spec.high), step=0.0)]
    elif spec.kind is int and spec.low is not None and spec.high is not None:
        d.integer_range = [IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=1)]
    if spec.choices:
        d.additional_constraints = "one of: " + ", ".join(spec.choices)
    return d


class CoprocessorNode(LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        self.stats = NodeStats()
        self.slots = TelemetrySlots()
        self.cop = None
        self.config_error = ""
        self._state = "unconfigured"
        self._last_log: dict[str, float] = {}
        self._declare_parameters()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._subs: list = []
        self._side_subs: dict[str, Any] = {}  # topic -> subscription in the Polled group: taken by
        # _poll_side, never by the executor
        self._side_lock = threading.Lock()
        self._side_timer = None
        self._pubs: dict[str, Any] = {}
        self._frames: dict[str, LatestSlot[Frame]] = {}  # one depth-1 slot per task's worker
        self._workers: list[threading.Thread] = []
        self._watchdog: Watchdog | None = None
        self._stop = threading.Event()
        self._last_frame_stamp_ns = 0
        self._last_good_mono_ns: dict[str, int] = {}
        self._last_timeout_pub_ns: dict[str, int] = {}
        self._marker_id = 0
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", qos.diagnostics_qos())
        self._diag_timer = self.create_timer(1.0, self._publish_diagnostics)

    # -- parameters ------------------------------------------------------------------------------
    def _declare_parameters(self) -> None:
        errors = []
        for spec in param_specs():
            desc = _descriptor(spec)
            try:
                self.declare_parameter(spec.name, spec.default, desc)
            except Exception as e:  # noqa: BLE001 - a bad override: keep the default, refuse to configure
                self.declare_parameter(spec.name, spec.default, desc, ignore_override=True)
                errors.append(f"{spec.name}: {e}")
        try:
            self.cfg = from_flat({s.name: self.get_parameter(s.name).value for s in param_specs()})
        except ValueError as e:
            self.cfg = NodeConfig()
            errors.append(str(e))
        self._param_error = "; ".join(errors)
        if self._param_error:
            self.get_logger().error(f"invalid parameters, node will not configure: {self._param_error}")

    def _on_set_parameters(self, params: list) -> SetParametersResult:
        changes = {p.name: p.value for p in params}
        try:
            new = from_flat(changes, base=self.cfg)
        except ValueError as e:
            return SetParametersResult(successful=False, reason=str(e))
        structural = sorted(set(changes) & set(STRUCTURAL))
        if structural and self.cop is not None:
            self.get_logger().info(f"{', '.join(structural)} take effect at the next configure")
        self.cfg = new
        self._param_error = ""
        if self.cop is not None:
            self.cop.set_config(new)
        return SetParametersResult(successful=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        from sol_control.coprocessor import Coprocessor

        if self._param_error:
            self.config_error = f"invalid parameters: {self._param_error}"
            self.get_logger().error(f"configure failed: {self.config_error}")
            return TransitionCallbackReturn.FAILURE
        cfg = self.cfg
        try:
            self.cop = Coprocessor(cfg)
        except Exception as e:  # noqa: BLE001 - any load error is a configure failure with its reason
            self.cop = None
            self.config_error = f"{type(e).__name__}: {e}"
            self.get_logger().error(f"configure failed: {self.config_error}")
            return TransitionCallbackReturn.FAILURE
        self.config_error = ""
        out_qos = qos.decision_qos(cfg.deadline.output_deadline_ms)
        events = PublisherEventCallbacks(deadline=self._on_offered_deadline_missed)
        pub = self.create_lifecycle_publisher
        if "qc" in self.cop.tasks:
            self._pubs["qc"] = pub(DiagnosticStatus, "qc/verdict", out_qos, event_callbacks=events)
        if "grasp" in self.cop.tasks:
            self._pubs["grasp"] = pub(DiagnosticStatus, "grasp/decision", out_qos, event_callbacks=events)
            self._pubs["pose"] = pub(PoseStamped, "grasp/pose", out_qos)
            self._pubs["gripper"] = pub(JointState, "grasp/gripper", out_qos)
            self._pubs["approach"] = pub(PoseArray, "grasp/approach", out_qos)
        self._pubs["markers"] = pub(MarkerArray, "decisions/markers", qos.decision_qos(0))
        in_qos = qos.sensor_qos(cfg.deadline.max_staleness_ms)
        polled = Polled()
        self._side_subs = {topic: self.create_subscription(kind, topic, fn, in_qos, callback_group=polled)
                           for topic, kind, fn in (("joint_states", JointState, self._on_joints),
                                                   ("wrench", WrenchStamped, self._on_wrench),
                                                   ("conveyor/joint_states", JointState, self._on_conveyor))}
        self._subs = [
            self.create_subscription(Image, "camera/image_raw", self._on_image, in_qos),
            self.create_subscription(CompressedImage, "camera/image_raw/compressed", self._on_compressed, in_qos),
            *self._side_subs.values(),
        ]
        # without frames nobody takes the side streams: count their rejections within SIDE_POLL_S
        self._side_timer = self.create_timer(SIDE_POLL_S, self._poll_side)
        self._state = "inactive"
        self.get_logger().info(f"configured: mode={cfg.mode}, bundles "
                               + ", ".join(f"{t}={cfg.bundle_dir(t)}" for t in self.cop.tasks))
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            warm = self.cop.warmup()
        except Exception as e:  # noqa: BLE001
            self.config_error = f"warm-up failed: {type(e).__name__}: {e}"
            self.get_logger().error(self.config_error)
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info("warm: full-precision latency " + ", ".join(f"{t} {ms:.1f} ms" for t, ms in warm.items()))
        self.slots.clear()
        self._stop.clear()
        self._last_frame_stamp_ns = 0  # a restarted (sim) clock must not look like out-of-order frames
        now = time.monotonic_ns()
        self._frames = {task: LatestSlot() for task in self.cop.tasks}
        self._last_good_mono_ns = {task: now for task in self.cop.tasks}
        self._last_timeout_pub_ns = dict(self._last_good_mono_ns)
        # one worker per task: in mode both, QC and grasp decide the same frame in parallel, each
        # with its own budget from the stamp, instead of grasp getting what QC leaves
        self._watchdog = Watchdog(self._on_watchdog)
        self._workers = [threading.Thread(target=self._work, args=(task,), name=f"sol_control-{task}", daemon=True)
                         for task in self.cop.tasks]
        for w in self._workers:
            w.start()
        if self.cfg.nice != 0:
            self._renice(self.cfg.nice)
        self._state = "active"
        return super().on_activate(state)  # activates the lifecycle publishers

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        self._state = "inactive"
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._state = "finalized"
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def _renice(self, nice: int) -> None:
        """Every thread of this process (executor, worker, DDS) to `nice`, except the shadow audit."""
        skip = self.cop.background_thread_ids() if self.cop else set()
        done, failed = 0, ""
        for tid in os.listdir("/proc/self/task"):
            if int(tid) in skip:
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                done += 1
            except OSError as e:
                failed = str(e)
        if failed:
            self.get_logger().warning(f"nice {nice}: {failed} (needs CAP_SYS_NICE below 0); {done} threads changed")
        else:
            self.get_logger().info(f"nice {nice} on {done} threads{self._renice_session(nice)}")

    @staticmethod
    def _renice_session(nice: int) -> str:
        """With sched_autogroup (most desktop and many server kernels) the scheduler shares the CPU
        between sessions first and applies thread nice values only inside a session, so a node in its
        own session (`setsid`, as the demo starts it) also sets its session's nice. A node sharing a
        session with others (a terminal, `ros2 launch`) leaves it alone: that would move them too."""
        if os.getsid(0) != os.getpid() or not _autogroup_in_effect():
            return ""
        try:
            with open(AUTOGROUP, "w") as f:
                f.write(f"{nice}\n")
        except OSError as e:
            return f"; session (autogroup) nice unchanged: {e}"
        return " and on its session (autogroup)"

    def _stop_worker(self) -> None:
        self._stop.set()
        for slot in self._frames.values():
            slot.wake()
        for w in self._workers:
            w.join(timeout=5.0)
        self._workers = []
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None

    def _release(self) -> None:
        self._stop_worker()
        if self._side_timer is not None:
            self.destroy_timer(self._side_timer)
            self._side_timer = None
        with self._side_lock:
            for s in self._subs:
                self.destroy_subscription(s)
            self._side_subs = {}
        for p in self._pubs.values():
            self.destroy_lifecycle_publisher(p)
        self._subs, self._pubs, self._frames = [], {}, {}
        if self.cop is not None:
            self.cop.close()
            self.cop = None
        self.slots.clear()

    def autostart(self) -> bool:
        """configure + activate; False (and the reason logged) when either fails."""
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            return False
        return self.trigger_activate() == TransitionCallbackReturn.SUCCESS

    # -- inputs (executor thread: validate, convert, put; never infer) --------------------------------
    def _admit_stamp(self, stamp_ns: int, recv_mono_ns: int, transport_ns: int = 0) -> int:
        """Budget start on the monotonic clock for a header stamp, or InputRejected.

        The budget starts at the header stamp; under sim time the node's clock only moves with
        /clock, so the DDS transport time (source timestamp to now, system clock) is taken as the
        age when it is larger: a frame's budget never starts after it was sent."""
        d = self.cfg.deadline
        if stamp_ns == 0:
            raise InputRejected("stamp_zero")
        age_ns = self.get_clock().now().nanoseconds - stamp_ns
        if age_ns < -d.max_future_ms * NS_PER_MS:
            raise InputRejected("stamp_future", f"{-age_ns / NS_PER_MS:.1f} ms ahead")
        if age_ns > d.max_staleness_ms * NS_PER_MS:
            raise InputRejected("stale", f"{age_ns / NS_PER_MS:.1f} ms old")
        if stamp_ns <= self._last_frame_stamp_ns:
            raise InputRejected("stamp_out_of_order", f"{stamp_ns} <= {self._last_frame_stamp_ns}")
        return recv_mono_ns - max(age_ns, transport_ns, 0)

    def _admit(self, msg, make_frame, info=None) -> None:
        recv = time.monotonic_ns()
        transport_ns = 0
        if info is not None and info.get("source_timestamp"):
            transport_ns = min(max(time.time_ns() - int(info["source_timestamp"]), 0), 10**9)
        try:
            stamp = convert.stamp_from_ros(msg.header.stamp)
            start = self._admit_stamp(stamp, recv, transport_ns)
            frame = make_frame(stamp, start)
        except InputRejected as e:
            self.stats.reject(e.reason)
            self._log_limited(e.reason, f"rejected input: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a malformed message never takes the node down
            self.stats.reject("conversion_error")
            self._log_limited("conversion_error", f"rejected input: {type(e).__name__}: {e}")
            return
        self._last_frame_stamp_ns = stamp
        for slot in self._frames.values():
            slot.put(frame)

    def _on_image(self, msg: Image, info) -> None:  # info: rclpy MessageInfo (DDS source timestamp)
        self._admit(msg, lambda stamp, start: Frame(
            convert.image_from_ros(msg, self.cfg.inputs.max_image_pixels), stamp, start, msg.header.frame_id),
            info)

    def _on_compressed(self, msg: CompressedImage, info) -> None:
        def make(stamp: int, start: int) -> Frame:
            data, kind = convert.compressed_from_ros(msg, self.cfg.inputs.max_compressed_bytes)
            return Frame(None, stamp, start, msg.header.frame_id, compressed=data, compressed_format=kind)
        self._admit(msg, make, info)

    def _poll_side(self, topics: tuple[str, ...] | None = None) -> None:
        """Take the newest sample (keep-last-1: at most one waits) of the side streams `topics`
        (default: all) and convert it; called by the workers before each decision and by a timer."""
        with self._side_lock:
            for topic, sub in self._side_subs.items():
                if topics is not None and topic not in topics:
                    continue
                try:
                    with sub.handle:
                        taken = sub.handle.take_message(sub.msg_type, sub.raw)
                except Exception as e:  # noqa: BLE001 - an rmw error on one stream skips it this time
                    self._log_limited("side_take_error", f"side stream {topic}: {type(e).__name__}: {e}")
                    continue
                if taken is not None:
                    msg, info = taken
                    waited_ns = time.time_ns() - int(info.get("received_timestamp") or 0)
                    sub.callback(msg, time.monotonic_ns() - min(max(waited_ns, 0), 10**9))

    def _side(self, slot, fn, msg, arrived_mono_ns: int) -> None:
        try:
            slot.put(fn(msg), arrived_mono_ns)
        except InputRejected as e:
            self.stats.reject(e.reason)
            self._log_limited(e.reason, f"rejected input: {e}")
        except Exception as e:  # noqa: BLE001
            self.stats.reject("conversion_error")
            self._log_limited("conversion_error", f"rejected input: {type(e).__name__}: {e}")

    def _on_joints(self, msg: JointState, arrived_mono_ns: int) -> None:
        self._side(self.slots.joints, lambda m: convert.joints_from_ros(m, self.cfg.inputs.max_joint_abs,
                                                                    self.cfg.inputs.max_joints), msg, arrived_mono_ns)

    def _on_wrench(self, msg: WrenchStamped, arrived_mono_ns: int) -> None:
        self._side(self.slots.wrench, lambda m: convert.wrench_from_ros(m, self.cfg.inputs.max_wrench_abs), msg,
                   arrived_mono_ns)

    def _on_conveyor(self, msg: JointState, arrived_mono_ns: int) -> None:
        self._side(self.slots.conveyor, lambda m: convert.conveyor_from_ros(m, self.cfg.inputs.max_belt_speed_mps),
                   msg, arrived_mono_ns)

    # -- worker thread ---------------------------------------------------------------------------
    def _work(self, task: str) -> None:
        slot = self._frames[task]
        while not self._stop.is_set():
            frame = slot.take(timeout_s=0.02)
            cfg = self.cfg
            if frame is None:
                self._check_sensor_timeout(cfg, task)
                continue
            age_ms = (time.monotonic_ns() - frame.start_mono_ns) / NS_PER_MS
            cop = self.cop
            if age_ms > cfg.deadline.max_staleness_ms:
                self.stats.reject("stale")
                continue
            if cop is None or self._watchdog is None:
                continue
            dl = cfg.deadline
            fire_at_ns = frame.start_mono_ns + int((dl.for_task(task) - dl.publish_margin_ms) * NS_PER_MS)
            job = self._watchdog.begin(task, fire_at_ns, frame)
            try:
                self._poll_side(SIDE_READS[task])
                d = cop.step(self.slots.snapshot(frame, cfg.deadline.max_staleness_ms), task=task)
            except InputRejected as e:
                self._watchdog.finish(job)
                self.stats.reject(e.reason)
                self._log_limited(e.reason, f"rejected input: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - labelled safe default, counted, logged
                self.stats.errors += 1
                self._log_limited("step_error", f"decision failed: {type(e).__name__}: {e}")
                d = self._safe_decision(task, cfg, frame.stamp_ns, frame.frame_id,
                                        f"internal_error:{type(e).__name__}", frame.start_mono_ns)
            if self._watchdog.finish(job):  # False: the watchdog answered this frame at its deadline
                self._publish(d)
            self._last_good_mono_ns[task] = time.monotonic_ns()
            self.stats.sensor_timeout = False

    def _on_watchdog(self, job: WatchJob) -> None:
        """The decision for `job.payload` (a Frame) is still running at its deadline: safe default now."""
        f = job.payload
        self._publish(self._safe_decision(job.task, self.cfg, f.stamp_ns, f.frame_id, "watchdog", f.start_mono_ns))

    def _safe_decision(self, task: str, cfg: NodeConfig, stamp_ns: int, frame_id: str, reason: str,
                       start_mono_ns: int) -> Decision:
        latency_ms = (time.monotonic_ns() - start_mono_ns) / NS_PER_MS
        deadline_ms = cfg.deadline.for_task(task)
        return Decision(task, safe_default(task), "safe_default", reason, latency_ms, deadline_ms,
                        latency_ms <= deadline_ms, stamp_ns, frame_id, start_mono_ns=start_mono_ns)

    def _check_sensor_timeout(self, cfg: NodeConfig, task: str) -> None:
        now = time.monotonic_ns()
        timeout_ns = cfg.deadline.sensor_timeout_ms * NS_PER_MS
        if now - self._last_good_mono_ns[task] < timeout_ns or now - self._last_timeout_pub_ns[task] < timeout_ns:
            return
        self._last_timeout_pub_ns[task] = now
        if not self.stats.sensor_timeout:
            self.get_logger().error(f"no usable frame for {cfg.deadline.sensor_timeout_ms:.0f} ms: publishing safe defaults")
        self.stats.sensor_timeout = True
        self._publish(self._safe_decision(task, cfg, self.get_clock().now().nanoseconds, "", "sensor_timeout", now))

    def _publish(self, d: Decision) -> None:
        # labels reflect the publish time (plus the margin the publish itself takes); late -> safe default
        d = on_time_or_safe(d, margin_ms=self.cfg.deadline.publish_margin_ms)
        try:
            pubs = self._pubs
            pubs[d.task].publish(convert.decision_to_status(d))
            frame_id = d.frame_id
            if d.task == "grasp":
                frame_id = self.cfg.grasp.frame_id or d.frame_id
                if not d.action.hold:
                    m = convert.grasp_to_ros(d.action, d.stamp_ns, frame_id)
                    pubs["pose"].publish(m.pose)
                    pubs["gripper"].publish(m.gripper)
                    pubs["approach"].publish(m.approach)
            self._marker_id = (self._marker_id + 1) % 64
            pubs["markers"].publish(convert.markers_for(d, frame_id, self._marker_id))
        except Exception as e:  # noqa: BLE001 - e.g. publishers torn down during deactivate
            self.stats.errors += 1
            self._log_limited("publish_error", f"publish failed: {type(e).__name__}: {e}")
        self.stats.record(d)  # after publishing: counting is not on the decision's critical path

    # -- diagnostics -----------------------------------------------------------------------------
    def _on_offered_deadline_missed(self, info) -> None:
        self.stats.offered_deadline_missed += int(info.total_count_change)

    def _publish_diagnostics(self) -> None:
        extra = self.cop.stats() if self.cop is not None else {}
        if self._watchdog is not None:
            for task in extra:
                extra[task]["watchdog_fired"] = self._watchdog.fired
                extra[task]["late_results_discarded"] = self._watchdog.discarded
        err = self.config_error or self._param_error
        msg = self.stats.to_msg(self.get_clock().now().to_msg(), self._state, err, extra,
                                sum(s.superseded for s in self._frames.values()))
        self._diag_pub.publish(msg)

    def _log_limited(self, key: str, text: str) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, 0.0) >= LOG_EVERY_S:
            self._last_log[key] = now
            self.get_logger().warning(text)


def main(args: list[str] | None = None) -> None:
    from sol_control.coprocessor import share_gil_quickly

    share_gil_quickly()  # the executor (images, /clock, timers) and the workers share the GIL
    rclpy.init(args=args)
    node = CoprocessorNode()
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        if node.cfg.autostart and not node.autostart():
            node.get_logger().error("autostart failed; the node stays up so a lifecycle manager can retry")
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node._release()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
