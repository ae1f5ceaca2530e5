"""The offline training loop: dataset -> replay buffer -> algorithm.update, evaluated in the real environment.

``--dataset`` (a D4RL or ctrl_rl HDF5 file, or a Minari id) is loaded and validated against the
evaluation env's observation and action sizes (``--env``), its actions are clipped to the algorithm's
``action_clip`` (inside tanh's open range) and it fills a replay buffer on the training device: D4RL
files through the ``qlearning`` view, exactly as ``d4rl.qlearning_dataset``; Minari datasets through
their episodes. IQL rescales rewards by ``1000 / (max - min)`` of the dataset's episode returns, as its
official code does on locomotion data. Cal-QL batches carry each row's Monte-Carlo return-to-go.

One iteration is one gradient step (``--total-steps`` counts gradient steps here). Every
``--eval-every`` steps (and at the end) the deterministic policy runs ``--eval-episodes`` episodes in
``--env``; the metrics hold the mean return and its normalized score with the reference table named.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from ctrl_rl.config import RunConfig, to_dict
from ctrl_rl.core.seeding import seed_everything
from ctrl_rl.algos.cql import MCTransition
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import global_rng_state, load_checkpoint, save_checkpoint, set_global_rng_state
from ctrl_rl.learn.evaluate import run_episodes
from ctrl_rl.learn.onpolicy import TrainingDiverged, TrainResult, build_env
from ctrl_rl.learn.runtime import open_run_dir, progress_bar, setup_device, single_thread_by_default
from ctrl_rl.storage.datasets import load_dataset, normalized_score, to_replay

OFFLINE_ALGOS = ("cql", "calql", "iql")


def make_offline_algo(name: str, cfg, spec, device: torch.device, gen: torch.Generator):
    if name == "iql":
        from ctrl_rl.algos.iql import IQL

        return IQL(cfg, spec, device, gen)
    from ctrl_rl.algos.cql import CQL

    return CQL(cfg, spec, device, gen)


def open_dataset(dataset: str, spec, action_clip: float):
    """``--dataset`` checked against the env's sizes: a file through the ``qlearning`` view (exactly
    ``d4rl.qlearning_dataset``), a Minari dataset through its episodes; actions clipped to +-``action_clip``."""
    ds = load_dataset(dataset, view="qlearning" if Path(dataset).is_file() else None, obs_dim=spec.obs_dim,
                      action_dim=spec.action_dim)
    ds.action.clamp_(-action_clip, action_clip)
    return ds


def evaluate_policy(algo, run: RunConfig, episodes: int, seed: int) -> tuple[float, float | None, str]:
    """Mean deterministic return over ``episodes`` episodes in ``run.env``, its normalized score and the table used."""
    env = build_env(dataclasses.replace(run, reward_scale=False), episodes, seed, 0.99)
    try:
        returns, _ = run_episodes(lambda o: algo.act(o, deterministic=True), env, seed)
    finally:
        env.close()
    mean = float(returns.mean()) if returns.numel() else float("nan")
    try:
        score, source = normalized_score(run.env, mean)
        return mean, float(score), source
    except UserInputError as e:
        return mean, None, str(e)


def train_offline(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                  max_iterations: int | None = None) -> TrainResult:
    """Train CQL, Cal-QL or IQL on ``run.dataset``; ``max_iterations`` stops early (simulates an interruption)."""
    if run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_MINARI_ID: expected a D4RL or ctrl_rl "
                             ".hdf5 file or a Minari dataset id")
    threads_on_entry = torch.get_num_threads()
    device = setup_device(run.device, run.threads)
    single_thread_by_default(device, run.threads)
    probe = build_env(run, 1, run.seed, 0.99)  # the evaluation env's spec (and a check that the id exists)
    spec = probe.spec
    probe.close()
    if spec.discrete:
        raise UserInputError(f"{algo_name} needs continuous actions: env {run.env!r} has discrete actions")
    ds = open_dataset(run.dataset, spec, cfg.action_clip)
    reward_scale = 1.0
    if algo_name == "iql":
        from ctrl_rl.algos.iql import locomotion_reward_scale

        reward_scale = locomotion_reward_scale(ds.episode_returns())
        ds.reward.mul_(reward_scale)
    buffer = to_replay(ds, device)
    mc_return = None
    if algo_name == "calql":
        from ctrl_rl.algos.cql import dataset_mc_returns

        mc_return = dataset_mc_returns(ds, cfg.gamma).to(device)  # [S] aligned with the buffer's rows
    gen = seed_everything(run.seed, device)
    algo = make_offline_algo(algo_name, cfg, spec, device, gen)
    total = run.total_steps

    def sample():
        if mc_return is None:
            return buffer.sample(cfg.batch_size, gen)
        idx = buffer.sample_indices(cfg.batch_size, gen)  # [B]
        b = buffer.gather(idx)
        return MCTransition(b.obs, b.action, b.reward, b.next_obs, b.terminated, b.truncated, mc_return[idx])

    ck_dir = run_dir / "checkpoints"
    step, wall0, last_return = 0, 0.0, float("nan")
    if resume:
        ck = load_checkpoint(ck_dir / "latest.pt", expect_algo=algo_name)
        algo.load_state_dict(ck["algo_state"])
        set_global_rng_state(ck["rng"])
        step, wall0, last_return = ck["counters"]["step"], ck["counters"]["wall_time"], ck["counters"]["last_return"]
    logger = open_run_dir(run_dir, algo_name, run, cfg, step if resume else None)
    bar = progress_bar(run.progress, total, step, f"{algo_name} {Path(run.dataset).name}", unit="upd")
    t_start = time.time()
    t_log, step_log, done = t_start, step, 0
    info: dict[str, torch.Tensor] = {}

    def checkpoint() -> None:
        save_checkpoint(ck_dir / "latest.pt", {
            "algo": algo_name, "config": {"run": to_dict(run), "algo": to_dict(cfg)}, "algo_state": algo.state_dict(),
            "rng": global_rng_state(), "counters": {"step": step, "wall_time": wall0 + time.time() - t_start,
                                                    "last_return": last_return, "reward_scale": reward_scale}})

    try:
        while step < total:
            if max_iterations is not None and done >= max_iterations:
                break
            info = algo.update(sample(), sync=False)
            step += 1
            done += 1
            evaluate = (run.eval_every > 0 and step % run.eval_every == 0) or step == total
            if step % run.log_every == 0 or evaluate:
                vals = dict(zip(info, torch.stack([v.float() for v in info.values()]).tolist()))
                bad = [k for k, v in vals.items() if not math.isfinite(v)]
                if bad or not algo.parameters_finite():
                    what = f"loss {bad[0]}" if bad else "a network parameter"
                    raise TrainingDiverged(f"training diverged at gradient step {step}: {what} became NaN/inf; "
                                           f"the last good checkpoint is {ck_dir / 'latest.pt'}")
                now = time.time()
                row = {"step": step, "wall_time": round(wall0 + now - t_start, 3),
                       "updates_per_s": round((step - step_log) / max(now - t_log, 1e-9), 1), **vals}
                t_log, step_log = now, step
                if evaluate:
                    ret, score, source = evaluate_policy(algo, run, run.eval_episodes, run.seed + 10_000)
                    last_return = ret
                    row.update(episode_return=ret, normalized_score=score, score_reference=source)
                logger.log(row)
                if bar is not None and evaluate:
                    bar.set_postfix_str(f"return={ret:.1f} score={'-' if score is None else f'{score:.1f}'}", refresh=False)
            if bar is not None:
                bar.update(1)
            if step % run.checkpoint_every == 0 or step == total:
                checkpoint()
        if done > 0 and step % run.checkpoint_every != 0 and step != total:
            checkpoint()
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        torch.set_num_threads(threads_on_entry)
    return TrainResult(run_dir, step, step, last_return, wall0 + time.time() - t_start, algo)
