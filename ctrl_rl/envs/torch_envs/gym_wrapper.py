"""One torch simulator as a single-env ``gymnasium.Env`` (NumPy in and out).

Useful for tools that expect the gymnasium API (``check_env``, evaluation scripts, renderless
debugging). It wraps a torch env built with ``num_envs=1``. Unlike the batched env, ``step`` does not
hand out the next episode's first observation: when an episode ends it returns the episode's final
observation (``final_obs``), and the caller must call ``reset()`` as with any gymnasium env. (Stepping
on without a reset continues in the episode the batched env already started; gymnasium leaves that
case undefined.)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ctrl_rl.envs.torch_envs import TORCH_ENVS
from ctrl_rl.envs.torch_envs.base import TorchEnv


class SingleEnvGym(gym.Env):
    """Single-env gymnasium view of a torch simulator.

    Args:
        env: a name from ``TORCH_ENVS`` (``"Pendulum"``), a ``TorchEnv`` subclass, or an instance built
            with ``num_envs=1``.
        **kwargs: constructor arguments (``seed``, ``max_episode_steps``, ...) when ``env`` is a name or a
            class; the torch env is always built on CPU with ``num_envs=1``.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: str | type[TorchEnv] | TorchEnv, **kwargs: Any) -> None:
        if isinstance(env, str):
            if env not in TORCH_ENVS:
                raise ValueError(f"Unknown torch env {env!r}; expected one of {sorted(TORCH_ENVS)}.")
            env = TORCH_ENVS[env]
        if isinstance(env, type):
            env = env(num_envs=1, device="cpu", **kwargs)
        elif kwargs:
            raise ValueError("Constructor arguments are only accepted with an env name or class, not an instance.")
        if env.num_envs != 1:
            raise ValueError(f"SingleEnvGym wraps a torch env with num_envs=1, got num_envs={env.num_envs}.")
        self.torch_env = env
        cls = type(env)
        self.observation_space = gym.spaces.Box(
            low=np.array(cls.obs_low, dtype=np.float32), high=np.array(cls.obs_high, dtype=np.float32), dtype=np.float32
        )
        if cls.discrete:
            self.action_space = gym.spaces.Discrete(cls.action_dim)
        else:
            self.action_space = gym.spaces.Box(
                low=np.array(cls.action_low, dtype=np.float32),
                high=np.array(cls.action_high, dtype=np.float32),
                dtype=np.float32,
            )
        self.render_mode = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)  # seeds self.np_random, which gymnasium's checker inspects
        obs = self.torch_env.reset(seed=seed)  # [1,O]
        return obs[0].cpu().numpy().copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        env = self.torch_env
        if env.discrete:
            a = torch.as_tensor(np.asarray(action, dtype=np.int64).reshape(1), device=env.device)  # [1]
        else:
            a = torch.as_tensor(np.asarray(action, dtype=np.float32).reshape(1, -1), device=env.device)  # [1,A]
        out = env.step(a)
        # final_obs, not obs: for the env that just ended, obs already holds the next episode's start.
        final = out.final_obs
        assert isinstance(final, torch.Tensor)  # a flat torch env, as the one Box observation_space says
        obs = final[0].cpu().numpy().copy()
        return obs, float(out.reward[0]), bool(out.terminated[0]), bool(out.truncated[0]), {}

    def close(self) -> None:
        self.torch_env.close()
