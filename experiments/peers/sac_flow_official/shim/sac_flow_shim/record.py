"""JSON lines into ``$SAC_FLOW_SHIM_DIR/<stream>.jsonl`` (nothing when unset), each row with ``_t``: seconds since
this module was first imported (launch.py imports it first), so rows of all streams share one clock."""

from __future__ import annotations

import json
import os
import time

T0 = time.perf_counter()
_files: dict = {}


def plain(value):
    """A JSON value for ``value``: arrays and array scalars of one element become numbers, others lists."""
    if hasattr(value, "tolist"):
        value = value.tolist()
        while isinstance(value, list) and len(value) == 1:
            value = value[0]
    return value


def now() -> float:
    return time.perf_counter() - T0


def write(stream: str, row: dict) -> None:
    folder = os.environ.get("SAC_FLOW_SHIM_DIR")
    if not folder:
        return
    path = os.path.join(folder, f"{stream}.jsonl")
    f = _files.get(path)
    if f is None:
        f = _files[path] = open(path, "a")  # noqa: SIM115 (kept open for the run)
    f.write(json.dumps({**{k: plain(v) for k, v in row.items()}, "_t": round(now(), 4)}, default=str) + "\n")
    f.flush()
