"""Batched torch continuous Mountain Car, equivalent to gymnasium ``MountainCarContinuous-v0``.

State ``[2,N]`` and observation ``[N,2]`` = (position, velocity); action ``[N,1]`` force in [-1, 1]. Per step::

    f        = clip(a, -1, 1)
    velocity <- clip(velocity + 0.0015 f - 0.0025 cos(3 position), -0.07, 0.07)
    position <- clip(position + velocity, -1.2, 0.6);  velocity <- 0 if at -1.2 and velocity < 0
    terminated = position >= 0.45 and velocity >= 0
    reward     = 100 * terminated - 0.1 a^2

As in gymnasium, the control cost uses the *unclipped* action ``a``, so actions outside [-1, 1] are
penalised for their full size. Start position uniform in [-0.6, -0.4], velocity 0; truncated after
999 steps.
"""

from __future__ import annotations

import torch

from ctrl_rl.envs.torch_envs.base import TorchEnv

_MIN_ACTION = -1.0
_MAX_ACTION = 1.0
_MIN_POSITION = -1.2
_MAX_POSITION = 0.6
_MAX_SPEED = 0.07
_GOAL_POSITION = 0.45
_GOAL_VELOCITY = 0.0
_POWER = 0.0015


class MountainCarContinuous(TorchEnv):
    """Batched ``MountainCarContinuous-v0``; see the module docstring."""

    name = "MountainCarContinuous"
    obs_dim = 2
    state_dim = 2
    discrete = False
    action_dim = 1
    action_low = (_MIN_ACTION,)
    action_high = (_MAX_ACTION,)
    obs_low = (_MIN_POSITION, -_MAX_SPEED)
    obs_high = (_MAX_POSITION, _MAX_SPEED)
    dt = 0.0  # the task has no physical time unit
    default_max_episode_steps = 999

    def _initial_state(self, n: int) -> torch.Tensor:
        position = self._uniform(1, n, -0.6, -0.4)  # [1,n]
        return torch.cat((position, torch.zeros_like(position)))  # [2,n]

    def _transition(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        position, velocity = state  # [N], [N]
        a = action[:, 0]  # [N]
        force = a.clamp(_MIN_ACTION, _MAX_ACTION)  # [N]
        velocity = (velocity + (force * _POWER - 0.0025 * torch.cos(3 * position))).clamp_(-_MAX_SPEED, _MAX_SPEED)
        position = position + velocity  # [N]
        at_left_wall = position <= _MIN_POSITION  # [N]
        position = position.clamp_(_MIN_POSITION, _MAX_POSITION)
        velocity = velocity.masked_fill_(at_left_wall & (velocity < 0), 0.0)  # [N]
        terminated = (position >= _GOAL_POSITION) & (velocity >= _GOAL_VELOCITY)  # [N]
        reward = terminated.to(state.dtype).mul_(100.0).sub_(0.1 * a.square())  # [N]
        return torch.stack((position, velocity)), reward, terminated  # [2,N], [N], [N]

    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(state)  # 2 x [N]
