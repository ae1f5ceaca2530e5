"""Any registered gymnasium env as a BatchedEnv, through gymnasium's own vector envs.

N copies of ``gymnasium.make(env_id)`` run in a ``SyncVectorEnv`` (one process; the default) or an
``AsyncVectorEnv`` (one process per env) with ``autoreset_mode=AutoresetMode.SAME_STEP``. In that
mode gymnasium 1.x resets an env inside the step that ended its episode and hands the last
observation back in ``info["final_obs"]`` (an object array, ``None`` where the env did not end; mask
``info["_final_obs"]``), so ``final_obs`` here is exact. This is the reference backend for the
gymnasium MuJoCo tasks; envpool is the fast one.

Conventions: gymnasium's ``TimeLimit`` sets ``truncated`` even when the env also terminated on the
last allowed step; the protocol wants only ``terminated`` then, so ``truncated &= ~terminated``.
Observations are cast to float32 (MuJoCo ones are float64). Non-Box observation spaces (Dict,
Tuple) are flattened per env with ``gymnasium.wrappers.FlattenObservation``.

Seeding: env i is seeded with ``seed + i`` on the first ``reset()`` (gymnasium's vector convention),
later resets without a seed continue the envs' generators.

Checkpointing: gymnasium envs cannot be saved in general. ``state_dict()`` holds metadata only
(seed and counters); after ``load_state_dict`` the next ``reset()`` re-seeds the envs from it, so a
resumed run continues with fresh episodes and is not bit-exact with an uninterrupted one.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import gymnasium  # the real package: ctrl_rl uses absolute imports, so this module does not shadow it
import numpy as np
import torch

from ctrl_rl.envs.mujoco_bindings import import_mujoco
from ctrl_rl.envs.protocol import EnvSpec, StepOut, action_to_numpy
from ctrl_rl.envs.reseed import load_metadata_state, metadata_state

# MuJoCo >= 3.3 warns, once per model compiled, that Gymnasium's HalfCheetah/Walker2d XML uses the deprecated
# compiler attribute ``settotalmass``: one stderr line per env, dozens per run. That message alone is dropped;
# every other MuJoCo warning (e.g. unstable simulation) still reaches stderr.
_DROPPED_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)
_warning_filter_installed = False


def filter_mujoco_warnings() -> None:
    """Route MuJoCo's warnings through a handler that drops the ``settotalmass`` line (once per process; also
    for gymnasium envs made elsewhere, e.g. by a baseline library in a benchmark)."""
    global _warning_filter_installed
    if _warning_filter_installed:
        return
    _warning_filter_installed = True
    try:
        mujoco = import_mujoco()
    except ImportError:  # not a MuJoCo install: nothing to filter
        return
    if mujoco.get_mju_user_warning() is not None:  # someone else's handler: leave it alone
        return
    import sys

    def handler(message: str) -> None:
        if not any(m in message for m in _DROPPED_MUJOCO_WARNINGS):
            print(f"WARNING: {message}", file=sys.stderr, flush=True)

    mujoco.set_mju_user_warning(handler)


def make(env_id: str, **make_kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make(env_id, **make_kwargs)`` without MuJoCo's ``settotalmass`` deprecation line."""
    filter_mujoco_warnings()
    return gymnasium.make(env_id, **make_kwargs)


def _make_one(env_id: str, make_kwargs: dict[str, Any]) -> gymnasium.Env:
    env = make(env_id, **make_kwargs)
    if not isinstance(env.observation_space, gymnasium.spaces.Box):
        env = gymnasium.wrappers.FlattenObservation(env)
    return env


def gym_spec(env_id: str, vector_mode: str = "sync", **make_kwargs: Any) -> EnvSpec:
    """The spec of ``gym:<env_id>`` with ``make_kwargs``: what ``GymnasiumEnv(env_id, ...).spec`` is.

    gymnasium's own registry entry (``gymnasium.spec(id)``) has the time limit but neither the spaces nor ``dt``,
    so one unvectorized env is made, read and closed (a MuJoCo task compiles its model once; no vector env,
    no subprocess)."""
    _check_vector_mode(vector_mode)
    single = _make_one(env_id, dict(make_kwargs))
    try:
        return _spec(env_id, single)
    finally:
        single.close()


def _check_vector_mode(vector_mode: str) -> None:
    if vector_mode not in ("sync", "async"):
        raise ValueError(f"vector_mode={vector_mode!r}: expected 'sync' or 'async'.")


def _spec(env_id: str, single: gymnasium.Env) -> EnvSpec:
    """The EnvSpec of one env as ``_make_one`` builds it: its spaces, ``dt`` and time limit."""
    unwrapped = single.unwrapped
    dt = float(getattr(unwrapped, "dt", getattr(unwrapped, "tau", 0.0)))  # CartPole calls it tau
    max_steps = single.spec.max_episode_steps if single.spec is not None else None
    obs_space, act_space = single.observation_space, single.action_space
    assert isinstance(obs_space, gymnasium.spaces.Box)  # _make_one flattens every other observation space
    if isinstance(act_space, gymnasium.spaces.Discrete):
        if int(act_space.start) != 0:
            raise ValueError(f"gymnasium env {env_id!r} has Discrete(start={act_space.start}); expected start 0.")
        discrete, action_dim, low, high = True, int(act_space.n), (), ()
    elif isinstance(act_space, gymnasium.spaces.Box):
        discrete, action_dim = False, int(np.prod(act_space.shape))
        low = tuple(float(x) for x in np.broadcast_to(act_space.low, act_space.shape).ravel())
        high = tuple(float(x) for x in np.broadcast_to(act_space.high, act_space.shape).ravel())
    else:
        raise ValueError(f"gymnasium env {env_id!r} has action space {act_space}; expected Box or Discrete.")
    return EnvSpec(
        env_id=f"gym:{env_id}",
        obs_shape=tuple(int(s) for s in obs_space.shape),
        discrete=discrete,
        action_dim=action_dim,
        action_low=low,
        action_high=high,
        dt=dt,
        max_episode_steps=int(max_steps) if max_steps is not None else None,
        backend="gymnasium",
    )


class GymnasiumEnv:
    """N gymnasium envs of one id, stepped as a batch; see the module docstring.

    Args:
        env_id: a registered gymnasium id without prefix (``Pendulum-v1``, ``HalfCheetah-v5``).
        num_envs: N.
        device: where returned tensors live.
        seed: env i is seeded with ``seed + i`` on the first reset.
        vector_mode: "sync" (one process) or "async" (a subprocess per env).
        **make_kwargs: passed to ``gymnasium.make`` (e.g. ``max_episode_steps``).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        seed: int = 0,
        vector_mode: Literal["sync", "async"] = "sync",
        **make_kwargs: Any,
    ) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        _check_vector_mode(vector_mode)
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self._env_id = env_id
        fns = [functools.partial(_make_one, env_id, dict(make_kwargs)) for _ in range(self.num_envs)]
        vec_cls = SyncVectorEnv if vector_mode == "sync" else AsyncVectorEnv
        self._vec = vec_cls(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self._seed = int(seed)
        self._pending_seed: int | None = self._seed  # the first reset seeds env i with seed + i
        self._resets = 0
        self._episodes = 0
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)  # [N] steps into the current episode

        # dt and the time limit live on a single env: the first one in sync mode, a probe otherwise.
        if isinstance(self._vec, SyncVectorEnv):
            self.spec = _spec(env_id, self._vec.envs[0])
        else:
            self.spec = gym_spec(env_id, **make_kwargs)
        act_space = self._vec.single_action_space
        assert act_space.shape is not None  # a Box or Discrete space (_spec refuses the others): both have a shape
        self._action_shape = (self.num_envs,) if self.spec.discrete else (self.num_envs, self.spec.action_dim)
        self._act_space_shape = act_space.shape
        self._action_dtype = act_space.dtype

    # ---- the BatchedEnv protocol ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every env; with a ``seed``, env i is re-seeded with ``seed + i``."""
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        if seed is not None:
            self._seed = int(seed)
        obs, _ = self._vec.reset(seed=seed)
        self._resets += 1
        self._elapsed[:] = 0
        return self._tensor(np.array(obs, dtype=np.float32))  # [N,O]

    def step(self, action: torch.Tensor) -> StepOut:
        """One step of every env; gymnasium resets the envs that ended within the same step."""
        act = action_to_numpy(action, self.spec, self._action_shape, self._action_dtype)
        act = act.reshape((self.num_envs, *self._act_space_shape))
        obs, reward, terminated, truncated, info = self._vec.step(act)
        obs = np.array(obs, dtype=np.float32)  # [N,O], owned copy
        terminated = np.asarray(terminated, dtype=bool)  # [N]
        truncated = np.asarray(truncated, dtype=bool) & ~terminated  # [N]; terminated wins
        done = terminated | truncated  # [N]
        self._elapsed += 1
        elapsed = self._elapsed.copy()  # [N] steps of the episode this step belongs to
        final_obs = obs.copy()  # [N,O]
        done_ids = np.flatnonzero(done)
        if done_ids.size:
            # Only the envs that ended have an entry; the stack is over those few, not all N.
            final_obs[done_ids] = np.stack([info["final_obs"][i] for i in done_ids]).astype(np.float32)
            self._elapsed[done_ids] = 0
            self._episodes += int(done_ids.size)
        return StepOut(
            obs=self._tensor(obs),
            reward=self._tensor(np.asarray(reward, dtype=np.float32)),
            terminated=self._tensor(terminated),
            truncated=self._tensor(truncated),
            final_obs=self._tensor(final_obs),
            info={"elapsed_step": self._tensor(elapsed)},
        )

    def close(self) -> None:
        self._vec.close()

    # ---- checkpointing (metadata only; see the module docstring) -------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Seed and counters only: gymnasium envs cannot be saved, resume re-seeds (not bit-exact)."""
        return metadata_state(self.spec.env_id, "gymnasium", self._seed, self._resets, self._episodes)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Schedule a re-seed for the next ``reset()`` from the saved seed and counters (not bit-exact)."""
        self._pending_seed, self._resets, self._episodes = load_metadata_state(d, self.spec.env_id)

    # ---- NumPy <-> torch boundary ----------------------------------------------------------------

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device)

    def __repr__(self) -> str:
        return f"GymnasiumEnv({self._env_id!r}, num_envs={self.num_envs}, device={str(self.device)!r})"
