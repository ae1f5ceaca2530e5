"""The on-policy training loop: envs -> rollout storage -> algorithm.update -> logging and checkpoints.

The loop owns environments, storage, logging and checkpoints; the algorithm owns networks and
optimizers. Everything in the collection loop stays on the device: the only host syncs are one per
update (the update's info dict and the episode statistics), at the logging boundary.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ctrl_rl.algos.ppo import PPO, PPOConfig
from ctrl_rl.config import RunConfig, to_dict
from ctrl_rl.core.seeding import seed_everything
from ctrl_rl.envs.registry import make_env, resolve_backend
from ctrl_rl.envs.wrappers import ActionRescale, EpisodeStats, RewardScale
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn import distributed as D
from ctrl_rl.learn.checkpoint import global_rng_state, load_checkpoint, save_checkpoint, set_global_rng_state
from ctrl_rl.learn.runtime import open_run_dir, progress_bar, setup_device
from ctrl_rl.storage.rollout import RolloutStorage


class TrainingDiverged(RuntimeError):
    """A loss or parameter became NaN/inf; the last good checkpoint is kept."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    iterations: int
    last_return: float
    wall_time: float
    algo: PPO


def build_env(run: RunConfig, num_envs: int, seed: int, gamma: float):
    env = make_env(run.env, num_envs=num_envs, device=run.device, seed=seed)
    env = EpisodeStats(env)
    if not env.spec.discrete:
        env = ActionRescale(env)
    if run.reward_scale:
        env = RewardScale(env, gamma=gamma)
    return env


class Collector:
    """Steps the envs for one rollout with the current policy and writes it into the storage.

    With one group it is the plain loop. With two groups (pipelined) it hands one group's actions to
    the simulator (``step_async``) and computes the other group's actions while those simulate, so the
    policy forward pass and the bookkeeping overlap the simulation. Every action still comes from the
    current policy: the rollout is exactly on-policy, only the order of the generator draws changes.
    Episode statistics are summed on the device (no host sync here).
    """

    def __init__(self, envs: list, device: torch.device):
        self.envs = envs
        self.spec = envs[0].spec
        sizes = [e.num_envs for e in envs]
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        self.num_envs = bounds[-1]
        # Per-env sums of finished episodes' returns and lengths and of their count, [3,N]: three
        # in-place adds per step instead of reducing to scalars every step; ``stats`` reduces on demand.
        self._episode_sums = torch.zeros(3, self.num_envs, device=device)  # [3,N]
        self._sum_rows = [[row[sl] for row in self._episode_sums] for sl in self.slices]  # views per group

    @property
    def stats(self) -> torch.Tensor:
        """Sum of returns, sum of lengths and number of the episodes finished since ``zero_stats``, ``[3]``."""
        return self._episode_sums.sum(1)

    def zero_stats(self) -> None:
        self._episode_sums.zero_()

    def reset(self, seed: int) -> torch.Tensor:
        return torch.cat([e.reset(seed=seed + 7919 * g) for g, e in enumerate(self.envs)])  # [N,O]

    def _record(self, t, storage, obs, action, logp, out, g) -> torch.Tensor:
        storage.add(t, obs, action, logp, out, self.slices[g])
        info = out.info
        ret, length, count = self._sum_rows[g]
        ret += info["episode_return"]
        length += info["episode_length"]
        count += info["episode_done"]
        return out.obs

    def collect(self, algo: PPO, storage: RolloutStorage, obs: torch.Tensor) -> torch.Tensor:
        T = storage.T
        if len(self.envs) == 1:
            env = self.envs[0]
            for t in range(T):
                action, logp = algo.sample(obs)  # [N,A], [N]
                obs = self._record(t, storage, obs, action, logp, env.step(action), 0)
            return obs
        (ea, eb), (sa, sb) = self.envs, self.slices
        oa, ob = obs[sa], obs[sb]  # [N/2,O] each
        aa, la = algo.sample(oa)
        ea.step_async(aa)
        for t in range(T):
            ab, lb = algo.sample(ob)
            eb.step_async(ab)  # group B simulates while group A's step is recorded and its next action computed
            oa = self._record(t, storage, oa, aa, la, ea.step_wait(), 0)
            if t + 1 < T:
                aa, la = algo.sample(oa)
                ea.step_async(aa)
            ob = self._record(t, storage, ob, ab, lb, eb.step_wait(), 1)
        return torch.cat([oa, ob])  # [N,O]

    def state_dict(self) -> dict:
        return {"groups": [e.state_dict() for e in self.envs]}

    def load_state_dict(self, state: dict) -> None:
        groups = state["groups"]
        if len(groups) != len(self.envs):
            raise UserInputError(f"checkpoint was collected with {len(groups)} env group(s), this run uses "
                                 f"{len(self.envs)}: expected the same --pipeline setting as the original run")
        for e, sd in zip(self.envs, groups):
            e.load_state_dict(sd)

    def close(self) -> None:
        for e in self.envs:
            e.close()


def train_onpolicy(
    run: RunConfig,
    cfg: PPOConfig,
    run_dir: Path,
    resume: bool = False,
    max_iterations: int | None = None,
    dist_info: D.DistInfo = D.DistInfo(),
) -> TrainResult:
    """Train PPO. ``resume`` continues from ``run_dir/checkpoints/latest.pt``; ``max_iterations`` stops
    early after that many updates of this call (used to simulate an interruption in tests)."""
    threads_on_entry = torch.get_num_threads()  # restored on return: the settings below are process-wide
    device = setup_device(run.device, run.threads)
    W, rank = dist_info.world_size, dist_info.rank
    if run.num_envs % W:
        raise UserInputError(f"--num-envs {run.num_envs} is not divisible by the {W} processes: expected a multiple of {W}")
    n_local = run.num_envs // W
    if dist_info.enabled:
        if cfg.minibatch_size % W:
            raise UserInputError(f"--minibatch-size {cfg.minibatch_size} is not divisible by the {W} processes")
        from dataclasses import replace

        cfg_local = replace(cfg, minibatch_size=cfg.minibatch_size // W, value_chunk=cfg.value_chunk)
    else:
        cfg_local = cfg
    rank_seed = run.seed + 1_000_003 * rank
    gen = seed_everything(rank_seed, device)
    backend = resolve_backend(run.env)
    if run.pipeline and (backend != "envpool" or n_local < 2 or n_local % 2):
        raise UserInputError(f"--pipeline needs an envpool env and an even number of envs per process: "
                             f"got {run.env!r} ({backend}) with {n_local} envs")
    if run.pipeline:
        envs = [build_env(run, n_local // 2, rank_seed, cfg.gamma), build_env(run, n_local // 2, rank_seed + 7919, cfg.gamma)]
    else:
        envs = [build_env(run, n_local, rank_seed, cfg.gamma)]
    env = Collector(envs, device)
    algo = PPO(
        cfg_local, env.spec, device, gen,
        grad_reduce=D.all_reduce_mean_ if dist_info.enabled else None,
        stats_reduce=D.all_reduce_sum if dist_info.enabled else None,
    )
    if dist_info.enabled:
        D.broadcast_module_(algo.ac)
    # envpool steps in its own C++ threads: one torch thread while collecting leaves it the cores
    # (measured on 2 cores: HalfCheetah-v5 with 64 envs, 1.2-1.3x end-to-end; experiments/bench/)
    envpool_cpu = env.spec.backend == "envpool" and device.type == "cpu"
    update_threads = torch.get_num_threads()
    if envpool_cpu and run.threads == 0 and update_threads <= 2:
        # On a 2-core machine the update of these small networks also runs on one thread unless
        # --threads says otherwise. A second OpenMP thread saved ~15% of the update on an idle
        # machine (HalfCheetah preset: 33 vs 39 ms), but when other processes compete for the cores,
        # each of the update's ~10^3 small parallel regions waits at its barrier for a descheduled
        # worker: updates then took 0.3-3.9 s instead of ~40 ms, 10-100x slower, end to end 2k instead
        # of 20k steps/s. One thread degrades only in proportion to the competition.
        update_threads = 1
        torch.set_num_threads(1)
    collect_threads = run.collect_threads or (1 if envpool_cpu else update_threads)
    T = cfg.rollout_steps
    steps_per_iter = T * run.num_envs
    iterations = math.ceil(run.total_steps / steps_per_iter)
    storage = RolloutStorage(T, n_local, env.spec, device)

    ck_dir = run_dir / "checkpoints"
    start_it, step, wall0, last_return = 0, 0, 0.0, float("nan")
    if resume:
        ck = load_checkpoint(ck_dir / "latest.pt", expect_algo="ppo")
        if W > 1 and ck.get("world_size", 1) != W:
            raise UserInputError(f"checkpoint was written by {ck.get('world_size', 1)} processes: expected {W}")
        algo.load_state_dict(ck["algo_state"] if W == 1 else ck["ranks"][rank]["algo_state"])
        env.load_state_dict(ck["env_state"] if W == 1 else ck["ranks"][rank]["env_state"])
        obs = (ck["obs"] if W == 1 else ck["ranks"][rank]["obs"]).to(device)
        set_global_rng_state(ck["rng"])
        c = ck["counters"]
        start_it, step, wall0, last_return = c["iteration"], c["step"], c["wall_time"], c["last_return"]
    else:
        obs = env.reset(seed=rank_seed)  # [N,O]

    logger = None
    if dist_info.is_main:
        logger = open_run_dir(run_dir, "ppo", run, cfg, step if resume else None)

    bar = progress_bar(run.progress and dist_info.is_main, iterations * steps_per_iter, step, f"ppo {run.env}")

    def checkpoint(it: int) -> None:
        state = {"algo_state": algo.state_dict(), "env_state": env.state_dict(), "obs": obs.detach().cpu()}
        if dist_info.enabled:
            gathered = [None] * W
            import torch.distributed as dist

            dist.all_gather_object(gathered, state)
            if not dist_info.is_main:
                return
            payload = {"ranks": gathered, "world_size": W}
        else:
            payload = dict(state)
        payload.update({"algo": "ppo", "config": {"run": to_dict(run), "algo": to_dict(cfg)},
                        "rng": global_rng_state(),
                        "counters": {"iteration": it, "step": step, "wall_time": wall0 + time.time() - t_start,
                                     "last_return": last_return}})
        save_checkpoint(ck_dir / "latest.pt", payload)

    t_start = time.time()
    it = start_it
    done_iters = 0
    t_log, step_log = time.time(), step
    try:
        while it < iterations:
            if max_iterations is not None and done_iters >= max_iterations:
                break
            if cfg.anneal_lr:
                algo.set_lr_fraction(1.0 - it / iterations)
            if collect_threads != update_threads:
                torch.set_num_threads(collect_threads)
            obs = env.collect(algo, storage, obs)  # [N,O]
            if collect_threads != update_threads:
                torch.set_num_threads(update_threads)
            info = algo.update(storage.rollout())
            it += 1
            done_iters += 1
            step += steps_per_iter
            bad = [k for k, v in info.items() if not math.isfinite(v)]
            if bad or not algo.parameters_finite():
                what = f"loss {bad[0]}" if bad else "a network parameter"
                raise TrainingDiverged(
                    f"training diverged at step {step} (update {it}): {what} became NaN/inf; "
                    f"the last good checkpoint is {ck_dir / 'latest.pt'}")
            last_log = it % run.log_every == 0 or it == iterations
            if last_log:
                stats = env.stats
                if dist_info.enabled:
                    stats = D.all_reduce_sum(stats)
                s, ln, n = stats.tolist()
                if n > 0:
                    last_return = s / n
                env.zero_stats()
                now = time.time()
                sps = (step - step_log) / max(now - t_log, 1e-9)
                t_log, step_log = now, step
                if logger is not None:
                    row = {"step": step, "wall_time": round(wall0 + now - t_start, 3), "iteration": it,
                           # null where no episode finished in this interval (no carried-forward values)
                           "episode_return": (s / n) if n > 0 else None, "episode_length": (ln / n) if n > 0 else None,
                           "episodes": int(n), "sps": round(sps, 1), **info}
                    logger.log(row)
                if bar is not None:
                    bar.set_postfix_str(f"sps={sps:,.0f} return={'-' if math.isnan(last_return) else f'{last_return:.1f}'}",
                                      refresh=False)
            if bar is not None:
                bar.update(steps_per_iter)
            if it % run.checkpoint_every == 0 or it == iterations:
                checkpoint(it)
        if done_iters > 0 and it % run.checkpoint_every != 0 and it != iterations:
            checkpoint(it)  # an early stop (max_iterations) leaves a resumable checkpoint
    finally:
        if bar is not None:
            bar.close()
        if logger is not None:
            logger.close()
        env.close()
        torch.set_num_threads(threads_on_entry)
    return TrainResult(run_dir, step, it, last_return, wall0 + time.time() - t_start, algo)

