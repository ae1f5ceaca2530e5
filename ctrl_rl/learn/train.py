"""``train``: runs an algorithm in the loop of its regime (``ctrl_rl.learn.regimes``: each loop module registers the
regime it runs), after the checks that hold for every regime."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ctrl_rl.algos import registry
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn import distributed as D
from ctrl_rl.learn.config import RunConfig, ensure_loop
from ctrl_rl.learn.regimes import get_regime
from ctrl_rl.learn.runtime import TrainResult


def train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
          max_iterations: int | None = None, dist_info: D.DistInfo = D.SINGLE_PROCESS) -> TrainResult:
    """Train ``algo_name`` with ``run`` (whose ``loop`` is the regime's loop config) into ``run_dir``."""
    entry = registry.get(algo_name)
    regime = get_regime(entry.regime)
    run = ensure_loop(entry, run)
    if dist_info.enabled and not entry.distributed:
        raise UserInputError(f"{algo_name!r} runs in one process: "
                             f"expected `ctrl-rl train {algo_name}` without torchrun")
    return regime.train(run, algo_name, cfg, run_dir, resume, max_iterations, dist_info)


def train_seeds(runs: Sequence[RunConfig], algo_name: str, cfg, run_dirs: Sequence[Path], resume: bool = False,
                max_iterations: int | None = None) -> list[TrainResult]:
    """Train ``algo_name`` once per run of ``runs`` (alike but for ``seed`` and directory) in one process, each into
    its directory of ``run_dirs``, where its regime's loop can (``--seeds``, ``learn/seeds.py``)."""
    entry = registry.get(algo_name)
    regime = get_regime(entry.regime)
    if regime.train_seeds is None or entry.seed_layout is None:
        raise UserInputError(f"--seeds is not available for {algo_name!r} ({entry.regime} regime): expected one "
                             "process per seed with --seed K")
    return regime.train_seeds([ensure_loop(entry, r) for r in runs], algo_name, cfg, run_dirs, resume,
                              max_iterations)
