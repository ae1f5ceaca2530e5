"""ctrl_rl's own dataset files: the D4RL HDF5 layout plus one JSON metadata record.

The record (``DatasetMeta``: env id, package versions, level, behaviour policy, seed, reference scores)
is stored as a JSON string in the root attribute ``ctrl_rl``. An attribute is invisible to
``d4rl``'s ``get_dataset`` (which reads datasets only), so every file ctrl_rl writes is also a valid D4RL
file for other tools, and the record cannot be separated from the data it describes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.d4rl import D4RLFile, View, check_flags, check_numeric, make_view, read_d4rl
from ctrl_rl.storage.datasets.offline import OfflineDataset, check_dims, check_finite, check_lengths

META_ATTR = "ctrl_rl"
FORMAT_VERSION = 1
_ROW_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")


@dataclass(frozen=True)
class DatasetMeta:
    """What a ctrl_rl dataset file says about how it was made."""

    env_id: str
    """Environment id with its version, e.g. ``"Hopper-v5"``."""
    level: str
    """Data level: ``random``, ``medium``, ``medium-replay``, ``expert``, ``medium-expert`` (free text for others)."""
    policy: str = ""
    """The behaviour policy: a checkpoint path or a short description (``uniform random`` for random)."""
    seed: int | None = None
    """Seed of the generating run."""
    versions: dict[str, str] = field(default_factory=dict)
    """Versions of the packages that simulated the data, e.g. ``{"gymnasium": "1.4.0", "mujoco": "3.3.0"}``."""
    ref_scores: dict[str, Any] | None = None
    """Reference returns for normalization: ``{"random": R_min, "expert": R_max, "source": "..."}``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (steps, episodes, checkpoint step...); JSON values only."""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "metadata") -> DatasetMeta:
        try:
            record = json.loads(text)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            known = set(cls.__dataclass_fields__)
            unknown = sorted(set(record) - known)
            if unknown:
                raise ValueError(f"unknown field {unknown[0]!r}")
            return cls(**record)
        except (ValueError, TypeError) as e:
            raise UserInputError(f"{source}: the ctrl_rl metadata record is malformed ({e}): expected a JSON object "
                                 f"with env_id, level, policy, seed, versions, ref_scores") from None


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def write_dataset(path: str | Path, arrays: Mapping[str, Any], meta: DatasetMeta,
                  compression: str | None = "gzip") -> Path:
    """Write ``arrays`` in the D4RL layout plus ``meta``; returns the path. The write is atomic.

    ``arrays`` uses D4RL key names: ``observations [N,O]``, ``actions [N,A]``, ``rewards [N]``,
    ``terminals [N]``, ``timeouts [N]`` (all required), optional ``next_observations [N,O]`` and
    ``infos/<name>`` per-row extras (``infos/qpos``, ``infos/qvel``...). Tensors or arrays.
    """
    import h5py

    path = Path(path).expanduser()
    source = f"dataset to write at {path}"
    data = {k: _numpy(v) for k, v in arrays.items()}
    unknown = [k for k in data if k not in _ROW_KEYS and not k.startswith("infos/")]
    if unknown:
        raise UserInputError(f"{source}: unknown key {unknown[0]!r}: expected {', '.join(_ROW_KEYS)} or infos/<name>")
    missing = [k for k in _ROW_KEYS[:5] if k not in data]
    if missing:
        raise UserInputError(f"{source} has no {missing[0]!r} array: expected {', '.join(_ROW_KEYS[:5])}")
    check_numeric(source, data)
    check_lengths(source, data)
    check_dims(source, data["observations"], data["actions"], None, None)
    check_finite(source, {k: data[k] for k in ("observations", "actions", "rewards", "next_observations") if k in data})
    check_flags(source, {k: data[k] for k in ("terminals", "timeouts")})
    dtypes = {"terminals": bool, "timeouts": bool}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in data.items():
                value = value.astype(dtypes.get(key, np.float32)) if key in _ROW_KEYS else value
                f.create_dataset(key, data=value, compression=compression)
            f.attrs[META_ATTR] = meta.to_json()
        os.replace(tmp, path)
    finally:  # nothing half-written: a failed write leaves neither the target nor the temporary file
        tmp.unlink(missing_ok=True)
    return path


def read_meta(f: D4RLFile) -> DatasetMeta | None:
    """The ctrl_rl record of a file read by ``read_d4rl``, or None for a plain D4RL file."""
    text = f.attrs.get(META_ATTR)
    return None if text is None else DatasetMeta.from_json(str(text), f.path)


def load_native(path: str | Path, view: View = "qlearning", terminate_on_end: bool = False,
                max_episode_steps: int | None = None, obs_dim: int | None = None,
                action_dim: int | None = None) -> OfflineDataset:
    """Read a ctrl_rl dataset file; its record goes into ``metadata["dataset"]`` (and env id, references)."""
    f = read_d4rl(path, obs_dim, action_dim)
    meta = read_meta(f)
    if meta is None:
        raise UserInputError(f"{f.path} has no '{META_ATTR}' metadata attribute: expected a dataset written by "
                             f"ctrl_rl (use the D4RL loader for plain D4RL files)")
    return attach_meta(make_view(f, view, terminate_on_end, max_episode_steps), meta)


def attach_meta(ds: OfflineDataset, meta: DatasetMeta) -> OfflineDataset:
    """Record a ctrl_rl file's metadata on the dataset read from it (``metadata["dataset"]``, env id, references)."""
    ds.metadata.update(format="ctrl_rl", dataset=asdict(meta), env_id=meta.env_id, ref_scores=meta.ref_scores)
    return ds
