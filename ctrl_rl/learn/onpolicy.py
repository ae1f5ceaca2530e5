"""The on-policy training loop: envs -> rollout storage -> algorithm.update -> logging and checkpoints.

The loop owns environments, storage, logging and checkpoints; the algorithm owns networks and
optimizers. Everything in the collection loop stays on the device: the only host syncs are one per
update (the update's info dict and the episode statistics), at the logging boundary.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.obs import Obs, obs_cat, obs_index, obs_map, obs_nbytes, obs_to
from ctrl_rl.core.protocols import Algorithm, OnPolicySampling, Scheduled
from ctrl_rl.envs.registry import resolve_backend
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn import distributed as D
from ctrl_rl.learn.config import OnPolicyLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import (
    RunContext,
    TrainResult,
    build_env,
    check_env_memory,
    check_memory,
    load_state,
    probe_spec,
)
from ctrl_rl.storage.rollout import RolloutStorage


@runtime_checkable
class OnPolicyAlgorithm(Algorithm, OnPolicySampling, Scheduled, Protocol):
    """What the on-policy loop needs of an algorithm: the contract, sampled actions with their log-probabilities
    (the rollout), settings that follow training progress, and the rollout length it updates on."""

    @property
    def rollout_steps(self) -> int:
        """T: env steps per env in every rollout."""
        ...


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
        # Per-env sums of finished episodes' returns, lengths, count and successes, [4,N]: in-place adds per
        # step instead of reducing to scalars every step; ``stats`` reduces on demand.
        self._episode_sums = torch.zeros(4, self.num_envs, device=device)  # [4,N]
        self.has_success = False  # the env reports success (info["episode_success"])
        self._sum_rows = [[row[sl] for row in self._episode_sums] for sl in self.slices]  # views per group

    @property
    def stats(self) -> torch.Tensor:
        """Sum of returns, sum of lengths, number and successes of the episodes finished since ``zero_stats``,
        ``[4]``."""
        return self._episode_sums.sum(1)

    def zero_stats(self) -> None:
        self._episode_sums.zero_()

    def reset(self, seed: int) -> Obs:
        return obs_cat([e.reset(seed=seed + 7919 * g) for g, e in enumerate(self.envs)])  # [N,O] (or a dict of parts)

    def _record(self, t, storage, obs, action, logp, out, g) -> Obs:
        storage.add(t, obs, action, logp, out, self.slices[g])
        info = out.info
        ret, length, count, succ = self._sum_rows[g]
        ret += info["episode_return"]
        length += info["episode_length"]
        count += info["episode_done"]
        if "episode_success" in info:
            self.has_success = True
            succ += info["episode_success"]
        return out.obs

    def collect(self, algo: OnPolicySampling, storage: RolloutStorage, obs: Obs) -> Obs:
        T = storage.T
        if len(self.envs) == 1:
            env = self.envs[0]
            for t in range(T):
                action, logp = algo.sample(obs)  # [N,A], [N]
                obs = self._record(t, storage, obs, action, logp, env.step(action), 0)
            return obs
        (ea, eb), (sa, sb) = self.envs, self.slices
        oa, ob = obs_index(obs, sa), obs_index(obs, sb)  # [N/2,O] each (or per part)
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
        return obs_cat([oa, ob])  # [N,O] (or per part)

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
    algo_name: str,
    cfg,
    run_dir: Path,
    resume: bool = False,
    max_iterations: int | None = None,
    dist_info: D.DistInfo = D.SINGLE_PROCESS,
) -> TrainResult:
    """Train an on-policy algorithm. ``resume`` continues from ``run_dir/checkpoints/latest.pt``;
    ``max_iterations`` stops early after that many updates of this call (simulates an interruption)."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    loop = run.loop
    assert isinstance(loop, OnPolicyLoopConfig)  # ensure_loop: the on-policy regime's loop config
    W, rank = dist_info.world_size, dist_info.rank
    if run.num_envs % W:
        raise UserInputError(f"--num-envs {run.num_envs} is not divisible by the {W} processes: "
                             f"expected a multiple of {W}")
    n_local = run.num_envs // W
    cfg_local = cfg
    if dist_info.enabled:
        if cfg.minibatch_size % W:
            raise UserInputError(f"--minibatch-size {cfg.minibatch_size} is not divisible by the {W} processes")
        cfg_local = dataclasses.replace(cfg, minibatch_size=cfg.minibatch_size // W)
    backend = resolve_backend(run.env)
    if loop.pipeline and (backend != "envpool" or n_local < 2 or n_local % 2):
        raise UserInputError(f"--pipeline needs an envpool env and an even number of envs per process: "
                             f"got {run.env!r} ({backend}) with {n_local} envs")
    with RunContext(algo_name, run, cfg, run_dir, resume, is_main=dist_info.is_main) as ctx:
        rank_seed = run.seed + 1_000_003 * rank
        gen = ctx.seed(rank_seed)
        gamma = getattr(cfg, "gamma", 0.99)
        check_env_memory(run, probe_spec(run), n_local, ctx.device)
        if loop.pipeline:
            envs = [build_env(run, n_local // 2, rank_seed, gamma),
                    build_env(run, n_local // 2, rank_seed + 7919, gamma)]
        else:
            envs = [build_env(run, n_local, rank_seed, gamma)]
        env = Collector(envs, ctx.device)
        try:
            kwargs = {}
            if dist_info.enabled:
                kwargs = {"grad_reduce": D.all_reduce_mean_, "stats_reduce": D.all_reduce_sum,
                          "broadcast": D.broadcast_module_}
            algo = entry.make(cfg_local, env.spec, ctx.device, gen, **kwargs)
            if not isinstance(algo, OnPolicyAlgorithm):
                raise TypeError(f"{algo_name} runs in the on-policy loop but has no sample, schedule and "
                                "rollout_steps")
            return _run(ctx, run, env, algo, n_local, max_iterations, dist_info)
        finally:
            env.close()


def _run(ctx: RunContext, run: RunConfig, env: Collector, algo: OnPolicyAlgorithm, n_local: int, max_iterations,
         dist_info) -> TrainResult:
    loop, device = run.loop, ctx.device
    assert isinstance(loop, OnPolicyLoopConfig)  # train_onpolicy ran ensure_loop
    W, rank = dist_info.world_size, dist_info.rank
    # envpool steps in its own C++ threads: one torch thread while collecting leaves it the cores
    # (measured on 2 cores: HalfCheetah-v5 with 64 envs, 1.2-1.3x end-to-end; the benchmarks under experiments/)
    envpool_cpu = env.spec.backend == "envpool" and device.type == "cpu"
    if envpool_cpu and run.threads == 0 and torch.get_num_threads() <= 2:
        # On a 2-core machine the update of these small networks also runs on one thread unless
        # --threads says otherwise. A second OpenMP thread saved ~15% of the update on an idle
        # machine (HalfCheetah preset: 33 vs 39 ms), but envpool's own worker threads compete with it:
        # each of the update's ~10^3 small parallel regions then waits at its barrier for a descheduled
        # worker (updates took 0.3-3.9 s instead of ~40 ms, end to end 2k instead of 20k steps/s).
        ctx.cap_threads(1)
    collect_threads = loop.collect_threads or (1 if envpool_cpu else 0)  # 0: the update's count
    T = algo.rollout_steps
    steps_per_iter = T * run.num_envs
    iterations = math.ceil(run.total_steps / steps_per_iter)
    A = 1 if env.spec.discrete else env.spec.action_dim
    check_memory(T * n_local * (2 * obs_nbytes(env.spec.parts) + 4 * (A + 4)),
                 f"the rollout storage of {T} steps x {n_local} envs", "--rollout-steps or --num-envs", device)
    storage = RolloutStorage(T, n_local, env.spec, device)

    start_it, step, last_return = 0, 0, float("nan")
    if ctx.checkpoint is not None:
        ck = ctx.checkpoint
        if W > 1 and ck.get("world_size", 1) != W:
            raise UserInputError(f"checkpoint was written by {ck.get('world_size', 1)} processes: expected {W}")
        where = ctx.ck_dir / "latest.pt"
        load_state(algo, ck["algo_state"] if W == 1 else ck["ranks"][rank]["algo_state"], "networks", where)
        load_state(env, ck["env_state"] if W == 1 else ck["ranks"][rank]["env_state"], "environments", where)
        obs = obs_to(ck["obs"] if W == 1 else ck["ranks"][rank]["obs"], device)
        ctx.restore_rng()
        c = ctx.counters
        start_it, step, last_return = c["iteration"], c["step"], c["last_return"]
    else:
        obs = env.reset(seed=run.seed + 1_000_003 * rank)  # [N,O]
    ctx.start(iterations * steps_per_iter, step, f"{ctx.algo_name} {run.env}")

    def checkpoint(it: int) -> None:
        state = {"algo_state": algo.state_dict(), "env_state": env.state_dict(),
                 "obs": obs_map(lambda v: v.detach().cpu(), obs)}
        if dist_info.enabled:
            import torch.distributed as dist

            gathered = [None] * W
            dist.all_gather_object(gathered, state)
            payload = {"ranks": gathered, "world_size": W}
        else:
            payload = state
        ctx.save(payload, {"iteration": it, "step": step, "last_return": last_return})

    it = start_it
    done_iters = 0
    t_log, step_log = time.time(), step
    while it < iterations:
        if max_iterations is not None and done_iters >= max_iterations:
            break
        algo.schedule(it / iterations)
        update_threads = torch.get_num_threads()  # the governor's or --threads' count
        if collect_threads and collect_threads != update_threads:
            torch.set_num_threads(collect_threads)
            obs = env.collect(algo, storage, obs)  # [N,O]
            torch.set_num_threads(update_threads)
        else:
            obs = env.collect(algo, storage, obs)  # [N,O]
        info = ctx.floats(algo.update(storage.rollout()))
        it += 1
        done_iters += 1
        step += steps_per_iter
        ctx.check_finite(info, algo, f"step {step} (update {it})")
        postfix = None
        if it % run.log_every == 0 or it == iterations:
            stats = env.stats
            if dist_info.enabled:
                stats = D.all_reduce_sum(stats)
            s, ln, n, k = stats.tolist()
            if n > 0:
                last_return = s / n
            env.zero_stats()
            now = time.time()
            sps = (step - step_log) / max(now - t_log, 1e-9)
            t_log, step_log = now, step
            # null where no episode finished in this interval (no carried-forward values)
            ctx.log({"step": step, "wall_time": round(ctx.wall_time(), 3), "iteration": it,
                     "episode_return": (s / n) if n > 0 else None, "episode_length": (ln / n) if n > 0 else None,
                     "episodes": int(n), "sps": round(sps, 1),
                     **({"success_rate": (k / n) if n > 0 else None} if env.has_success else {}), **info})
            postfix = f"sps={sps:,.0f} return={'-' if math.isnan(last_return) else f'{last_return:.1f}'}"
        ctx.advance(steps_per_iter, postfix)
        if it % run.checkpoint_every == 0 or it == iterations:
            checkpoint(it)
    if done_iters > 0 and it % run.checkpoint_every != 0 and it != iterations:
        checkpoint(it)  # an early stop (max_iterations) leaves a resumable checkpoint
    return TrainResult(ctx.run_dir, step, it, last_return, ctx.wall_time(), algo)


register_regime(Regime(
    "on-policy", OnPolicyLoopConfig, train_onpolicy,
    summary="envs -> rollout storage [T,N] -> returns -> update(rollout); data-parallel under torchrun"))
