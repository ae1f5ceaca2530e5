"""The data and env side of the shim that runs the official RAVL code (anyasims/edge-of-reach) on ctrl_rl's data.

The fake ``d4rl``, ``gym`` and ``wandb`` packages beside this file import it; nothing here imports ctrl_rl.

* Datasets: a name such as ``halfcheetah-medium-v5`` is the D4RL-layout HDF5 file ``<name>.hdf5`` in
  ``$CTRL_RL_DATA_DIR``, else ``$XDG_CACHE_HOME/ctrl_rl/datasets``, else ``~/.cache/ctrl_rl/datasets`` (where
  ``ctrl-rl data generate`` writes them). ``qlearning_dataset`` is ``d4rl.qlearning_dataset`` (D4RL 1.1) for
  files with ``timeouts``: rows ``0..N-2`` that are not time-outs, next observation ``observations[i+1]``,
  ``terminals`` as the done flag. ``$RAVL_SHIM_EXCLUDE_ROWS`` (a ``.npy`` of row indices of that view) drops rows,
  so that a holdout set shared with ctrl_rl stays unseen (``run.py --holdout-rows``); ``$RAVL_SHIM_MAX_ROWS`` then
  keeps the first N rows only (smoke runs on a slow machine: ``run.py --max-rows``).
* Envs: the Gymnasium v5 task of the dataset (``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``, default kwargs,
  1000-step limit) behind gym 0.23's API: ``reset()`` returns the observation, ``step`` returns
  ``(obs, reward, terminated or truncated, info)`` with ``info["TimeLimit.truncated"]`` as gym's TimeLimit sets it.
* Scores: ``get_normalized_score(R) = (R - R_random) / (R_expert - R_random)`` (D4RL's, a fraction) with the
  local v5 references ``reference_scores_v5.json`` (``$CTRL_RL_REFERENCE_SCORES`` overrides its path), or
  D4RL's v2 constants with ``RAVL_SHIM_REFS=d4rl``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

TASK_ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
# D4RL's reference returns (d4rl/infos.py; every -v2 gym-mujoco dataset uses the -random-v0 values)
D4RL_REFERENCES = {"halfcheetah": (-280.178953, 12135.0), "hopper": (-20.272305, 3234.3),
                   "walker2d": (1.629008, 4592.3)}


class ShimError(RuntimeError):
    """A missing dataset or reference file, or a name the shim does not know (one sentence)."""


def task_of(name: str) -> str | None:
    """``halfcheetah-medium-v5`` / ``HalfCheetah-v5`` -> ``halfcheetah``; None for other names."""
    head = name.lower().split("/")[-1].split("-")[0]
    return head if head in TASK_ENVS else None


def data_dir() -> Path:
    if os.environ.get("CTRL_RL_DATA_DIR"):
        return Path(os.environ["CTRL_RL_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "ctrl_rl" / "datasets"


def dataset_file(name: str) -> Path:
    path = Path(name).expanduser() if name.endswith(".hdf5") else data_dir() / f"{name}.hdf5"
    if not path.is_file():
        raise ShimError(f"dataset {name!r}: no file {path}; expected a D4RL-layout HDF5 file written by "
                        f"`ctrl-rl data generate` (or set CTRL_RL_DATA_DIR)")
    return path


def references(task: str) -> tuple[float, float, str]:
    """``(R_random, R_expert, source)`` of a task, from the table ``$RAVL_SHIM_REFS`` names (local or d4rl)."""
    which = os.environ.get("RAVL_SHIM_REFS", "local")
    if which == "d4rl":
        lo, hi = D4RL_REFERENCES[task]
        return lo, hi, "D4RL v2 reference returns (d4rl/infos.py)"
    if which != "local":
        raise ShimError(f"RAVL_SHIM_REFS={which!r}: expected 'local' or 'd4rl'")
    path = os.environ.get("CTRL_RL_REFERENCE_SCORES")
    if path:
        file = Path(path).expanduser()
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        file = Path(cache).expanduser() / "ctrl_rl" / "reference_scores_v5.json"
    if not file.is_file():
        raise ShimError(f"no reference scores at {file}: expected the JSON `ctrl-rl data generate` writes, or "
                        f"RAVL_SHIM_REFS=d4rl")
    record = json.loads(file.read_text())
    s = record["scores"][task]
    return float(s["random"]), float(s["expert"]), f"{record.get('source', 'local references')} [{file}]"


def read_file(path: Path) -> dict[str, np.ndarray]:
    """The root arrays of a D4RL-layout file that ``qlearning_dataset`` reads (what ``env.get_dataset()`` gives)."""
    import h5py

    with h5py.File(path, "r") as f:
        out = {k: f[k][()] for k in ("observations", "actions", "rewards", "terminals", "timeouts") if k in f}
    if "timeouts" not in out:
        raise ShimError(f"{path} has no 'timeouts': expected a D4RL-layout file with time-out flags")
    return out


def qlearning_rows(dataset: dict[str, np.ndarray], terminate_on_end: bool = False) -> np.ndarray:
    """Rows ``d4rl.qlearning_dataset`` keeps (files with ``timeouts``): ``0..N-2`` less time-outs unless
    ``terminate_on_end``."""
    n = dataset["rewards"].shape[0]
    timeouts = dataset["timeouts"][: n - 1].astype(bool)
    return np.arange(n - 1) if terminate_on_end else np.flatnonzero(~timeouts)


def qlearning_dataset(env=None, dataset: dict | None = None, terminate_on_end: bool = False, **kwargs) -> dict:
    """``d4rl.qlearning_dataset`` on the env's file: observations, actions, next_observations (float32),
    rewards (float32), terminals (bool), one row per kept transition, less ``$RAVL_SHIM_EXCLUDE_ROWS``, at most
    ``$RAVL_SHIM_MAX_ROWS``."""
    if dataset is None:
        if env is None:
            raise ShimError("qlearning_dataset needs an env made from a dataset name or a dataset dict")
        dataset = env.get_dataset(**kwargs)
    rows = qlearning_rows(dataset, terminate_on_end)
    exclude = os.environ.get("RAVL_SHIM_EXCLUDE_ROWS")
    if exclude:
        drop = np.load(exclude)
        keep = np.ones(rows.size, dtype=bool)
        keep[drop] = False
        rows = rows[keep]
        print(f"[shim] {drop.size} rows of the qlearning view held out ({exclude}): {rows.size} rows left")
    cap = os.environ.get("RAVL_SHIM_MAX_ROWS")
    if cap:
        rows = rows[: int(cap)]
        print(f"[shim] the first {rows.size} rows kept (RAVL_SHIM_MAX_ROWS)")
    obs = dataset["observations"]
    return {"observations": obs[rows].astype(np.float32), "actions": dataset["actions"][rows].astype(np.float32),
            "next_observations": obs[rows + 1].astype(np.float32),
            "rewards": dataset["rewards"][rows].astype(np.float32),
            "terminals": dataset["terminals"][rows].astype(bool)}


class GymEnv:
    """A Gymnasium v5 env behind gym 0.23's ``reset``/``step`` (see the module docstring), with D4RL's
    ``get_dataset`` and ``get_normalized_score`` when it was made from a dataset name."""

    def __init__(self, name: str, **kwargs):
        import gymnasium

        task = task_of(name)
        env_id = TASK_ENVS[task] if task is not None and not name.startswith(TASK_ENVS[task]) else name
        self.dataset_name = name if env_id != name else None
        self.task = task
        self._env = gymnasium.make(env_id, **kwargs)
        self.env_id = env_id
        self.observation_space = self._env.observation_space
        self.action_space = self._env.action_space
        self.spec = self._env.spec
        self._max_episode_steps = self.spec.max_episode_steps if self.spec is not None else None

    def reset(self, seed: int | None = None, return_info: bool = False, options: dict | None = None):
        obs, info = self._env.reset(seed=seed, options=options)
        return (obs, info) if return_info else obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self._env.step(action)
        if truncated and not terminated:
            info["TimeLimit.truncated"] = True
        return obs, float(reward), bool(terminated or truncated), info

    def seed(self, seed: int | None = None):
        self._env.reset(seed=seed)
        return [seed]

    def close(self) -> None:
        self._env.close()

    def get_dataset(self, **kwargs) -> dict[str, np.ndarray]:
        if self.dataset_name is None:
            raise ShimError(f"env {self.env_id!r} was not made from a dataset name: expected e.g. "
                            f"'{(self.task or 'hopper')}-medium-v5'")
        return read_file(dataset_file(self.dataset_name))

    def get_normalized_score(self, score):
        if self.task is None:
            raise ShimError(f"no reference scores for {self.env_id!r}")
        lo, hi, _ = references(self.task)
        return (score - lo) / (hi - lo)

    def __getattr__(self, name: str):
        if name == "_env":  # not set yet (__init__ failed): no recursion
            raise AttributeError(name)
        return getattr(self._env, name)
