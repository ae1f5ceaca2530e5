"""The data and env side of the shim that runs the official NeuBay code (twni2016/neubay @ 5604bad) on ctrl_rl's data.

The fake ``d4rl`` package beside this file imports it; nothing here imports ctrl_rl or the official code.

* Envs: ``register()`` adds ``<task>-<level>-v5`` ids (task halfcheetah / hopper / walker2d; level random, medium,
  medium-replay, medium-expert, expert) to **gym 0.23's** registry, as ``import d4rl`` registers its ``-v2`` ids.
  ``gym.make(id)`` then gives gym 0.23's ``TimeLimit(OrderEnforcing(V5Env))`` with a 1000-step limit, where
  ``V5Env`` is the Gymnasium v5 task (``HalfCheetah-v5`` / ``Hopper-v5`` / ``Walker2d-v5``, default kwargs) behind
  gym 0.23's API: ``reset(seed=)`` returns the observation, ``step`` returns ``(obs, reward, terminated, info)``
  (truncation is left to gym's ``TimeLimit``, which sets ``info["TimeLimit.truncated"]`` as the official evaluator
  reads it). The spaces are gym 0.23 ``Box`` es (the official ``ActionRewardWrapper`` checks for them).
* ``env.get_dataset()``: the D4RL-layout HDF5 file of the id (``<id>.hdf5`` in ``$CTRL_RL_DATA_DIR``, else
  ``$XDG_CACHE_HOME/ctrl_rl/datasets``, else ``~/.cache/ctrl_rl/datasets``), or the file ``$NEUBAY_SHIM_DATASET``
  names; ``$NEUBAY_SHIM_MAX_ROWS`` keeps its first N rows (smoke runs). Keys observations, actions,
  next_observations, rewards, terminals, timeouts, as D4RL's ``get_dataset`` returns them.
* ``env.get_normalized_score(R) = (R - R_random) / (R_expert - R_random)`` (D4RL's, a fraction) with the local v5
  references ``reference_scores_v5.json`` (``$CTRL_RL_REFERENCE_SCORES`` overrides its path).
* ``env.set_state(qpos, qvel)``: the MuJoCo env's (the official ``OracleEnv``, a debugging aid, builds one env).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

TASK_ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
LEVELS = ("random", "medium", "medium-replay", "medium-expert", "expert")
KEYS = ("observations", "actions", "next_observations", "rewards", "terminals", "timeouts")


class ShimError(RuntimeError):
    """A missing dataset or reference file, or a name the shim does not know (one sentence)."""


def task_of(name: str) -> str:
    head = name.lower().split("/")[-1].split("-")[0]
    if head not in TASK_ENVS:
        raise ShimError(f"{name!r}: the shim knows the tasks {sorted(TASK_ENVS)} only")
    return head


def data_dir() -> Path:
    if os.environ.get("CTRL_RL_DATA_DIR"):
        return Path(os.environ["CTRL_RL_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "ctrl_rl" / "datasets"


def dataset_file(name: str) -> Path:
    override = os.environ.get("NEUBAY_SHIM_DATASET")
    path = Path(override).expanduser() if override else data_dir() / f"{name}.hdf5"
    if not path.is_file():
        raise ShimError(f"dataset {name!r}: no file {path}; expected a D4RL-layout HDF5 file written by "
                        "`ctrl-rl data generate` (or set CTRL_RL_DATA_DIR / NEUBAY_SHIM_DATASET)")
    return path


def load_dataset(name: str) -> dict[str, np.ndarray]:
    import h5py

    path = dataset_file(name)
    rows = int(os.environ.get("NEUBAY_SHIM_MAX_ROWS", "0") or 0)
    with h5py.File(path, "r") as f:
        missing = [k for k in KEYS if k not in f]
        if missing:
            raise ShimError(f"{path}: no {missing}; the official code needs D4RL's layout with next_observations "
                            "and timeouts")
        cut = slice(0, rows) if rows > 0 else slice(None)
        data = {k: f[k][cut] for k in KEYS}
    data["terminals"] = data["terminals"].astype(bool)
    data["timeouts"] = data["timeouts"].astype(bool)
    print(f"[shim] dataset {name}: {path} ({len(data['rewards'])} rows"
          f"{f', first {rows}' if rows > 0 else ''})", flush=True)
    return data


def references(task: str) -> tuple[float, float]:
    path = os.environ.get("CTRL_RL_REFERENCE_SCORES")
    if path:
        file = Path(path).expanduser()
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        file = Path(cache).expanduser() / "ctrl_rl" / "reference_scores_v5.json"
    if not file.is_file():
        raise ShimError(f"no reference scores at {file}: expected the JSON `ctrl-rl data generate` writes")
    s = json.loads(file.read_text())["scores"][task]
    return float(s["random"]), float(s["expert"])


def _make_v5_class():
    import gym
    import gymnasium
    from gym import spaces

    class V5Env(gym.Env):
        """A Gymnasium v5 MuJoCo task behind gym 0.23's API (see the module docstring)."""

        metadata = {"render_modes": []}

        def __init__(self, dataset_name: str):
            self.dataset_name = dataset_name
            self.task = task_of(dataset_name)
            # gym's TimeLimit (registered with max_episode_steps=1000) ends episodes; Gymnasium's own limit is off
            self._env = gymnasium.make(TASK_ENVS[self.task], max_episode_steps=None, disable_env_checker=True)
            o, a = self._env.observation_space, self._env.action_space
            self.observation_space = spaces.Box(low=o.low, high=o.high, dtype=np.float64)
            self.action_space = spaces.Box(low=a.low, high=a.high, dtype=np.float32)
            self._refs = None

        def reset(self, *, seed=None, return_info=False, options=None):
            obs, info = self._env.reset(seed=seed, options=options)
            return (obs, info) if return_info else obs

        def step(self, action):
            obs, reward, terminated, truncated, info = self._env.step(np.asarray(action))
            return obs, float(reward), bool(terminated), info

        def set_state(self, qpos, qvel):
            self._env.unwrapped.set_state(qpos, qvel)

        def get_dataset(self, **kwargs):
            return load_dataset(self.dataset_name)

        def get_normalized_score(self, score):
            if self._refs is None:
                self._refs = references(self.task)
            lo, hi = self._refs
            return (score - lo) / (hi - lo)

        def close(self):
            self._env.close()

    return V5Env


_V5 = None


def make_v5(dataset_name: str):
    global _V5
    if _V5 is None:
        _V5 = _make_v5_class()
    return _V5(dataset_name)


def register() -> None:
    """``<task>-<level>-v5`` ids in gym 0.23's registry (what ``import d4rl`` does for its -v2 ids)."""
    from gym.envs.registration import register as gym_register
    from gym.envs.registration import registry

    for task in TASK_ENVS:
        for level in LEVELS:
            name = f"{task}-{level}-v5"
            if name in getattr(registry, "env_specs", registry):
                continue
            gym_register(id=name, entry_point="neubay_shim:make_v5", max_episode_steps=1000,
                         kwargs={"dataset_name": name})
