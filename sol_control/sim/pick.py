"""The pick station: lay out a scene, wait for a grasp decision, execute it, score it.

Sequence for a decision: home → ready (above the table) → approach waypoints a1..a3 → descend to
the grasp pose with the fingers open to the commanded width → close with the commanded force
(finger position target 0, actuator force limited to force_n) → lift → hold `hold_s` → score
(an object risen by `success_lift_m` touching both pads) → release → home → next scene.
Poses are in frame `pick_table` (the pick model's world frame). A new scene recompiles the model.

While the grasp node's liveliness is lost the station holds: no new grasp starts, the camera is not
triggered, a scene waiting for its decision goes back to waiting (its image's decision will not
come), and once a node is back the scene is imaged again and decided as usual; until the first
decision after an outage arrives the camera looks again every `hold_retry_s` (a node that was just
respawned may drop the first frames while DDS rediscovers the cell). A sequence already running
completes: its decision was on time and valid, and the arm controller is still there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from sol_control.sim import scene as sc
from sol_control.sim.appearance import sample_pick_scene, teacher_label
from sol_control.sim.config import PickConfig
from sol_control.sim.ik import ArmIK, equivalent_yaw
from sol_control.tasks.grasp import HOME_JOINTS_RAD

READY_TCP_M = np.array([0.0, 0.05, 0.28])
READY_SEED_RAD = np.array([0.0, 0.3, 1.6, 0.0, 1.24, 0.0])
OPEN_WIDTH_M = 2 * sc.FINGER_MAX_M
OPEN_FORCE_N = 20.0
FORCE_RANGE_N = (0.5, 100.0)


@dataclass(frozen=True)
class GraspCommand:
    x_m: float
    y_m: float
    z_m: float
    yaw_rad: float
    width_m: float                               # opening on approach (tasks.common margin included)
    force_n: float                               # squeeze force per finger
    approach_m: tuple = ()                       # ((x, y, z), ...) in pick_table, outer first
    info: dict = field(default_factory=dict)     # source, latency_ms, ... (copied to the outcome)


@dataclass
class Segment:
    kind: str                  # joint | cart | wait
    pos_m: np.ndarray          # TCP target, pick_table
    yaw_rad: float
    duration_s: float
    width_m: float
    force_n: float
    tag: str


def smoothstep(s: float) -> float:
    s = min(max(s, 0.0), 1.0)
    return s * s * (3.0 - 2.0 * s)


class PickStation:
    def __init__(self, cfg: PickConfig, timestep_s: float, rng: np.random.Generator, on_new_model=None):
        self.cfg = cfg
        self.timestep_s = timestep_s
        self.rng = rng
        self.on_new_model = on_new_model or (lambda model: None)
        self.q_home = np.asarray(HOME_JOINTS_RAD, float)
        self.q_cmd = self.q_home.copy()
        self.scene = None
        self.target_index = -1
        self.label: dict = {}
        self.scene_id = -1
        self.state = "spawn"
        self.state_t_s = 0.0
        self.segments: list[Segment] = []
        self.command: GraspCommand | None = None
        self.holds = 0                                # consecutive holds on the current scene
        self.controller_alive = True                  # the grasp node's liveliness, as the cell sees it
        self.outage_holds = 0                         # decisions waited for when the node was lost
        self.look_again = False                       # after an outage: re-trigger until a decision comes
        self.trigger_t_s = 0.0
        self._load([], t_s=0.0)

    # ---- model --------------------------------------------------------------------------------
    def _load(self, objects, t_s: float) -> None:
        """(Re)compile the station with `objects`; the arm keeps its joint state."""
        carry = self._arm_state() if hasattr(self, "data") else None
        self.model = mujoco.MjModel.from_xml_string(sc.build_pick_mjcf(objects, self.timestep_s))
        self.data = mujoco.MjData(self.model)
        self.ik = ArmIK(self.model)
        act = {n: mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_ACTUATOR, f"a_{n}")
               for n in sc.ARM_JOINTS + sc.FINGER_JOINTS}
        self.arm_act = np.array([act[j] for j in sc.ARM_JOINTS])
        self.finger_act = np.array([act[f] for f in sc.FINGER_JOINTS])
        fj = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, f) for f in sc.FINGER_JOINTS]
        self.finger_qpos = np.array([self.model.jnt_qposadr[j] for j in fj])
        self.finger_dof = np.array([self.model.jnt_dofadr[j] for j in fj])
        self.pads = {mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in ("pad_l", "pad_r")}
        self.obj_bodies = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, f"obj{i}")
                           for i in range(len(objects))]
        if carry is None:
            carry = (self.q_home, np.zeros(6), np.full(2, sc.FINGER_MAX_M), np.zeros(2))
        (self.data.qpos[self.ik.qpos_adr], self.data.qvel[self.ik.dof_adr],
         self.data.qpos[self.finger_qpos], self.data.qvel[self.finger_dof]) = carry
        self.data.time = t_s
        self.data.ctrl[self.arm_act] = self.q_cmd
        self._grip(OPEN_WIDTH_M, OPEN_FORCE_N)
        mujoco.mj_forward(self.model, self.data)
        self.obj_z0_m = [float(self.data.xpos[b][2]) for b in self.obj_bodies]
        self.on_new_model(self.model)

    def _arm_state(self) -> tuple[np.ndarray, ...]:
        """Arm and finger positions/velocities (object joints come first, so addresses move)."""
        d = self.data
        return (d.qpos[self.ik.qpos_adr].copy(), d.qvel[self.ik.dof_adr].copy(),
                d.qpos[self.finger_qpos].copy(), d.qvel[self.finger_dof].copy())

    def physics_step(self) -> None:
        mujoco.mj_step(self.model, self.data)

    # ---- per control tick ---------------------------------------------------------------------
    def step(self, t_s: float) -> list[dict]:
        events = []
        if self.state == "spawn":
            self.scene = sample_pick_scene(self.rng)
            self.target_index, self.label = teacher_label(self.scene)
            self.scene_id += 1
            self.command = None
            self.holds = 0
            self._load(self.scene.objects, t_s)
            self.state, self.state_t_s = "settle", t_s
        elif self.state == "settle" and t_s - self.state_t_s >= self.cfg.settle_s - 1e-9 and self.controller_alive:
            self.state, self.state_t_s = "ready", t_s
            events.append(self._trigger(t_s))
        elif self.state == "ready" and t_s - self.state_t_s >= self.cfg.decision_timeout_s:
            events.append(self._outcome(t_s, "no_decision"))
            self.state = "spawn"
        elif self.state == "ready" and self.look_again and t_s - self.trigger_t_s >= self.cfg.hold_retry_s - 1e-9:
            events.append(self._trigger(t_s))
        elif self.state == "run":
            events += self._run(t_s)
        return events

    def _trigger(self, t_s: float) -> dict:
        self.trigger_t_s = t_s
        return {"type": "pick_trigger", "scene_id": self.scene_id, "t_s": t_s}

    def _run(self, t_s: float) -> list[dict]:
        seg = self.segments[0]
        s = (t_s - self.seg_start_s) / seg.duration_s
        if seg.kind == "joint":
            self.q_cmd = self.seg_q0 + smoothstep(s) * (self.seg_goal - self.seg_q0)
        elif seg.kind == "cart":
            pos = self.seg_p0 + smoothstep(s) * (seg.pos_m - self.seg_p0)
            self.q_cmd, _ = self.ik.solve(self.q_cmd, pos, seg.yaw_rad, iters=15)
        self.data.ctrl[self.arm_act] = self.q_cmd
        self._grip(seg.width_m, seg.force_n)
        if s < 1.0 - 1e-9:
            return []
        self.segments.pop(0)
        events = [self._score(t_s)] if seg.tag == "hold" else []
        if not self.segments:
            self.state = "spawn"
            return events
        self._begin_segment(t_s)
        return events

    def _begin_segment(self, t_s: float) -> None:
        seg = self.segments[0]
        self.seg_start_s = t_s
        self.seg_q0 = self.q_cmd.copy()
        self.seg_p0, _ = self.ik.forward(self.q_cmd)
        if seg.kind != "joint":
            return
        if seg.tag == "home":
            self.seg_goal = self.q_home.copy()
        else:
            seed = READY_SEED_RAD if seg.tag == "ready" else self.q_cmd
            self.seg_goal = self.ik.solve(seed, seg.pos_m, seg.yaw_rad)[0]

    def _grip(self, width_m: float, force_n: float) -> None:
        self.data.ctrl[self.finger_act] = width_m / 2
        self.model.actuator_forcerange[self.finger_act] = (-force_n, force_n)

    # ---- commands -----------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.state == "ready"

    def set_controller_alive(self, alive: bool, t_s: float) -> dict | None:
        """The grasp node's liveliness changed. Lost while waiting for a decision: hold, and image
        the scene again once a node is back (returns the hold event)."""
        self.controller_alive = alive
        self.look_again = alive
        if alive or self.state != "ready":
            return None
        self.outage_holds += 1
        self.state, self.state_t_s = "settle", t_s - self.cfg.settle_s   # trigger again as soon as alive
        return {"type": "grasp_outage_hold", "scene_id": self.scene_id, "t_s": t_s}

    def apply_grasp(self, cmd: GraspCommand, t_s: float) -> bool:
        """Start executing a decision; False when the station is not waiting for one (or the grasp
        node's liveliness is lost: nothing new moves)."""
        if self.state != "ready" or not self.controller_alive:
            return False
        self.look_again = False
        self.command = cmd
        c = self.cfg
        yaw = equivalent_yaw(cmd.yaw_rad, 0.0)
        grasp = np.array([cmd.x_m, cmd.y_m, cmd.z_m])
        lift = grasp + np.array([0.0, 0.0, c.lift_height_m])
        width = float(np.clip(cmd.width_m, 0.0, OPEN_WIDTH_M))
        force = float(np.clip(cmd.force_n, *FORCE_RANGE_N))
        points = [np.asarray(p, float) for p in cmd.approach_m] or [grasp + np.array([0, 0, 0.12])]
        segs = [Segment("joint", READY_TCP_M, yaw, c.ready_s, width, OPEN_FORCE_N, "ready"),
                Segment("joint", points[0], yaw, c.approach_s, width, OPEN_FORCE_N, "approach")]
        segs += [Segment("cart", p, yaw, c.waypoint_s, width, OPEN_FORCE_N, "approach") for p in points[1:]]
        segs += [Segment("cart", grasp, yaw, c.descend_s, width, OPEN_FORCE_N, "descend"),
                 Segment("wait", grasp, yaw, c.close_s, 0.0, force, "close"),
                 Segment("cart", lift, yaw, c.lift_s, 0.0, force, "lift"),
                 Segment("wait", lift, yaw, c.hold_s, 0.0, force, "hold"),
                 Segment("wait", lift, yaw, c.release_s, OPEN_WIDTH_M, OPEN_FORCE_N, "release"),
                 Segment("joint", lift, 0.0, c.home_s, OPEN_WIDTH_M, OPEN_FORCE_N, "home")]
        self.segments = segs
        self.state = "run"
        self._begin_segment(t_s)
        return True

    def apply_hold(self, t_s: float, info: dict | None = None) -> dict | None:
        """The safe default: no grasp. The arm stays still and the camera looks again after
        `hold_retry_s`; after `max_holds` holds in a row the scene counts as held and is replaced.
        Returns the outcome event then, else None."""
        if self.state != "ready":
            return None
        self.look_again = False
        self.command = GraspCommand(0, 0, 0, 0, 0, 0, (), dict(info or {}))
        self.holds += 1
        if self.holds >= self.cfg.max_holds:
            self.state = "spawn"
            return self._outcome(t_s, "held", holds=self.holds)
        self.state, self.state_t_s = "settle", t_s - self.cfg.settle_s + self.cfg.hold_retry_s
        return None

    # ---- scoring ------------------------------------------------------------------------------
    def _score(self, t_s: float) -> dict:
        touching: dict[int, set] = {}
        for i in range(self.data.ncon):
            c = self.data.contact[i]
            for a, b in ((c.geom1, c.geom2), (c.geom2, c.geom1)):
                if a in self.pads:
                    touching.setdefault(int(self.model.geom_bodyid[b]), set()).add(a)
        best = (-1, -np.inf, 0)
        for k, body in enumerate(self.obj_bodies):
            risen = float(self.data.xpos[body][2] - self.obj_z0_m[k])
            pads = len(touching.get(body, ()))
            if (pads, risen) > (best[2], best[1]):
                best = (k, risen, pads)
        k, risen_m, pads = best
        ok = k >= 0 and risen_m >= self.cfg.success_lift_m and pads == 2
        return self._outcome(t_s, "success" if ok else "failure", object_index=k,
                             risen_m=round(risen_m, 4), pads=pads, target_object=k == self.target_index)

    def _outcome(self, t_s: float, outcome: str, **extra) -> dict:
        cmd = self.command
        ob = self.scene.objects[self.target_index]
        out = {"type": "grasp_outcome", "scene_id": self.scene_id, "t_s": t_s, "outcome": outcome,
               "n_objects": len(self.scene.objects), "target_shape": ob.shape,
               "teacher": {k: round(v, 4) for k, v in self.label.items() if len(k) <= 5}}
        if cmd is not None and outcome != "held":
            out["command"] = {"x_m": cmd.x_m, "y_m": cmd.y_m, "z_m": cmd.z_m, "yaw_rad": cmd.yaw_rad,
                              "width_m": cmd.width_m, "force_n": cmd.force_n}
        out.update(cmd.info if cmd is not None else {})
        out.update(extra)
        return out
