"""The chunk-rollouts loop: envs stepped one action chunk at a time, beside LeRobot demonstrations -> ``update`` of a
VLA; evaluated in ``--env`` by success rate. One step is one update (``--total-steps`` counts updates; the metrics
add ``env_steps``).

Every step: ``--rollout-chunks`` chunks in each of ``--num-envs`` envs (``vla.rollouts.ChunkCollector``) ->
``update({"rollout", "demos", "own"})`` with the demonstration batches the algorithm reads
(``batches_per_update()``, each of ``--batch-size`` frames, stacked) and, when it keeps its own successes
(``success_capacity``), batches of the chunks of its own successful episodes from a ``vla.rollouts.SuccessBuffer``
(None while that is empty). The set-up (env id, demonstrations, ``--init``, resume) is the demonstrations loop's
(``learn/demonstrations.py``).

An algorithm with ``episode_groups`` G (group-relative advantages) gets a training env with ``group_size=G``, so
each block of G envs replays the same episodes, and a rollout must hold whole episodes. The env state is not
checkpointed: a run resumes its weights, optimiser and counters, and resets its envs (and empties its success
buffer).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ctrl_rl.algos import registry
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.config import ChunkRolloutsLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.demonstrations import prepare, start
from ctrl_rl.learn.offline import run_updates
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainResult, build_env
from ctrl_rl.vla.rollouts import ChunkCollector, ChunkLearner, SuccessBuffer


def grouped_env_id(env: str, group_size: int, execute: int, rollout_chunks: int, episode_steps: int | None) -> str:
    """The training env's id for group-relative advantages: ``group_size`` envs per block replay the same episodes
    (the env refuses a number of envs the group size does not divide), and a rollout holds whole episodes. Raises
    ``UserInputError`` naming the setting that prevents it."""
    if not env.startswith("manip:"):
        raise UserInputError(f"--advantage group needs envs that replay an episode per group: expected a manip: env, "
                             f"got {env!r}")
    if not episode_steps or episode_steps % execute or (rollout_chunks * execute) % episode_steps:
        raise UserInputError(f"--advantage group needs rollouts of whole episodes: expected the episode length "
                             f"({episode_steps} steps) a multiple of the {execute} steps executed per chunk and "
                             f"--rollout-chunks x {execute} a multiple of the episode length, got --rollout-chunks "
                             f"{rollout_chunks}")
    return f"{env},group_size={group_size}"


def train_chunk_rollouts(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                         max_iterations: int | None = None) -> TrainResult:
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    run, cfg, init = prepare(entry, run, cfg, resume)
    loop = run.loop
    assert isinstance(loop, ChunkRolloutsLoopConfig)
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        s = start(ctx, entry, run, cfg, init)
        algo, gen, B = s.algo, s.algo.gen, loop.batch_size
        if not isinstance(algo, ChunkLearner):
            raise TypeError(f"{algo_name} runs on chunk rollouts but does not meet vla.rollouts.ChunkLearner")
        env_run = run
        if algo.episode_groups is not None:
            env_run = dataclasses.replace(run, env=grouped_env_id(
                run.env, algo.episode_groups, algo.execute, loop.rollout_chunks, s.spec.max_episode_steps))
        env = build_env(env_run, run.num_envs, run.seed)
        try:
            collector = ChunkCollector(env, algo, loop.rollout_chunks, run.seed)
            capacity = algo.success_capacity
            own = SuccessBuffer(capacity, gen) if capacity is not None else None
            count = algo.batches_per_update()
            ctx.start(run.total_steps, s.step, f"{algo_name} {Path(str(run.dataset)).name}", unit="upd")

            def update() -> dict:
                ro = collector.collect()
                batch = {"rollout": ro, "demos": s.demos.sample(count["demos"] * B, gen, ctx.device), "own": None}
                counts = collector.stats()
                if own is not None:
                    own.add(ro)
                    batch["own"] = own.sample(count["own"] * B)
                    counts["stats/self_imitation_added"] = own.added  # chunks ever added (the FIFO drops the oldest)
                    counts["stats/self_imitation_held"] = len(own)
                info = algo.update(batch)
                return {**info, **s.static, **{k: torch.tensor(float(v)) for k, v in counts.items()}}

            return run_updates(ctx, algo, update, s.step, s.last_return, {}, max_iterations)
        finally:
            env.close()


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_chunk_rollouts(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "chunk-rollouts", ChunkRolloutsLoopConfig, _train,
    summary="envs stepped one action chunk at a time, with LeRobot demonstrations -> update of a VLA"))
