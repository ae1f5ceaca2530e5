"""D4RL HDF5 files: reading, validation, and the two views (``qlearning`` and ``trajectory``).

Shape letters: N rows in the file, S rows kept by a view, K episodes, O obs dim, A action dim.

Layout (docs/guides/datasets.md#d4rl-hdf5-layout): flat arrays of N rows at the root (``observations``, ``actions``,
``rewards``,
``terminals``, ``timeouts``, optional ``next_observations``), per-row extras under ``infos/`` (``qpos``,
``qvel``, ``action_log_probs``), and the behaviour policy and scalars under ``metadata/``.

Views:

* ``qlearning`` reproduces ``d4rl.qlearning_dataset`` (D4RL 1.1, ``d4rl/__init__.py``) row for row,
  quirks included: it walks rows ``0..N-2`` (the last row of the file is always dropped); the next
  observation is always ``observations[i+1]``, never the stored ``next_observations``, so a terminal row's
  next observation is the first observation of the following episode; rows with ``timeouts[i]`` are
  dropped unless ``terminate_on_end``, and when kept their done flag stays ``terminals[i]`` (their next
  observation is again the next episode's start). Files without ``timeouts`` use d4rl's step counter
  with ``max_episode_steps``, including its off-by-one: after a kept episode end the counter restarts at
  1, not 0, so later episodes are cut one step early.
* ``trajectory`` keeps every row and whole episodes: an episode ends where ``terminals | timeouts``;
  ``terminated = terminals`` and ``truncated = timeouts``; the next observation is the stored
  ``next_observations`` when present, else the following row inside the episode (unknown at an
  episode's end: ``next_obs_valid`` False). Without ``timeouts`` an episode is cut after
  ``max_episode_steps`` steps (the correct count; d4rl's ``sequence_dataset`` has the counter off-by-one
  described above).

``get_dataset`` in d4rl squeezes ``actions``; here 1-D actions become ``[N,1]`` instead, so the action
dimension is never lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.offline import OfflineDataset, check_dims, check_finite, check_lengths, offsets_from_ends

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")
FLAG_KEYS = ("terminals", "timeouts")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

View = Literal["qlearning", "trajectory"]


@dataclass
class D4RLFile:
    """The arrays of one D4RL-layout file, validated; ``timeouts``/``next_observations`` may be None."""

    path: str
    observations: np.ndarray  # [N,O] float32
    actions: np.ndarray  # [N,A] float32
    rewards: np.ndarray  # [N] float32
    terminals: np.ndarray  # [N] bool
    timeouts: np.ndarray | None  # [N] bool
    next_observations: np.ndarray | None  # [N,O] float32
    infos: dict[str, np.ndarray] = field(default_factory=dict)  # "infos/qpos" -> [N,nq], ...
    metadata: dict[str, Any] = field(default_factory=dict)  # scalars under metadata/ (algorithm, iteration...)
    attrs: dict[str, Any] = field(default_factory=dict)  # root attributes (ctrl_rl's own record lives here)

    def __len__(self) -> int:
        return self.observations.shape[0]


def has_hdf5_signature(path: Path) -> bool:
    """True when the HDF5 superblock signature sits at byte 0, 512, 1024, 2048, ... (a user block may precede it)."""
    size, offset = path.stat().st_size, 0
    with open(path, "rb") as f:
        while offset + 8 <= size:
            f.seek(offset)
            if f.read(8) == _HDF5_SIGNATURE:
                return True
            offset = 512 if offset == 0 else 2 * offset
    return False


def open_hdf5(path: str | Path, what: str = "D4RL-layout .hdf5 file"):
    """``h5py.File(path, 'r')``, or a UserInputError saying whether the path is missing, not HDF5, or damaged."""
    try:
        import h5py
    except ImportError:
        raise UserInputError("reading HDF5 datasets needs h5py: expected `pip install 'ctrl-rl[offline]'`") from None
    p = Path(path).expanduser()
    if not p.exists():
        raise UserInputError(f"dataset file {p} does not exist: expected a {what}")
    if not p.is_file():
        raise UserInputError(f"dataset path {p} is not a file: expected a {what}")
    try:
        return h5py.File(p, "r")
    except OSError as e:
        if has_hdf5_signature(p):
            reason = str(e).split("(", 1)[-1].rstrip(")") if "(" in str(e) else str(e)
            raise UserInputError(f"{p} is a truncated or damaged HDF5 file ({reason}): expected a complete {what}, "
                                 f"so download or write it again") from None
        raise UserInputError(f"{p} is not an HDF5 file: expected a {what}") from None


def _scalar(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


_KIND_NAMES = {"S": "byte strings", "U": "strings", "O": "Python objects", "c": "complex numbers", "V": "raw records",
               "M": "dates", "m": "time spans"}  # numpy dtype kinds that are not numbers


def check_numeric(source: str, arrays: dict[str, np.ndarray]) -> None:
    """Every array holds numbers or booleans (not strings, bytes or Python objects, which ``float32`` casts would
    either refuse deep inside or, for numeric strings, silently parse)."""
    for key, arr in arrays.items():
        dtype = np.asarray(arr).dtype
        if dtype.kind not in "biuf":
            raise UserInputError(f"{source}: '{key}' has dtype {dtype} ({_KIND_NAMES.get(dtype.kind, 'not numbers')}): "
                                 f"expected numbers (float or integer) or booleans")


def check_flags(source: str, arrays: dict[str, np.ndarray]) -> None:
    """Episode flags (terminals, timeouts, terminations, truncations) are booleans or exactly 0/1: a NaN or any
    other number would otherwise count as True when cast to bool."""
    for key, arr in arrays.items():
        arr = np.asarray(arr)
        if arr.dtype == np.bool_:
            continue
        bad = ~((arr == 0) | (arr == 1))  # NaN compares unequal to both
        if bad.any():
            first = tuple(np.argwhere(bad)[0])
            raise UserInputError(f"{source}: '{key}' holds {int(bad.sum())} values other than 0 and 1 (first "
                                 f"{arr[first].item()!r} at row {int(first[0])}): expected one flag per step, "
                                 f"bool or 0/1")


def read_d4rl(path: str | Path, obs_dim: int | None = None, action_dim: int | None = None) -> D4RLFile:
    """Read and validate every row array of a D4RL-layout file (the keys ``env.get_dataset()`` returns)."""
    import h5py

    source = str(Path(path).expanduser())
    rows: dict[str, np.ndarray] = {}
    metadata: dict[str, Any] = {}
    with open_hdf5(path) as f:
        attrs = {k: _scalar(v) for k, v in f.attrs.items()}
        datasets: list[tuple[str, h5py.Dataset]] = []
        f.visititems(lambda name, item: datasets.append((name, item)) if isinstance(item, h5py.Dataset) else None)
        for name, dataset in datasets:
            try:
                value = dataset[()]
            except (OSError, RuntimeError) as e:
                raise UserInputError(f"{source}: dataset '{name}' cannot be read ({e}): expected a complete HDF5 "
                                     f"file, so the file is probably truncated") from None
            if name.startswith("metadata/"):
                if np.ndim(value) == 0:
                    metadata[name[len("metadata/"):]] = _scalar(value)
            elif np.ndim(value) == 0:
                metadata[name] = _scalar(value)
            else:
                rows[name] = value
    missing = [k for k in REQUIRED_KEYS if k not in rows]
    if missing:
        raise UserInputError(f"{source} has no '{missing[0]}' dataset: expected a D4RL-layout file with the keys "
                             f"{', '.join(REQUIRED_KEYS)} (and timeouts)")
    used = (*REQUIRED_KEYS, "timeouts", "next_observations")
    check_numeric(source, {k: v for k, v in rows.items() if k in used or k.startswith("infos/")})
    for key in ("rewards", "terminals", "timeouts"):  # d4rl accepts [N,1] here
        if key in rows and rows[key].ndim == 2 and rows[key].shape[1] == 1:
            rows[key] = rows[key][:, 0]
        if key in rows and rows[key].ndim != 1:
            raise UserInputError(f"{source}: '{key}' has shape {rows[key].shape}: expected one value per step, [N]")
    if rows["actions"].ndim == 1:
        rows["actions"] = rows["actions"][:, None]
    n = check_lengths(source, rows)
    if n == 0:
        raise UserInputError(f"{source} holds no steps: expected at least one row in 'observations'")
    check_dims(source, rows["observations"], rows["actions"], obs_dim, action_dim)
    if "next_observations" in rows and rows["next_observations"].shape != rows["observations"].shape:
        raise UserInputError(f"{source}: 'next_observations' has shape {rows['next_observations'].shape}: expected "
                             f"the shape of 'observations', {rows['observations'].shape}")
    check_finite(source, {k: rows[k] for k in ("observations", "actions", "rewards", "next_observations") if k in rows})
    check_flags(source, {k: rows[k] for k in FLAG_KEYS if k in rows})

    def get(key: str, dtype: type) -> np.ndarray:  # d4rl casts to float32 too
        return rows[key].astype(dtype, copy=False)

    def get_optional(key: str, dtype: type) -> np.ndarray | None:
        return get(key, dtype) if key in rows else None

    return D4RLFile(source, get("observations", np.float32), get("actions", np.float32), get("rewards", np.float32),
                    get("terminals", bool), get_optional("timeouts", bool),
                    get_optional("next_observations", np.float32),
                    infos={k: v for k, v in rows.items() if k.startswith("infos/")}, metadata=metadata, attrs=attrs)


# ----- the qlearning view: d4rl.qlearning_dataset, exactly -----

def qlearning_rows(terminals: np.ndarray, timeouts: np.ndarray | None, terminate_on_end: bool = False,
                   max_episode_steps: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which rows ``d4rl.qlearning_dataset`` keeps: ``(rows [S] int64, final [S] bool, ends [N] bool)``.

    ``final`` is d4rl's ``final_timestep`` of each kept row (a time-limit end; True only with
    ``terminate_on_end``); ``ends`` marks every row where d4rl's walk sees an episode end (for grouping).
    """
    n = terminals.shape[0]
    if timeouts is not None:  # "use_timeouts": final_timestep = timeouts[i]
        final_all = timeouts[: max(n - 1, 0)]
        keep = np.ones_like(final_all) if terminate_on_end else ~final_all  # [N-1]
        rows = np.flatnonzero(keep)
        return rows.astype(np.int64), final_all[rows], terminals | timeouts
    if max_episode_steps is None:
        raise ValueError("a file without 'timeouts' needs max_episode_steps")
    # d4rl's step counter, reproduced literally (including the restart at 1 after a kept episode end)
    rows_l, final_l, ends = [], [], np.zeros(n, dtype=bool)
    term = terminals.tolist()
    step = 0
    for i in range(n - 1):
        final = step == max_episode_steps - 1
        if final and not terminate_on_end:
            ends[i] = True
            step = 0
            continue
        if term[i] or final:
            ends[i] = True
            step = 0
        rows_l.append(i)
        final_l.append(final)
        step += 1
    ends[n - 1] = True
    return np.asarray(rows_l, dtype=np.int64), np.asarray(final_l, dtype=bool), ends


def _offsets_of_rows(rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Offsets ``[K+1]`` grouping the kept ``rows`` by the episode each came from."""
    episode = np.cumsum(ends) - ends  # [N] episode number of each file row
    kept = episode[rows]  # [S]
    starts = np.flatnonzero(np.diff(kept)) + 1
    return np.concatenate([[0], starts, [rows.size]]).astype(np.int64) if rows.size else np.zeros(1, dtype=np.int64)


def qlearning_view(f: D4RLFile, terminate_on_end: bool = False, max_episode_steps: int | None = None) -> OfflineDataset:
    """The transitions ``d4rl.qlearning_dataset(env, dataset, terminate_on_end)`` returns, as an OfflineDataset."""
    if f.timeouts is None and max_episode_steps is None:
        raise UserInputError(f"{f.path} has no 'timeouts' dataset: expected max_episode_steps (the env's time limit) "
                             f"to find episode ends as d4rl does")
    rows, final, ends = qlearning_rows(f.terminals, f.timeouts, terminate_on_end, max_episode_steps)
    if rows.size == 0:
        n = len(f)
        if n == 1:
            why = "a file's last row is always dropped"
        elif f.timeouts is not None:
            why = f"its {n - 1} rows before the last are all time-outs, which are dropped"
        else:
            why = f"its {n - 1} rows before the last all reach max_episode_steps={max_episode_steps}, which are dropped"
        raise UserInputError(f"{f.path}: the qlearning view (d4rl.qlearning_dataset) keeps none of its {n} "
                             f"row{'s' if n != 1 else ''} ({why}): expected at least one row before the last that is "
                             f"not a time-out (the trajectory view keeps every row)")
    t = torch.from_numpy
    return OfflineDataset(
        obs=t(f.observations[rows]), action=t(f.actions[rows]), reward=t(f.rewards[rows]),
        next_obs=t(f.observations[rows + 1]),  # d4rl: always the following row
        terminated=t(f.terminals[rows]), truncated=t(final.astype(bool)),
        episode_offsets=t(_offsets_of_rows(rows, ends)), next_obs_valid=torch.ones(rows.size, dtype=torch.bool),
        infos={k.split("/", 1)[1]: t(np.ascontiguousarray(v[rows])) for k, v in f.infos.items()},
        metadata={"source": f.path, "view": "qlearning", "terminate_on_end": terminate_on_end,
                  "file_rows": len(f), "d4rl_metadata": dict(f.metadata)},
    )


# ----- the trajectory view: every row, whole episodes -----

def episode_ends(terminals: np.ndarray, timeouts: np.ndarray | None,
                 max_episode_steps: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(ends [N], truncated [N])``: where episodes end and which ends are time limits."""
    if timeouts is not None:
        return terminals | timeouts, timeouts.copy()
    if max_episode_steps is None:
        raise ValueError("a file without 'timeouts' needs max_episode_steps")
    truncated = np.zeros_like(terminals)
    step = 0
    for i, term in enumerate(terminals.tolist()):
        step += 1
        if term:
            step = 0
        elif step == max_episode_steps:
            truncated[i], step = True, 0
    return terminals | truncated, truncated


def trajectory_view(f: D4RLFile, max_episode_steps: int | None = None) -> OfflineDataset:
    """Every row of the file, grouped into whole episodes; terminals and timeouts kept apart."""
    if f.timeouts is None and max_episode_steps is None:
        raise UserInputError(f"{f.path} has no 'timeouts' dataset: expected max_episode_steps (the env's time limit) "
                             f"to find where episodes end")
    ends, truncated = episode_ends(f.terminals, f.timeouts, max_episode_steps)
    n = len(f)
    if f.next_observations is not None:
        next_obs, valid = f.next_observations, np.ones(n, dtype=bool)
    else:
        valid = ~ends  # [N] the following row is in the same episode
        valid[-1] = False
        next_obs = f.observations.copy()
        idx = np.flatnonzero(valid)
        next_obs[idx] = f.observations[idx + 1]
    t = torch.from_numpy
    return OfflineDataset(
        obs=t(f.observations), action=t(f.actions), reward=t(f.rewards), next_obs=t(next_obs),
        terminated=t(f.terminals), truncated=t(truncated), episode_offsets=t(offsets_from_ends(ends)),
        next_obs_valid=t(valid), infos={k.split("/", 1)[1]: t(v) for k, v in f.infos.items()},
        metadata={"source": f.path, "view": "trajectory", "file_rows": n, "d4rl_metadata": dict(f.metadata),
                  "next_obs_from": "next_observations" if f.next_observations is not None else "following row"},
    )


def make_view(f: D4RLFile, view: View = "qlearning", terminate_on_end: bool = False,
              max_episode_steps: int | None = None) -> OfflineDataset:
    if view == "qlearning":
        return qlearning_view(f, terminate_on_end, max_episode_steps)
    if view == "trajectory":
        if terminate_on_end:
            raise UserInputError("terminate_on_end applies to the qlearning view: expected view='qlearning'")
        return trajectory_view(f, max_episode_steps)
    raise UserInputError(f"unknown dataset view {view!r}: expected 'qlearning' or 'trajectory'")


def load_d4rl(path: str | Path, view: View = "qlearning", terminate_on_end: bool = False,
              max_episode_steps: int | None = None, obs_dim: int | None = None,
              action_dim: int | None = None) -> OfflineDataset:
    """Read a D4RL HDF5 file and return the chosen view (see the module docstring)."""
    ds = make_view(read_d4rl(path, obs_dim, action_dim), view, terminate_on_end, max_episode_steps)
    ds.metadata["format"] = "d4rl"
    return ds
