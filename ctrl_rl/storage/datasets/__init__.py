"""Offline datasets: D4RL HDF5, Minari and ctrl_rl's own files, as one ``OfflineDataset`` type.

``load_dataset(path_or_id)`` reads any of them (validated, with clear errors); ``to_replay`` fills a
``ReplayBuffer``; ``normalized_score`` says which reference table it used.
"""

from ctrl_rl.storage.datasets.d4rl import load_d4rl, qlearning_view, read_d4rl, trajectory_view
from ctrl_rl.storage.datasets.loader import load_dataset
from ctrl_rl.storage.datasets.minari import load_minari
from ctrl_rl.storage.datasets.native import DatasetMeta, load_native, write_dataset
from ctrl_rl.storage.datasets.offline import OfflineDataset, to_replay
from ctrl_rl.storage.datasets.scores import (
    D4RL_REFERENCES,
    ReferenceScores,
    load_local_references,
    normalized_score,
    save_local_references,
)

__all__ = [
    "D4RL_REFERENCES", "DatasetMeta", "OfflineDataset", "ReferenceScores", "load_d4rl", "load_dataset",
    "load_local_references", "load_minari", "load_native", "normalized_score", "qlearning_view", "read_d4rl",
    "save_local_references", "to_replay", "trajectory_view", "write_dataset",
]
