"""One entry point for every dataset source: ``load_dataset(path_or_id) -> OfflineDataset``; plus the env a
dataset belongs to (``infer_env_id``) and the check that a dataset fits an env (``check_env_fits``)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Literal

from ctrl_rl.core.provenance import file_sha256
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.registry import spec_of
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.cache import TASK_ENVS, parse_dataset_id, resolve_dataset_id
from ctrl_rl.storage.datasets.d4rl import View, make_view, open_hdf5, read_d4rl
from ctrl_rl.storage.datasets.minari import datasets_root, is_minari_dataset, load_minari, minari_env_id
from ctrl_rl.storage.datasets.native import META_ATTR, DatasetMeta, attach_meta, read_meta
from ctrl_rl.storage.datasets.offline import OfflineDataset

MINARI_PREFIX = "minari:"
_HDF5_SUFFIXES = (".hdf5", ".h5", ".hdf")

# D4RL's gym-mujoco files (-v0 to -v2) were collected on gym's MuJoCo v2/v3 envs, which are not available here.
# The closest env is the Gymnasium v5 task of the same robot; it is inferred for a file named after the task only
# when the file's observation and action sizes are that env's (checked against the envs themselves in
# tests/storage/test_dataset_errors.py). D4RL's Ant has 111-dim observations (contact forces of all 14 bodies)
# and Ant-v5 105 (13 bodies), so no env is inferred for D4RL's Ant files.
V5_TASKS = {"hopper": ("Hopper-v5", 11, 3), "halfcheetah": ("HalfCheetah-v5", 17, 6),
            "walker2d": ("Walker2d-v5", 17, 6), "ant": ("Ant-v5", 105, 8)}
"""Task of a D4RL-style file name -> ``(Gymnasium v5 env id, obs dim, action dim)``."""
_D4RL_NAME = re.compile(rf"({'|'.join(V5_TASKS)})[-_](random|medium|expert|mixed|medium[-_]replay|medium[-_]expert|"
                        r"full[-_]replay)([-_]v\d+)?", re.IGNORECASE)


def load_dataset(path_or_id: str | Path, view: View | None = None, *, terminate_on_end: bool = False,
                 max_episode_steps: int | None = None, obs_dim: int | None = None, action_dim: int | None = None,
                 minari_root: str | Path | None = None, action_key: str | None = None) -> OfflineDataset:
    """Load a dataset from a path or a Minari id and validate it (against ``obs_dim``/``action_dim`` if given).

    * an HDF5 file: ctrl_rl's own format when it carries the ``ctrl_rl`` record, else a D4RL file; ``view``
      is ``"qlearning"`` (default: ``d4rl.qlearning_dataset`` exactly) or ``"trajectory"`` (whole episodes);
    * a generated dataset id (``hopper-medium-v5``, ``walker2d-medium-replay-v5``...): the file
      ``ctrl-rl data generate`` wrote to the dataset cache (``$CTRL_RL_DATA_DIR``, see ``cache.data_dir``);
    * a Minari dataset: ``minari:<id>``, a bare id found under ``minari_root`` / ``$MINARI_DATASETS_PATH``, or
      a dataset directory (holding ``data/metadata.json``). Minari stores every next observation, so its one
      view is the trajectory view; ``view="qlearning"`` and the D4RL-only options are refused.
    * a LeRobot dataset directory (``meta/info.json``, v3.0 or v2.x; ``lerobot.load_lerobot``): the
      ``observation.state`` vector and ``action``, rewards and terminals where the dataset has them. Its next
      observations are the next frames, so it too has the trajectory view only. ``action_key`` names its action
      feature (keys joined by +; default ``action``).
    """
    kind, where, root = _locate(path_or_id, minari_root)
    if kind == "minari":
        return _minari(str(where), root, view, terminate_on_end, max_episode_steps, obs_dim, action_dim)
    if kind == "lerobot":
        return _lerobot(Path(where), view, terminate_on_end, max_episode_steps, obs_dim, action_dim, action_key)
    f = read_d4rl(where, obs_dim, action_dim)
    meta = read_meta(f)
    ds = make_view(f, view or "qlearning", terminate_on_end, max_episode_steps)
    if meta is None:
        ds.metadata["format"] = "d4rl"
        return ds
    return attach_meta(ds, meta)


def infer_env_id(path_or_id: str | Path, minari_root: str | Path | None = None) -> str | None:
    """The env id a dataset belongs to, from its metadata or its name; None when neither tells.

    * a ctrl_rl file: the ``env_id`` of its record (``Hopper-v5`` for generated datasets);
    * a generated dataset id (``hopper-medium-v5``): its task's v5 env;
    * a Minari dataset: the id of the env spec in its ``metadata.json`` (``Hopper-v5`` for ``mujoco/hopper/*``);
    * a D4RL-layout file without a record, named after a D4RL gym-mujoco dataset (``hopper-medium-v2.hdf5``,
      ``hopper_medium_replay-v2.hdf5``): the Gymnasium v5 task of that robot when the file's observation and
      action sizes are the v5 env's (Hopper-v5, HalfCheetah-v5, Walker2d-v5), else None (D4RL's Ant, see
      ``V5_TASKS``). The v5 dynamics are not D4RL's v2 ones: scores are only approximately comparable.

    ``path_or_id`` takes every form ``load_dataset`` does, and a path or id that does not exist, or a file
    that is not HDF5, is refused with the same one-sentence ``UserInputError``. Only the metadata and the
    array shapes are read, not the rows.
    """
    text = str(path_or_id)
    parsed = parse_dataset_id(text)
    if parsed is not None and not Path(text).expanduser().exists():  # known without the (maybe absent) file
        return TASK_ENVS[parsed[0]]
    kind, where, root = _locate(path_or_id, minari_root)
    if kind == "minari":
        return minari_env_id(str(where), root)
    if kind == "lerobot":
        return None  # LeRobot records a robot type, not a simulator task
    with open_hdf5(where) as f:
        import h5py  # an optional dependency: open_hdf5 has said how to install it when it is missing

        record = f.attrs.get(META_ATTR)
        shapes = {k: d.shape for k in ("observations", "actions") if isinstance(d := f.get(k), h5py.Dataset)}
    if record is not None:
        return DatasetMeta.from_json(str(record), str(where)).env_id or None
    m = _D4RL_NAME.fullmatch(Path(where).stem)
    if m is None or len(shapes) < 2 or len(shapes["observations"]) != 2:
        return None
    env_id, obs_dim, action_dim = V5_TASKS[m.group(1).lower()]
    act = shapes["actions"]
    return env_id if shapes["observations"][1] == obs_dim and (act[1] if len(act) == 2 else 1) == action_dim else None


env_spec = spec_of  # the name cli.py imports; ``ctrl_rl.envs.spec_of`` is the one function


def check_env_fits(ds: OfflineDataset, env_id: str, spec: EnvSpec | None = None) -> None:
    """Refuse a dataset whose observation or action size is not the env's, naming both (the env's spec from
    ``spec_of`` unless ``spec`` is given)."""
    spec = spec if spec is not None else spec_of(env_id)
    discrete = ds.action.ndim == 1
    fits = ds.obs_dim == spec.obs_dim and discrete == spec.discrete and (discrete or ds.action_dim == spec.action_dim)
    if not fits:
        ours = (f"observations of dim {ds.obs_dim} and "
                + ("discrete actions" if discrete else f"actions of dim {ds.action_dim}"))
        theirs = (f"observations of dim {spec.obs_dim} and "
                  + (f"{spec.action_dim} discrete actions" if spec.discrete else f"actions of dim {spec.action_dim}"))
        raise UserInputError(f"{ds.metadata.get('source', 'the dataset')} has {ours} but env {env_id!r} has {theirs}: "
                             f"expected a dataset of this env")


def _locate(path_or_id: str | Path, minari_root: str | Path | None
            ) -> tuple[Literal["file", "minari", "lerobot"], Path | str, str | Path | None]:
    """``("file", path, None)``, ``("minari", dataset id, root)`` or ``("lerobot", directory, None)``; refuses what
    is none of them, in one sentence."""
    text = str(path_or_id)
    if text.startswith(MINARI_PREFIX):
        return "minari", text[len(MINARI_PREFIX):], minari_root
    p = Path(text).expanduser()
    if not p.exists():
        p = resolve_dataset_id(text) or p
    if p.is_dir():
        if (p / "data" / "metadata.json").is_file():
            return "minari", p.name, p.parent
        if (p / "meta" / "info.json").is_file():
            return "lerobot", p, None
        raise UserInputError(f"dataset path {p} is a directory: expected an HDF5 file, a Minari dataset directory "
                             f"holding data/metadata.json or a LeRobot dataset directory holding meta/info.json")
    if p.is_file():
        return "file", p, None
    if p.suffix.lower() in _HDF5_SUFFIXES:
        raise UserInputError(f"dataset file {p} does not exist: expected a D4RL or ctrl_rl .hdf5 file")
    if is_minari_dataset(text, minari_root):
        return "minari", text, minari_root
    raise UserInputError(f"dataset {text!r} is neither an existing file nor a Minari dataset under "
                         f"{datasets_root(minari_root)}: expected a D4RL or ctrl_rl .hdf5 path or a local Minari id")


# Files hashed by name and size only in a dataset directory: encoded camera videos (a LeRobot dataset's bulk,
# gigabytes for a real robot's); every other file (rows, metadata) is hashed byte for byte.
_LISTED_ONLY = (".mp4", ".mkv", ".webm", ".avi")


def dataset_fingerprint(path_or_id: str | Path, minari_root: str | Path | None = None) -> dict:
    """What identifies the data behind ``path_or_id`` (every form ``load_dataset`` takes), for a run's config.json:
    ``{"path", "bytes", "sha256"}``, and ``"files"`` for a directory.

    A file: the sha256 of its bytes. A Minari or LeRobot directory: the sha256 of its files in sorted order, each
    as its relative path, its size and the sha256 of its bytes, where an encoded video counts by path and size only
    (``_LISTED_ONLY``). The same id can name other rows on another machine (``ctrl-rl data generate`` re-runs a
    seeded training for medium-replay, see ``ctrl_rl.datagen.generate``), so a run records this, not the id alone.
    Hashing runs at about 1 GB/s (measured on the 2-core machine, file in the page cache)."""
    kind, where, root = _locate(path_or_id, minari_root)
    if kind == "minari" and not isinstance(where, Path):
        where = datasets_root(root) / str(where)
    path = Path(where).resolve()
    if path.is_file():
        return {"path": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    digest, total, files = hashlib.sha256(), 0, 0
    for f in sorted(q for q in path.rglob("*") if q.is_file()):
        size = f.stat().st_size
        body = "-" if f.suffix.lower() in _LISTED_ONLY else file_sha256(f)
        digest.update(f"{f.relative_to(path).as_posix()}\t{size}\t{body}\n".encode())
        total, files = total + size, files + 1
    return {"path": str(path), "bytes": total, "files": files, "sha256": digest.hexdigest()}


def is_lerobot(path_or_id: str | Path) -> bool:
    """Whether ``path_or_id`` is a LeRobot dataset directory (holding ``meta/info.json``)."""
    return (Path(str(path_or_id)).expanduser() / "meta" / "info.json").is_file()


def _lerobot(path: Path, view, terminate_on_end, max_episode_steps, obs_dim, action_dim,
             action_key: str | None = None) -> OfflineDataset:
    from ctrl_rl.storage.datasets.lerobot import load_lerobot

    if view == "qlearning" or terminate_on_end or max_episode_steps is not None:
        raise UserInputError(f"LeRobot dataset {str(path)!r} stores whole episodes: expected the trajectory view "
                             "without terminate_on_end or max_episode_steps (D4RL-file options)")
    ds = load_lerobot(path, **({"action_key": action_key} if action_key else {}))
    for what, have, want in (("observation", ds.obs_dim, obs_dim), ("action", ds.action_dim, action_dim)):
        if want is not None and have != want:
            raise UserInputError(f"LeRobot dataset {str(path)!r} has {what}s of dim {have}: expected {want}")
    return ds


def _minari(dataset_id, root, view, terminate_on_end, max_episode_steps, obs_dim, action_dim) -> OfflineDataset:
    if view == "qlearning" or terminate_on_end or max_episode_steps is not None:
        raise UserInputError(f"Minari dataset {dataset_id!r} stores every episode's final observation: expected the "
                             f"trajectory view without terminate_on_end or max_episode_steps (D4RL-file options)")
    return load_minari(dataset_id, root, obs_dim, action_dim)
