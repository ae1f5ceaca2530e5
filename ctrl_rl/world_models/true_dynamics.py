"""The real MuJoCo simulator in place of a learned model: episodes that start from dataset states.

RAVL's edge-of-reach experiment (docs/algorithms/mbpo.md#the-true-dynamics-check) replaces the dynamics ensemble by the
true dynamics and keeps
everything else: short rollouts (``horizon`` k) from states drawn uniformly from the dataset, with the task's own
rewards and terminations. ``TrueDynamicsEnv`` is that env, a BatchedEnv over N Gymnasium MuJoCo envs
(``gymnasium.make(env_id).unwrapped``, default arguments), stepped one after another on the CPU. It has the
surface of ``ModelEnv``: start states from the dataset, truncation after ``horizon`` steps, same-step auto-reset
(``envs/protocol.py``), and an info dict.

Start states. A reset (and every auto-reset) draws a dataset row ``j`` uniformly with the env's own
``torch.Generator`` and puts that env's simulator in ``qpos[j], qvel[j]`` the way Gymnasium's own reset does:
``mj_resetData`` (zero warm start, time, controls), then ``MujocoEnv.set_state(qpos, qvel)`` (which runs
``mj_forward``), then ``mj_rnePostConstraint``; the observation is the env's ``_get_obs()`` of that state. For
Hopper, Walker2d and HalfCheetah the observation is a function of qpos and qvel, so it equals the observation a
dataset row stores with the qpos/qvel it was computed from (``infos/qpos``, ``infos/qvel`` of
``ctrl-rl data generate``; tested). Ant-v5's observation also holds contact forces, which the env computes after a
step from the constraint forces of the step's last sub-step: not a function of (qpos, qvel). Here they are the
contact forces of the set state itself (``mj_rnePostConstraint`` after ``mj_forward``), the nearest thing the
state defines (Gymnasium's own reset shows zeros there; on Ant rows of random actions this halves the mean gap to
the stored contact forces, measured once, not a test). Rows of ``qpos``/``qvel`` stored as float32 (the
project's datasets) are exact float64 values, and set as such.

Rewards and ``terminated`` are the env's own ``step`` outputs; ``truncated`` is ``elapsed == horizon`` and not
terminated (``horizon`` None: the task's registered time limit). ``info``: ``elapsed_step`` [N] (steps of the
episode each step belongs to, 1, 2, ...) and ``start_row`` [N] (the dataset row that episode started from);
``start_rows`` is the row of each env's current episode.

Checkpointing is exact: ``state_dict()`` holds the generator state, step counters, start rows and each
simulator's state: ``qpos``, ``qvel``, ``act``, the solver's warm start (``qacc_warmstart``: MuJoCo's constraint
solver starts from it, so without it a resumed step differs in the last bits), ``time``, and the body positions
``xpos``/``xipos``, which after ``mj_step`` are one sub-step old and which a v5 ``step`` reads before it simulates
(Ant's xy velocity, Humanoid's centre of mass). ``load_state_dict`` restores them and the continuation is
bit-identical, float64 simulator states included (tested for Hopper and Ant). Episodes begun by a reset step
bit for bit as a new Gymnasium env given the same ``set_state`` (tested).

Cost: one Gymnasium env (``MjModel`` and ``MjData``) per env and a Python loop over envs per step. Measured for
Hopper-v5 on a 2-core machine: about 10 ms and 1 MB to build each env, 0.3 s per step of 1000 envs (one core).
Shape letters: N envs, M dataset rows, O obs dim, A action dim.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import gymnasium
import numpy as np
import torch

from ctrl_rl.envs.gymnasium import make
from ctrl_rl.envs.mujoco_bindings import import_mujoco
from ctrl_rl.envs.protocol import EnvSpec, StepOut, action_to_numpy
from ctrl_rl.errors import UserInputError

_PREFIXES = ("gym", "gymnasium", "envpool", "true")  # dropped from env ids: the simulator is always gymnasium's


def _is_count(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and bool(x >= 1)


class _MujocoEnv(Protocol):
    """What this module uses of an unwrapped Gymnasium MuJoCo env (``gymnasium.envs.mujoco.MujocoEnv``)."""

    model: Any  # mujoco.MjModel
    data: Any  # mujoco.MjData
    action_space: gymnasium.spaces.Box
    observation_space: gymnasium.spaces.Box

    @property
    def dt(self) -> float: ...

    def set_state(self, qpos: np.ndarray, qvel: np.ndarray) -> None: ...

    def _get_obs(self) -> np.ndarray: ...

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


def _mujoco_env(env: gymnasium.Env) -> _MujocoEnv:
    """``env.unwrapped`` as a ``_MujocoEnv``: a Gymnasium MuJoCo env (``_check_rows`` checks the first one for
    ``set_state``, ``data`` and ``model``; the others are made from the same id)."""
    return cast(_MujocoEnv, env.unwrapped)  # gymnasium.make types every env as Env


def _rows(x: Any, name: str) -> np.ndarray:
    """``x`` (tensor or array) as a float64 ``[M,D]`` NumPy array, or a UserInputError saying what was expected."""
    a = x.detach().cpu().to(torch.float64).numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0:
        raise UserInputError(f"{name} has shape {tuple(a.shape)}: expected a non-empty 2-D array [rows, dim] of "
                             f"dataset states.")
    if not np.isfinite(a).all():
        raise UserInputError(f"{name} holds non-finite values: expected finite simulator states.")
    return np.ascontiguousarray(a)


class TrueDynamicsEnv:
    """N Gymnasium MuJoCo envs whose episodes start from dataset states; see the module docstring.

    Args:
        env_id: a Gymnasium MuJoCo id (``Hopper-v5``; a ``gym:``, ``gymnasium:``, ``envpool:`` or ``true:`` prefix
            is dropped).
        qpos: ``[M,nq]`` dataset positions (``infos/qpos``), tensor or array.
        qvel: ``[M,nv]`` dataset velocities (``infos/qvel``), the same M rows.
        num_envs: N.
        horizon: steps before truncation (RAVL's rollout length k); None for the task's registered time limit.
        seed: seeds the generator that draws start rows (``reset(seed)`` re-seeds it).
        device: where returned tensors live.
    """

    def __init__(self, env_id: str, qpos: Any, qvel: Any, num_envs: int, horizon: int | None = None, seed: int = 0,
                 device: str | torch.device = "cpu") -> None:
        prefix, sep, name = env_id.partition(":")
        name = name if sep and prefix in _PREFIXES else env_id
        if not _is_count(num_envs):
            raise UserInputError(f"num_envs={num_envs!r}: expected an int >= 1.")
        if horizon is not None and not _is_count(horizon):
            raise UserInputError(f"horizon={horizon!r}: expected None or an int >= 1.")
        num_envs, horizon = int(num_envs), (None if horizon is None else int(horizon))
        try:
            first = make(name)
        except gymnasium.error.Error as e:
            raise UserInputError(f"env {env_id!r} cannot be made by gymnasium ({e}): expected a Gymnasium MuJoCo id "
                                 f"such as Hopper-v5.") from None
        raw = _mujoco_env(first)
        try:
            qpos, qvel = self._check_rows(env_id, raw, qpos, qvel)
        except UserInputError:
            first.close()
            raise
        limit = first.spec.max_episode_steps if first.spec is not None else None

        self.num_envs = num_envs
        self.device = torch.device(device)
        self._name = name
        self._qpos, self._qvel = qpos, qvel  # [M,nq], [M,nv] float64
        self._envs = [raw] + [_mujoco_env(make(name)) for _ in range(num_envs - 1)]
        self._horizon = horizon if horizon is not None else (int(limit) if limit else None)
        self._gen = torch.Generator()
        self._gen.manual_seed(int(seed))
        self._elapsed = np.zeros(num_envs, dtype=np.int64)  # [N] steps into the current episode
        self._start = np.zeros(num_envs, dtype=np.int64)  # [N] dataset row of the current episode

        space = raw.action_space
        self._action_dtype = space.dtype
        self._action_shape = (num_envs, int(np.prod(space.shape)))
        self.spec = EnvSpec(
            env_id=f"true:{name}",
            obs_shape=tuple(int(s) for s in raw.observation_space.shape),
            discrete=False,
            action_dim=self._action_shape[1],
            action_low=tuple(float(x) for x in np.broadcast_to(space.low, space.shape).ravel()),
            action_high=tuple(float(x) for x in np.broadcast_to(space.high, space.shape).ravel()),
            dt=float(raw.dt),
            max_episode_steps=self._horizon,
            backend="true",
        )

    @staticmethod
    def _check_rows(env_id: str, raw: Any, qpos: Any, qvel: Any) -> tuple[np.ndarray, np.ndarray]:
        """The dataset states as float64 ``[M,nq]``, ``[M,nv]`` arrays, checked against the env's model."""
        if not (hasattr(raw, "set_state") and hasattr(raw, "data") and hasattr(raw, "model")):
            raise UserInputError(f"env {env_id!r} is not a Gymnasium MuJoCo env: expected an id such as Hopper-v5 "
                                 f"whose simulator state is qpos and qvel.")
        model = raw.model
        qpos, qvel = _rows(qpos, "qpos"), _rows(qvel, "qvel")
        if qpos.shape[0] != qvel.shape[0]:
            raise UserInputError(f"qpos has {qpos.shape[0]} rows and qvel {qvel.shape[0]}: expected one qvel row per "
                                 f"qpos row (the same dataset rows).")
        if qpos.shape[1] != model.nq or qvel.shape[1] != model.nv:
            raise UserInputError(f"qpos/qvel rows have {qpos.shape[1]}/{qvel.shape[1]} elements: expected "
                                 f"nq={model.nq} and nv={model.nv} for env {env_id!r}.")
        return qpos, qvel

    # ---- the BatchedEnv protocol ---------------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """M: dataset rows start states are drawn from."""
        return int(self._qpos.shape[0])

    @property
    def start_rows(self) -> torch.Tensor:
        """``[N]`` int64: the dataset row each env's current episode started from."""
        return self._tensor(self._start.copy())

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every env from a freshly drawn dataset row; a ``seed`` re-seeds the row generator first."""
        if seed is not None:
            self._gen.manual_seed(int(seed))
        obs = self._begin(np.arange(self.num_envs))  # [N,O]
        self._elapsed[:] = 0
        return self._tensor(obs)

    def step(self, action: torch.Tensor) -> StepOut:
        """One step of every env; the envs whose episode ended start again from new dataset rows."""
        act = action_to_numpy(action, self.spec, self._action_shape, self._action_dtype)  # [N,A]
        n, o = self.num_envs, self.spec.obs_shape[0]
        obs = np.empty((n, o), dtype=np.float32)  # [N,O]
        reward = np.empty(n, dtype=np.float32)  # [N]
        terminated = np.empty(n, dtype=bool)  # [N]
        for i, env in enumerate(self._envs):
            ob, r, term, _, _ = env.step(act[i])
            obs[i], reward[i], terminated[i] = ob, r, term
        self._elapsed += 1
        elapsed = self._elapsed.copy()  # [N] steps of the episode this step belongs to
        start = self._start.copy()  # [N] its start row
        limit = self._horizon if self._horizon is not None else np.iinfo(np.int64).max
        truncated = (self._elapsed >= limit) & ~terminated  # [N]; terminated wins
        done = np.flatnonzero(terminated | truncated)
        final_obs = obs.copy()  # [N,O]
        if done.size:
            obs[done] = self._begin(done)
            self._elapsed[done] = 0
        return StepOut(
            obs=self._tensor(obs),
            reward=self._tensor(reward),
            terminated=self._tensor(terminated),
            truncated=self._tensor(truncated),
            final_obs=self._tensor(final_obs),
            info={"elapsed_step": self._tensor(elapsed), "start_row": self._tensor(start)},
        )

    def close(self) -> None:
        for env in self._envs:
            env.close()

    def _begin(self, ids: np.ndarray) -> np.ndarray:
        """Put envs ``ids`` in freshly drawn dataset states; their observations ``[len(ids),O]``."""
        mujoco = import_mujoco()
        rows = torch.randint(self.num_rows, (len(ids),), generator=self._gen).numpy()  # [len(ids)]
        out = np.empty((len(ids), self.spec.obs_shape[0]), dtype=np.float32)
        for k, (i, j) in enumerate(zip(ids, rows)):
            env = self._envs[i]
            mujoco.mj_resetData(env.model, env.data)  # as gymnasium's reset: no warm start or forces carried over
            env.set_state(self._qpos[j], self._qvel[j])  # mj_forward
            mujoco.mj_rnePostConstraint(env.model, env.data)  # contact forces of this state (Ant's observation)
            out[k] = env._get_obs()
            self._start[i] = j
        return out

    # ---- checkpointing (exact; see the module docstring) -----------------------------------------------------

    _SIM_FIELDS = ("qpos", "qvel", "act", "qacc_warmstart", "xpos", "xipos")

    def state_dict(self) -> dict[str, Any]:
        """Generator state, step counters, start rows and every env's simulator state (float64 tensors)."""
        sims = {f: torch.from_numpy(np.stack([np.array(getattr(e.data, f), dtype=np.float64) for e in self._envs]))
                for f in self._SIM_FIELDS}  # each [N,...]
        return {"env_id": self.spec.env_id, "generator": self._gen.get_state(),
                "elapsed_steps": torch.from_numpy(self._elapsed.copy()),
                "start_rows": torch.from_numpy(self._start.copy()),
                "time": torch.tensor([e.data.time for e in self._envs], dtype=torch.float64), **sims}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Continue exactly where ``state_dict()`` was taken (same env id and num_envs)."""
        if d.get("env_id") != self.spec.env_id:
            raise ValueError(f"state_dict is for env {d.get('env_id')!r}, not {self.spec.env_id!r}.")
        data0 = self._envs[0].data
        for f in self._SIM_FIELDS:
            want = (self.num_envs, *np.shape(getattr(data0, f)))
            if tuple(d[f].shape) != want:
                raise ValueError(f"state_dict holds {f} of shape {tuple(d[f].shape)}, expected {want} "
                                 f"(num_envs={self.num_envs}).")
        for f in ("elapsed_steps", "start_rows", "time"):
            if tuple(d[f].shape) != (self.num_envs,):
                raise ValueError(f"state_dict holds {f} of shape {tuple(d[f].shape)}, expected ({self.num_envs},).")
        rows = d["start_rows"].numpy()
        if rows.min() < 0 or rows.max() >= self.num_rows:
            raise ValueError(f"state_dict holds start rows outside this env's {self.num_rows} dataset rows.")
        gen = torch.Generator()
        gen.set_state(d["generator"])  # checked before anything changes
        mujoco = import_mujoco()
        for i, env in enumerate(self._envs):
            mujoco.mj_resetData(env.model, env.data)
            for f in ("qpos", "qvel", "act", "qacc_warmstart"):
                getattr(env.data, f)[:] = d[f][i].numpy()
            env.data.time = float(d["time"][i])
            mujoco.mj_forward(env.model, env.data)  # derived quantities of this state, with the saved warm start
            mujoco.mj_rnePostConstraint(env.model, env.data)
            env.data.xpos[:] = d["xpos"][i].numpy()  # the sub-step-old positions a step reads before simulating
            env.data.xipos[:] = d["xipos"][i].numpy()
        self._elapsed = d["elapsed_steps"].numpy().astype(np.int64, copy=True)
        self._start = rows.astype(np.int64, copy=True)
        self._gen = gen

    # ---- NumPy <-> torch boundary ------------------------------------------------------------------------------

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device)

    def __repr__(self) -> str:
        return (f"TrueDynamicsEnv({self._name!r}, rows={self.num_rows}, num_envs={self.num_envs}, "
                f"horizon={self._horizon}, device={str(self.device)!r})")


__all__ = ["TrueDynamicsEnv"]
