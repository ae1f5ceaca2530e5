"""The offline training loop: dataset -> buffer -> algorithm update, evaluated in the real environment.

``--dataset`` (a D4RL or ctrl_rl HDF5 file, a generated dataset id or a Minari id) is loaded and validated
against the evaluation env's observation and action sizes (``--env``), its actions are mapped from the env's units
to the agent's [-1, 1] (``storage.datasets.open_dataset``: out of the env's bounds refused, or clipped with
``--clip-dataset-actions``) and clipped to the loop's ``clip_actions`` (inside tanh's open range), and it fills a
replay buffer on the training device: D4RL files through the ``qlearning`` view, exactly as
``d4rl.qlearning_dataset``; Minari datasets through their episodes.
An algorithm that needs more than plain batches says so in its registry entry (``prepare_offline``: IQL's
reward scale, Cal-QL's Monte-Carlo returns); its record (e.g. the reward scale) goes into the checkpoint.

One iteration is one gradient step (``--total-steps`` counts gradient steps here). Every ``--eval-every``
steps (and at the end) the deterministic policy runs ``--eval-episodes`` episodes in ``--env``; the metrics
hold the mean return and its normalized score with the reference table named. A LeRobot dataset of a real robot
trains without a simulator: the env is ``robot:<name>`` (the CLI takes it from the dataset's ``robot_type`` or
``--robot``), completed with the state's width (``storage.datasets.envdata.robot_env_id``), its actions the
dataset's keys of the robot's action space, and nothing is evaluated.

The same loop runs the offline pre-training phase of an offline-to-online algorithm (its entry's
``pretrain_step`` in place of the update; ``train_offline(..., update_step=...)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from ctrl_rl.algos import registry
from ctrl_rl.algos.registry import default_update_step
from ctrl_rl.core.protocols import Algorithm, Scheduled
from ctrl_rl.core.seeds import batch_seeds
from ctrl_rl.envs.registry import has_simulator
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.config import OfflineLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.evaluate import evaluate_policy
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainResult, load_state, training_spec
from ctrl_rl.learn.seeds import OwnRNG, sample_seeds, split_info
from ctrl_rl.storage.datasets import open_dataset, to_replay
from ctrl_rl.storage.datasets.envdata import robot_env_id


def env_spec(run: RunConfig, algo_name: str, continuous_only: bool):
    """The evaluation env's spec (and a check that the id exists and fits the algorithm), without building it."""
    spec = training_spec(run)
    if continuous_only and spec.discrete:
        raise UserInputError(f"{algo_name} needs continuous actions: env {run.env!r} has discrete actions")
    return spec


def train_offline(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                  max_iterations: int | None = None, update_step=None) -> TrainResult:
    """Train an offline algorithm on ``run.dataset``; ``max_iterations`` stops early (simulates an interruption);
    ``update_step`` replaces the entry's update (an offline pre-training phase)."""
    entry = registry.get(algo_name)
    if not isinstance(run.loop, OfflineLoopConfig):  # an offline pre-training phase brings its own
        run = ensure_loop(entry, run)
    loop = run.loop
    assert isinstance(loop, OfflineLoopConfig)  # ensure_loop: the offline regime's loop config
    if run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: expected a D4RL or ctrl_rl "
                             ".hdf5 file, a generated dataset id or a Minari dataset id")
    step_fn = update_step or entry.update_step
    if not resume:  # a real robot without a simulator (robot:<name>): its state width from the dataset
        run = dataclasses.replace(run, env=robot_env_id(run.env, run.dataset))
    assert run.dataset is not None  # checked above
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        spec = env_spec(run, algo_name, entry.continuous_only)
        ds = open_dataset(run.dataset, run.env, loop.clip_actions, run.clip_dataset_actions)
        buffer = to_replay(ds, ctx.device)
        sampler, record = buffer, {}
        if entry.prepare_offline is not None and update_step is None:
            sampler, record = entry.prepare_offline(ds, buffer, cfg)
        del ds
        gen = ctx.seed(run.seed)
        algo = entry.make(cfg, spec, ctx.device, gen)
        if not isinstance(algo, Algorithm):
            raise TypeError(f"{algo_name} runs in the offline loop but builds a {type(algo).__name__}, "
                            "not an Algorithm")
        total = run.total_steps
        step, last_return = 0, float("nan")
        if ctx.checkpoint is not None:
            load_state(algo, ctx.checkpoint["algo_state"], "networks", ctx.ck_dir / "latest.pt")
            ctx.restore_rng()
            step, last_return = ctx.counters["step"], ctx.counters["last_return"]
        ctx.start(total, step, f"{algo_name} {Path(run.dataset).name}", unit="upd")
        return run_updates(ctx, algo, lambda: step_fn(algo, sampler, loop.batch_size, cfg), step, last_return,
                           record, max_iterations)


class Rounds(Protocol):
    """What a loop built on ``run_updates`` does besides updates (the model-based loop's collector)."""

    def before(self, step: int) -> dict[str, float]:
        """Called before gradient step ``step + 1``; returns figures to log with the next metrics row."""
        ...

    def state(self) -> dict:
        """Extra checkpoint payload (restored by the loop that built it)."""
        ...


class StepRecorder:
    """What follows every gradient step of one run: metrics rows, evaluation in the real env and checkpoints
    (``run_updates``'s bookkeeping; a seeds-run keeps one per seed, each with its seed's global RNG state)."""

    def __init__(self, ctx: RunContext, algo: Algorithm, step: int, last_return: float, record: dict,
                 rounds: Rounds | None = None, rng: OwnRNG | None = None):
        self.ctx, self.algo, self.record, self.rounds, self.rng = ctx, algo, record, rounds, rng
        self.step, self.last_return = step, last_return
        self.simulated = has_simulator(ctx.run.env)  # a real robot's spec (robot:<name>) has nothing to evaluate in
        self.t_log, self.step_log, self.saved_at = time.time(), step, step
        self.pending: dict[str, float] = {}

    def _own_rng(self) -> contextlib.AbstractContextManager:
        return self.rng if self.rng is not None else contextlib.nullcontext()

    def checkpoint(self) -> None:
        extra = self.rounds.state() if self.rounds is not None else {}
        with self._own_rng():
            self.ctx.save({"algo_state": self.algo.state_dict(), **extra},
                          {"step": self.step, "last_return": self.last_return, **self.record})
        self.saved_at = self.step

    def after_update(self, info: dict) -> str | None:
        """Count one gradient step with its ``info``; log, evaluate and checkpoint when due. Returns the progress
        bar's postfix after an evaluation."""
        ctx, run = self.ctx, self.ctx.run
        self.step += 1
        step = self.step
        evaluate = self.simulated and ((run.eval_every > 0 and step % run.eval_every == 0) or step == run.total_steps)
        postfix = None
        if step % run.log_every == 0 or evaluate:
            vals = ctx.floats(info)
            ctx.check_finite(vals, self.algo, f"gradient step {step}")
            now = time.time()
            row = {"step": step, "wall_time": round(ctx.wall_time(), 3),
                   "updates_per_s": round((step - self.step_log) / max(now - self.t_log, 1e-9), 1), **vals,
                   **self.pending}
            self.t_log, self.step_log, self.pending = now, step, {}
            if evaluate:
                with self._own_rng():
                    ret, score, source, success = evaluate_policy(self.algo, run, run.eval_episodes, run.seed + 10_000)
                self.last_return = ret
                row.update(episode_return=ret, normalized_score=score, score_reference=source)
                if success is not None:
                    row["eval_success_rate"] = success
                postfix = f"return={ret:.1f} score={'-' if score is None else f'{score:.1f}'}"
            ctx.log(row)
        if step % run.checkpoint_every == 0 or step == run.total_steps:
            self.checkpoint()
        return postfix

    def finish(self, done: int) -> TrainResult:
        """An early stop (max_iterations) leaves a resumable checkpoint; the run's result."""
        if done > 0 and self.saved_at != self.step:
            self.checkpoint()
        return TrainResult(self.ctx.run_dir, self.step, self.step, self.last_return, self.ctx.wall_time(), self.algo)


def run_updates(ctx: RunContext, algo: Algorithm, update, step: int, last_return: float, record: dict,
                max_iterations: int | None, rounds: Rounds | None = None) -> TrainResult:
    """Gradient steps ``update()`` from ``step`` to ``run.total_steps`` with logging, evaluation in the real env
    and checkpoints (the offline loop's body; the model-based loop adds its collector as ``rounds``). A
    ``Scheduled`` algorithm gets ``schedule(step / total_steps)`` before every update."""
    total = ctx.run.total_steps
    scheduled = isinstance(algo, Scheduled)
    rec = StepRecorder(ctx, algo, step, last_return, record, rounds)
    done = 0
    while rec.step < total:
        if max_iterations is not None and done >= max_iterations:
            break
        if rounds is not None:
            rec.pending.update(rounds.before(rec.step))
        if scheduled:
            algo.schedule(rec.step / total)
        postfix = rec.after_update(update())
        done += 1
        ctx.advance(1, postfix)
    return rec.finish(done)


def train_offline_seeds(runs: Sequence[RunConfig], algo_name: str, cfg, run_dirs: Sequence[Path], resume: bool = False,
                        max_iterations: int | None = None) -> list[TrainResult]:
    """``train_offline`` of every run of ``runs`` (one per seed, alike but for ``seed`` and the directory) in one
    process: one dataset buffer, each seed's agent built, seeded, sampled for and checkpointed as alone, the agents
    updated together by the entry's seed layout (``core.seeds``, ``learn.seeds``)."""
    entry = registry.get(algo_name)
    runs = [ensure_loop(entry, r) for r in runs]
    run0, loop = runs[0], runs[0].loop
    assert isinstance(loop, OfflineLoopConfig)  # ensure_loop: the offline regime's loop config
    if run0.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: expected a D4RL or ctrl_rl "
                             ".hdf5 file, a generated dataset id or a Minari dataset id")
    layout = entry.seed_layout
    if layout is None or entry.update_step is not default_update_step:
        raise UserInputError(f"--seeds is not available for {algo_name!r}: expected an algorithm with a seed layout "
                             "and plain batches")
    if not resume:
        runs = [dataclasses.replace(r, env=robot_env_id(r.env, run0.dataset)) for r in runs]
    with contextlib.ExitStack() as stack:
        ctxs = []
        for r, d in zip(runs, run_dirs):
            # the first context sets threads (a governor under --threads 0); the others keep what it set
            fixed = r if not ctxs else dataclasses.replace(r, threads=torch.get_num_threads())
            ctx = stack.enter_context(RunContext(algo_name, fixed, cfg, d, resume))
            ctx.run = r  # config.json and the checkpoints record the seed's own run
            ctxs.append(ctx)
        ctx0 = ctxs[0]
        spec = env_spec(run0, algo_name, entry.continuous_only)
        ds = open_dataset(run0.dataset, run0.env, loop.clip_actions, run0.clip_dataset_actions)
        buffer = to_replay(ds, ctx0.device)
        sampler, record = buffer, {}
        if entry.prepare_offline is not None:
            sampler, record = entry.prepare_offline(ds, buffer, cfg)
        del ds
        algos, recs = [], []
        for ctx, r in zip(ctxs, runs):
            gen = ctx.seed(r.seed)
            algo = entry.make(cfg, spec, ctx.device, gen)
            if not isinstance(algo, Algorithm) or isinstance(algo, Scheduled):
                raise TypeError(f"{algo_name} has a seed layout but builds a {type(algo).__name__}: expected an "
                                "Algorithm without a schedule")
            step, last_return = 0, float("nan")
            if ctx.checkpoint is not None:
                load_state(algo, ctx.checkpoint["algo_state"], "networks", ctx.ck_dir / "latest.pt")
                ctx.restore_rng()
                step, last_return = ctx.counters["step"], ctx.counters["last_return"]
            algos.append(algo)
            recs.append(StepRecorder(ctx, algo, step, last_return, record, rng=OwnRNG()))
        if len({rec.step for rec in recs}) != 1:
            raise UserInputError(f"the seeds' checkpoints stand at different steps {[rec.step for rec in recs]}: "
                                 "expected the directories of one seeds-run, resumed together")
        batched = batch_seeds(algos, layout)
        gens = [a.gen for a in algos]
        S, total, done = len(algos), run0.total_steps, 0
        for ctx in ctxs:
            ctx.start(total, recs[0].step, f"{algo_name} {Path(run0.dataset).name} seeds {[r.seed for r in runs]}",
                      unit="upd")
        while recs[0].step < total:
            if max_iterations is not None and done >= max_iterations:
                break
            info = batched.update(sample_seeds(sampler, loop.batch_size, gens))
            postfix = [rec.after_update(i) for rec, i in zip(recs, split_info(info, S))]
            done += 1
            ctx0.advance(1, postfix[0])
        return [rec.finish(done) for rec in recs]


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_offline(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "offline", OfflineLoopConfig, _train, train_seeds=train_offline_seeds,
    summary="dataset -> replay buffer -> update(batch), evaluated in the env"))
