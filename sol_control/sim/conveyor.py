"""The QC line: kinematic belt, parts in texture slots, camera trigger, reject pusher, scoring.

Parts ride the belt as mocap bodies (x = spawn_x + v * t). A part centred under the QC camera
fires a trigger (like a photo-eye); verdicts arrive with an `eject_time_s` (sim time at which the
part reaches the pusher) and fire the pusher then. Outcomes come from where the part ends up.

Fail-safe rule (positive release, what a PLC does): only a `pass` lets a part through. At the
divert cutoff, the last moment the pusher can still be started for a part (its arrival at the
ejector minus the pusher's lead), a part without a verdict, with `uncertain`, or with a reject the
node gave no eject time for, is pushed off by the cell itself; a verdict that arrives later is
ignored (`late_verdicts`). A part that was between the camera and the cutoff while the QC node's
liveliness was lost is counted `outage_diverted`, apart from the accuracy figures.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import mujoco
import numpy as np

from sol_control.sim import scene
from sol_control.sim.appearance import QCPart, sample_qc_part
from sol_control.sim.config import ConveyorConfig

SPAWN_X_M = scene.BELT_X_RANGE_M[0] + 0.07
END_X_M = scene.BELT_X_RANGE_M[1] - 0.07
TEXTURE_PAD = 0.125


@dataclass
class BeltPart:
    part_id: int
    slot: int
    part: QCPart
    spawn_t_s: float
    x_m: float = SPAWN_X_M
    y_m: float = 0.0
    triggered: bool = False
    verdict: str | None = None          # pass | reject | uncertain (None: never decided)
    verdict_info: dict = field(default_factory=dict)
    pushed: bool = False
    done: bool = False
    push_scheduled: bool = False        # the pusher is set for this part (reject with eject time, or divert)
    cut_off: bool = False               # past the divert cutoff: later verdicts are ignored
    diverted_t_s: float | None = None   # when the cell decided to divert it (no pass verdict by the cutoff)
    outage: bool = False                # the QC node's liveliness was lost between camera and cutoff


def _inner_px() -> int:
    """Texture pixels covered by the part's own square (even, so the border is symmetric)."""
    return 2 * int(round(scene.PART_TEXTURE_PX / (1 + 2 * TEXTURE_PAD) / 2))


def part_texture(part: QCPart, belt_rgb) -> np.ndarray:
    """[P, P, 3] uint8: the part's top texture over the belt colour (alpha = footprint), inside a
    belt-coloured border of TEXTURE_PAD on each side so mipmaps never wrap part colour round the
    edge (that drew a faint square outline). The geom is (1 + 2 * TEXTURE_PAD) times the part."""
    p = scene.PART_TEXTURE_PX
    inner = _inner_px()
    pad = (p - inner) // 2
    rgba = np.zeros((p, p, 4), np.float32)                                                   # [P, P, 4]
    rgba[pad:pad + inner, pad:pad + inner] = cv2.resize(part.rgba, (inner, inner), interpolation=cv2.INTER_AREA)
    alpha = rgba[..., 3:4] / 255.0
    rgb = rgba[..., :3] * alpha + np.asarray(belt_rgb, np.float32) * (1.0 - alpha)
    # texture row 0 lands on the face's +y edge, like an image's top row: no flip
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def outcome_of(defective: bool, rejected: bool, verdict: str | None, outage: bool = False) -> str:
    """no_verdict / outage_diverted: pushed off for want of a verdict (the node alive / gone);
    unverified_pass: left the line at the end without a pass verdict (the fail-safe rule failed)."""
    if verdict in (None, "uncertain") and not rejected:
        return "unverified_pass"
    if verdict is None:
        return "outage_diverted" if outage else "no_verdict"
    if verdict == "uncertain":
        return "manual"
    if rejected:
        return "correct_reject" if defective else "false_reject"
    return "missed_defect" if defective else "correct_accept"


class Conveyor:
    def __init__(self, cfg: ConveyorConfig, model: mujoco.MjModel, data: mujoco.MjData,
                 rng: np.random.Generator, upload_texture):
        self.cfg = cfg
        self.model = model
        self.data = data
        self.rng = rng
        self.upload_texture = upload_texture       # callable(tex_id) → re-uploads to renderers
        self.parts: list[BeltPart] = []
        self.free_slots = list(range(scene.PART_SLOTS))
        self.next_id = 0
        self.next_spawn_t_s = 0.0
        self.push_times_s: list[float] = []        # pusher fire times (mid-stroke), sorted
        self.pusher_y_m = scene.PUSHER_REST_Y_M
        self.ejector_x_m = cfg.camera_to_ejector_m
        self.mocap = {i: model.body_mocapid[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f"part{i}")]
                      for i in range(scene.PART_SLOTS)}
        self.geom = {i: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"part_geom{i}")
                     for i in range(scene.PART_SLOTS)}
        self.tex = {i: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_TEXTURE, f"part_tex{i}")
                    for i in range(scene.PART_SLOTS)}
        self.pusher_mocap = model.body_mocapid[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "pusher")]
        # the pusher leaves its rest this long before its paddle crosses the belt centre
        self.pusher_lead_s = cfg.pusher_stroke_s * -scene.PUSHER_REST_Y_M / (scene.PUSHER_REACH_Y_M - scene.PUSHER_REST_Y_M)
        self.controller_alive = True        # the QC node's liveliness, as the line controller sees it
        self.late_verdicts = 0

    def set_controller_alive(self, alive: bool) -> None:
        """The QC node's liveliness changed; parts between camera and cutoff now are outage parts."""
        self.controller_alive = alive
        if not alive:
            for bp in self.parts:
                if bp.triggered and not bp.cut_off:
                    bp.outage = True

    def belt_position_m(self, t_s: float) -> float:
        return self.cfg.belt_speed_mps * t_s

    def arrival_t_s(self, bp: BeltPart) -> float:
        """When the part's centre reaches the ejector (the cell tracks parts like a PLC: encoder counts)."""
        return bp.spawn_t_s + (self.ejector_x_m - SPAWN_X_M) / self.cfg.belt_speed_mps

    def trigger_t_s(self, bp: BeltPart) -> float:
        return bp.spawn_t_s + (0.0 - SPAWN_X_M) / self.cfg.belt_speed_mps

    def cutoff_t_s(self, bp: BeltPart) -> float:
        """The divert cutoff: the last moment the pusher can be started to meet the part."""
        return self.arrival_t_s(bp) - self.pusher_lead_s

    # ---- per step -------------------------------------------------------------------------
    def step(self, data: mujoco.MjData, t_s: float) -> list[dict]:
        """Advance kinematics to time t_s; returns events (qc_trigger, qc_outcome)."""
        events = []
        if t_s >= self.next_spawn_t_s and self.free_slots:
            self._spawn(t_s)
        self.pusher_y_m = self._pusher_y(t_s)
        for bp in self.parts:
            if bp.done:
                continue
            half = bp.part.size_m / 2
            if not bp.pushed:
                bp.x_m = SPAWN_X_M + self.cfg.belt_speed_mps * (t_s - bp.spawn_t_s)
            self._push(bp, half)
            if not bp.triggered and bp.x_m >= 0.0:
                bp.triggered = True
                events.append({"type": "qc_trigger", "part_id": bp.part_id, "t_s": t_s})
            self._fail_safe(bp, t_s)
            off_belt = bp.y_m - half > scene.BELT_HALF_WIDTH_M
            if off_belt or bp.x_m >= END_X_M:
                events.append(self._finish(bp, rejected=off_belt, t_s=t_s))
            else:
                data.mocap_pos[self.mocap[bp.slot]] = (bp.x_m, bp.y_m, scene.PART_HALF_HEIGHT_M)
        data.mocap_pos[self.pusher_mocap] = (self.ejector_x_m, self.pusher_y_m, scene.PUSHER_HALF_M[2])
        self.parts = [bp for bp in self.parts if not bp.done]
        return events

    def _spawn(self, t_s: float) -> None:
        slot = self.free_slots.pop(0)
        part = sample_qc_part(self.rng, self.cfg.defect_rate, self.cfg.families)
        bp = BeltPart(part_id=self.next_id, slot=slot, part=part, spawn_t_s=t_s)
        self.next_id += 1
        tex_id = self.tex[slot]
        adr, n = self.model.tex_adr[tex_id], self.model.tex_width[tex_id] * self.model.tex_height[tex_id] * 3
        self.model.tex_data[adr:adr + n] = part_texture(part, scene.BELT_RGB).ravel()
        self.upload_texture(tex_id)
        half = part.size_m / 2 * scene.PART_TEXTURE_PX / _inner_px()     # geom covers the padding too
        self.model.geom_size[self.geom[slot]] = (half, half, scene.PART_HALF_HEIGHT_M)
        self.model.geom_rbound[self.geom[slot]] = float(np.sqrt(2 * half * half))
        self.data.mocap_quat[self.mocap[slot]] = (np.cos(part.yaw_rad / 2), 0.0, 0.0, np.sin(part.yaw_rad / 2))
        self.parts.append(bp)
        gap = self.cfg.part_pitch_m + self.rng.uniform(-self.cfg.pitch_jitter_m, self.cfg.pitch_jitter_m)
        self.next_spawn_t_s = t_s + gap / self.cfg.belt_speed_mps

    def _pusher_y(self, t_s: float) -> float:
        """Paddle front y: a triangle profile, crossing the belt centre at each fire time."""
        stroke = self.cfg.pusher_stroke_s
        travel = scene.PUSHER_REACH_Y_M - scene.PUSHER_REST_Y_M
        y = scene.PUSHER_REST_Y_M
        for t_mid in self.push_times_s:
            t0 = t_mid - stroke * (-scene.PUSHER_REST_Y_M / travel)   # leave rest so y=0 at t_mid
            if t0 <= t_s <= t0 + 2 * stroke:
                phase = (t_s - t0) / stroke
                frac = phase if phase <= 1.0 else 2.0 - phase
                y = max(y, scene.PUSHER_REST_Y_M + frac * travel)
        self.push_times_s = [t for t in self.push_times_s if t + 2 * stroke >= t_s]
        return y + scene.PUSHER_HALF_M[1]   # front face

    def _push(self, bp: BeltPart, half: float) -> None:
        overlap_x = abs(bp.x_m - self.ejector_x_m) < half + scene.PUSHER_HALF_M[0]
        if overlap_x and self.pusher_y_m > bp.y_m - half and self.pusher_y_m < bp.y_m + half:
            bp.y_m = self.pusher_y_m + half
            bp.pushed = bp.pushed or bp.y_m - half > 0.0   # once shoved past centre it leaves the belt's flow

    def _fail_safe(self, bp: BeltPart, t_s: float) -> None:
        """Outage attribution while the part is between camera and cutoff; at the cutoff, divert
        it unless a pass verdict (or a reject with its own push) arrived."""
        if bp.cut_off or not bp.triggered:
            return
        if not self.controller_alive:
            bp.outage = True
        if t_s < self.cutoff_t_s(bp):
            return
        bp.cut_off = True
        if bp.verdict == "pass" or bp.push_scheduled:
            return
        bp.diverted_t_s = t_s
        bp.push_scheduled = True
        self.push_times_s.append(self.arrival_t_s(bp))
        self.push_times_s.sort()

    def _finish(self, bp: BeltPart, rejected: bool, t_s: float) -> dict:
        bp.done = True
        self.free_slots.append(bp.slot)
        self.free_slots.sort()
        self.model.geom_size[self.geom[bp.slot]] = (0.001, 0.001, 0.001)
        return {"type": "qc_outcome", "part_id": bp.part_id, "t_s": t_s, "defect": bp.part.defect,
                "verdict": bp.verdict, "rejected": rejected, "trigger_t_s": self.trigger_t_s(bp),
                "cutoff_t_s": self.cutoff_t_s(bp), "diverted_t_s": bp.diverted_t_s, "outage": bp.outage,
                "outcome": outcome_of(bp.part.defective, rejected, bp.verdict, bp.outage), **bp.verdict_info}

    # ---- commands -------------------------------------------------------------------------
    def apply_verdict(self, verdict: str, eject_time_s: float | None, stamp_s: float | None,
                      t_now_s: float, info: dict | None = None) -> int | None:
        """Assign a verdict to the part it was made for; a reject fires the pusher at eject_time.
        A verdict for a part past its divert cutoff is ignored and counted (`late_verdicts`)."""
        bp = self._match(eject_time_s, stamp_s)
        if bp is None:
            return None
        if bp.cut_off:
            self.late_verdicts += 1
            return None
        bp.verdict = verdict
        bp.verdict_info = dict(info or {})
        if verdict == "reject" and eject_time_s is not None and eject_time_s > t_now_s:
            self.push_times_s.append(float(eject_time_s))
            self.push_times_s.sort()
            bp.push_scheduled = True
        return bp.part_id

    def _match(self, eject_time_s: float | None, stamp_s: float | None) -> BeltPart | None:
        v = self.cfg.belt_speed_mps
        best, best_dx = None, self.cfg.part_pitch_m / 2
        for bp in self.parts:
            if bp.verdict is not None or bp.done:
                continue
            if eject_time_s is not None:
                dx = abs(SPAWN_X_M + v * (eject_time_s - bp.spawn_t_s) - self.ejector_x_m)
            elif stamp_s is not None:
                dx = abs(SPAWN_X_M + v * (stamp_s - bp.spawn_t_s))
            else:
                return None
            if dx < best_dx:
                best, best_dx = bp, dx
        return best

    def truth(self, part_id: int) -> QCPart | None:
        return next((bp.part for bp in self.parts if bp.part_id == part_id), None)
