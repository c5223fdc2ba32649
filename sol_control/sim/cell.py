"""The ROS-free cell: QC line + pick station on one clock, their cameras, and the tallies.

    cell = Cell(CellConfig(seed=3))
    events = cell.step_until_event(max_s=5.0)   # lock-step: advance until a camera trigger
    image = cell.render_qc()                    # [128, 128, 3] uint8, orthographic top view

Same config + seed + same commands at the same sim times ⇒ bit-identical images and outcomes.
"""
from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from sol_control.sim import scene  # noqa: E402
from sol_control.sim.config import CellConfig  # noqa: E402
from sol_control.sim.conveyor import Conveyor  # noqa: E402
from sol_control.sim.pick import GraspCommand, PickStation  # noqa: E402
from sol_control.sim.render import CameraRenderer  # noqa: E402
from sol_control.sim.scoring import Tally  # noqa: E402

TRIGGERS = ("qc_trigger", "pick_trigger")


class Cell:
    def __init__(self, cfg: CellConfig | None = None, render: bool = True):
        self.cfg = cfg or CellConfig()
        self.render_enabled = render
        self.renderers: dict[str, CameraRenderer] = {}
        qc_seed, pick_seed = np.random.SeedSequence(self.cfg.seed).spawn(2)
        self.conveyor = None
        if self.cfg.qc:
            self.qc_model = mujoco.MjModel.from_xml_string(
                scene.build_qc_mjcf(self.cfg.conveyor.camera_to_ejector_m, self.cfg.timestep_s))
            self.qc_data = mujoco.MjData(self.qc_model)
            if render:
                self.renderers["qc"] = CameraRenderer(self.qc_model, "qc", scene.QC_IMAGE_PX)
            self.conveyor = Conveyor(self.cfg.conveyor, self.qc_model, self.qc_data,
                                     np.random.default_rng(qc_seed), self._upload_qc_texture)
        self.pick = None
        if self.cfg.grasp:
            self.pick = PickStation(self.cfg.pick, self.cfg.timestep_s, np.random.default_rng(pick_seed),
                                    self._pick_model_changed)
        self.steps_per_control = round(self.cfg.control_period_s / self.cfg.timestep_s)
        self.tally = Tally()
        self.n_steps = 0

    # ---- clock --------------------------------------------------------------------------------
    @property
    def time_s(self) -> float:
        return self.n_steps * self.cfg.timestep_s      # exact multiples: no drift between runs

    def step(self) -> list[dict]:
        """One physics step (control runs on control ticks). Returns the events it produced."""
        events: list[dict] = []
        t = self.time_s
        if self.conveyor is not None:
            events += self.conveyor.step(self.qc_data, t)
        if self.pick is not None:
            if self.n_steps % self.steps_per_control == 0:
                events += self.pick.step(t)
            self.pick.physics_step()
        self.n_steps += 1
        for e in events:
            self.tally.add(e)
        return events

    def step_for(self, duration_s: float) -> list[dict]:
        events = []
        for _ in range(max(0, round(duration_s / self.cfg.timestep_s))):
            events += self.step()
        return events

    def step_until_event(self, max_s: float, types: tuple[str, ...] = TRIGGERS) -> list[dict]:
        """Advance until a step yields an event whose type is in `types`, or max_s passes."""
        events = []
        for _ in range(max(1, round(max_s / self.cfg.timestep_s))):
            new = self.step()
            events += new
            if any(e["type"] in types for e in new):
                break
        return events

    # ---- sensors ------------------------------------------------------------------------------
    def render_qc(self) -> np.ndarray:
        """[128, 128, 3] uint8 from the orthographic QC camera."""
        mujoco.mj_kinematics(self.qc_model, self.qc_data)    # mocap poses → geoms
        mujoco.mj_camlight(self.qc_model, self.qc_data)      # camera pose
        return self.renderers["qc"].render(self.qc_data)

    def render_pick(self) -> np.ndarray:
        """[192, 192, 3] uint8 from the orthographic pick camera."""
        return self.renderers["pick"].render(self.pick.data)

    def render_overview(self, size_px: int = 360) -> np.ndarray:
        """[size, 2 * size, 3] uint8: perspective views of the QC line and the pick station (for people).
        Flat lighting, so depth reads from outlines only."""
        views = []
        stations = []
        if self.conveyor is not None:
            stations.append(("qc", self.qc_model, self.qc_data))
        if self.pick is not None:
            stations.append(("pick", self.pick.model, self.pick.data))
        for name, model, data in stations:
            key = f"overview_{name}"
            if key not in self.renderers:
                self.renderers[key] = CameraRenderer(model, "overview", size_px)
            elif self.renderers[key].model is not model:
                self.renderers[key].set_model(model)
            if name == "qc":
                mujoco.mj_kinematics(model, data)
                mujoco.mj_camlight(model, data)
            views.append(self.renderers[key].render(data))
        return np.hstack(views)

    def _upload_qc_texture(self, tex_id: int) -> None:
        for key in ("qc", "overview_qc"):
            if key in self.renderers:
                self.renderers[key].upload_texture(tex_id)

    def _pick_model_changed(self, model: mujoco.MjModel) -> None:
        if not self.render_enabled:
            return
        if "pick" in self.renderers:
            self.renderers["pick"].set_model(model)
        else:
            self.renderers["pick"] = CameraRenderer(model, "pick", scene.GRASP_IMAGE_PX)

    def joint_state(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Arm joints (rad) and fingers (m): names, positions, velocities."""
        names = list(scene.ARM_JOINTS + scene.FINGER_JOINTS)
        if self.pick is None:
            return names, np.zeros(len(names)), np.zeros(len(names))
        q, dq, fq, fdq = self.pick._arm_state()
        return names, np.concatenate([q, fq]), np.concatenate([dq, fdq])

    def belt_state(self) -> tuple[float, float]:
        """(position m, velocity m/s) of the belt."""
        v = self.cfg.conveyor.belt_speed_mps if self.conveyor is not None else 0.0
        return v * self.time_s, v

    # ---- commands -----------------------------------------------------------------------------
    def set_controller_alive(self, task: str, alive: bool) -> list[dict]:
        """The liveliness of the node deciding `task` (qc | grasp) changed (the line controller's
        view: a DDS liveliness event). Returns the events it caused."""
        if task == "qc" and self.conveyor is not None:
            self.conveyor.set_controller_alive(alive)
        if task == "grasp" and self.pick is not None:
            event = self.pick.set_controller_alive(alive, self.time_s)
            if event is not None:
                self.tally.add(event)
                return [event]
        return []

    def apply_qc_verdict(self, verdict: str, eject_time_s: float | None, stamp_s: float | None = None,
                         info: dict | None = None) -> int | None:
        """verdict pass | reject | uncertain; returns the id of the part it was matched to (None:
        no part, or the part was past its divert cutoff: `late_verdicts`)."""
        if verdict not in ("pass", "reject", "uncertain"):
            raise ValueError(f"verdict must be pass|reject|uncertain, got {verdict!r}")
        late = self.conveyor.late_verdicts
        part_id = self.conveyor.apply_verdict(verdict, eject_time_s, stamp_s, self.time_s, info)
        if self.conveyor.late_verdicts > late:
            self.tally.late_verdicts += 1
        elif part_id is None:
            self.tally.unmatched_verdicts += 1
        return part_id

    def apply_grasp(self, cmd: GraspCommand) -> bool:
        accepted = self.pick.apply_grasp(cmd, self.time_s)
        if not accepted:
            self.tally.ignored_grasps += 1
        return accepted

    def apply_grasp_hold(self, info: dict | None = None) -> bool:
        """The safe default; False when the station was not waiting for a decision."""
        if not self.pick.ready():
            self.tally.ignored_grasps += 1
            return False
        event = self.pick.apply_hold(self.time_s, info)
        if event is not None:
            self.tally.add(event)
        return True

    def eject_time_s(self, stamp_s: float) -> float:
        """When a part centred under the camera at stamp_s reaches the pusher."""
        c = self.cfg.conveyor
        return stamp_s + c.camera_to_ejector_m / c.belt_speed_mps

    def close(self) -> None:
        for r in self.renderers.values():
            r.close()
        self.renderers.clear()
