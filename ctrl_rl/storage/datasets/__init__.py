"""Offline datasets: D4RL HDF5, Minari and ctrl_rl's own files, as one ``OfflineDataset`` type.

``load_dataset(path_or_id)`` reads any of them (validated, with clear errors); ``infer_env_id`` names the env a
dataset belongs to; ``open_dataset`` opens one for training in an env (actions mapped from the env's units to
the agent's [-1, 1] by ``to_agent_units``); ``to_replay`` fills a ``ReplayBuffer``; ``normalized_score`` says which
reference table it used.
``cache`` is where generated datasets live. Generating them is ``ctrl_rl.datagen``'s job (a layer above): nothing
here imports it, nor the algorithms, loops, configs or CLI.
"""

from ctrl_rl.storage.datasets.d4rl import load_d4rl, qlearning_view, read_d4rl, trajectory_view
from ctrl_rl.storage.datasets.envdata import open_dataset, to_agent_units, unit_bounds
from ctrl_rl.storage.datasets.loader import check_env_fits, infer_env_id, load_dataset
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
    "D4RL_REFERENCES", "DatasetMeta", "OfflineDataset", "ReferenceScores", "check_env_fits", "infer_env_id",
    "load_d4rl", "load_dataset", "load_local_references", "load_minari", "load_native", "normalized_score",
    "open_dataset", "qlearning_view", "read_d4rl", "save_local_references", "to_agent_units", "to_replay",
    "trajectory_view", "unit_bounds", "write_dataset",
]
