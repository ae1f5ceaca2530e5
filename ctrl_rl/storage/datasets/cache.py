"""Where generated datasets live: the dataset cache, the ids of its files, and whether a path can be written.

``ctrl-rl data generate`` (``ctrl_rl.datagen``) writes ``<task>-<level>-v5.hdf5`` into the cache; this module is
the storage side of that contract, so that reading a dataset by id (``load_dataset("hopper-medium-v5")``) needs
nothing from the generation code. The cache is ``$CTRL_RL_DATA_DIR``, else ``$XDG_CACHE_HOME/ctrl_rl/datasets``,
else ``~/.cache/ctrl_rl/datasets``.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ctrl_rl.errors import UserInputError

DATA_DIR_ENV = "CTRL_RL_DATA_DIR"
LEVELS = ("random", "medium", "expert", "medium-expert", "medium-replay")
"""The D4RL levels ``ctrl-rl data generate`` makes, in the order ``--level all`` makes them."""
TASK_ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
"""Task of a generated dataset id -> the Gymnasium MuJoCo v5 env its rows come from."""
_ID = re.compile(rf"({'|'.join(TASK_ENVS)})-({'|'.join(sorted(LEVELS, key=len, reverse=True))})-v5")


def data_dir() -> Path:
    """``$CTRL_RL_DATA_DIR``, else ``$XDG_CACHE_HOME/ctrl_rl/datasets``, else ``~/.cache/ctrl_rl/datasets``."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "ctrl_rl" / "datasets"


def dataset_name(task: str, level: str) -> str:
    """The id of a generated dataset: ``hopper``, ``medium`` -> ``hopper-medium-v5`` (its file adds ``.hdf5``)."""
    return f"{task}-{level}-v5"


def parse_dataset_id(text: str) -> tuple[str, str] | None:
    """``(task, level)`` of a generated dataset id (``walker2d-medium-replay-v5``), None for any other text."""
    m = _ID.fullmatch(str(text))
    return None if m is None else (m.group(1), m.group(2))


def resolve_dataset_id(text: str) -> Path | None:
    """The cached file of a generated dataset id (``hopper-medium-v5``); None if ``text`` is not such an id.
    Refuses an id whose file has not been generated yet, saying how to make it."""
    parsed = parse_dataset_id(text)
    if parsed is None:
        return None
    path = data_dir() / f"{text}.hdf5"
    if not path.is_file():
        task, level = parsed
        raise UserInputError(f"dataset {text!r} has not been generated (no file at {path}): expected "
                             f"`ctrl-rl data generate --env {TASK_ENVS[task]} --level {level}` to make it first")
    return path


def check_writable(path: str | Path, what: str) -> None:
    """Refuse, before any work, a file ``path`` that cannot be written (its directory may not exist yet).

    The nearest existing ancestor must be a directory in which a file can be created: probed by creating and
    removing an empty temporary file there, because permission bits say nothing for root (who is still refused
    by a read-only mount, ``/proc`` or a regular file standing where a directory should be). Nothing is left
    behind. ``what`` names the input in the message, e.g. ``"--out /x/y.hdf5"``.
    """
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise UserInputError(f"{what}: {p} is a directory: expected the path of a file")
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserInputError(f"{what}: {parent} is a file, so {p} cannot be created: expected a path whose "
                             f"parents are directories")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ctrl_rl-write-check-", dir=parent)
    except OSError as e:
        raise UserInputError(f"{what}: {parent} is not writable ({e.strerror or e}): expected a directory this "
                             f"user can write to") from None
    os.close(fd)
    os.unlink(probe)


__all__ = ["DATA_DIR_ENV", "LEVELS", "TASK_ENVS", "check_writable", "data_dir", "dataset_name", "parse_dataset_id",
           "resolve_dataset_id"]
