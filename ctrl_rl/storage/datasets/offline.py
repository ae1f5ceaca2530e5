"""OfflineDataset: one flat table of transitions with episode boundaries, shared by every loader.

Shape letters: S transitions (rows), K episodes, O obs dim, A action dim.

Observations are ``Obs`` (``ctrl_rl.core.obs``): a float32 ``[S,O]`` tensor, or for datasets recorded
from envs with several observation parts a dict of ``[S,*part.shape]`` tensors (images uint8).

Every loader (D4RL HDF5, Minari, ctrl_rl's own files) ends in the same place: an ``OfflineDataset`` of CPU
tensors, validated once by the helpers below so that a broken file gives one sentence naming the file and
what was expected (``UserInputError``), never a deep traceback. ``to_replay`` copies the rows into a
device-resident ``ReplayBuffer``. Loading runs once per run, so NumPy is used freely here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ctrl_rl.core.obs import Obs, ObsPart, is_flat, obs_batch_size, obs_index, obs_to, parts_from_shape, state_shape
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.replay import ReplayBuffer


@dataclass
class OfflineDataset:
    """Transitions of a dataset in file order, plus where each episode starts and ends.

    Episode ``k`` is rows ``episode_offsets[k]:episode_offsets[k+1]``. ``terminated`` is the true env
    termination and ``truncated`` the time limit, kept apart. ``next_obs_valid`` is False on rows whose
    next observation the file does not hold (last step of an episode in a D4RL file without
    ``next_observations``); ``next_obs`` there is a copy of ``obs`` and ``to_replay`` drops the row.
    """

    obs: Obs  # [S,O] float32, or a dict of parts [S,*part.shape] (images uint8)
    action: torch.Tensor  # [S,A] float32 ([S] int64 for a discrete action space)
    reward: torch.Tensor  # [S] float32
    next_obs: Obs  # [S,O] float32, or a dict with the parts of obs
    terminated: torch.Tensor  # [S] bool
    truncated: torch.Tensor  # [S] bool
    episode_offsets: torch.Tensor  # [K+1] int64, first 0 and last S
    next_obs_valid: torch.Tensor  # [S] bool
    infos: dict[str, torch.Tensor] = field(default_factory=dict)  # per-row extras, e.g. "qpos" [S,nq]
    metadata: dict[str, Any] = field(default_factory=dict)  # source, format, view, env id, references...

    def __post_init__(self):
        S = obs_batch_size(self.obs)
        if isinstance(self.obs, dict):
            assert isinstance(self.next_obs, dict) and sorted(self.next_obs) == sorted(self.obs), \
                f"next_obs has parts {list(self.next_obs) if isinstance(self.next_obs, dict) else 'none'}, " \
                f"obs {list(self.obs)}"
            for k, v in (*self.obs.items(), *self.next_obs.items()):
                assert v.shape[0] == S, f"observation part {k!r} has {v.shape[0]} rows, obs {S}"
        else:
            assert isinstance(self.next_obs, torch.Tensor), "next_obs is a dict of parts but obs a tensor"
        for name in ("action", "reward", "next_obs", "terminated", "truncated", "next_obs_valid"):
            rows = obs_batch_size(getattr(self, name))
            assert rows == S, f"{name} has {rows} rows, obs {S}"
        assert self.episode_offsets.ndim == 1 and int(self.episode_offsets[0]) == 0
        assert int(self.episode_offsets[-1]) == S

    def __len__(self) -> int:
        return obs_batch_size(self.obs)

    @property
    def num_episodes(self) -> int:
        return self.episode_offsets.numel() - 1

    @property
    def obs_parts(self) -> tuple[ObsPart, ...]:
        """The observation's parts as stored: the flat ``state`` part, or one per dict entry."""
        if isinstance(self.obs, torch.Tensor):
            return parts_from_shape(self.obs.shape[1:])
        return tuple(ObsPart(k, tuple(v.shape[1:]), v.dtype) for k, v in self.obs.items())

    @property
    def obs_dim(self) -> int:
        """O for flat observations; with several parts the width of the ``state`` part (0 without one)."""
        if isinstance(self.obs, torch.Tensor):
            return self.obs.shape[1]
        state = self.obs.get("state")
        return 0 if state is None else state.shape[1:].numel()

    @property
    def action_dim(self) -> int:
        return self.action.shape[1] if self.action.ndim == 2 else 1

    def episode_ids(self) -> torch.Tensor:
        """Episode index of every row: ``[S]`` int64."""
        lengths = self.episode_offsets.diff()  # [K]
        return torch.repeat_interleave(torch.arange(lengths.numel()), lengths)  # [S]

    def episode_returns(self) -> torch.Tensor:
        """Undiscounted return of every episode (sum of the rows this view kept): ``[K]`` float64."""
        out = torch.zeros(self.num_episodes, dtype=torch.float64)  # [K]
        return out.index_add_(0, self.episode_ids(), self.reward.double())


def to_replay(dataset: OfflineDataset, device: torch.device | str = "cpu", capacity: int | None = None) -> ReplayBuffer:
    """A ``ReplayBuffer`` on ``device`` holding every row of ``dataset`` whose next observation is known.

    ``capacity`` defaults to exactly the number of rows, so nothing is overwritten.
    """
    keep = dataset.next_obs_valid.nonzero().squeeze(1)  # [S']
    n = keep.numel()
    if n == 0:
        raise UserInputError(f"dataset {dataset.metadata.get('source', '?')} has no usable transitions: "
                             "expected at least one row")
    capacity = n if capacity is None else capacity
    if capacity < n:
        raise UserInputError(f"replay capacity {capacity} is smaller than the dataset's {n} transitions: "
                             f"expected at least {n}")
    discrete = dataset.action.ndim == 1
    parts = dataset.obs_parts
    obs_parts = () if is_flat(parts) else parts  # flat data: the buffer exactly as before parts existed
    buf = ReplayBuffer(capacity, state_shape(parts), dataset.action_dim, device=device, discrete=discrete,
                       obs_parts=obs_parts)
    dev = buf.device

    def rows(o: Obs) -> Obs:  # a dict holding only a float32 "state" part goes in as the flat tensor
        o = o["state"] if isinstance(o, dict) and not obs_parts else o
        return obs_to(obs_index(o, keep), dev)

    buf.add(rows(dataset.obs), dataset.action[keep].to(dev), dataset.reward[keep].to(dev),
            rows(dataset.next_obs), dataset.terminated[keep].to(dev), dataset.truncated[keep].to(dev))
    return buf


# ----- validation shared by the loaders (one sentence per failure, naming the file) -----

def check_lengths(source: str, arrays: Mapping[str, np.ndarray], reference: str = "observations") -> int:
    """All arrays have the row count of ``arrays[reference]``; returns it."""
    n = arrays[reference].shape[0]
    for key, arr in arrays.items():
        if arr.shape[0] != n:
            raise UserInputError(f"{source}: '{key}' has {arr.shape[0]} rows but '{reference}' has {n}: "
                                 f"expected one row per step in every key")
    return n


def check_finite(source: str, arrays: Mapping[str, np.ndarray]) -> None:
    """No NaN or inf in any floating-point array."""
    for key, arr in arrays.items():
        if not np.issubdtype(arr.dtype, np.floating):
            continue
        bad = ~np.isfinite(arr)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise UserInputError(f"{source}: '{key}' holds {int(bad.sum())} NaN or inf values (first at row {row}): "
                                 f"expected finite numbers")


def check_dims(source: str, obs: np.ndarray, action: np.ndarray, obs_dim: int | None, action_dim: int | None,
               discrete: bool = False) -> None:
    """Observations are ``[N,O]`` and actions ``[N,A]`` (``[N]`` discrete), matching the env when given."""
    if obs.ndim != 2:
        raise UserInputError(f"{source}: observations have shape {obs.shape}: expected a 2-D array [steps, obs_dim]")
    if obs_dim is not None and obs.shape[1] != obs_dim:
        raise UserInputError(f"{source}: observations have dim {obs.shape[1]}: expected {obs_dim} for this env")
    if discrete:
        if action.ndim != 1:
            raise UserInputError(f"{source}: discrete actions have shape {action.shape}: expected a 1-D array [steps]")
        return
    if action.ndim != 2:
        raise UserInputError(f"{source}: actions have shape {action.shape}: expected a 2-D array [steps, action_dim]")
    if action_dim is not None and action.shape[1] != action_dim:
        raise UserInputError(f"{source}: actions have dim {action.shape[1]}: expected {action_dim} for this env")


def offsets_from_ends(ends: np.ndarray) -> np.ndarray:
    """Episode offsets ``[K+1]`` from a per-row "episode ends here" flag ``[N]``; a trailing unfinished
    episode counts as one."""
    n = ends.shape[0]
    stops = np.flatnonzero(ends) + 1  # [K'] exclusive ends
    if stops.size == 0 or stops[-1] != n:
        stops = np.append(stops, n)
    return np.concatenate([[0], stops]).astype(np.int64) if n else np.zeros(1, dtype=np.int64)
