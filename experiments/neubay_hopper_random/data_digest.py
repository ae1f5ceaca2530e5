"""SHA-256 of every array of a cached dataset (by id, or an .hdf5 path), as JSON: whether a dataset regenerated on
another machine (``device_seeds.sh``) holds the same rows as the local file.

    python experiments/neubay_hopper_random/data_digest.py hopper-random-v5
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import h5py
import numpy as np


def digests(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj) -> None:
            if isinstance(obj, h5py.Dataset):
                a = np.ascontiguousarray(obj[()])
                out[name] = f"{a.dtype.str}{list(a.shape)}:{hashlib.sha256(a.tobytes()).hexdigest()}"
        f.visititems(visit)
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: data_digest.py DATASET_ID_OR_HDF5", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if path.suffix != ".hdf5":
        from ctrl_rl.storage.datasets.cache import data_dir

        path = data_dir() / f"{argv[0]}.hdf5"
    if not path.is_file():
        print(f"no dataset file {path}: expected a generated dataset id or an .hdf5 path", file=sys.stderr)
        return 2
    print(json.dumps({"file": path.name, "arrays": digests(path)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
