"""The dataset the GPU runs of ``seed_batching.py`` read: the first whole episodes of a cached D4RL-layout dataset
up to ``--rows`` rows, without ``infos/`` (a device call carries at most 64 MiB, the repository included).

    python experiments/seed_batching/device_data.py --dataset hopper-medium-v5 --rows 250000 \\
        --out .devdata/hopper-medium-250k.hdf5

The per-row arrays are cut at the last episode end (``terminals | timeouts``) within ``--rows``; the ``ctrl_rl``
metadata attribute is kept, with its step and episode counts set to the cut and a note of where it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import copy_rows  # noqa: E402

FIELDS = ("actions", "next_observations", "observations", "rewards", "terminals", "timeouts")


def cut(src: Path, rows: int, out: Path) -> int:
    """Write the first whole episodes of ``src`` within ``rows`` rows to ``out``; returns the rows written."""
    with h5py.File(src, "r") as f:
        ends = np.nonzero(np.asarray(f["terminals"][:rows]) | np.asarray(f["timeouts"][:rows]))[0]  # type: ignore[index]
        if len(ends) == 0:
            raise SystemExit(f"{src}: no episode ends within the first {rows} rows: expected a larger --rows")
        meta = json.loads(str(f.attrs["ctrl_rl"])) if "ctrl_rl" in f.attrs else {}
    n = int(ends[-1]) + 1
    out.parent.mkdir(parents=True, exist_ok=True)
    copy_rows(src, out, n, FIELDS, compression="gzip")
    extra = meta.setdefault("extra", {})
    extra["steps"], extra["episodes"] = n, len(ends)
    extra["subset_of"] = f"{src.name}: the first {n} rows (whole episodes), for a device benchmark"
    with h5py.File(out, "a") as d:
        d.attrs["ctrl_rl"] = json.dumps(meta)
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="hopper-medium-v5", help="a cached dataset id or an .hdf5 path")
    p.add_argument("--rows", type=int, default=250_000)
    p.add_argument("--out", type=Path, default=Path(".devdata/hopper-medium-250k.hdf5"))
    a = p.parse_args()
    src = Path(a.dataset)
    if not src.is_file():
        from ctrl_rl.storage.datasets.cache import resolve_dataset_id

        found = resolve_dataset_id(a.dataset)
        if found is None:
            raise SystemExit(f"--dataset {a.dataset!r}: expected an .hdf5 file or a generated dataset id")
        src = found
    n = cut(src, a.rows, a.out)
    print(f"wrote {a.out}: {n} rows of {src}")


if __name__ == "__main__":
    main()
