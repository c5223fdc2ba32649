"""`ros2 run sol_control coprocessor`: the lifecycle node `sol_control`.

    image thread:    camera message ─► validate + convert ─► + newest side-stream samples
                     ─► each task runner's slot (depth 1)   (ros.inputs, ros.image_pump)
    executor thread: services, parameters, timers (diagnostics, side-stream poll)
    runner threads:  one per task (qc, grasp): sol_control.runner.TaskRunner (newest snapshot ─►
                     watchdog ─► Coprocessor.step ─► on-time-or-safe ─► _publish)
    side streams:    joint states, wrench, conveyor: never spun; taken per image and by a timer
    audit thread:    sampled fast decisions recomputed at fp32 (lowest priority)

configure: validate parameters, verify bundles (sha256), build sessions; on failure the node stays
unconfigured and says why (log + /diagnostics). activate: warm up, create the decision publishers,
start the runners, publish. deactivate stops the runners and destroys the decision publishers, so
their liveliness (AUTOMATIC, `qos.liveliness_lease_ms`) tells subscribers whether a node that
decides is there: a dead or inactive node has none. cleanup/shutdown release sessions and topics.
`autostart` (default true) does configure + activate at start for users without a lifecycle manager.
`qc.bundle` / `grasp.bundle` set while configured swap that task's bundle between two frames (ros.bundle_swap).
"""
from __future__ import annotations

import time
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from sol_control import priority
from sol_control.config import NODE_NAME, STRUCTURAL, NodeConfig, from_flat
from sol_control.decision import Decision
from sol_control.energy import EnergyMeter
from sol_control.gc_pauses import GcPauses
from sol_control.ros import qos
from sol_control.ros.bundle_swap import BundleSwaps, named
from sol_control.ros.diagnostics import NodeStats, task_extra
from sol_control.ros.inputs import NodeInputs
from sol_control.ros.outputs import DecisionOutputs
from sol_control.ros.params import declare_config
from sol_control.runner import RunnerHooks, TaskRunner
from sol_control.startup import Startup

LOG_EVERY_S = 5.0


class CoprocessorNode(LifecycleNode, RunnerHooks):
    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any):
        LifecycleNode.__init__(self, node_name, **kwargs)
        self.stats = NodeStats()
        self.startup = Startup()  # process age at each start-up stage (main() marks the first ones)
        self.gc_pauses = GcPauses()  # collections while active, on /diagnostics
        self.cop = None
        self.config_error = ""
        self._state = "unconfigured"
        self._last_log: dict[str, float] = {}
        self.cfg, self._param_error = declare_config(self, NodeConfig, "parameters")
        if self._param_error:
            self.get_logger().error(f"invalid parameters, node will not configure: {self._param_error}")
        self.energy = EnergyMeter(self.cfg.energy.watts_per_busy_core)  # RAPL if readable, else estimated
        self.bundle_swaps = BundleSwaps(self.get_logger())
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.inputs: NodeInputs | None = None
        self.outputs = DecisionOutputs(self, self._on_offered_deadline_missed)
        self.runners: dict[str, TaskRunner] = {}
        # /diagnostics is absolute: one topic for every line; statuses carry the namespace (the line)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", qos.diagnostics_qos())
        self._diag_timer = self.create_timer(1.0, self._publish_diagnostics)

    # -- parameters ------------------------------------------------------------------------------
    def _on_set_parameters(self, params: list) -> SetParametersResult:
        changes = {p.name: p.value for p in params}
        try:
            new = from_flat(changes, base=self.cfg)
        except ValueError as e:
            return SetParametersResult(successful=False, reason=str(e))
        if self.cop is not None and (refused := self.bundle_swaps.apply(self.cop, self.runners, changes, new)):
            return SetParametersResult(successful=False, reason=refused)
        structural = sorted(set(changes) & set(STRUCTURAL))
        if structural and self.cop is not None:
            self.get_logger().info(f"{', '.join(structural)} take effect at the next configure")
        self.cfg = new
        self._param_error = ""
        if self.cop is not None:
            self.cop.set_config(new)
        self.energy.assumed_w = new.energy.watts_per_busy_core  # a measured RAPL rate stays measured
        return SetParametersResult(successful=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        from sol_control.coprocessor import Coprocessor

        if self._param_error:
            return self._configure_failed(f"invalid parameters: {self._param_error}")
        cfg = self.cfg
        try:
            self.cop = Coprocessor(cfg)
        except Exception as e:  # noqa: BLE001 - any load error is a configure failure with its reason
            self.cop = None
            return self._configure_failed(f"{type(e).__name__}: {e}")
        self.config_error = ""
        self.startup.detail.update(self.cop.load_times_s())
        self.runners = {task: TaskRunner(task, self.cop, self._publish, self) for task in self.cop.tasks}
        self.inputs = NodeInputs(self, lambda: self.cfg, self.runners, self.reject)
        self._state = "inactive"
        self.startup.mark("configure")
        self.get_logger().info(f"configured: mode={cfg.mode}, bundles "
                               + ", ".join(f"{t}={cfg.bundle_dir(t)}" for t in self.cop.tasks))
        return TransitionCallbackReturn.SUCCESS

    def _configure_failed(self, why: str) -> TransitionCallbackReturn:
        self.config_error = why
        self.get_logger().error(f"configure failed: {why}")
        return TransitionCallbackReturn.FAILURE

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            warm = self.cop.warmup()
        except Exception as e:  # noqa: BLE001
            self.config_error = f"warm-up failed: {type(e).__name__}: {e}"
            self.get_logger().error(self.config_error)
            return TransitionCallbackReturn.FAILURE
        latency = ", ".join(f"{t} {ms:.1f} ms" for t, ms in warm.items())
        self.get_logger().info(f"warm: full-precision latency {latency}")
        self.startup.mark("warmup")
        self.inputs.restart()
        # decision publishers exist only while active: a subscriber's liveliness event says a node
        # that decides is (no longer) there
        self.outputs.create(self.cfg, self.cop.tasks)
        result = super().on_activate(state)  # activates the lifecycle publishers
        self.gc_pauses.install()
        # one runner per task: in mode both, QC and grasp decide the same frame in parallel, each
        # with its own budget from the stamp, instead of grasp getting what QC leaves
        for runner in self.runners.values():
            runner.start()
        if self.cfg.nice != 0:
            self._renice(self.cfg.nice)
        self._state = "active"
        self.startup.mark("active")
        self.get_logger().info(self.startup.summary("active"))
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_runners()
        self.gc_pauses.uninstall()
        self.outputs.destroy()
        self._state = "inactive"
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._released("unconfigured")

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._released("finalized")

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._released("unconfigured")

    def _released(self, new_state: str) -> TransitionCallbackReturn:
        self._release()
        self._state = new_state
        return TransitionCallbackReturn.SUCCESS

    def _renice(self, nice: int) -> None:
        """Every thread of this process (executor, runners, DDS) to `nice`, except the shadow audit."""
        ok, what = priority.renice_process(nice, self.cop.background_thread_ids() if self.cop else set())
        (self.get_logger().info if ok else self.get_logger().warning)(what)

    def _stop_runners(self) -> None:
        for runner in self.runners.values():
            runner.stop()

    def _release(self) -> None:
        self._stop_runners()
        self.gc_pauses.uninstall()
        if self.inputs is not None:  # nothing is offered to the runners after this
            self.inputs.destroy()
            self.inputs = None
        self.runners = {}
        self.outputs.destroy()
        if self.cop is not None:
            self.cop.close()
            self.cop = None

    def autostart(self) -> bool:
        """configure + activate; False (and the reason logged) when either fails."""
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            return False
        return self.trigger_activate() == TransitionCallbackReturn.SUCCESS

    # -- RunnerHooks (runner threads) -----------------------------------------------------------
    def reject(self, reason: str, detail: str) -> None:
        self.stats.reject(reason)
        self._log_limited(reason, f"rejected input: {detail}")

    def error(self, key: str, text: str) -> None:
        self.stats.errors += 1
        self._log_limited(key, text)

    def sensor_timeout(self, active: bool) -> None:
        if active and not self.stats.sensor_timeout:
            timeout_ms = self.cfg.deadline.sensor_timeout_ms
            self.get_logger().error(f"no usable frame for {timeout_ms:.0f} ms: publishing safe defaults")
        self.stats.sensor_timeout = active

    def ros_now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    # -- outputs ---------------------------------------------------------------------------------
    def _publish(self, d: Decision) -> None:
        """A labelled decision (the runner relabelled it at publish time) on its topics."""
        frame_id = (self.cfg.grasp.frame_id or d.frame_id) if d.task == "grasp" else d.frame_id
        d = named(d, self.cop)  # the runner's own answers carry the bundle deciding too
        try:
            self.outputs.publish(d, frame_id)
        except Exception as e:  # noqa: BLE001 - e.g. publishers torn down during deactivate
            self.error("publish_error", f"publish failed: {type(e).__name__}: {e}")
        self.stats.record(d)  # after publishing: counting is not on the decision's critical path
        if d.reason != "sensor_timeout":   # the first decision on a frame
            self.startup.mark("first_decision", once=True)

    def _on_offered_deadline_missed(self, info) -> None:
        self.stats.offered_deadline_missed += int(info.total_count_change)

    def _publish_diagnostics(self) -> None:
        extra = task_extra(self.cop.stats() if self.cop is not None else {}, self.runners, self.bundle_swaps)
        self.energy.update()
        self._diag_pub.publish(self.stats.to_msg(
            self.get_clock().now().to_msg(), self._state, self.config_error or self._param_error, extra,
            sum(r.frames.superseded for r in self.runners.values()), self.energy, self.get_namespace().strip("/"),
            {**self.startup.key_values(), **self.gc_pauses.key_values()}))

    def _log_limited(self, key: str, text: str) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, 0.0) >= LOG_EVERY_S:
            self._last_log[key] = now
            self.get_logger().warning(text)


def main(args: list[str] | None = None) -> None:
    from sol_control.coprocessor import share_gil_quickly

    startup = Startup()
    startup.mark("imports")  # interpreter start and module imports
    share_gil_quickly()  # the executor (images, /clock, timers) and the runners share the GIL
    rclpy.init(args=args)
    node = CoprocessorNode()
    startup.mark("init")  # rclpy, the node, its parameters
    node.startup = startup
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        if node.cfg.autostart and not node.autostart():
            node.get_logger().error("autostart failed; the node stays up so a lifecycle manager can retry")
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except RuntimeError:
        if rclpy.ok():
            raise
        # SIGINT shut the context down while the executor was taking a message: rclpy's take_message
        # then raises "Unable to convert call argument '0' to Python object"; it is the requested
        # stop, not a failure
    finally:
        node._release()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
