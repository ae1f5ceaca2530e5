"""Minari datasets from a local ``MINARI_DATASETS_PATH``, read through the ``minari`` package.

Shape letters: T steps of one episode, S rows in all, K episodes, O obs dim, A action dim.

Layout (docs/guides/datasets.md#minari-layout): ``<root>/<dataset id>/data/`` holds ``metadata.json`` and
``main_data.hdf5``
(or Arrow files), one ``episode_<i>`` group per episode with ``observations`` of T+1 rows (the last is the
final observation) and ``actions``, ``rewards``, ``terminations``, ``truncations`` of T rows. Because the
final observation is stored, every transition has its true next observation and one view suffices:
``next_obs[t] = observations[t+1]``, ``terminated``/``truncated`` as recorded. Only flat ``Box``
observations (and ``Box`` or ``Discrete`` actions) are supported. Reading needs ``minari`` but not jax
(jax is only needed by minari's data collector, for writing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.d4rl import check_flags, check_numeric
from ctrl_rl.storage.datasets.offline import OfflineDataset, check_dims, check_finite

_META_KEYS = ("dataset_id", "total_episodes", "total_steps", "algorithm_name", "minari_version", "ref_min_score",
              "ref_max_score", "num_episodes_average_score", "code_permalink", "author", "description")


def datasets_root(root: str | Path | None = None) -> Path:
    """Where Minari keeps datasets: ``root``, else ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env).expanduser() if env else Path.home() / ".minari" / "datasets"


def is_minari_dataset(dataset_id: str, root: str | Path | None = None) -> bool:
    return (datasets_root(root) / dataset_id / "data").is_dir()


def minari_data_path(dataset_id: str, root: str | Path | None = None) -> Path:
    """``<root>/<dataset id>/data``, refused with one sentence when it is not there (nothing is downloaded)."""
    base = datasets_root(root)
    data_path = base / dataset_id / "data"
    if not data_path.is_dir():
        raise UserInputError(f"Minari dataset {dataset_id!r} is not under {base}: expected a directory "
                             f"{data_path} (set MINARI_DATASETS_PATH or download it with `minari download`)")
    return data_path


def minari_env_id(dataset_id: str, root: str | Path | None = None) -> str | None:
    """The id of the env spec a Minari dataset records (``metadata.json``'s ``env_spec``), read without the
    ``minari`` package; None when the dataset records no env spec."""
    path = minari_data_path(dataset_id, root) / "metadata.json"
    try:
        spec = json.loads(path.read_text()).get("env_spec")
        spec = json.loads(spec) if isinstance(spec, str) else spec
        env_id = spec.get("id") if isinstance(spec, dict) else None
    except (OSError, ValueError, AttributeError):  # unreadable metadata: load_minari says what is wrong
        return None
    return str(env_id) if env_id else None


def _import_minari():
    try:
        import minari
    except ImportError:
        raise UserInputError("reading Minari datasets needs the minari package: expected "
                             "`pip install 'ctrl-rl[offline]'`") from None
    return minari


def load_minari(dataset_id: str, root: str | Path | None = None, obs_dim: int | None = None,
                action_dim: int | None = None) -> OfflineDataset:
    """All episodes of a local Minari dataset as one OfflineDataset (no download is ever attempted)."""
    minari = _import_minari()
    data_path = minari_data_path(dataset_id, root)
    source = f"Minari dataset {dataset_id!r} at {data_path.parent}"
    try:
        if root is None:  # the package's own lookup (reads MINARI_DATASETS_PATH)
            dataset = minari.load_dataset(dataset_id)
        else:
            dataset = minari.MinariDataset(data_path)
        episodes = list(dataset.iterate_episodes())
        raw_meta = dict(dataset.storage.metadata)
    except UserInputError:
        raise
    except (ValueError, KeyError, OSError, AssertionError, TypeError) as e:
        raise UserInputError(f"{source} cannot be read by minari {minari.__version__} ({type(e).__name__}: {e}): "
                             f"expected a complete dataset in the Minari layout") from None
    import gymnasium as gym

    if not isinstance(dataset.observation_space, gym.spaces.Box) or len(dataset.observation_space.shape) != 1:
        raise UserInputError(f"{source} has observation space {dataset.observation_space}: expected a flat Box")
    discrete = isinstance(dataset.action_space, gym.spaces.Discrete)
    if not discrete and not isinstance(dataset.action_space, gym.spaces.Box):
        raise UserInputError(f"{source} has action space {dataset.action_space}: expected a Box or Discrete space")
    if not episodes:
        raise UserInputError(f"{source} holds no episodes: expected at least one")

    obs, nxt, act, rew, term, trunc, lengths = [], [], [], [], [], [], []
    for ep in episodes:
        o = np.asarray(ep.observations)  # [T+1,O]
        T = len(ep.rewards)
        sizes = {"actions": len(ep.actions), "terminations": len(ep.terminations), "truncations": len(ep.truncations)}
        if o.shape[0] != T + 1 or any(v != T for v in sizes.values()):
            raise UserInputError(f"{source}: episode {ep.id} has {o.shape[0]} observations, {T} rewards and "
                                 f"{sizes}: expected T+1 observations and T of everything else")
        obs.append(o[:-1])
        nxt.append(o[1:])
        act.append(np.asarray(ep.actions))
        rew.append(np.asarray(ep.rewards))
        term.append(np.asarray(ep.terminations))
        trunc.append(np.asarray(ep.truncations))
        lengths.append(T)
    arrays = {"observations": np.concatenate(obs), "next_observations": np.concatenate(nxt),
              "actions": np.concatenate(act), "rewards": np.concatenate(rew)}
    flags = {"terminations": np.concatenate(term), "truncations": np.concatenate(trunc)}
    if arrays["rewards"].shape[0] == 0:
        k = len(episodes)
        raise UserInputError(f"{source} holds {k} episode{'s' if k != 1 else ''} of no steps: expected at least "
                             f"one step")
    check_numeric(source, {**arrays, **flags})
    check_flags(source, flags)
    check_dims(source, arrays["observations"], arrays["actions"], obs_dim, None if discrete else action_dim,
               discrete=discrete)
    if isinstance(dataset.action_space, gym.spaces.Discrete) and action_dim is not None \
            and int(dataset.action_space.n) != action_dim:
        raise UserInputError(f"{source} has {dataset.action_space.n} discrete actions: "
                             f"expected {action_dim} for this env")
    check_finite(source, arrays)
    t = torch.from_numpy
    action = t(arrays["actions"].astype(np.int64)) if discrete else t(arrays["actions"].astype(np.float32))
    metadata: dict[str, Any] = {k: _plain(raw_meta[k]) for k in _META_KEYS if k in raw_meta}
    env_spec = dataset.env_spec
    metadata.update(source=source, format="minari", view="episodes", env_id=env_spec.id if env_spec else None)
    if raw_meta.get("ref_min_score") is not None and raw_meta.get("ref_max_score") is not None:
        metadata["ref_scores"] = {"random": float(raw_meta["ref_min_score"]),
                                  "expert": float(raw_meta["ref_max_score"]),
                                  "source": f"Minari metadata of {dataset_id}"}
    n = sum(lengths)
    return OfflineDataset(
        obs=t(arrays["observations"].astype(np.float32)), action=action,
        reward=t(arrays["rewards"].astype(np.float32)), next_obs=t(arrays["next_observations"].astype(np.float32)),
        terminated=t(flags["terminations"].astype(bool)), truncated=t(flags["truncations"].astype(bool)),
        episode_offsets=t(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
        next_obs_valid=torch.ones(n, dtype=torch.bool), metadata=metadata,
    )


def _plain(value: Any) -> Any:
    """JSON-friendly form of a metadata value (minari turns author lists into sets)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, np.generic):
        return value.item()
    return value
