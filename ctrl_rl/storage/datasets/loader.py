"""One entry point for every dataset source: ``load_dataset(path_or_id) -> OfflineDataset``."""

from __future__ import annotations

from pathlib import Path

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.d4rl import View, make_view, read_d4rl
from ctrl_rl.storage.datasets.generate import resolve_dataset_id
from ctrl_rl.storage.datasets.minari import datasets_root, is_minari_dataset, load_minari
from ctrl_rl.storage.datasets.native import attach_meta, read_meta
from ctrl_rl.storage.datasets.offline import OfflineDataset

MINARI_PREFIX = "minari:"


def load_dataset(path_or_id: str | Path, view: View | None = None, *, terminate_on_end: bool = False,
                 max_episode_steps: int | None = None, obs_dim: int | None = None, action_dim: int | None = None,
                 minari_root: str | Path | None = None) -> OfflineDataset:
    """Load a dataset from a path or a Minari id and validate it (against ``obs_dim``/``action_dim`` if given).

    * an HDF5 file: ctrl_rl's own format when it carries the ``ctrl_rl`` record, else a D4RL file; ``view``
      is ``"qlearning"`` (default: ``d4rl.qlearning_dataset`` exactly) or ``"trajectory"`` (whole episodes);
    * a generated dataset id (``hopper-medium-v5``, ``walker2d-medium-replay-v5``...): the file
      ``ctrl-rl data generate`` wrote to the dataset cache (``$CTRL_RL_DATA_DIR``, see ``generate.data_dir``);
    * a Minari dataset: ``minari:<id>``, a bare id found under ``minari_root`` / ``$MINARI_DATASETS_PATH``, or
      a dataset directory (holding ``data/metadata.json``). Minari stores every next observation, so its one
      view is the trajectory view; ``view="qlearning"`` and the D4RL-only options are refused.
    """
    text = str(path_or_id)
    minari_id = text[len(MINARI_PREFIX):] if text.startswith(MINARI_PREFIX) else None
    p = Path(text).expanduser()
    if minari_id is None and not p.exists():
        p = resolve_dataset_id(text) or p
    if minari_id is None and p.is_dir() and (p / "data" / "metadata.json").is_file():
        return _minari(p.name, p.parent, view, terminate_on_end, max_episode_steps, obs_dim, action_dim)
    if minari_id is None and p.is_dir():
        raise UserInputError(f"dataset path {p} is a directory: expected an HDF5 file or a Minari dataset directory "
                             f"holding data/metadata.json")
    if minari_id is None and p.is_file():
        f = read_d4rl(p, obs_dim, action_dim)
        meta = read_meta(f)
        ds = make_view(f, view or "qlearning", terminate_on_end, max_episode_steps)
        if meta is None:
            ds.metadata["format"] = "d4rl"
            return ds
        return attach_meta(ds, meta)
    if minari_id is None and p.suffix.lower() in (".hdf5", ".h5", ".hdf"):
        raise UserInputError(f"dataset file {p} does not exist: expected a D4RL or ctrl_rl .hdf5 file")
    if minari_id is not None or is_minari_dataset(text, minari_root):
        return _minari(minari_id or text, minari_root, view, terminate_on_end, max_episode_steps, obs_dim, action_dim)
    raise UserInputError(f"dataset {text!r} is neither an existing file nor a Minari dataset under "
                         f"{datasets_root(minari_root)}: expected a D4RL or ctrl_rl .hdf5 path or a local Minari id")


def _minari(dataset_id, root, view, terminate_on_end, max_episode_steps, obs_dim, action_dim) -> OfflineDataset:
    if view == "qlearning" or terminate_on_end or max_episode_steps is not None:
        raise UserInputError(f"Minari dataset {dataset_id!r} stores every episode's final observation: expected the "
                             f"trajectory view without terminate_on_end or max_episode_steps (D4RL-file options)")
    return load_minari(dataset_id, root, obs_dim, action_dim)
