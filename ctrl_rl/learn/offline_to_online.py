"""The offline-to-online data flow: an optional offline pre-training phase, then the off-policy loop from its
checkpoint with the offline data kept in a fixed fraction of every batch.

An entry with a ``pretrain_step`` and ``--offline-steps K > 0`` (and no ``--init``) first runs an offline run of K
gradient steps on ``--dataset`` in ``RUN_DIR/pretrain`` (its own config, metrics and checkpoint, resumable; the
offline loop with the entry's ``pretrain_step`` as its update), then the online run in ``RUN_DIR`` starts from
that checkpoint (``--init RUN_DIR/pretrain``). Without a pre-training phase this is the off-policy loop with
``--init`` and/or ``--dataset`` (WSRL, RLPD).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ctrl_rl.algos import registry
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn import distributed as D
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OfflineLoopConfig, OffPolicyLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.offline import train_offline
from ctrl_rl.learn.offpolicy import train_offpolicy
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import TrainResult


def train_offline_to_online(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                            max_iterations: int | None = None, dist_info: D.DistInfo = D.SINGLE_PROCESS) -> TrainResult:
    """Train an offline-to-online algorithm (module docstring); ``max_iterations`` counts the steps of both phases."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    loop = run.loop
    assert isinstance(loop, OffPolicyLoopConfig)
    if (entry.pretrain_step is not None and loop.offline_steps > 0
            and (loop.init is None or _is_own_pretrain(loop, run_dir))):
        pre_dir = Path(run_dir) / "pretrain"
        if run.dataset is None:
            raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: "
                                 "expected the offline data it "
                                 "pre-trains on")
        done = _pretrain_step(pre_dir)
        if done < loop.offline_steps:
            pre_run = dataclasses.replace(run, total_steps=loop.offline_steps, run_dir=str(pre_dir), resume=None,
                                          checkpoint_every=min(run.checkpoint_every, loop.offline_steps),
                                          loop=OfflineLoopConfig(batch_size=loop.batch_size,
                                                                 clip_actions=loop.clip_actions))
            res = train_offline(pre_run, algo_name, cfg, pre_dir, resume=done > 0, max_iterations=max_iterations,
                                update_step=entry.pretrain_step)
            if res.step < loop.offline_steps:  # stopped inside the offline phase
                return res
            if max_iterations is not None:
                max_iterations = max(0, max_iterations - (res.step - done))
        run = dataclasses.replace(run, loop=dataclasses.replace(loop, init=str(pre_dir)))
        # the online run may not have started
        resume = resume and (Path(run_dir) / "checkpoints" / "latest.pt").is_file()
    return train_offpolicy(run, algo_name, cfg, run_dir, resume, max_iterations)


def _pretrain_step(pre_dir: Path) -> int:
    ck = pre_dir / "checkpoints" / "latest.pt"
    return int(load_checkpoint(ck)["counters"]["step"]) if ck.is_file() else 0


def _is_own_pretrain(loop: OffPolicyLoopConfig, run_dir: Path) -> bool:
    return Path(str(loop.init)).resolve() == (Path(run_dir) / "pretrain").resolve()


register_regime(Regime(
    "offline-to-online", OffPolicyLoopConfig, train_offline_to_online,
    summary="checkpoint (or an offline pre-training phase) -> warm-up -> online updates with offline data mixed in"))
