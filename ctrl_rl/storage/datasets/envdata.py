"""Offline data opened for an env: loaded, checked against the env's observation and action sizes, clipped."""

from __future__ import annotations

from pathlib import Path

from ctrl_rl.storage.datasets.loader import load_dataset
from ctrl_rl.storage.datasets.offline import OfflineDataset


def open_dataset(dataset: str, spec, action_clip: float | None) -> OfflineDataset:
    """``--dataset`` checked against ``spec``'s sizes: a file through the ``qlearning`` view (exactly
    ``d4rl.qlearning_dataset``), a Minari dataset through its episodes; actions clipped to +-``action_clip``."""
    ds = load_dataset(dataset, view="qlearning" if Path(dataset).is_file() else None, obs_dim=spec.obs_dim,
                      action_dim=spec.action_dim)
    if action_clip is not None:
        ds.action.clamp_(-action_clip, action_clip)
    return ds
