"""Atomic checkpoints holding the full training state.

A checkpoint is a ``torch.save`` dict readable with ``weights_only=True`` (tensors, numbers, strings,
lists, tuples and dicts only):
``{"format", "version", "algo", "config", "algo_state", "env_state", "obs", "rng", "counters"}``.
Writes go to a temporary file in the same directory, are flushed to disk and renamed over the target,
so a crash never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrl_rl.errors import UserInputError

FORMAT = "ctrl_rl.checkpoint"
VERSION = 1


def global_rng_state() -> dict:
    """Python, NumPy and torch global RNG states, in a weights_only-loadable form."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py = random.getstate()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }


def set_global_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = {"format": FORMAT, "version": VERSION, **payload}
    try:
        with open(tmp, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_checkpoint(path: Path, expect_algo: str | None = None) -> dict[str, Any]:
    """Load and validate a checkpoint; every failure is one UserInputError sentence naming the file."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"checkpoint {str(path)!r} does not exist: expected a .pt file written by `ctrl-rl train`")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserInputError(f"checkpoint {str(path)!r} is truncated or not a ctrl_rl checkpoint ({first[:120]}): "
                             "expected a complete file written by `ctrl-rl train`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserInputError(f"checkpoint {str(path)!r} is not a ctrl_rl checkpoint: expected a file written by `ctrl-rl train`")
    if data.get("version") != VERSION:
        raise UserInputError(f"checkpoint {str(path)!r} has format version {data.get('version')!r}: expected {VERSION}")
    if expect_algo is not None and data.get("algo") != expect_algo:
        raise UserInputError(f"checkpoint {str(path)!r} holds a {data.get('algo')!r} run: expected a {expect_algo!r} checkpoint")
    return data


def find_checkpoint(path_or_dir: str | Path) -> Path:
    """A run directory resolves to its latest checkpoint; a file is returned as is."""
    p = Path(path_or_dir)
    if p.is_dir():
        ck = p / "checkpoints" / "latest.pt"
        if not ck.is_file():
            raise UserInputError(f"run directory {str(p)!r} has no checkpoints/latest.pt: expected a directory written by `ctrl-rl train`")
        return ck
    if not p.exists():
        raise UserInputError(f"{str(p)!r} does not exist: expected a run directory or a checkpoint file")
    return p
