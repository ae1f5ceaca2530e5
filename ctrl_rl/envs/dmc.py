"""dm_control suite tasks, run directly, as a BatchedEnv.

N independent ``dm_control.suite.load(domain, task, task_kwargs={"random": seed + i})`` environments
are stepped one after the other in a Python loop. That is acceptable at this adapter boundary: this is
the reference backend for the DMC tasks, and envpool's dm_control tasks (``envpool:CheetahRun-v1``)
are the fast one.

dm_control conventions mapped onto the protocol:

- An episode ends with ``step_type == LAST``. ``discount == 0`` there is a true termination; the
  suite's time limit ends with ``discount == 1`` and becomes ``truncated``.
- dm_control resets on the step *after* LAST; this adapter resets at once (same step) and keeps the
  LAST observation as ``final_obs``.
- The observation dict is flattened in sorted key order (scalars count as one entry), cast to
  float32; ``envpool:`` dm_control tasks are flattened to the same layout.
- ``dt`` is the control timestep; action bounds come from ``action_spec()``.
- ``max_episode_steps=K`` replaces the suite's time limit (the task gets ``time_limit=inf``
  and this adapter truncates after K steps itself, avoiding float round-off in time / control dt).

Compatibility: dm_control 1.0.50's bindings list a few flex fields that MuJoCo 4 removed
(``flex_vertedge``...), and every ``Physics`` construction fails on them. ``_patch_dm_control_sizes``
drops the fields the installed ``mujoco`` does not have from dm_control's size table, once, before the
first load. The suite tasks do not use flex objects; remove the patch when dm_control catches up.

Checkpointing: ``state_dict()`` holds metadata only (seed and counters); after ``load_state_dict`` the
next ``reset()`` re-seeds the tasks' random states from it, so a resumed run continues with fresh
episodes and is not bit-exact with an uninterrupted one.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from ctrl_rl.envs.mujoco_bindings import import_mujoco
from ctrl_rl.envs.protocol import EnvSpec, StepOut, action_to_numpy
from ctrl_rl.envs.reseed import load_metadata_state, metadata_state

_PATCHED = False


def _patch_dm_control_sizes() -> None:
    """Drop the MjModel/MjData fields the installed MuJoCo lacks from dm_control's size table (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    mujoco = import_mujoco()

    with warnings.catch_warnings():
        # dm_control probes GLFW for rendering on import; without a display that only warns (we never render here)
        warnings.filterwarnings("ignore", message=".*DISPLAY environment variable.*")
        from dm_control.mujoco.wrapper.mjbindings import sizes

    for struct_name, cls in (("mjmodel", mujoco.MjModel), ("mjdata", mujoco.MjData)):
        table = sizes.array_sizes[struct_name]
        for field in [f for f in table if not hasattr(cls, f)]:
            del table[field]
    _PATCHED = True


def dmc_spec(domain: str, task: str, max_episode_steps: int | None = None,
             task_kwargs: dict[str, Any] | None = None, environment_kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """The spec of ``dmc:<domain>-<task>``: what ``DMCEnv(domain, task, ...).spec`` is.

    dm_control keeps the observation and action specs, the control timestep and the time limit on a loaded
    environment only, so one task is loaded (its physics compiled once), read and closed."""
    env = _load(domain, task, max_episode_steps, task_kwargs, environment_kwargs, 0)
    try:
        return _spec(f"{domain}-{task}", env, max_episode_steps)
    finally:
        env.close()


def _load(domain: str, task: str, max_episode_steps: int | None, task_kwargs: dict[str, Any] | None,
          environment_kwargs: dict[str, Any] | None, seed: int) -> Any:
    """One ``suite.load`` environment seeded with ``seed``; ``max_episode_steps`` lifts the suite's time limit."""
    _patch_dm_control_sizes()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*DISPLAY environment variable.*")
        from dm_control import suite

    task_kwargs = dict(task_kwargs or {})
    if max_episode_steps is not None:
        if int(max_episode_steps) < 1:
            raise ValueError(f"max_episode_steps={max_episode_steps!r}: expected a positive integer or None.")
        task_kwargs["time_limit"] = float("inf")  # the suite's task functions take the limit
    return suite.load(domain, task, task_kwargs={**task_kwargs, "random": seed}, environment_kwargs=environment_kwargs)


def _spec(name: str, env: Any, max_episode_steps: int | None) -> EnvSpec:
    """The EnvSpec of a loaded suite environment (``name`` = ``<domain>-<task>``)."""
    obs_spec = env.observation_spec()
    obs_dim = sum(int(np.prod(obs_spec[k].shape)) for k in obs_spec)
    act_spec = env.action_spec()
    if max_episode_steps is None:
        step_limit = env._step_limit  # dm_control exposes the limit only as this (time / control dt)
        max_episode_steps = None if step_limit == float("inf") else int(round(step_limit))
    return EnvSpec(
        env_id=f"dmc:{name}",
        obs_shape=(obs_dim,),
        discrete=False,
        action_dim=int(np.prod(act_spec.shape)),
        action_low=tuple(float(x) for x in np.broadcast_to(act_spec.minimum, act_spec.shape).ravel()),
        action_high=tuple(float(x) for x in np.broadcast_to(act_spec.maximum, act_spec.shape).ravel()),
        dt=float(env.control_timestep()),
        max_episode_steps=int(max_episode_steps) if max_episode_steps is not None else None,
        backend="dmc",
    )


class DMCEnv:
    """N dm_control suite envs of one task, stepped in a loop; see the module docstring.

    Args:
        domain: suite domain (``cheetah``, ``ball_in_cup``, ``humanoid_CMU``).
        task: task of that domain (``run``).
        num_envs: N.
        device: where returned tensors live.
        seed: env i's task is seeded with ``seed + i``; ``reset(seed)`` re-seeds in place.
        max_episode_steps: time limit in steps; ``None`` keeps the suite's own (1000 for most tasks).
        task_kwargs: extra keyword arguments of the suite task (``random`` is set from ``seed``).
        environment_kwargs: extra keyword arguments of ``control.Environment``.
    """

    def __init__(
        self,
        domain: str,
        task: str,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int | None = None,
        task_kwargs: dict[str, Any] | None = None,
        environment_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self._name = f"{domain}-{task}"
        self._envs = [_load(domain, task, max_episode_steps, task_kwargs, environment_kwargs, int(seed) + i)
                      for i in range(self.num_envs)]
        self._seed = int(seed)
        self._pending_seed: int | None = None
        self._resets = 0
        self._episodes = 0
        self._started = False  # dm_control would silently reset on a first step(); require reset()

        self._obs_keys = sorted(self._envs[0].observation_spec())
        self.spec = _spec(self._name, self._envs[0], max_episode_steps)
        limit = self.spec.max_episode_steps
        self._limit = limit if limit is not None else np.iinfo(np.int64).max
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)  # [N] steps into the current episode
        self._action_shape = (self.num_envs, self.spec.action_dim)

    # ---- the BatchedEnv protocol ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every env; with a ``seed``, env i's task is re-seeded with ``seed + i``."""
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        if seed is not None:
            self._seed = int(seed)
            for i, env in enumerate(self._envs):
                env.task.random.seed(self._seed + i)
        obs = np.empty((self.num_envs, self.spec.obs_dim), dtype=np.float32)  # [N,O]
        for i, env in enumerate(self._envs):
            obs[i] = self._flat(env.reset().observation)
        self._elapsed[:] = 0
        self._resets += 1
        self._started = True
        return self._tensor(obs)

    def step(self, action: torch.Tensor) -> StepOut:
        """One step of every env (a loop over envs), resetting the envs that ended in the same step."""
        if not self._started:
            raise RuntimeError(f"{self.spec.env_id}: call reset() before the first step().")
        act = action_to_numpy(action, self.spec, self._action_shape, np.float64)  # [N,A]
        n, o = self.num_envs, self.spec.obs_dim
        obs = np.empty((n, o), dtype=np.float32)  # [N,O]
        final_obs = np.empty((n, o), dtype=np.float32)  # [N,O]
        reward = np.empty(n, dtype=np.float32)  # [N]
        terminated = np.zeros(n, dtype=bool)  # [N]
        truncated = np.zeros(n, dtype=bool)  # [N]
        self._elapsed += 1
        elapsed = self._elapsed.copy()  # [N] steps of the episode this step belongs to
        for i, env in enumerate(self._envs):
            ts = env.step(act[i])
            final_obs[i] = self._flat(ts.observation)
            reward[i] = ts.reward
            if ts.last():
                terminated[i] = ts.discount == 0.0  # a terminal state; a time limit keeps discount 1
                truncated[i] = not terminated[i]
            elif self._elapsed[i] >= self._limit:
                truncated[i] = True
            if terminated[i] or truncated[i]:
                obs[i] = self._flat(env.reset().observation)
                self._elapsed[i] = 0
                self._episodes += 1
            else:
                obs[i] = final_obs[i]
        return StepOut(
            obs=self._tensor(obs),
            reward=self._tensor(reward),
            terminated=self._tensor(terminated),
            truncated=self._tensor(truncated),
            final_obs=self._tensor(final_obs),
            info={"elapsed_step": self._tensor(elapsed)},
        )

    def close(self) -> None:
        for env in self._envs:
            env.close()

    # ---- checkpointing (metadata only; see the module docstring) -------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Seed and counters only: resume re-seeds the tasks (not bit-exact)."""
        return metadata_state(self.spec.env_id, "dmc", self._seed, self._resets, self._episodes)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Schedule a re-seed for the next ``reset()`` from the saved seed and counters (not bit-exact)."""
        self._pending_seed, self._resets, self._episodes = load_metadata_state(d, self.spec.env_id)

    # ---- NumPy <-> torch boundary ----------------------------------------------------------------

    def _flat(self, observation: dict[str, Any]) -> np.ndarray:
        return np.concatenate([np.asarray(observation[k], dtype=np.float64).ravel() for k in self._obs_keys])  # [O]

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device)

    def __repr__(self) -> str:
        return f"DMCEnv({self._name!r}, num_envs={self.num_envs}, device={str(self.device)!r})"
