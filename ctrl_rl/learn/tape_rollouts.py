"""The history-based model loop (regime ``model-based-recurrent``; docs/algorithms/neubay.md#the-loop), a sibling of
``learn/model_based.py``'s MBPO-style loop.

The model comes from ``--model RUN`` or is fitted first in ``RUN_DIR/dynamics`` (``model_based.fit_first``, with the
``dynamics`` entry's defaults and the agent entry's ``model_defaults``: NeuBay's LayerNorm residual ensemble). The
dataset is read as whole trajectories (``world_models.history``); the
threshold ``u_max`` (``--uncertainty-quantile`` of the epistemic figure over the data) is computed once.

Then, before the first gradient step and whenever the previous collection's updates are used up: one collection
of ``--parallel-rollouts`` real histories continued in the model by the current actor (one elite per rollout,
truncated by ``u_max`` or when the time from the trajectory's start reaches ``--horizon``), added to the tape
buffer as whole tapes; it pays for ``ceil(--utd x transitions added)`` gradient steps, each on
``--batch-transitions`` rows of concatenated tapes. The algorithm's ``schedule(step / total)`` runs before every
update. Evaluation in the real env, logging and checkpoints are the offline loop's (``offline.run_updates``);
checkpoints also hold the tape buffer and the collector (its generator and the steps left of the current
collection), so ``--resume`` continues bit for bit. Each collection's figures (rollout lengths, why rollouts
ended, u_max, buffer size) go to the next metrics row, next to the update's losses and Q statistics.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ctrl_rl.algos import registry
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.config import RecurrentModelBasedLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.model_based import load_model, model_source, termination_for
from ctrl_rl.learn.offline import env_spec, run_updates
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainingDiverged, TrainResult, check_memory, load_state
from ctrl_rl.storage.datasets import load_dataset
from ctrl_rl.storage.tapes import TapeBuffer
from ctrl_rl.world_models.history import HistoryCollector, trajectories_from_dataset, uncertainty_threshold
from ctrl_rl.world_models.model_env import ModelDiverged


class Collections:
    """``run_updates``' rounds: a collection whenever the last one's ``ceil(utd x added)`` updates are used up."""

    def __init__(self, collector: HistoryCollector, algo, buffer: TapeBuffer, utd: float, total: int,
                 first_row: dict[str, float]):
        self.collector, self.algo, self.buffer, self.utd, self.total = collector, algo, buffer, utd, total
        self.remaining = 0  # gradient steps still paid for by the last collection
        self.collections = 0
        self.progress = 0.0
        self.first_row = first_row  # figures of the set-up, logged with the first collection of this process

    def before(self, step: int) -> dict[str, float]:
        self.progress = step / self.total
        if self.remaining > 0:
            self.remaining -= 1
            return {}
        try:
            tapes, stats = self.collector.collect(self.algo)
        except ModelDiverged as e:
            raise TrainingDiverged(f"before gradient step {step + 1}: {e}") from None
        added = self.buffer.add(tapes)
        paid = max(1, math.ceil(self.utd * added))
        self.remaining = paid - 1
        self.collections += 1
        row = {**self.first_row, **{k: round(v, 6) for k, v in stats.items()}, "rollout/updates_paid": float(paid),
               "rollout/collections": float(self.collections), "buffer/transitions": float(len(self.buffer)),
               "buffer/tapes": float(self.buffer.num_tapes)}
        self.first_row = {}
        return row

    def state(self) -> dict:
        return {"tape_buffer": self.buffer.state_dict(), "collector": self.state_dict()}

    def state_dict(self) -> dict:
        return {"collector": self.collector.state_dict(), "remaining": self.remaining, "collections": self.collections}

    def load_state_dict(self, state: dict) -> None:
        self.collector.load_state_dict(state["collector"])
        self.remaining, self.collections = int(state["remaining"]), int(state["collections"])


def train_neubay(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                 max_iterations: int | None = None) -> TrainResult:
    """Train a history-based model agent on ``run.dataset`` (see the module docstring)."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    loop = run.loop
    model_dir = model_source(run, algo_name, run_dir, max_iterations, entry.model_defaults)
    if model_dir is None:
        return TrainResult(Path(run_dir), 0, 0, float("nan"), 0.0, None)
    with RunContext(algo_name, run, cfg, run_dir, resume, single_thread=True) as ctx:
        spec = env_spec(run, algo_name, entry.continuous_only)
        horizon = loop.horizon if loop.horizon is not None else spec.max_episode_steps
        if horizon is None:
            raise UserInputError(f"env {run.env!r} has no time limit: expected --horizon N, the steps after which an "
                                 "imagined episode is truncated")
        model = load_model(model_dir, spec, run.env, ctx.device)
        ds = load_dataset(run.dataset, view="trajectory", obs_dim=spec.obs_dim, action_dim=spec.action_dim)
        if loop.clip_actions is not None:
            ds.action.clamp_(-loop.clip_actions, loop.clip_actions)
        data = trajectories_from_dataset(ds, horizon, ctx.device)
        del ds
        u_max, u_stats = uncertainty_threshold(model, data.obs, data.action, loop.uncertainty_quantile)
        O, A = spec.obs_dim, spec.action_dim
        most = min(loop.buffer_transitions,
                   math.ceil(run.total_steps / loop.utd) + 2 * loop.parallel_rollouts * horizon)
        check_memory(most * (4 * (2 * O + A + 1) + 3), f"the tape buffer of up to {most:,} transitions",
                     "--buffer-transitions", ctx.device)
        buffer = TapeBuffer(loop.buffer_transitions, O, A, ctx.device)
        gen = ctx.seed(run.seed)
        algo = entry.make(cfg, spec, ctx.device, gen)
        collector = HistoryCollector(model, data, termination_for(run.env, model), horizon, u_max,
                                     loop.parallel_rollouts, run.env, seed=run.seed + 7)
        first_row = {"rollout/u_max": u_max, **{f"rollout/{k}": round(v, 6) for k, v in u_stats.items()},
                     "rollout/history_trajectories": float(data.lengths.numel())}
        rounds = Collections(collector, algo, buffer, loop.utd, run.total_steps, first_row)
        step, last_return = 0, float("nan")
        if ctx.checkpoint is not None:
            ck, where = ctx.checkpoint, ctx.ck_dir / "latest.pt"
            load_state(algo, ck["algo_state"], "networks", where)
            load_state(buffer, ck["tape_buffer"], "tape buffer", where)
            load_state(rounds, ck["collector"], "collector", where)
            ctx.restore_rng()
            step, last_return = ctx.counters["step"], ctx.counters["last_return"]
        ctx.start(run.total_steps, step, f"{algo_name} {Path(run.dataset).name}", unit="upd")

        def update() -> dict[str, torch.Tensor]:
            algo.schedule(rounds.progress)
            return algo.update(buffer.sample(loop.batch_transitions, algo.gen))

        return run_updates(ctx, algo, update, step, last_return, {"u_max": u_max}, max_iterations, rounds)


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_neubay(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "model-based-recurrent", RecurrentModelBasedLoopConfig, _train,
    summary="dataset -> fitted model -> history prefixes continued in the model -> episode tapes -> update(tapes)"))
