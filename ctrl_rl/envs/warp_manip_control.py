"""The manipulation tasks' controller (``envs/manipulation/control.py``) batched in torch, for ``warp:Reach`` and
``warp:Lift``: N worlds' joint targets from DROID-style actions in one pass of tensor operations on the worlds' device.

``control.py`` states the controller; this module computes the same thing for ``[N, ...]`` tensors:

- the end effector's pose and the ``[6,7]`` site Jacobian come from the arm's forward kinematics written here over
  the model's kinematic chain (``ArmChain``: body offsets, hinge anchors and axes, the site's frame, read once from
  the ``MjModel``), where ``control.py`` reads them from MuJoCo (``mj_kinematics``, ``mj_jacSite`` on a scratch
  ``MjData``). The chain repeats MuJoCo's own recursion (a body's frame from its parent's, then its hinge turned by
  ``q - qpos0`` about its axis at its anchor), so the two agree to float32 rounding (tested against MuJoCo);
- the damped least squares solve uses a Cholesky factorisation (``J J^T + lambda^2 I`` is symmetric positive
  definite) without error checks, so a step never waits on the host;
- the rotation helpers (``euler_to_mat``, ``mat_to_euler``, ``rotvec``) are ``control.py``'s, batched; ``rotvec``
  takes the angle as ``atan2(|v| / 2, (tr R - 1) / 2)``, which is ``acos((tr R - 1) / 2)`` but keeps its precision
  near 0 in float32.

Everything is float32 (the simulator's precision); the constants (damping, null-space gain, iterations, limit
margin, step scales, limits) are ``control.py``'s and the ``RobotSpec``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ctrl_rl.envs.manipulation.control import IK_DAMPING, IK_ITERATIONS, LIMIT_MARGIN, NULL_GAIN

# ---- rotations (extrinsic xyz Euler angles, as control.py) ----------------------------------------------------------


def euler_to_mat(e: torch.Tensor) -> torch.Tensor:
    """``[N,3,3]`` rotation matrices of extrinsic xyz Euler angles ``e [N,3]``: ``Rz(yaw) Ry(pitch) Rx(roll)``."""
    cr, sr = torch.cos(e[:, 0]), torch.sin(e[:, 0])  # [N]
    cp, sp = torch.cos(e[:, 1]), torch.sin(e[:, 1])
    cy, sy = torch.cos(e[:, 2]), torch.sin(e[:, 2])
    rows = (
        (cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr),
        (sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr),
        (-sp, cp * sr, cp * cr),
    )
    return torch.stack([torch.stack(r, dim=1) for r in rows], dim=1)  # [N,3,3]


def mat_to_euler(r: torch.Tensor) -> torch.Tensor:
    """``[N,3]`` extrinsic xyz Euler angles (roll, pitch, yaw) of rotation matrices ``r [N,3,3]``; roll and yaw in
    (-pi, pi], pitch in [-pi/2, pi/2]."""
    pitch = -torch.asin(r[:, 2, 0].clamp(-1.0, 1.0))  # [N]
    return torch.stack([torch.atan2(r[:, 2, 1], r[:, 2, 2]), pitch, torch.atan2(r[:, 1, 0], r[:, 0, 0])], dim=1)


def rotvec(r: torch.Tensor) -> torch.Tensor:
    """``[N,3]`` rotation vectors (axis * angle, angle in [0, pi]) of rotation matrices ``r [N,3,3]``, with
    ``control.rotvec``'s three regimes (small angle, general, near pi) chosen per row."""
    v = torch.stack([r[:, 2, 1] - r[:, 1, 2], r[:, 0, 2] - r[:, 2, 0], r[:, 1, 0] - r[:, 0, 1]], dim=1)  # [N,3]
    diag = torch.diagonal(r, dim1=1, dim2=2)  # [N,3]
    half_sin = 0.5 * v.norm(dim=1)  # [N] sin(angle)
    cos = (0.5 * (diag.sum(dim=1) - 1.0)).clamp(-1.0, 1.0)  # [N]
    angle = torch.atan2(half_sin, cos)  # [N]
    general = v * (angle / (2.0 * torch.sin(angle).clamp_min(1e-12)))[:, None]  # [N,3]
    # near pi: the axis from the symmetric part, its signs relative to the largest component
    axis = ((diag + 1.0) / 2.0).clamp_min(0.0).sqrt()  # [N,3]
    big = axis.argmax(dim=1)  # [N]
    sym = r + r.transpose(1, 2)  # [N,3,3]
    signs = torch.sign(sym.gather(1, big[:, None, None].expand(-1, 1, 3)).squeeze(1))  # [N,3] sign(r_ij + r_ji)
    signs = signs.scatter(1, big[:, None], 1.0)  # the largest component keeps its sign
    axis = axis * signs
    near_pi = axis / axis.norm(dim=1, keepdim=True).clamp_min(1e-12) * angle[:, None]  # [N,3]
    out = torch.where((angle < 1e-6)[:, None], 0.5 * v, general)
    return torch.where((math.pi - angle < 1e-4)[:, None], near_pi, out)  # [N,3]


def _axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """``[N,3,3]`` rotations by ``angle [N]`` about the unit ``axis [3]`` (Rodrigues)."""
    k = torch.zeros(3, 3, dtype=axis.dtype, device=axis.device)  # the cross-product matrix of the axis
    k[0, 1], k[0, 2], k[1, 2] = -axis[2], axis[1], -axis[0]
    k = k - k.T
    s, c = torch.sin(angle)[:, None, None], torch.cos(angle)[:, None, None]  # [N,1,1]
    eye = torch.eye(3, dtype=axis.dtype, device=axis.device)
    return eye + s * k + (1.0 - c) * (k @ k)  # [N,3,3]


def _quat_to_mat(q: Any) -> torch.Tensor:
    """``[3,3]`` float64 rotation of a unit quaternion (w, x, y, z)."""
    w, x, y, z = (float(c) for c in q)
    return torch.tensor([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ], dtype=torch.float64)


# ---- forward kinematics of the arm ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmChain:
    """The kinematic chain from the world to a site through the arm's hinges, read from an ``MjModel``.

    Attributes:
        body_pos, body_rot: ``[B,3]``, ``[B,3,3]`` each chain body's offset and rotation in its parent's frame.
        joint: ``[B]`` which of the arm's joints (0..6) turns each body, -1 for a rigid one.
        jnt_pos, jnt_axis: ``[B,3]`` the hinge's anchor and unit axis in its body's frame.
        qpos0: ``[B]`` the hinge's reference angle (MuJoCo turns it by ``q - qpos0``).
        site_pos, site_rot: ``[3]``, ``[3,3]`` the site in the last body's frame.
    """

    body_pos: torch.Tensor
    body_rot: torch.Tensor
    joint: tuple[int, ...]
    jnt_pos: torch.Tensor
    jnt_axis: torch.Tensor
    qpos0: torch.Tensor
    site_pos: torch.Tensor
    site_rot: torch.Tensor

    @classmethod
    def from_model(cls, model: Any, site_id: int, qpos_idx: Any, device: torch.device) -> ArmChain:
        """The chain of ``model`` from the world to site ``site_id``, whose hinges are the joints at ``qpos_idx``
        (``[7]`` qpos addresses); a chain with another kind of joint, or with an arm joint missing, is refused."""
        qpos_idx = [int(i) for i in qpos_idx]
        bodies = []
        b = int(model.site_bodyid[site_id])
        while b != 0:
            bodies.append(b)
            b = int(model.body_parentid[b])
        bodies.reverse()
        pos, rot, joint, jpos, jaxis, q0 = [], [], [], [], [], []
        for b in bodies:
            pos.append(torch.as_tensor(model.body_pos[b], dtype=torch.float64))
            rot.append(_quat_to_mat(model.body_quat[b]))
            first, count = int(model.body_jntadr[b]), int(model.body_jntnum[b])
            if count > 1 or (count == 1 and int(model.jnt_type[first]) != 3):  # 3: mjJNT_HINGE
                raise ValueError(f"body {b} of the arm's chain has joints other than one hinge.")
            adr = int(model.jnt_qposadr[first]) if count else -1
            if count and adr not in qpos_idx:
                raise ValueError(f"the hinge of body {b} is not one of the arm's joints {qpos_idx}.")
            joint.append(qpos_idx.index(adr) if count else -1)
            jpos.append(torch.as_tensor(model.jnt_pos[first] if count else [0.0] * 3, dtype=torch.float64))
            jaxis.append(torch.as_tensor(model.jnt_axis[first] if count else [0.0, 0.0, 1.0], dtype=torch.float64))
            q0.append(float(model.qpos0[adr]) if count else 0.0)
        if sorted(j for j in joint if j >= 0) != list(range(len(qpos_idx))):
            raise ValueError("the arm's chain does not pass through every arm joint once.")

        def f32(x: torch.Tensor) -> torch.Tensor:
            return x.to(device=device, dtype=torch.float32)

        return cls(f32(torch.stack(pos)), f32(torch.stack(rot)), tuple(joint), f32(torch.stack(jpos)),
                   f32(torch.stack(jaxis)), f32(torch.tensor(q0)),
                   f32(torch.as_tensor(model.site_pos[site_id], dtype=torch.float64)),
                   f32(_quat_to_mat(model.site_quat[site_id])))

    def forward(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(site position [N,3], site rotation [N,3,3], hinge anchors [N,7,3], hinge axes [N,7,3])`` in the world
        frame for arm joint angles ``q [N,7]``, by MuJoCo's recursion (module docstring)."""
        n = q.shape[0]
        p = torch.zeros(n, 3, dtype=q.dtype, device=q.device)  # [N,3] the world body's frame
        r = torch.eye(3, dtype=q.dtype, device=q.device).expand(n, 3, 3)  # [N,3,3]
        anchors: list[torch.Tensor] = [p] * q.shape[1]
        axes: list[torch.Tensor] = [p] * q.shape[1]
        for b, j in enumerate(self.joint):
            p = p + r @ self.body_pos[b]  # [N,3]
            r = r @ self.body_rot[b]  # [N,3,3]
            if j >= 0:
                anchor = p + r @ self.jnt_pos[b]  # [N,3]
                anchors[j], axes[j] = anchor, r @ self.jnt_axis[b]
                r = r @ _axis_angle(self.jnt_axis[b], q[:, j] - self.qpos0[b])
                p = anchor - r @ self.jnt_pos[b]
        site = p + r @ self.site_pos  # [N,3]
        return site, r @ self.site_rot, torch.stack(anchors, dim=1), torch.stack(axes, dim=1)

    @staticmethod
    def jacobian(site: torch.Tensor, anchors: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
        """``[N,6,7]`` site Jacobian over the hinges (linear rows, then angular), as ``mj_jacSite`` gives it."""
        lin = torch.linalg.cross(axes, site[:, None, :] - anchors, dim=2)  # [N,7,3]
        return torch.cat([lin, axes], dim=2).transpose(1, 2)  # [N,6,7]


# ---- the controller -------------------------------------------------------------------------------------------------


class BatchedDiffIK:
    """``control.DiffIK`` for N worlds at once: joint targets ``[N,7]`` from actions (``control.py`` states it).

    Args:
        chain: the arm's ``ArmChain``.
        robot: the ``RobotSpec`` (limits, home, control rate, step scales).
        action: ``"cartesian_velocity"`` or ``"joint_velocity"``.
        device: where the constants live (the worlds' device).
    """

    def __init__(self, chain: ArmChain, robot: Any, action: str, device: torch.device) -> None:
        def t(x: Any) -> torch.Tensor:
            return torch.as_tensor(x, dtype=torch.float32, device=device)

        self.chain, self.action = chain, action
        scale = robot.action_space(action).step_scale
        self.lin_step, self.rot_step = (float(scale[0]), float(scale[3])) if action == "cartesian_velocity" else (0, 0)
        self.joint_step = t(scale[:7]) if action == "joint_velocity" else t([0.0] * 7)  # [7]
        self.grip_step = float(robot.action_space("cartesian_velocity").step_scale[6])
        self.low = t(robot.joint_pos_low) + LIMIT_MARGIN  # [7]
        self.high = t(robot.joint_pos_high) - LIMIT_MARGIN  # [7]
        self.max_dq = t(robot.joint_vel_limit) / robot.control_hz  # [7] rad per control step
        self.home = t(robot.home)  # [7]
        self.ws_low, self.ws_high = t(robot.workspace_low), t(robot.workspace_high)  # [3]
        self._damping = IK_DAMPING**2 * torch.eye(6, dtype=torch.float32, device=device)  # [6,6]
        self._eye7 = torch.eye(7, dtype=torch.float32, device=device)  # [7,7]

    def joint_targets(self, q: torch.Tensor, arm_action: torch.Tensor) -> torch.Tensor:
        """``[N,7]`` joint position targets for arm joints ``q [N,7]`` and the arm part of the actions
        (``[N,6]`` cartesian or ``[N,7]`` joint velocity)."""
        a = arm_action.clamp(-1.0, 1.0)
        dq = self.joint_step * a if self.action == "joint_velocity" else self._cartesian_dq(q, a)  # [N,7]
        peak = (dq.abs() / self.max_dq).amax(dim=1, keepdim=True)  # [N,1]
        dq = torch.where(peak > 1.0, dq / peak, dq)  # uniform scaling keeps the direction of motion
        return torch.minimum(torch.maximum(q + dq, self.low), self.high)  # [N,7]

    def _dls(self, jac: torch.Tensor) -> torch.Tensor:
        """``[N,6,6]`` Cholesky factor of ``J J^T + lambda^2 I`` (no error check: no host sync)."""
        factor, _ = torch.linalg.cholesky_ex(jac @ jac.transpose(1, 2) + self._damping)
        return factor

    def _cartesian_dq(self, q: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        chain = self.chain
        p, r, anchors, axes = chain.forward(q)
        p_target = torch.minimum(torch.maximum(p + self.lin_step * a[:, :3], self.ws_low), self.ws_high)  # [N,3]
        r_target = euler_to_mat(self.rot_step * a[:, 3:6]) @ r  # [N,3,3] the delta applied on the left
        jac = chain.jacobian(p, anchors, axes)  # [N,6,7]
        dq = torch.zeros_like(q)  # [N,7]
        for it in range(IK_ITERATIONS):
            if it > 0:  # re-linearise at the intermediate solution
                p, r, anchors, axes = chain.forward(q + dq)
                jac = chain.jacobian(p, anchors, axes)
            err = torch.cat([p_target - p, rotvec(r_target @ r.transpose(1, 2))], dim=1)  # [N,6]
            step = jac.transpose(1, 2) @ torch.cholesky_solve(err[:, :, None], self._dls(jac))  # [N,7,1]
            dq = dq + step[:, :, 0]
        # the null space of the final Jacobian: drift toward home without moving the end effector (to first order)
        pinv = torch.cholesky_solve(jac, self._dls(jac)).transpose(1, 2)  # [N,7,6] J^T (J J^T + lambda^2 I)^-1
        pull = NULL_GAIN * (self.home - (q + dq))  # [N,7]
        return dq + ((self._eye7 - pinv @ jac) @ pull[:, :, None])[:, :, 0]  # [N,7]
