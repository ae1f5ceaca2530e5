"""``train``: runs an algorithm in the loop of its regime (read from the registry), including the offline
pre-training phase of offline-to-online algorithms that have one.

Regimes and loops: ``on-policy`` -> ``train_onpolicy``; ``off-policy`` and ``offline-to-online`` ->
``train_offpolicy``; ``offline`` -> ``train_offline``; ``world-model`` -> ``train_dynamics``; ``model-based`` ->
``train_model_based``; ``model-based-recurrent`` -> ``train_neubay``. An offline-to-online entry with a ``pretrain_step`` and
``--offline-steps K > 0`` (and no ``--init``) first runs an offline run of K gradient steps on ``--dataset`` in
``RUN_DIR/pretrain`` (its own config, metrics and checkpoint, resumable), then the online run in ``RUN_DIR``
starts from that checkpoint (``--init RUN_DIR/pretrain``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ctrl_rl.algos import registry
from ctrl_rl.learn.config import OfflineLoopConfig, RunConfig, ensure_loop
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn import distributed as D
from ctrl_rl.learn.actor_learner import train_actor_learner
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.model_based import train_dynamics, train_model_based
from ctrl_rl.learn.neubay import train_neubay
from ctrl_rl.learn.offline import train_offline
from ctrl_rl.learn.offpolicy import train_offpolicy
from ctrl_rl.learn.onpolicy import train_onpolicy
from ctrl_rl.learn.runtime import TrainResult
from ctrl_rl.learn.vla import train_vla

LOOPS = {"on-policy": train_onpolicy, "off-policy": train_offpolicy, "offline-to-online": train_offpolicy,
         "offline": train_offline, "world-model": train_dynamics, "model-based": train_model_based,
         "model-based-recurrent": train_neubay, "actor-learner": train_actor_learner,
         "vla-finetuning": train_vla}


def train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
          max_iterations: int | None = None, dist_info: D.DistInfo = D.DistInfo()) -> TrainResult:
    """Train ``algo_name`` with ``run`` (whose ``loop`` is the regime's loop config) into ``run_dir``."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    if entry.regime not in LOOPS:
        raise UserInputError(f"{algo_name!r} runs in the {entry.regime!r} regime, which has no loop yet: expected one of "
                             f"{sorted(LOOPS)}")
    if dist_info.enabled and not entry.distributed:
        raise UserInputError(f"{algo_name!r} runs in one process: expected `ctrl-rl train {algo_name}` without torchrun")
    if entry.regime == "on-policy":
        return train_onpolicy(run, algo_name, cfg, run_dir, resume, max_iterations, dist_info)
    if entry.regime in ("offline", "world-model", "model-based", "model-based-recurrent", "actor-learner", "vla-finetuning"):
        return LOOPS[entry.regime](run, algo_name, cfg, run_dir, resume, max_iterations)
    loop = run.loop
    if entry.pretrain_step is not None and loop.offline_steps > 0 and (loop.init is None or _is_own_pretrain(loop, run_dir)):
        pre_dir = Path(run_dir) / "pretrain"
        if run.dataset is None:
            raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: expected the offline data it "
                                 "pre-trains on")
        done = _pretrain_step(pre_dir)
        if done < loop.offline_steps:
            pre_run = dataclasses.replace(run, total_steps=loop.offline_steps, run_dir=str(pre_dir), resume=None,
                                          checkpoint_every=min(run.checkpoint_every, loop.offline_steps),
                                          loop=OfflineLoopConfig(batch_size=loop.batch_size, clip_actions=loop.clip_actions))
            res = train_offline(pre_run, algo_name, cfg, pre_dir, resume=done > 0, max_iterations=max_iterations,
                                update_step=entry.pretrain_step)
            if res.step < loop.offline_steps:  # stopped inside the offline phase
                return res
            if max_iterations is not None:
                max_iterations = max(0, max_iterations - (res.step - done))
        run = dataclasses.replace(run, loop=dataclasses.replace(loop, init=str(pre_dir)))
        resume = resume and (Path(run_dir) / "checkpoints" / "latest.pt").is_file()  # the online run may not have started
    return train_offpolicy(run, algo_name, cfg, run_dir, resume, max_iterations)


def _pretrain_step(pre_dir: Path) -> int:
    ck = pre_dir / "checkpoints" / "latest.pt"
    return int(load_checkpoint(ck)["counters"]["step"]) if ck.is_file() else 0


def _is_own_pretrain(loop, run_dir: Path) -> bool:
    return Path(loop.init).resolve() == (Path(run_dir) / "pretrain").resolve()
