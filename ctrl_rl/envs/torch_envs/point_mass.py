"""Batched 2-D point mass that reaches a goal, observed from state (``PointMass``) or from a camera
(``PointMassPixels``): an easy task for comparing learning from pixels with learning from state.

Arena ``[-1, 1]^2``. State ``[4,N]`` = (x, y, goal_x, goal_y). The agent moves directly by the action
(no inertia, so one frame shows everything that matters)::

    a        = clip(action, -1, 1)                                   action [N,2]
    (x, y)  <- clip((x, y) + MAX_STEP * a, -1, 1)                    MAX_STEP = 0.1 (speed 1 / s at dt 0.1)
    reward   = -|| (x, y) - (goal_x, goal_y) ||                      after the move, dense

Start: agent and goal uniform in ``[-0.8, 0.8]^2`` each, independently; the goal stays put for the
episode. Never terminates; truncated after 50 steps. The farthest start (~2.3 apart) is reached in
~16 steps, so an episode leaves time to reach the goal and stay on it: heading straight for the goal
scores about -3 per episode, uniform random actions about -45.

Observations:

- ``PointMass``: flat float32 ``[N,4]`` = (x, y, goal_x, goal_y).
- ``PointMassPixels``: a dict of parts (``ctrl_rl.core.obs``):
  ``image/top`` uint8 ``[N,3,S,S]`` (S = ``image_size``, 64 by default), a top view of the arena with
  row 0 at y = +1 and column 0 at x = -1; the goal is a disc of radius 0.15 in the red channel, the
  agent a disc of radius 0.1 in the green channel (255 inside a disc, 0 outside; so both stay visible
  when they overlap), and the blue channel a constant 64 background. With ``proprio=True`` (the
  default) also ``state`` float32 ``[N,2]`` = (x, y), the agent's own position as a robot knows its
  joints; the goal is then only in the image. ``proprio=False`` leaves the image alone.

The image is drawn for all N envs at once by comparing the grid of pixel centres with each disc
(``render_top``), no per-env loop: five elementwise passes over ``[N,S,S]`` bytes per image. A step
draws two images (``final_obs`` and ``obs``), as every torch env builds both observations.

Learning from pixels on a CPU is dominated by the CNN, not the env: for runs of minutes use
``image_size=32`` with a 2-layer encoder (``EncoderConfig(cnn_layers=2)``); 64 is the default size.
"""

from __future__ import annotations

import dataclasses

import torch

from ctrl_rl.core.obs import ObsPart, state_shape
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.torch_envs.base import TorchEnv

_MAX_STEP = 0.1
_DT = 0.1
_START = 0.8  # agent and goal start uniform in [-_START, _START]^2
_AGENT_RADIUS = 0.1
_GOAL_RADIUS = 0.15
_BACKGROUND_BLUE = 64


def pixel_centres(size: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Arena coordinates of the pixel centres of a ``size x size`` top view: ``(xs [S], ys [S])``.

    Column j is at ``x = -1 + (j + 0.5) * 2 / S``; row i at ``y = 1 - (i + 0.5) * 2 / S`` (row 0 on top).
    """
    c = (torch.arange(size, device=device, dtype=dtype) + 0.5) * (2.0 / size) - 1.0  # [S]
    return c, c.flip(0)


def render_top(agent: torch.Tensor, goal: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Top-view image of every env: goal disc in red, agent disc in green, blue background.

    Args:
        agent: ``[2,N]`` agent positions (x, y).
        goal: ``[2,N]`` goal positions.
        xs, ys: ``[S]`` pixel-centre coordinates from ``pixel_centres``.

    Returns:
        ``[N,3,S,S]`` uint8.
    """
    n, s = agent.shape[1], xs.shape[0]
    img = torch.empty((n, 3, s, s), dtype=torch.uint8, device=agent.device)  # [N,3,S,S]; every pixel written below
    for channel, centre, radius in ((0, goal, _GOAL_RADIUS), (1, agent, _AGENT_RADIUS)):  # two discs, not envs
        # inside <=> dy^2 <= r^2 - dx^2: one broadcast compare makes the [N,S,S] mask
        room = (xs.view(1, 1, s) - centre[0].view(n, 1, 1)).square_().neg_().add_(radius * radius)  # [N,1,S]
        dy2 = (ys.view(1, s, 1) - centre[1].view(n, 1, 1)).square_()  # [N,S,1]
        torch.mul((dy2 <= room).view(torch.uint8), 255, out=img[:, channel])  # [N,S,S]; bool viewed as 0/1 bytes
    img[:, 2].fill_(_BACKGROUND_BLUE)
    return img


class PointMass(TorchEnv):
    """Batched 2-D point mass reaching a goal, flat state observation; see the module docstring."""

    name = "PointMass"
    obs_dim = 4
    state_dim = 4
    discrete = False
    action_dim = 2
    action_low = (-1.0, -1.0)
    action_high = (1.0, 1.0)
    obs_low = (-1.0,) * 4
    obs_high = (1.0,) * 4
    dt = _DT
    default_max_episode_steps = 50

    def _initial_state(self, n: int) -> torch.Tensor:
        return self._uniform(4, n, -_START, _START)  # [4,n] = (x, y, goal_x, goal_y)

    def _transition(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pos, goal = state[0:2], state[2:4]  # [2,N], [2,N]
        new_pos = (pos + _MAX_STEP * action.clamp(-1.0, 1.0).T).clamp_(-1.0, 1.0)  # [2,N]
        reward = -torch.linalg.vector_norm(new_pos - goal, dim=0)  # [N]
        terminated = torch.zeros(state.shape[1], dtype=torch.bool, device=state.device)  # [N]
        return torch.cat((new_pos, goal)), reward, terminated  # [4,N], [N], [N]

    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(state.unbind(0))  # x, y, goal_x, goal_y, each [N]


class PointMassPixels(PointMass):
    """``PointMass`` seen through a top camera (uint8 image part, optional proprio ``state`` part).

    Args:
        num_envs, device, seed, max_episode_steps, dtype: as ``TorchEnv``.
        image_size: S, the side of the square image in pixels (64 by default; 32 for cheaper runs).
        proprio: add the ``state`` part (agent position, float32 ``[2]``) next to the image.
    """

    name = "PointMassPixels"
    obs_dim = 2  # the proprio ``state`` part; ``spec.parts`` describes the whole observation
    obs_low = (-1.0, -1.0)
    obs_high = (1.0, 1.0)

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int | None = None,
        dtype: torch.dtype = torch.float32,
        image_size: int = 64,
        proprio: bool = True,
    ) -> None:
        spec = self.static_spec(max_episode_steps, image_size, proprio)  # checks the options first
        super().__init__(num_envs, device=device, seed=seed, max_episode_steps=max_episode_steps, dtype=dtype)
        self.image_size, self.proprio = int(image_size), bool(proprio)
        self.spec = spec
        self._xs, self._ys = pixel_centres(self.image_size, self.device, self.dtype)  # [S], [S]

    @classmethod
    def static_spec(cls, max_episode_steps: int | None = None, image_size: int = 64,  # type: ignore[override]
                    proprio: bool = True) -> EnvSpec:
        """The spec with the camera part ``image/top`` ``[3,S,S]`` and, with ``proprio``, the ``state`` part."""
        if int(image_size) < 8:
            raise ValueError(f"image_size must be an integer >= 8, got {image_size!r}.")
        size = int(image_size)
        parts = (ObsPart("image/top", (3, size, size), torch.uint8),)
        if proprio:
            parts += (ObsPart("state", (2,), torch.float32),)
        base = super().static_spec(max_episode_steps)
        return dataclasses.replace(base, obs_shape=state_shape(parts), obs_parts=parts)

    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return state[0], state[1]  # the proprio part: x, y, each [N]

    def _obs_tensor(self, state: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        # The base class calls this for every observation it hands out (reset, obs and final_obs of a
        # step), so overriding it is all a multi-part observation needs.
        obs = {"image/top": render_top(state[0:2], state[2:4], self._xs, self._ys)}  # [N,3,S,S]
        if self.proprio:
            obs["state"] = super()._obs_tensor(state)  # [N,2]
        return obs
