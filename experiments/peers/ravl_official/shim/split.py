"""ctrl_rl's dynamics holdout rows for a seed, as the row indices of the dataset's qlearning view:

    python split.py DATASET SEED OUT.npy

ctrl_rl's ``world_models.ensemble.fit`` holds out ``perm[:n]`` with ``perm = torch.randperm(S, generator=gen)``,
``n = max(1, min(int(0.2 * S), S - 1))`` (``holdout_ratio`` 0.2, no ``max_holdout``), where ``gen`` is the run's
fresh generator seeded with ``--seed`` (``core.seeding.seed_everything``) and the randperm is its first draw, on
the CPU; S rows of the qlearning view (``learn.model_based.dataset_arrays``). The same torch version (2.13.0 in
both venvs) gives the same permutation. This reproduces those numbers without importing ctrl_rl.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ravl_shim  # noqa: E402 (after the path)


def holdout_rows(data: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """ctrl_rl's holdout rows for ``seed`` (sorted indices into the qlearning view of the file's arrays ``data``)."""
    S = int(ravl_shim.qlearning_rows(data).size)
    n = max(1, min(int(0.2 * S), S - 1))
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(seed))  # [S]
    return np.sort(perm[:n].numpy())


def main() -> None:
    dataset, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    data = ravl_shim.read_file(ravl_shim.dataset_file(dataset))
    rows = holdout_rows(data, seed)
    np.save(out, rows)
    print(f"[split] ctrl_rl's holdout for seed {seed}: {rows.size} of {ravl_shim.qlearning_rows(data).size} rows -> "
          f"{out}")


if __name__ == "__main__":
    main()
