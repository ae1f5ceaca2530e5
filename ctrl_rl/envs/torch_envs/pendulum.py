"""Batched torch Pendulum, equivalent to gymnasium ``Pendulum-v1``.

State ``[2,N]`` = (theta, theta_dot); observation ``[N,3]`` = (cos theta, sin theta, theta_dot);
action ``[N,1]`` torque, clipped to [-2, 2] as gymnasium does. Per step (dt = 0.05, g = 10, m = l = 1)::

    cost      = normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2        (reward = -cost)
    theta_dot <- clip(theta_dot + (3 g / (2 l) sin theta + 3 / (m l^2) u) dt, -8, 8)
    theta     <- theta + theta_dot dt

Start state uniform in theta in [-pi, pi], theta_dot in [-1, 1]. Never terminates; truncated after
200 steps (gymnasium's registered time limit).

Deviation: theta is stored wrapped to [-pi, pi]. Observations and rewards depend on theta only
through sin, cos and the wrapped angle, so they are unchanged, but float32 keeps full precision
instead of losing ~1e-5 as |theta| grows over an episode.
"""

from __future__ import annotations

import math

import torch

from ctrl_rl.envs.torch_envs.base import TorchEnv

_MAX_SPEED = 8.0
_MAX_TORQUE = 2.0
_DT = 0.05
_G = 10.0
_M = 1.0
_L = 1.0


def _wrap_angle(x: torch.Tensor) -> torch.Tensor:
    """Angle to [-pi, pi] like gymnasium's ``angle_normalize`` (which gives [-pi, pi)).

    ``x - 2 pi round(x / 2 pi)`` is cheaper than a float remainder; it can differ only at exactly
    +-pi, where sin, cos and the squared angle in the cost agree.
    """
    turns = torch.mul(x, 1 / (2 * math.pi)).round_()  # [N]
    return torch.sub(x, turns, alpha=2 * math.pi)


class Pendulum(TorchEnv):
    """Batched ``Pendulum-v1``; see the module docstring."""

    name = "Pendulum"
    obs_dim = 3
    state_dim = 2
    discrete = False
    action_dim = 1
    action_low = (-_MAX_TORQUE,)
    action_high = (_MAX_TORQUE,)
    obs_low = (-1.0, -1.0, -_MAX_SPEED)
    obs_high = (1.0, 1.0, _MAX_SPEED)
    dt = _DT
    default_max_episode_steps = 200

    def _initial_state(self, n: int) -> torch.Tensor:
        state = self._uniform(2, n, -1.0, 1.0)  # [2,n]
        state[0].mul_(math.pi)
        return state

    def _transition(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        th, thdot = state  # [N], [N]
        u = action[:, 0].clamp(-_MAX_TORQUE, _MAX_TORQUE)  # [N]
        # In-place chains below only touch fresh temporaries; they save allocations at large N.
        cost = _wrap_angle(th).square_().addcmul_(thdot, thdot, value=0.1).addcmul_(u, u, value=0.001)  # [N]
        acc = torch.sin(th).mul_(3 * _G / (2 * _L)).add_(u, alpha=3.0 / (_M * _L**2))  # [N]
        new_thdot = acc.mul_(_DT).add_(thdot).clamp_(-_MAX_SPEED, _MAX_SPEED)  # [N]
        new_th = _wrap_angle(torch.add(th, new_thdot, alpha=_DT))  # [N]
        terminated = torch.zeros_like(th, dtype=torch.bool)  # [N]
        return torch.stack((new_th, new_thdot)), cost.neg_(), terminated  # [2,N], [N], [N]

    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        th, thdot = state  # [N], [N]
        return torch.cos(th), torch.sin(th), thdot
