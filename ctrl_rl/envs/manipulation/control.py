"""From DROID-style actions to joint position targets: damped-least-squares differential IK for the Panda.

Frames and units as in ``scene.py`` (world = robot base frame, m, rad). NumPy only, one env at a time: this runs
inside the per-env simulator (``sim.py``), never in a torch hot path.

Cartesian velocity (the default action, DROID's ``cartesian_velocity``), 7 values in [-1, 1]:

- ``a[0:3]`` linear velocity: the end-effector target is ``p + 0.075 m * a[0:3]`` (``RobotSpec`` step scale),
  clipped to the spec's workspace box;
- ``a[3:6]`` angular velocity as xyz-extrinsic Euler angles (roll, pitch, yaw) of a rotation of ``0.15 rad * a``
  applied on the left, in the world frame (DROID's ``add_angles``: ``R_target = R(delta) @ R_current``);
- ``a[6]`` gripper velocity: the commanded gripper position (0 open, 1 closed) moves by ``0.25 * a[6]`` per step.

Both deltas are taken from the *measured* pose each step (DROID's ``cartesian_velocity_to_delta`` + the current
pose), so a blocked arm does not wind up a target. The 6-D pose error ``e = [dp, dw]`` (``dw`` the rotation vector
of the delta rotation) becomes joint motion by damped least squares,

    dq = J^T (J J^T + lambda^2 I)^-1 e  +  (I - J^+ J) k_null (q_home - q),

``J`` the 6x7 site Jacobian (``mj_jacSite``), ``lambda = 0.05``, and a null-space pull toward the home pose
(``k_null = 0.05`` per step) that keeps the redundant elbow away from its limits. ``IK_ITERATIONS`` Gauss-Newton
passes on a scratch ``MjData`` refine ``dq`` for the finite step. Then limits, in the order they bind:

1. per-joint speed: ``dq`` is scaled down uniformly (direction kept) so that ``|dq_i| <= v_max_i / control_hz``
   (Franka's velocity limits, ``RobotSpec.joint_vel_limit``);
2. position: ``q + dq`` is clipped to the spec's position limits shrunk by ``LIMIT_MARGIN``.

Joint velocity (``action=joint_velocity``), 8 values in [-1, 1]: ``dq = 0.2 rad * a[0:7]`` (DROID's
``joint_velocity``), the same two limits, and ``a[7]`` the gripper velocity as above.

The gripper command integrates: ``g_cmd <- clip(g_cmd + 0.25 a, 0, 1)``; finger targets are ``0.04 (1 - g_cmd)`` m
each. (DROID adds the delta to the *measured* position and lets the Robotiq's force control squeeze; with a plain
position-servoed finger that would drop a held object whenever the command is 0, so the command is a state here.)
"""

from __future__ import annotations

import math

import numpy as np

from ctrl_rl.envs.mujoco_bindings import import_mujoco

IK_DAMPING = 0.05  # lambda of the damped least squares (m / rad)
NULL_GAIN = 0.05  # fraction of the home-pose error removed per step in the null space
IK_ITERATIONS = 2  # Gauss-Newton passes per control step
LIMIT_MARGIN = 0.02  # rad kept between a joint target and the position limit


# ---- rotations (extrinsic xyz Euler angles = scipy's "xyz", DROID's convention) ----------------------------------


def euler_to_mat(e: np.ndarray) -> np.ndarray:
    """Rotation matrix of extrinsic xyz Euler angles ``e = (roll, pitch, yaw)``: ``Rz(yaw) Ry(pitch) Rx(roll)``."""
    cr, sr = math.cos(e[0]), math.sin(e[0])
    cp, sp = math.cos(e[1]), math.sin(e[1])
    cy, sy = math.cos(e[2]), math.sin(e[2])
    return np.array([
        [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
        [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
        [-sp, cp * sr, cp * cr],
    ])


def mat_to_euler(r: np.ndarray) -> np.ndarray:
    """Extrinsic xyz Euler angles (roll, pitch, yaw) of a rotation matrix; roll, yaw in (-pi, pi], pitch in
    [-pi/2, pi/2]. A gripper pointing straight down has roll near +-pi: the wrap is DROID's convention too."""
    pitch = -math.asin(max(-1.0, min(1.0, r[2, 0])))
    return np.array([math.atan2(r[2, 1], r[2, 2]), pitch, math.atan2(r[1, 0], r[0, 0])])


def rotvec(r: np.ndarray) -> np.ndarray:
    """Rotation vector (axis * angle) of a rotation matrix, angle in [0, pi]."""
    cos = max(-1.0, min(1.0, (np.trace(r) - 1.0) / 2.0))
    angle = math.acos(cos)
    v = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    if angle < 1e-6:
        return 0.5 * v
    if math.pi - angle < 1e-4:  # near pi: the axis from the symmetric part
        axis = np.sqrt(np.maximum((np.diag(r) + 1.0) / 2.0, 0.0))
        i = int(np.argmax(axis))
        axis[[j for j in range(3) if j != i]] *= np.sign(np.array([r[i, j] + r[j, i] for j in range(3) if j != i]))
        return axis / np.linalg.norm(axis) * angle
    return v * (angle / (2.0 * math.sin(angle)))


# ---- the IK controller ---------------------------------------------------------------------------------------------


class DiffIK:
    """Joint targets from cartesian or joint velocity commands for one (model, data) pair (module docstring).

    Args:
        model: the task's ``MjModel`` (any per-env copy of it).
        site_id: the end-effector site.
        qpos_idx, dof_idx: ``[7]`` indices of the arm joints in ``qpos`` / ``qvel``.
        robot: the ``RobotSpec`` (limits, home, control rate, step scales).
        action: ``"cartesian_velocity"`` or ``"joint_velocity"``.
    """

    def __init__(self, model, site_id: int, qpos_idx: np.ndarray, dof_idx: np.ndarray, robot, action: str) -> None:
        mujoco = import_mujoco()

        self._mj = mujoco
        self.model, self.site_id = model, site_id
        self.qpos_idx, self.dof_idx = np.asarray(qpos_idx), np.asarray(dof_idx)
        space = robot.action_space(action)
        scale = np.asarray(space.step_scale)
        self.action = action
        self.lin_step, self.rot_step = (scale[0], scale[3]) if action == "cartesian_velocity" else (0.0, 0.0)
        self.joint_step = scale[:7] if action == "joint_velocity" else np.zeros(7)
        self.grip_step = robot.action_space("cartesian_velocity").step_scale[6]
        self.low = np.asarray(robot.joint_pos_low) + LIMIT_MARGIN  # [7]
        self.high = np.asarray(robot.joint_pos_high) - LIMIT_MARGIN  # [7]
        self.max_dq = np.asarray(robot.joint_vel_limit) / robot.control_hz  # [7] rad per control step
        self.home = np.asarray(robot.home)  # [7]
        self.ws_low, self.ws_high = np.asarray(robot.workspace_low), np.asarray(robot.workspace_high)
        self._scratch = mujoco.MjData(model)
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def ee_pose(self, data) -> tuple[np.ndarray, np.ndarray]:
        """``(position [3], rotation [3,3])`` of the end-effector site in ``data`` (after kinematics)."""
        return data.site_xpos[self.site_id].copy(), data.site_xmat[self.site_id].reshape(3, 3).copy()

    def jacobian(self, data) -> np.ndarray:
        """``[6,7]`` site Jacobian (linear rows, then angular) over the arm joints."""
        self._mj.mj_jacSite(self.model, data, self._jacp, self._jacr, self.site_id)
        return np.concatenate([self._jacp[:, self.dof_idx], self._jacr[:, self.dof_idx]])  # [6,7]

    def joint_targets(self, data, arm_action: np.ndarray) -> np.ndarray:
        """``[7]`` joint position targets for the arm part of an action (``[6]`` cartesian or ``[7]`` joint)."""
        q = data.qpos[self.qpos_idx].copy()  # [7]
        if self.action == "joint_velocity":
            dq = self.joint_step * np.clip(arm_action, -1.0, 1.0)  # [7]
        else:
            dq = self._cartesian_dq(data, q, np.clip(arm_action, -1.0, 1.0))
        peak = np.max(np.abs(dq) / self.max_dq)
        if peak > 1.0:
            dq = dq / peak  # uniform: the direction of motion is kept
        return np.clip(q + dq, self.low, self.high)

    def _cartesian_dq(self, data, q: np.ndarray, a: np.ndarray) -> np.ndarray:
        p, r = self.ee_pose(data)
        p_target = np.clip(p + self.lin_step * a[:3], self.ws_low, self.ws_high)  # [3]
        r_target = euler_to_mat(self.rot_step * a[3:6]) @ r  # [3,3]; the delta rotation is applied on the left
        scratch, dq = self._scratch, np.zeros(7)
        jac = self.jacobian(data)
        for it in range(IK_ITERATIONS):
            if it > 0:  # re-linearise at the intermediate solution on the scratch data
                scratch.qpos[:] = data.qpos
                scratch.qpos[self.qpos_idx] = q + dq
                self._mj.mj_kinematics(self.model, scratch)
                self._mj.mj_comPos(self.model, scratch)
                p, r = self.ee_pose(scratch)
                jac = self.jacobian(scratch)
            err = np.concatenate([p_target - p, rotvec(r_target @ r.T)])  # [6]
            jjt = jac @ jac.T + IK_DAMPING**2 * np.eye(6)  # [6,6]
            step = jac.T @ np.linalg.solve(jjt, err)  # [7]
            dq = dq + step
        # null space of the final Jacobian: drift toward home without moving the end effector (to first order)
        pinv = jac.T @ np.linalg.inv(jac @ jac.T + IK_DAMPING**2 * np.eye(6))  # [7,6]
        dq += (np.eye(7) - pinv @ jac) @ (NULL_GAIN * (self.home - (q + dq)))
        return dq
