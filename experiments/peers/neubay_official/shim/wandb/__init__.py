"""wandb stand-in: ``init``/``log``/``finish`` write JSON lines to ``$NEUBAY_SHIM_LOG`` (nothing when unset).

Every row carries ``_t``, seconds since ``init`` (time.perf_counter). JAX and NumPy values become plain numbers or
lists.
"""

from __future__ import annotations

import json
import os
import time

_state: dict = {"file": None, "t0": 0.0}


def _plain(value):
    try:
        import numpy as np

        value = np.asarray(value) if hasattr(value, "__array__") else value
    except Exception:  # noqa: BLE001
        pass
    return value.tolist() if hasattr(value, "tolist") else value


def _write(row: dict) -> None:
    f = _state["file"]
    if f is not None:
        row["_t"] = round(time.perf_counter() - _state["t0"], 4)
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()


def init(project=None, name=None, config=None, **kwargs) -> None:
    path = os.environ.get("NEUBAY_SHIM_LOG")
    _state["t0"] = time.perf_counter()
    if path and _state["file"] is None:
        _state["file"] = open(path, "a")  # noqa: SIM115 (open for the run's length, closed by finish)
    _write({"_event": "init", "project": project, "name": name, "config": config})


def log(data: dict, step=None, commit=None) -> None:
    _write({k: _plain(v) for k, v in data.items()})


def finish(*args, **kwargs) -> None:
    _write({"_event": "finish"})
    if _state["file"] is not None:
        _state["file"].close()
        _state["file"] = None
