"""Batched torch CartPole, equivalent to gymnasium ``CartPole-v1``.

State ``[4,N]`` and observation ``[N,4]`` = (x, x_dot, theta, theta_dot); action ``[N]`` int64, 1 pushes right
with 10 N and any other value pushes left (gymnasium's ``force_mag if action == 1 else -force_mag``).
Dynamics from Florian (2005), "Correct equations for the dynamics of the cart-pole system", with
gymnasium's constants (g = 9.8, cart 1 kg, pole 0.1 kg, half length 0.5 m) and explicit Euler,
tau = 0.02 s::

    temp      = (F + m_p l theta_dot^2 sin theta) / (m_c + m_p)
    theta_acc = (g sin theta - cos theta temp) / (l (4/3 - m_p cos^2 theta / (m_c + m_p)))
    x_acc     = temp - m_p l theta_acc cos theta / (m_c + m_p)
    x <- x + tau x_dot;  x_dot <- x_dot + tau x_acc;  theta <- theta + tau theta_dot;  theta_dot <- ...

Reward 1 on every step, including the terminal one. Terminated when |x| > 2.4 or
|theta| > 12 degrees; truncated after 500 steps. Start state uniform in [-0.05, 0.05]^4.
"""

from __future__ import annotations

import math

import torch

from ctrl_rl.envs.torch_envs.base import TorchEnv

_GRAVITY = 9.8
_MASS_CART = 1.0
_MASS_POLE = 0.1
_TOTAL_MASS = _MASS_CART + _MASS_POLE
_HALF_LENGTH = 0.5
_POLEMASS_LENGTH = _MASS_POLE * _HALF_LENGTH
_FORCE_MAG = 10.0
_TAU = 0.02
_THETA_THRESHOLD = 12 * 2 * math.pi / 360
_X_THRESHOLD = 2.4


class CartPole(TorchEnv):
    """Batched ``CartPole-v1`` with 2 discrete actions; see the module docstring."""

    name = "CartPole"
    obs_dim = 4
    state_dim = 4
    discrete = True
    action_dim = 2
    obs_low = (-2 * _X_THRESHOLD, -math.inf, -2 * _THETA_THRESHOLD, -math.inf)
    obs_high = (2 * _X_THRESHOLD, math.inf, 2 * _THETA_THRESHOLD, math.inf)
    dt = _TAU
    default_max_episode_steps = 500

    def _initial_state(self, n: int) -> torch.Tensor:
        return self._uniform(4, n, -0.05, 0.05)  # [4,n]

    def _transition(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, x_dot, theta, theta_dot = state  # [N] each
        force = torch.where(action == 1, _FORCE_MAG, -_FORCE_MAG).to(state.dtype)  # [N]
        cos, sin = torch.cos(theta), torch.sin(theta)  # [N], [N]
        temp = (force + _POLEMASS_LENGTH * theta_dot.square() * sin) / _TOTAL_MASS  # [N]
        theta_acc = (_GRAVITY * sin - cos * temp) / (
            _HALF_LENGTH * (4.0 / 3.0 - _MASS_POLE * cos.square() / _TOTAL_MASS)
        )  # [N]
        x_acc = temp - _POLEMASS_LENGTH * theta_acc * cos / _TOTAL_MASS  # [N]
        next_state = torch.stack(
            (x + _TAU * x_dot, x_dot + _TAU * x_acc, theta + _TAU * theta_dot, theta_dot + _TAU * theta_acc),
        )  # [4,N]
        new_x, new_theta = next_state[0], next_state[2]  # [N], [N]
        terminated = (new_x.abs() > _X_THRESHOLD) | (new_theta.abs() > _THETA_THRESHOLD)  # [N]
        reward = torch.ones_like(x)  # [N]
        return next_state, reward, terminated

    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(state)  # 4 x [N]
