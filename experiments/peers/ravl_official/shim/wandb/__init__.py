"""wandb stand-in: ``init``/``log``/``finish`` write JSON lines to ``$RAVL_SHIM_LOG`` (nothing when unset).

Every row carries ``_t``, seconds since ``init`` (time.perf_counter), so that the wrapper can measure gradient steps
per second between the official code's update logs. Tensor and NumPy values become plain numbers or lists.
"""

from __future__ import annotations

import json
import os
import time

_state: dict = {"file": None, "t0": 0.0}


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else value


def _write(row: dict) -> None:
    f = _state["file"]
    if f is not None:
        row["_t"] = round(time.perf_counter() - _state["t0"], 4)
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()


def init(config: dict | None = None, project: str | None = None, group: str | None = None, name: str | None = None,
         **kwargs) -> None:
    path = os.environ.get("RAVL_SHIM_LOG")
    _state["t0"] = time.perf_counter()
    if path:
        _state["file"] = open(path, "a")  # noqa: SIM115 (open for the run's length, closed by finish)
    _write({"_event": "init", "project": project, "group": group, "name": name, "config": config})


def log(data: dict, step: int | None = None, commit: bool | None = None) -> None:
    _write({k: _plain(v) for k, v in data.items()})


def finish(*args, **kwargs) -> None:
    _write({"_event": "finish"})
    if _state["file"] is not None:
        _state["file"].close()
        _state["file"] = None
