"""Damped-least-squares inverse kinematics for the arm's tool centre point (TCP).

A pose is a TCP position (m) and a yaw: the tool points straight down and yaw is the direction of
the jaw line (tasks.grasp: the object's long axis), so the fingers close across it, along
(-sin yaw, cos yaw, 0). IK runs on its own MjData so the simulated
state is never touched.
"""
from __future__ import annotations

import mujoco
import numpy as np

from sol_control.sim.scene import ARM_JOINTS

ROT_WEIGHT = 0.3       # metres of position error that one radian of orientation error is worth
DAMPING = 0.02         # DLS lambda
MAX_STEP_RAD = 0.3     # per-iteration joint step cap


def tool_rotation(yaw_rad: float) -> np.ndarray:
    """[3, 3] columns = tool x (jaw line), y (finger travel), z (approach, pointing down)."""
    c, s = np.cos(yaw_rad), np.sin(yaw_rad)
    return np.array([[-c, -s, 0.0], [-s, c, 0.0], [0.0, 0.0, -1.0]])


def equivalent_yaw(yaw_rad: float, reference_rad: float) -> float:
    """The parallel gripper is symmetric: yaw and yaw+pi grasp alike; pick the one nearest reference."""
    options = yaw_rad + np.pi * np.arange(-2, 3)
    return float(options[np.argmin(np.abs(options - reference_rad))])


class ArmIK:
    def __init__(self, model: mujoco.MjModel):
        self.model = model
        self.data = mujoco.MjData(model)
        self.site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "tcp")
        joint_ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in ARM_JOINTS]
        self.qpos_adr = np.array([model.jnt_qposadr[j] for j in joint_ids])
        self.dof_adr = np.array([model.jnt_dofadr[j] for j in joint_ids])
        self.q_low = model.jnt_range[joint_ids, 0].copy()
        self.q_high = model.jnt_range[joint_ids, 1].copy()
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def forward(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TCP position [3] and rotation [3, 3] for arm joints q [6]."""
        self.data.qpos[self.qpos_adr] = q
        mujoco.mj_kinematics(self.model, self.data)
        return self.data.site_xpos[self.site_id].copy(), self.data.site_xmat[self.site_id].reshape(3, 3).copy()

    def solve(self, q0: np.ndarray, pos_m: np.ndarray, yaw_rad: float, iters: int = 100,
              tol_m: float = 1e-4) -> tuple[np.ndarray, float]:
        """Joints reaching the pose from warm start q0; returns (q [6], residual error norm)."""
        q = np.asarray(q0, float).copy()
        target_rot = tool_rotation(yaw_rad)
        err_norm = np.inf
        for _ in range(iters):
            self.data.qpos[self.qpos_adr] = q
            mujoco.mj_kinematics(self.model, self.data)
            mujoco.mj_comPos(self.model, self.data)
            pos = self.data.site_xpos[self.site_id]
            rot = self.data.site_xmat[self.site_id].reshape(3, 3)
            err_pos = pos_m - pos                                          # [3]
            err_rot = 0.5 * sum(np.cross(rot[:, i], target_rot[:, i]) for i in range(3))  # [3]
            err = np.concatenate([err_pos, ROT_WEIGHT * err_rot])         # [6]
            err_norm = float(np.linalg.norm(err))
            if err_norm < tol_m:
                break
            mujoco.mj_jacSite(self.model, self.data, self._jacp, self._jacr, self.site_id)
            jac = np.vstack([self._jacp[:, self.dof_adr], ROT_WEIGHT * self._jacr[:, self.dof_adr]])  # [6, 6]
            dq = jac.T @ np.linalg.solve(jac @ jac.T + DAMPING ** 2 * np.eye(6), err)
            dq = np.clip(dq, -MAX_STEP_RAD, MAX_STEP_RAD)
            q = np.clip(q + dq, self.q_low, self.q_high)
        return q, err_norm
