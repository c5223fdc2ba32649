"""`ros2 run sol_control cell_sim`: the simulated cell on ROS, like Gazebo + ros_gz_bridge.

Publishes (sim time):  /clock  qc/camera/image_raw + camera_info  pick/camera/image_raw +
  camera_info  joint_states (the 6 arm joints)  gripper/joint_states (fingers, m)
  conveyor/joint_states (belt position m, velocity m/s).
Consumes the coprocessor's decision records:  qc/verdict  and  grasp/decision
  (diagnostic_msgs/DiagnosticStatus, docs/ROS_INTERFACE.md): rejects fire the pusher at
  eject_time, grasps run the pick sequence, holds replace the scene. Both are subscribed with
  AUTOMATIC liveliness (`liveliness_lease_ms`): while a task's node is gone the cell fails safe
  (parts without a pass verdict are diverted at the ejector anyway; the pick station holds), and in
  lock-step the world waits for it to come back (`controller_wait_s`).

Cameras are triggered like a photo-eye line: one QC image per part centred under the camera, one
pick image per scene once it has settled. `mode:=lockstep` waits for each decision before time
moves on (same seed ⇒ same images and outcomes); `mode:=realtime` keeps sim time on the wall clock.
"""
from __future__ import annotations

import hashlib
import json
import math
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image, JointState

from sol_control.budget import NS_PER_S
from sol_control.decision import STAGE_FIELDS
from sol_control.ros import convert, qos
from sol_control.ros.liveliness import DecisionWatch
from sol_control.sim import scene
from sol_control.sim.cell import Cell
from sol_control.sim.clocking import ClockingMixin
from sol_control.sim.config import BridgeConfig
from sol_control.sim.pick import GraspCommand
from sol_control.sim.scoring import decision_stats

TASK_OF_CAMERA = {"qc": "qc", "pick": "grasp"}
CAMERA_OF_TASK = {task: camera for camera, task in TASK_OF_CAMERA.items()}
# What cell_sim publishes (key: topic, message type) — what Gazebo + ros_gz_bridge would give.
PUBLISHED = {"clock": ("/clock", Clock),
             "qc": ("qc/camera/image_raw", Image), "qc_info": ("qc/camera/camera_info", CameraInfo),
             "pick": ("pick/camera/image_raw", Image), "pick_info": ("pick/camera/camera_info", CameraInfo),
             "joints": ("joint_states", JointState), "gripper": ("gripper/joint_states", JointState),
             "conveyor": ("conveyor/joint_states", JointState)}
CONSUMED = {"qc": ("qc/verdict", DiagnosticStatus), "grasp": ("grasp/decision", DiagnosticStatus)}


def _qos(depth: int, reliable: bool) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, durability=DurabilityPolicy.VOLATILE,
                      reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT)


def _type_name(kind) -> str:
    return f"{kind.__module__.split('.')[0]}/msg/{kind.__name__}"


def camera_info(size_px: int, fov_m: float, stamp_ns: int, frame_id: str) -> CameraInfo:
    """Orthographic camera: K holds pixels per metre (valid at every depth), no distortion."""
    f = size_px / fov_m
    c = size_px / 2.0
    msg = CameraInfo(header=convert.header(stamp_ns, frame_id), height=size_px, width=size_px,
                     distortion_model="plumb_bob")
    msg.d = [0.0] * 5
    msg.k = [f, 0.0, c, 0.0, f, c, 0.0, 0.0, 1.0]
    msg.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    msg.p = [f, 0.0, c, 0.0, 0.0, f, c, 0.0, 0.0, 0.0, 1.0, 0.0]
    return msg


class CellBridge(ClockingMixin):
    def __init__(self, cfg: BridgeConfig, node: Node, on_event=None):
        self.cfg = cfg
        self.node = node
        self.on_event = on_event or (lambda event: None)
        self.cell = Cell(cfg.cell)
        self.step_ns = int(round(cfg.cell.timestep_s * NS_PER_S))
        self.state_steps = max(1, round(cfg.state_period_s / cfg.cell.timestep_s))
        clock_s = cfg.state_period_s if cfg.mode == "lockstep" else cfg.clock_period_s
        self.clock_steps = max(1, round(clock_s / cfg.cell.timestep_s))
        self.steps_per_tick = max(1, round(cfg.cell.control_period_s / cfg.cell.timestep_s))
        sensor, reliable = _qos(1, False), _qos(10, True)
        self.pub = {key: node.create_publisher(kind, topic, reliable if key == "clock" else sensor)
                    for key, (topic, kind) in PUBLISHED.items()}
        self.tasks = tuple(t for t, on in (("qc", cfg.cell.qc), ("grasp", cfg.cell.grasp)) if on)
        self.watch = {task: DecisionWatch(node, kind, topic, handler, cfg.liveliness_lease_ms,
                                          lambda alive, task=task: self._on_liveliness(task, alive))
                      for (task, (topic, kind)), handler in zip(CONSUMED.items(), (self._on_verdict, self._on_grasp))}
        self.awaiting = set(self.tasks)    # lock-step: tasks whose node the world waits for
        for task in self.tasks:            # no live decision publisher seen yet
            self.cell.set_controller_alive(task, False)
        self.before_image: list = []    # callables(task) right before an image goes out (the chaos run's kill)
        self.sent_wall_ns: dict[tuple[str, int], int] = {}   # (task, stamp) → wall time of publish
        self.pending: dict[str, int] = {}                     # task → stamp awaiting its decision
        self.last_image: dict[str, tuple[float, object]] = {}  # task → (wall s sent, message): resends
        self.decisions: list[dict] = []
        self.counters = {"decision_timeouts": 0, "ignored_decisions": 0, "realtime_lag_s": 0.0,
                         "images": 0, "decisions_lost": 0, "resent_images": 0}
        self.image_digest = hashlib.sha256()                  # every published image, in order
        self.events_file = open(cfg.events_path, "a") if cfg.events_path else None
        self.recorder = None
        self.pub_truth = node.create_publisher(DiagnosticStatus, "sim/truth", reliable)
        if cfg.record_path:
            from sol_control.sim.record import BagRecorder

            self.recorder = BagRecorder(cfg.record_path)

    # ---- publishing ---------------------------------------------------------------------------
    def _out(self, key: str, msg) -> None:
        """Publish on a cell_sim topic (and record it)."""
        self.pub[key].publish(msg)
        if self.recorder is not None and key != "clock":
            topic, kind = PUBLISHED[key]
            self.recorder.write(topic, _type_name(kind), self.stamp_ns(), serialize_message(msg))

    def _record_msg(self, topic: str, msg) -> None:
        if self.recorder is not None:
            self.recorder.write(topic, _type_name(type(msg)), self.stamp_ns(), serialize_message(msg))

    def stamp_ns(self) -> int:
        return self.cell.n_steps * self.step_ns

    def publish_clock(self) -> None:
        msg = Clock()
        msg.clock = convert.stamp_to_ros(self.stamp_ns())
        self._out("clock", msg)

    def publish_state(self) -> None:
        """/clock, then joints, gripper and belt, all stamped now."""
        stamp = self.stamp_ns()
        self.publish_clock()
        names, q, dq = self.cell.joint_state()
        h = convert.header(stamp, "")
        self._out("joints", JointState(header=h, name=names[:6], position=q[:6].tolist(), velocity=dq[:6].tolist()))
        self._out("gripper", JointState(header=h, name=names[6:], position=q[6:].tolist(), velocity=dq[6:].tolist()))
        pos_m, v_mps = self.cell.belt_state()
        self._out("conveyor", JointState(header=h, name=["belt"], position=[pos_m], velocity=[v_mps]))

    def publish_image(self, task: str) -> None:
        """task = camera name: qc | pick."""
        stamp = self.stamp_ns()
        self.publish_state()
        if task == "qc":
            rgb, frame, fov = self.cell.render_qc(), "qc_camera", scene.QC_FOV_M
        else:
            rgb, frame, fov = self.cell.render_pick(), "pick_camera", scene.GRASP_FOV_M
        self.image_digest.update(rgb.tobytes())
        self._out(f"{task}_info", camera_info(rgb.shape[0], fov, stamp, frame))
        truth = self.truth(task, stamp)
        self.pub_truth.publish(truth)
        self._record_msg("sim/truth", truth)
        msg = convert.image_to_ros(rgb, stamp, frame)
        for hook in self.before_image:
            hook(TASK_OF_CAMERA[task])
        # taken right before publish(), which gives the sample its DDS source timestamp: the moment the
        # node starts the budget from under sim time (DDS stamps use this clock)
        self.sent_wall_ns[(TASK_OF_CAMERA[task], stamp)] = time.time_ns()
        self._out(task, msg)
        self.last_image[TASK_OF_CAMERA[task]] = (time.monotonic(), msg)
        self.pending[TASK_OF_CAMERA[task]] = stamp
        self.counters["images"] += 1

    def republish_image(self, task: str) -> None:
        """The last frame of `task` once more (the same message: a resend, not a new photo), after
        the time: a node that has only just matched /clock would refuse it as from the future."""
        msg = self.last_image[task][1]
        self.publish_clock()
        self.pub[CAMERA_OF_TASK[task]].publish(msg)
        self.last_image[task] = (time.monotonic(), msg)
        self.counters["resent_images"] += 1

    def ros_ok(self) -> bool:
        return rclpy.ok()

    def truth(self, camera: str, stamp_ns: int) -> DiagnosticStatus:
        """Ground truth for the image just taken (evaluation and replay only; the node never sees it)."""
        values = {"stamp": str(stamp_ns)}
        if camera == "qc":
            bp = min(self.cell.conveyor.parts, key=lambda b: abs(b.x_m))
            values.update(part_id=str(bp.part_id), defect=bp.part.defect,
                          defective="true" if bp.part.defective else "false")
        else:
            values.update(scene_id=str(self.cell.pick.scene_id),
                          **{k: repr(float(v)) for k, v in self.cell.pick.label.items()})
        return DiagnosticStatus(name=f"sol_control/sim_truth/{TASK_OF_CAMERA[camera]}", hardware_id=camera,
                                values=[KeyValue(key=k, value=v) for k, v in values.items()])

    # ---- decisions ----------------------------------------------------------------------------
    def _record(self, task: str, msg: DiagnosticStatus, msg_info):
        """Record the message (rosbag), parse, time and log a decision: (decision, event record, the
        summary handed to the cell), or None when it is not one we asked for.

        Timing uses DDS sample timestamps (system clock): e2e_ms = image published → decision
        published (what the deadline is about, including the image's transport that a sim-time
        stamp cannot show the node); measured_ms = image published → decision received here."""
        self._record_msg(CONSUMED[task][0], msg)
        recv = msg_info.get("received_timestamp") or time.time_ns()
        src = msg_info.get("source_timestamp") or recv
        try:
            d = convert.decision_from_status(msg)
        except (KeyError, ValueError):
            self.counters["ignored_decisions"] += 1
            return None
        sent = self.sent_wall_ns.pop((task, d.stamp_ns), None)
        if sent is None:          # e.g. sensor-timeout safe defaults, or a frame we never sent
            self.counters["ignored_decisions"] += 1
            return None
        if self.pending.get(task) == d.stamp_ns:
            del self.pending[task]
        measured_ms = (recv - sent) / 1e6
        e2e_ms = (src - sent) / 1e6
        rec = {"type": "decision", "task": task, "stamp_ns": d.stamp_ns, "t_s": self.cell.time_s,
               "source": d.source, "reason": d.reason, "latency_ms": d.latency_ms,
               "deadline_ms": d.deadline_ms, "deadline_met": d.deadline_met, "e2e_ms": e2e_ms,
               "measured_ms": measured_ms, "unlabelled_miss": bool(d.deadline_met and e2e_ms > d.deadline_ms),
               "confidence": d.action.confidence, "cpu_ms": d.cpu_ms, "policy": d.policy_rule,
               "policy_overruled": d.policy_overruled, "bundle_sha256": d.bundle_sha256,
               **{k: getattr(d, k) for k in STAGE_FIELDS}}
        info = {k: rec[k] for k in ("source", "latency_ms", "deadline_met", "e2e_ms", "confidence")}
        return d, rec, info

    def _on_verdict(self, msg: DiagnosticStatus, msg_info) -> None:
        got = self._record("qc", msg, msg_info)
        if got is None:
            return
        d, rec, info = got
        rec.update(verdict=d.action.verdict, defect_pred=d.action.defect)
        eject_s = d.eject_time_ns / NS_PER_S if d.eject_time_ns else None
        info["defect_pred"] = d.action.defect
        rec["part_id"] = self.cell.apply_qc_verdict(d.action.verdict, eject_s, d.stamp_ns / NS_PER_S, info)
        self._emit(rec)

    def _on_grasp(self, msg: DiagnosticStatus, msg_info) -> None:
        got = self._record("grasp", msg, msg_info)
        if got is None:
            return
        d, rec, info = got
        a = d.action
        rec["hold"] = bool(a.hold)
        if a.hold or not all(math.isfinite(v) for v in (a.x_m, a.y_m, a.z_m, a.yaw_rad, a.width_m, a.force_n)):
            rec["accepted"] = self.cell.apply_grasp_hold(info)
        else:
            cmd = GraspCommand(a.x_m, a.y_m, a.z_m, a.yaw_rad, a.width_m, a.force_n, tuple(a.approach_m), info)
            rec["accepted"] = self.cell.apply_grasp(cmd)
        self._emit(rec)

    def _on_liveliness(self, task: str, alive: bool) -> None:
        """A task's node appeared or is gone (DDS liveliness): the cell acts on it, lock-step waits."""
        self._emit({"type": "liveliness", "task": task, "alive": alive, "t_s": self.cell.time_s})
        for event in self.cell.set_controller_alive(task, alive):
            self._emit(event)
        if not alive and task in self.tasks:
            self.awaiting.add(task)


    def _emit(self, event: dict) -> None:
        if event["type"] == "decision":
            self.decisions.append(event)
        if self.events_file is not None:
            self.events_file.write(json.dumps(event, default=float) + "\n")
        self.on_event(event)

    # ---- stepping and waiting: sim/clocking.py (ClockingMixin) ----------------------------------
    def summary(self) -> dict:
        out = self.cell.tally.summary()
        out.update(decision_stats(self.decisions, self.cell.time_s))
        out.update(self.counters)
        out["liveliness"] = {t: {"lost": w.lost, "regained": w.regained, "incompatible": w.incompatible}
                             for t, w in self.watch.items() if t in self.tasks}
        out["lost_frames"] = sorted([task, stamp / NS_PER_S] for task, stamp in self.sent_wall_ns)
        out["sim_time_s"] = self.cell.time_s
        out["image_sha256"] = self.image_digest.hexdigest()
        return out

    def close(self) -> None:
        if self.events_file is not None:
            self.events_file.close()
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self.cell.close()


class OracleController:
    """Ground-truth decisions over ROS, for testing the bridge without models (not the coprocessor).

    Subscribes to the cameras like the coprocessor does and publishes the same decision records
    (qc/verdict, grasp/decision) with source "oracle", reading the truth from an in-process cell.
    """

    def __init__(self, node: Node, cell: Cell, lease_ms: float = 0.0):
        from sol_control.actions import GraspDecision, QCVerdict
        from sol_control.decision import Decision

        self.node, self.cell = node, cell
        self._types = (Decision, QCVerdict, GraspDecision)
        out = qos.decision_qos(0.0, lease_ms)   # in-process: no lease (sol_control.ros.liveliness)
        self.pub_qc = node.create_publisher(DiagnosticStatus, "qc/verdict", out)
        self.pub_grasp = node.create_publisher(DiagnosticStatus, "grasp/decision", out)
        node.create_subscription(Image, "qc/camera/image_raw", self._on_qc, _qos(1, False))
        node.create_subscription(Image, "pick/camera/image_raw", self._on_pick, _qos(1, False))

    def _on_qc(self, msg: Image) -> None:
        Decision, QCVerdict, _ = self._types
        stamp = convert.stamp_from_ros(msg.header.stamp)
        t_s = stamp / NS_PER_S
        v = self.cell.cfg.conveyor.belt_speed_mps
        parts = [bp for bp in self.cell.conveyor.parts if not bp.done]
        bp = min(parts, key=lambda b: abs(b.x_m - v * (self.cell.time_s - t_s)))   # the one centred at t_s
        verdict = "reject" if bp.part.defective else "pass"
        action = QCVerdict(bp.part.defect, verdict, 0.5, 0.5, bp.part.spec.severity, 1.0)
        eject_ns = int(round(self.cell.eject_time_s(t_s) * NS_PER_S))
        d = Decision("qc", action, "oracle", 0.0, 10.0, True, stamp, msg.header.frame_id, eject_time_ns=eject_ns)
        self.pub_qc.publish(convert.decision_to_status(d))

    def _on_pick(self, msg: Image) -> None:
        Decision, _, GraspDecision = self._types
        lab = self.cell.pick.label
        approach = tuple((lab[f"a{k}_x"], lab[f"a{k}_y"], lab[f"a{k}_z"]) for k in (1, 2, 3))
        action = GraspDecision(lab["x"], lab["y"], lab["z"], lab["yaw"], lab["width"], lab["force"], approach, 1.0)
        d = Decision("grasp", action, "oracle", 0.0, 10.0, True, convert.stamp_from_ros(msg.header.stamp), "pick_table")
        self.pub_grasp.publish(convert.decision_to_status(d))


def wait_active(node: Node, executor, node_names: list[str], timeout_s: float, alive=lambda: True) -> dict:
    """Ask each lifecycle node's ~/get_state once it serves it; returns {name: state label}.

    The coprocessor with autostart serves services only after configure + activate returned, so its
    first answer is final: anything but "active" means start-up failed (its log says why)."""
    from lifecycle_msgs.srv import GetState

    clients = {n: node.create_client(GetState, f"/{n}/get_state") for n in node_names}
    states = {n: "unknown" for n in node_names}
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end and alive() and any(v == "unknown" for v in states.values()):
        for name, cli in clients.items():
            if states[name] != "unknown" or not cli.service_is_ready():
                continue
            fut = cli.call_async(GetState.Request())
            executor.spin_until_future_complete(fut, timeout_sec=1.0)
            if fut.done() and fut.result() is not None:
                states[name] = fut.result().current_state.label
        executor.spin_once(timeout_sec=0.2)
    for cli in clients.values():
        node.destroy_client(cli)
    return states


class Session:
    """One run of the cell on ROS: its own rclpy context, the `cell_sim` node, an executor and
    (with `oracle`) the ground-truth controller. `with Session(cfg, domain_id) as s: s.run(...)`."""

    def __init__(self, cfg: BridgeConfig, domain_id: int, oracle: bool = False, listeners=()):
        if oracle:   # the oracle runs in this process: liveliness from matching only (ros/liveliness.py)
            cfg = cfg.model_copy(update={"liveliness_lease_ms": 0.0})
        self.cfg, self.domain_id, self.oracle = cfg, domain_id, oracle
        self.events: list[dict] = []
        self.listeners = listeners      # more callables(event), e.g. the chaos run's monitor
        self.bridge: CellBridge | None = None

    def __enter__(self) -> "Session":
        from rclpy.executors import SingleThreadedExecutor

        rclpy.init(domain_id=self.domain_id)
        self.node = rclpy.create_node("cell_sim")
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        try:
            self.bridge = CellBridge(self.cfg, self.node, on_event=self._on_event)
            if self.oracle:
                oracle_node = rclpy.create_node("oracle_controller")
                OracleController(oracle_node, self.bridge.cell)
                self.executor.add_node(oracle_node)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _on_event(self, event: dict) -> None:
        self.events.append(event)
        for listener in self.listeners:
            listener(event)

    def wait_active(self, node_names: list[str], timeout_s: float, alive=lambda: True) -> dict:
        return wait_active(self.node, self.executor, node_names, timeout_s, alive)

    def run(self, should_stop=lambda: False) -> dict:
        return self.bridge.run(self.executor, should_stop)

    def __exit__(self, *exc) -> None:
        if self.bridge is not None:
            self.bridge.close()
        self.node.destroy_node()
        rclpy.try_shutdown()


def _declare(node: Node) -> BridgeConfig:
    """ROS parameters (dotted BridgeConfig names, e.g. cell.seed) → BridgeConfig; ValueError names
    every bad field and value."""
    from sol_control.ros.params import declare_config

    cfg, error = declare_config(node, BridgeConfig, "cell_sim parameters")
    if error:
        raise ValueError(error)
    return cfg


def main(args: list[str] | None = None) -> None:
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

    rclpy.init(args=args)
    node = Node("cell_sim")
    bridge = None
    try:
        cfg = _declare(node)
        bridge = CellBridge(cfg, node)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        node.get_logger().info(f"cell_sim: mode={cfg.mode} seed={cfg.cell.seed} duration_s={cfg.duration_s or 'inf'}")
        summary = bridge.run(executor)
        print(json.dumps(summary, indent=1, default=float))
    except ValueError as e:
        node.get_logger().error(str(e))
    except (KeyboardInterrupt, ExternalShutdownException):
        if bridge is not None:
            print(json.dumps(bridge.summary(), indent=1, default=float))
    finally:
        if bridge is not None:
            bridge.close()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
