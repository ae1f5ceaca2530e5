"""Batched torch planar 2-link Reacher, modelled on gymnasium ``Reacher-v5`` (MuJoCo).

An analytic rigid-body re-implementation, not MuJoCo. It uses the same model (``reacher.xml``) and the
same integration settings, so from a state away from the elbow limit one step agrees with MuJoCo to
float precision in the joint state (the fingertip term of MuJoCo's observation is ~1e-6 off because
MuJoCo reports body positions from an intermediate RK4 stage; ours are the final state's). It is not
meant to match MuJoCo step by step over an episode (see "Deviations").

Model (from gymnasium's ``reacher.xml``; masses from its capsule/sphere geoms at density 1000):
two hinges about z in the horizontal plane (gravity does no work), upper link 0.1 m, fingertip
0.11 m past the elbow; each joint has armature 1 and damping 1; motors have gear 200 and
ctrl in [-1, 1]. With q = (q0 shoulder, q1 elbow) the manipulator equation is::

    M(q) q_dd + c(q, q_d) + D q_d = 200 clip(a, -1, 1)
    M   = [[A + 2 K cos q1 + 1, B + K cos q1], [B + K cos q1, B + 1]]       (the +1 is armature)
    c   = K sin q1 [-(2 q_d0 q_d1 + q_d1^2), q_d0^2],   D = I (damping 1)

with A = 7.0516e-4 kg m^2 (both links about the shoulder at q1 = 0), B = 1.7904e-4 kg m^2
(forearm + fingertip about the elbow), K = 2.2410e-4 kg m^2 (upper link length times the forearm's
first moment). Integrated like the XML: classic RK4 with h = 0.01 s, 2 substeps per step (dt = 0.02).

State ``[6,N]`` = (q0, q1, q_d0, q_d1, target_x, target_y). Observation ``[N,10]`` in Reacher-v5's
layout: cos q (2), sin q (2), target xy (2), q_d (2), fingertip xy - target xy (2). Reward (after the
physics step, as v5)::

    reward = -w_dist ||fingertip - target|| - w_ctrl ||a||^2

with the unclipped action ``a``, as gymnasium. Start: q uniform in [-0.1, 0.1]^2, q_d uniform in
[-0.005, 0.005]^2, target uniform in the disc of radius 0.2. No termination; truncated after 50 steps.

Deviations from MuJoCo's Reacher-v5:
- The elbow limit |q1| <= 3 is a hard stop applied after each substep (clamp q1, zero the velocity
  into the stop), not MuJoCo's soft constraint; trajectories that reach the limit differ.
- q0 is stored wrapped to [-pi, pi] (MuJoCo lets it grow); observations are unaffected.
- The target is sampled in closed form (radius 0.2 sqrt(u)) instead of by rejection from a square.
- ``reward_control_weight`` defaults to 1, which is what gymnasium 1.x's ``Reacher-v5`` constructor
  uses (checked on a real step: action (1, 1) gives reward_ctrl -2), although gymnasium's docs say 0.1.
"""

from __future__ import annotations

import math

import torch

from ctrl_rl.envs.torch_envs.base import TorchEnv

_L1 = 0.1  # shoulder to elbow
_L2 = 0.11  # elbow to fingertip
_A = 7.051618870247652e-4  # M00 at q1 = 0 without armature
_B = 1.7903936532808235e-4  # M11 without armature
_K = 2.2410027595607193e-4  # coupling coefficient (upper link length * forearm first moment)
_ARMATURE = 1.0
_DAMPING = 1.0
_GEAR = 200.0
_ELBOW_LIMIT = 3.0
_H = 0.01  # MuJoCo timestep
_SUBSTEPS = 2  # gymnasium frame_skip
_TARGET_RADIUS = 0.2


def _accel(q1: torch.Tensor, qd0: torch.Tensor, qd1: torch.Tensor, tau0: torch.Tensor, tau1: torch.Tensor):
    """Joint accelerations ``q_dd`` of the arm, each ``[N]``."""
    cos1, sin1 = torch.cos(q1), torch.sin(q1)  # [N], [N]
    m01 = _B + _K * cos1  # [N]
    m00 = (_A + _ARMATURE) + 2 * _K * cos1  # [N]
    m11 = _B + _ARMATURE
    h = _K * sin1  # [N]
    rhs0 = tau0 - _DAMPING * qd0 + h * (2 * qd0 * qd1 + qd1 * qd1)  # [N]
    rhs1 = tau1 - _DAMPING * qd1 - h * qd0 * qd0  # [N]
    inv_det = 1.0 / (m00 * m11 - m01 * m01)  # [N]
    return (m11 * rhs0 - m01 * rhs1) * inv_det, (m00 * rhs1 - m01 * rhs0) * inv_det


def _fingertip(q0: torch.Tensor, q1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q01 = q0 + q1  # [N]
    return _L1 * torch.cos(q0) + _L2 * torch.cos(q01), _L1 * torch.sin(q0) + _L2 * torch.sin(q01)


class Reacher(TorchEnv):
    """Batched analytic 2-link Reacher; see the module docstring.

    Args (besides the common ones of ``TorchEnv``):
        reward_dist_weight: weight of the fingertip-target distance.
        reward_control_weight: weight of the squared action norm.
    """

    name = "Reacher"
    obs_dim = 10
    state_dim = 6
    discrete = False
    action_dim = 2
    action_low = (-1.0, -1.0)
    action_high = (1.0, 1.0)
    obs_low = (-math.inf,) * 10
    obs_high = (math.inf,) * 10
    dt = _H * _SUBSTEPS
    default_max_episode_steps = 50

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int | None = None,
        dtype: torch.dtype = torch.float32,
        reward_dist_weight: float = 1.0,
        reward_control_weight: float = 1.0,
    ) -> None:
        self.reward_dist_weight = float(reward_dist_weight)
        self.reward_control_weight = float(reward_control_weight)
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps, dtype=dtype)

    def _initial_state(self, n: int) -> torch.Tensor:
        u = torch.rand(6, n, generator=self.generator, device=self.device, dtype=self.dtype)  # [6,n]
        q = u[0:2] * 0.2 - 0.1  # [2,n]
        qd = u[2:4] * 0.01 - 0.005  # [2,n]
        radius = u[4].sqrt().mul_(_TARGET_RADIUS)  # [n]
        angle = u[5] * (2 * math.pi)  # [n]
        target = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)))  # [2,n]
        return torch.cat((q, qd, target))  # [6,n]

    def _transition(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q0, q1, qd0, qd1, tx, ty = state  # [N] each
        tau = action.clamp(-1.0, 1.0) * _GEAR  # [N,2]
        tau0, tau1 = tau.unbind(-1)  # [N], [N]
        for _ in range(_SUBSTEPS):  # fixed count of whole-batch RK4 substeps, not a per-env loop
            a0, a1 = _accel(q1, qd0, qd1, tau0, tau1)  # k1
            b0, b1 = _accel(q1 + 0.5 * _H * qd1, qd0 + 0.5 * _H * a0, qd1 + 0.5 * _H * a1, tau0, tau1)  # k2
            c0, c1 = _accel(q1 + 0.5 * _H * (qd1 + 0.5 * _H * a1), qd0 + 0.5 * _H * b0, qd1 + 0.5 * _H * b1, tau0, tau1)
            e1_q1 = q1 + _H * (qd1 + 0.5 * _H * b1)  # k4 evaluation point for q1
            d0, d1 = _accel(e1_q1, qd0 + _H * c0, qd1 + _H * c1, tau0, tau1)  # k4
            # q_dot at the four stages is qd, qd + h/2 k1_acc, qd + h/2 k2_acc, qd + h k3_acc.
            q0 = q0 + _H / 6 * (6 * qd0 + _H * (a0 + b0 + c0))
            q1 = q1 + _H / 6 * (6 * qd1 + _H * (a1 + b1 + c1))
            qd0 = qd0 + _H / 6 * (a0 + 2 * b0 + 2 * c0 + d0)
            qd1 = qd1 + _H / 6 * (a1 + 2 * b1 + 2 * c1 + d1)
            # Hard elbow stop (MuJoCo uses a soft constraint here; see the module docstring).
            over = q1 > _ELBOW_LIMIT  # [N]
            under = q1 < -_ELBOW_LIMIT  # [N]
            q1 = q1.clamp(-_ELBOW_LIMIT, _ELBOW_LIMIT)
            qd1 = torch.where((over & (qd1 > 0)) | (under & (qd1 < 0)), 0.0, qd1)
        q0 = q0 - (2 * math.pi) * torch.round(q0 * (1 / (2 * math.pi)))  # [N], wrapped to [-pi, pi]
        fx, fy = _fingertip(q0, q1)  # [N], [N]
        dist = torch.hypot(fx - tx, fy - ty)  # [N]
        reward = -self.reward_dist_weight * dist - self.reward_control_weight * action.square().sum(-1)  # [N]
        terminated = torch.zeros_like(q0, dtype=torch.bool)  # [N]
        return torch.stack((q0, q1, qd0, qd1, tx, ty)), reward, terminated  # [6,N], [N], [N]

    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q0, q1, qd0, qd1, tx, ty = state  # [N] each
        fx, fy = _fingertip(q0, q1)  # [N], [N]
        return torch.cos(q0), torch.cos(q1), torch.sin(q0), torch.sin(q1), tx, ty, qd0, qd1, fx - tx, fy - ty
