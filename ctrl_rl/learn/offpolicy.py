"""The off-policy training loop: envs -> replay buffer -> algorithm update x UTD -> logging and checkpoints.

One iteration steps all N envs once (N transitions). The first ``learning_starts`` env steps make no update
and act with uniformly random actions in ``[-1, 1]^A`` (``warmup_actions="random"``) or with the policy,
sampling (``"policy"``: WSRL's frozen warm-up); after that the policy acts and every iteration makes
``utd_ratio * N`` updates (fractions carry over to the next iteration). How one update draws its batch is
the registry entry's ``update_step`` (default: one batch of ``batch_size`` with the algorithm's generator).
Updates return device tensors; the loop syncs with the host once per log step, where it also checks for NaN/inf.

The replay buffer goes into checkpoints only with ``--save-replay`` (it can be GBs); a run resumed
without it starts from an empty buffer and updates again once the buffer holds ``batch_size``
transitions. With the replay saved, a resumed run on torch-native envs equals the uninterrupted run.

Offline-to-online runs use the same loop: ``--init`` starts from a pre-trained checkpoint of one of the
entry's ``init_from`` algorithms (its ``init_fields`` replace the config's), ``--dataset`` with ``offline_ratio``
mixes offline data into every batch, ``clip_actions`` clips stored actions. An entry with a ``pretrain_step``
first runs an offline pre-training run (``ctrl_rl.learn.offline_to_online``). With ``--eval-every K`` (env steps) the
deterministic policy is evaluated at step 0 and every K steps, logging ``eval_return``, ``normalized_score`` and
``eval_s`` (the evaluation's own wall time, which benchmarks of training time subtract).

The FastTD3/FastSAC recipe (experiments/presets/fastsac-*.json) adds two things here: ``--n-step`` (batches of
n-step transitions, ``storage.replay.NStepSampler``) and, for an agent with running observation statistics
(``core.protocols.ObservationStatistics``, SAC's ``obs_norm``), every step's observations fed to them before it acts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.obs import obs_map, obs_nbytes, obs_to
from ctrl_rl.core.protocols import Algorithm, ObservationStatistics
from ctrl_rl.core.seeds import batch_seeds
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import read_init, with_network_shape
from ctrl_rl.learn.config import OffPolicyLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.evaluate import evaluate_policy
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
from ctrl_rl.learn.seeds import OwnRNG, SeedSamplers, split_info
from ctrl_rl.storage.datasets import open_dataset, to_replay
from ctrl_rl.storage.replay import MixedSampler, NStepSampler, ReplayBuffer


def load_init(algo: Algorithm, state: dict, path: str, env_id: str) -> None:
    """Load a pre-trained state into ``algo``, keeping ``algo``'s own generator state."""
    try:
        algo.load_state_dict({**state, "gen": algo.gen.get_state()})
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserInputError(f"--init {path!r} does not fit env {env_id!r} and this algorithm's networks "
                             f"({str(e).splitlines()[0][:120]}): "
                             "expected a checkpoint trained on the same task") from None


def open_offline_data(entry, run: RunConfig, spec, device: torch.device):
    """The offline replay of ``--dataset`` (actions in the agent's units, clipped to the loop's ``clip_actions``), or
    None."""
    loop = run.loop
    assert isinstance(loop, OffPolicyLoopConfig)  # the off-policy regime's loop config (ensure_loop)
    if run.dataset is None:
        if loop.offline_ratio:
            raise UserInputError(f"--offline-ratio {loop.offline_ratio} needs --dataset PATH_OR_ID: "
                                 "expected a D4RL/ctrl_rl "
                                 "file or dataset id, or --offline-ratio 0")
        return None
    if loop.offline_ratio == 0 and entry.pretrain_step is None:
        raise UserInputError("--dataset was given with --offline-ratio 0: expected a positive --offline-ratio "
                             "(the fraction of every batch drawn from the dataset)")
    return to_replay(open_dataset(run.dataset, run.env, loop.clip_actions, run.clip_dataset_actions), device)


class EpisodeTally:
    """Sums of finished episodes' returns, lengths and successes on the device (read at the logging boundary)."""

    def __init__(self, num_envs: int, device: torch.device):
        self.sums = torch.zeros(4, num_envs, device=device)  # [4,N] per-env sums: returns, lengths, episodes, successes
        self.has_success = False

    def add(self, info: dict) -> None:  # in-place adds, no reduction per step
        ret, length, count, succ = self.sums
        ret += info["episode_return"]
        length += info["episode_length"]
        count += info["episode_done"]
        if "episode_success" in info:
            self.has_success = True
            succ += info["episode_success"]

    def pop(self) -> tuple[float, float, int, float | None]:
        """(sum of returns, sum of lengths, episodes, success rate or None where the env reports no success)."""
        s, ln, n, k = self.sums.sum(1).tolist()
        self.sums.zero_()
        return s, ln, int(n), ((k / n) if n > 0 else None) if self.has_success else None


def replay_sampler(buffer: ReplayBuffer, offline: ReplayBuffer | None, loop: OffPolicyLoopConfig, cfg,
                   num_envs: int) -> ReplayBuffer | MixedSampler | NStepSampler:
    """What the updates draw their batches from: the replay buffer, its mix with offline data (``offline_ratio``),
    or its n-step transitions (``n_step > 1``, with the algorithm's ``gamma``; the buffer is filled ``num_envs``
    rows at a time)."""
    if loop.n_step > 1:
        if offline is not None and loop.offline_ratio > 0:
            raise UserInputError(f"--n-step {loop.n_step} reads whole trajectories from the replay buffer, which "
                                 "offline data mixed into the batches (--offline-ratio) does not have: expected "
                                 "--n-step 1 with --dataset")
        gamma = getattr(cfg, "gamma", None)
        if not isinstance(gamma, (int, float)) or isinstance(gamma, bool):
            raise UserInputError(f"--n-step {loop.n_step} discounts with the algorithm's gamma, and "
                                 f"{type(cfg).__name__} has none: expected --n-step 1")
        return NStepSampler(buffer, loop.n_step, float(gamma), num_envs)
    if offline is None or loop.offline_ratio == 0:
        return buffer
    return MixedSampler(buffer, offline, loop.offline_ratio)


def train_offpolicy(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                    max_iterations: int | None = None) -> TrainResult:
    """Train an off-policy or offline-to-online algorithm. ``resume`` continues from
    ``run_dir/checkpoints/latest.pt``; ``max_iterations`` stops early after that many env steps of all envs
    of this call (simulates an interruption)."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    loop = run.loop
    assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop: the off-policy regime's loop config
    if entry.requires_init and loop.init is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --init RUN_DIR_OR_CHECKPOINT: "
                             "expected a run of one of "
                             f"{list(entry.init_from)} to fine-tune")
    if entry.requires_dataset and run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: "
                             "expected a D4RL or ctrl_rl .hdf5 "
                             "file, a generated dataset id or a Minari dataset id")
    N = run.num_envs
    if loop.buffer_size < N:
        raise UserInputError(f"--buffer-size {loop.buffer_size} is smaller than one step of {N} envs: expected >= {N}")
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        gen = ctx.seed(run.seed)
        spec = probe_spec(run)
        check_env_memory(run, spec, N, ctx.device)
        A = 1 if spec.discrete else spec.action_dim
        check_memory(loop.buffer_size * (2 * obs_nbytes(spec.parts) + 4 * A + 6),
                     f"--buffer-size {loop.buffer_size} of {run.env}", "--buffer-size", ctx.device)
        env = build_env(run, N, run.seed, getattr(cfg, "gamma", 0.99))
        try:
            if entry.continuous_only and env.spec.discrete:
                raise UserInputError(f"{algo_name} needs continuous actions: env {run.env!r} has discrete actions")
            A = env.spec.action_dim
            init = None
            if loop.init is not None and ctx.checkpoint is not None:  # the shapes this run took from its --init
                cfg = with_network_shape(cfg, ctx.checkpoint["config"]["algo"], entry.init_fields)
            elif loop.init is not None:
                cfg, init_state, init_path = read_init(entry, cfg, loop.init)
                init = (init_state, init_path)
            ctx.cfg = cfg
            offline = open_offline_data(entry, run, env.spec, ctx.device)
            algo = entry.make(cfg, env.spec, ctx.device, gen)
            if not isinstance(algo, Algorithm):
                raise TypeError(f"{algo_name} runs in the off-policy loop but builds a {type(algo).__name__}, "
                                "not an Algorithm")
            if init is not None:
                load_init(algo, *init, run.env)
            buffer = ReplayBuffer(loop.buffer_size, env.spec.obs_shape, A, ctx.device, obs_parts=env.spec.parts)
        except BaseException:
            env.close()
            raise
        try:
            return _run(ctx, entry, run, cfg, env, algo, buffer, offline, max_iterations)
        finally:
            env.close()


def _run(ctx: RunContext, entry, run: RunConfig, cfg, env, algo: Algorithm, buffer, offline,
         max_iterations) -> TrainResult:
    loop, gen, device = run.loop, ctx.gen, ctx.device
    assert isinstance(loop, OffPolicyLoopConfig)  # train_offpolicy ran ensure_loop
    N, A = run.num_envs, env.spec.action_dim
    sampler = replay_sampler(buffer, offline, loop, cfg, N)
    stats = algo if isinstance(algo, ObservationStatistics) else None  # running observation statistics (obs_norm)
    B = loop.batch_size

    def update() -> dict:
        return entry.update_step(algo, sampler, B, cfg)

    random_warmup = loop.warmup_actions == "random"
    clip = loop.clip_actions
    iterations = math.ceil(run.total_steps / N)
    it, step, updates, credit, last_return, next_eval = 0, 0, 0, 0.0, float("nan"), 0
    if ctx.checkpoint is not None:
        ck, c = ctx.checkpoint, ctx.counters
        load_state(algo, ck["algo_state"], "networks", ctx.ck_dir / "latest.pt")
        load_state(env, ck["env_state"], "environments", ctx.ck_dir / "latest.pt")
        obs = obs_to(ck["obs"], device)
        if ck.get("replay") is not None:
            buffer.load_state_dict(ck["replay"])
        ctx.restore_rng()
        it, step, updates, credit = c["iteration"], c["step"], c["updates"], c["credit"]
        last_return, next_eval = c["last_return"], c.get("next_eval", 0)
    else:
        obs = env.reset(seed=run.seed)  # [N,O]
    ctx.start(iterations * N, step, f"{entry.name} {run.env}")
    saved_at = it

    def checkpoint(snapshot: bool = False) -> None:
        nonlocal saved_at
        ctx.check_finite({}, algo, f"step {step}")
        payload = {"algo_state": algo.state_dict(), "env_state": env.state_dict(),
                   "obs": obs_map(lambda v: v.detach().cpu(), obs),
                   "replay": buffer.state_dict() if loop.save_replay and not snapshot else None}
        counters = {"iteration": it, "step": step, "updates": updates, "credit": credit, "last_return": last_return,
                    "next_eval": next_eval}
        if snapshot:
            ctx.save(payload, counters, name=f"step_{step:09d}.pt")
            return
        ctx.save(payload, counters)
        saved_at = it

    def evaluate() -> dict:
        t0 = time.perf_counter()
        ret, score, source, success = evaluate_policy(algo, run, run.eval_episodes, run.seed + 10_000)
        row = {"eval_return": ret, "normalized_score": score, "score_reference": source,
               "eval_s": round(time.perf_counter() - t0, 3)}  # wall time of this evaluation (benchmarks subtract it)
        return row if success is None else {**row, "eval_success_rate": success}

    tally = EpisodeTally(N, device)
    info: dict = {}
    done_iters = 0
    t_log, step_log, upd_log = time.time(), step, updates
    while it < iterations:
        if max_iterations is not None and done_iters >= max_iterations:
            break
        if run.eval_every and step >= next_eval:
            ctx.log({"step": step, "wall_time": round(ctx.wall_time(), 3), **evaluate()})
            next_eval += run.eval_every
        if stats is not None:
            stats.update_obs_stats(obs)
        if step < loop.learning_starts and random_warmup:
            action = torch.rand((N, A), generator=gen, device=device) * 2 - 1  # [N,A] uniform in [-1, 1]
        else:
            action = algo.act(obs)  # [N,A]
        if clip is not None:
            action = action.clamp(-clip, clip)
        out = env.step(action)
        buffer.add(obs, action, out.reward, out.final_obs, out.terminated, out.truncated)
        tally.add(out.info)
        obs = out.obs
        it += 1
        done_iters += 1
        step += N
        if step >= loop.learning_starts and len(buffer) >= B:
            credit += loop.utd_ratio * N
            k = int(credit)
            credit -= k
            for _ in range(k):
                info = update()
            updates += k
        postfix = None
        if it % run.log_every == 0 or it == iterations:
            vals = ctx.floats(info)
            ctx.check_finite(vals, algo, f"step {step} (update {updates})")
            s, ln, n, success = tally.pop()
            if n > 0:
                last_return = s / n
            now = time.time()
            dt = max(now - t_log, 1e-9)
            sps, ups = (step - step_log) / dt, (updates - upd_log) / dt
            t_log, step_log, upd_log = now, step, updates
            row = {"step": step, "wall_time": round(ctx.wall_time(), 3), "iteration": it,
                   "updates": updates, "episode_return": (s / n) if n > 0 else None,
                   "episode_length": (ln / n) if n > 0 else None, "episodes": n, "sps": round(sps, 1),
                   "updates_per_s": round(ups, 1), "replay_size": len(buffer), **vals}
            if success is not None:
                row["success_rate"] = success
            if run.eval_every and it == iterations:
                row.update(evaluate())
                next_eval = step + run.eval_every
            ctx.log(row)
            postfix = f"sps={sps:,.0f} ups={ups:,.0f} return={'-' if math.isnan(last_return) else f'{last_return:.1f}'}"
        ctx.advance(N, postfix)
        if loop.keep_every and it % loop.keep_every == 0:
            checkpoint(snapshot=True)
        if it % run.checkpoint_every == 0 or it == iterations:
            checkpoint()
    if done_iters > 0 and saved_at != it:
        checkpoint()  # an early stop (max_iterations) leaves a resumable checkpoint
    return TrainResult(ctx.run_dir, step, it, last_return, ctx.wall_time(), algo)


class _Seed:
    """One seed of an off-policy seeds-run: what ``_run`` keeps for its one run (context, envs, replay, agent, tally,
    evaluation schedule), collected with, evaluated and checkpointed exactly as that run alone, under its own global
    RNG state (``learn.seeds.OwnRNG``)."""

    def __init__(self, ctx: RunContext, env, algo: Algorithm, buffer: ReplayBuffer, sampler, obs, rng: OwnRNG):
        self.ctx, self.env, self.algo, self.buffer, self.sampler, self.obs, self.rng = (ctx, env, algo, buffer, sampler,
                                                                                         obs, rng)
        self.tally = EpisodeTally(ctx.run.num_envs, ctx.device)
        self.last_return, self.next_eval = float(ctx.counters.get("last_return", float("nan"))), 0
        if ctx.checkpoint is not None:
            self.next_eval = ctx.counters.get("next_eval", 0)

    def evaluate(self) -> dict:
        run = self.ctx.run
        t0 = time.perf_counter()
        with self.rng:
            ret, score, source, success = evaluate_policy(self.algo, run, run.eval_episodes, run.seed + 10_000)
        row = {"eval_return": ret, "normalized_score": score, "score_reference": source,
               "eval_s": round(time.perf_counter() - t0, 3)}  # wall time of this evaluation (as _run logs it)
        return row if success is None else {**row, "eval_success_rate": success}

    def collect(self, step: int) -> None:
        """One step of the seed's N envs into its replay, as ``_run`` steps them (evaluation first when due)."""
        ctx, run = self.ctx, self.ctx.run
        loop = run.loop
        assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop ran
        if run.eval_every and step >= self.next_eval:
            ctx.log({"step": step, "wall_time": round(ctx.wall_time(), 3), **self.evaluate()})
            self.next_eval += run.eval_every
        N, A = run.num_envs, self.env.spec.action_dim
        if isinstance(self.algo, ObservationStatistics):  # running observation statistics (obs_norm), as _run
            self.algo.update_obs_stats(self.obs)
        if step < loop.learning_starts and loop.warmup_actions == "random":
            action = torch.rand((N, A), generator=ctx.gen, device=ctx.device) * 2 - 1  # [N,A] uniform in [-1, 1]
        else:
            action = self.algo.act(self.obs)  # [N,A]
        if loop.clip_actions is not None:
            action = action.clamp(-loop.clip_actions, loop.clip_actions)
        out = self.env.step(action)
        self.buffer.add(self.obs, action, out.reward, out.final_obs, out.terminated, out.truncated)
        self.tally.add(out.info)
        self.obs = out.obs

    def checkpoint(self, counters: dict, snapshot: bool = False) -> None:
        ctx, loop = self.ctx, self.ctx.run.loop
        assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop ran
        ctx.check_finite({}, self.algo, f"step {counters['step']}")
        payload = {"algo_state": self.algo.state_dict(), "env_state": self.env.state_dict(),
                   "obs": obs_map(lambda v: v.detach().cpu(), self.obs),
                   "replay": self.buffer.state_dict() if loop.save_replay and not snapshot else None}
        counters = {**counters, "last_return": self.last_return, "next_eval": self.next_eval}
        with self.rng:
            ctx.save(payload, counters, name=f"step_{counters['step']:09d}.pt" if snapshot else "latest.pt")


def train_offpolicy_seeds(runs: Sequence[RunConfig], algo_name: str, cfg, run_dirs: Sequence[Path],
                          resume: bool = False, max_iterations: int | None = None) -> list[TrainResult]:
    """``train_offpolicy`` of every run of ``runs`` (one per seed, alike but for ``seed`` and the directory) in one
    process: each seed's envs (seeded as alone), replay buffer, agent and generator built, collected with, evaluated
    and checkpointed as its run alone; every update trains all seeds at once, the entry's ``update_step`` on the
    agents batched by the entry's seed layout (``core.seeds``) drawing each seed's batch from its own replay
    (``learn.seeds.SeedSamplers``). ``--dataset`` (offline data mixed into every batch) is loaded once and shared."""
    entry = registry.get(algo_name)
    runs = [ensure_loop(entry, r) for r in runs]
    run0, layout = runs[0], entry.seed_layout
    loop = run0.loop
    assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop: the off-policy regime's loop config
    if layout is None or entry.pretrain_step is not None:
        raise UserInputError(f"--seeds is not available for {algo_name!r}: expected an algorithm with a seed layout "
                             "and no offline pre-training phase")
    if entry.requires_init and loop.init is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --init RUN_DIR_OR_CHECKPOINT: expected a run of one "
                             f"of {list(entry.init_from)} to fine-tune")
    if entry.requires_dataset and run0.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: expected a D4RL or ctrl_rl "
                             ".hdf5 file, a generated dataset id or a Minari dataset id")
    N, S = run0.num_envs, len(runs)
    if loop.buffer_size < N:
        raise UserInputError(f"--buffer-size {loop.buffer_size} is smaller than one step of {N} envs: expected >= {N}")
    with contextlib.ExitStack() as stack:
        seeds: list[_Seed] = []
        offline = None
        for r, d in zip(runs, run_dirs):
            # the first context sets threads (a governor under --threads 0); the others keep what it set
            fixed = r if not seeds else dataclasses.replace(r, threads=torch.get_num_threads())
            ctx = stack.enter_context(RunContext(algo_name, fixed, cfg, d, resume))
            ctx.run = r  # config.json and the checkpoints record the seed's own run
            # what train_offpolicy does before its loop, in its order (global RNG draws included), for this seed
            gen = ctx.seed(r.seed)
            spec = probe_spec(r)
            if not spec.is_flat:
                raise UserInputError(f"--seeds trains agents of flat state observations: env {r.env!r} has the parts "
                                     f"{[p.name for p in spec.parts]} (expected one process per seed with --seed K)")
            check_env_memory(r, spec, S * N, ctx.device)
            A = 1 if spec.discrete else spec.action_dim
            check_memory(S * loop.buffer_size * (2 * obs_nbytes(spec.parts) + 4 * A + 6),
                         f"--buffer-size {loop.buffer_size} of {r.env} for {S} seeds", "--buffer-size", ctx.device)
            env = build_env(r, N, r.seed, getattr(cfg, "gamma", 0.99))
            stack.callback(env.close)
            if entry.continuous_only and env.spec.discrete:
                raise UserInputError(f"{algo_name} needs continuous actions: env {r.env!r} has discrete actions")
            cfg_k, init = cfg, None
            if loop.init is not None and ctx.checkpoint is not None:  # the shapes this run took from its --init
                cfg_k = with_network_shape(cfg, ctx.checkpoint["config"]["algo"], entry.init_fields)
            elif loop.init is not None:
                cfg_k, init_state, init_path = read_init(entry, cfg, loop.init)
                init = (init_state, init_path)
            ctx.cfg = cfg_k
            if not seeds:  # the offline data, read once for every seed
                offline = open_offline_data(entry, r, env.spec, ctx.device)
            algo = entry.make(cfg_k, env.spec, ctx.device, gen)
            if not isinstance(algo, Algorithm):
                raise TypeError(f"{algo_name} runs in the off-policy loop but builds a {type(algo).__name__}, "
                                "not an Algorithm")
            if init is not None:
                load_init(algo, *init, r.env)
            buffer = ReplayBuffer(loop.buffer_size, env.spec.obs_shape, env.spec.action_dim, ctx.device,
                                  obs_parts=env.spec.parts)
            sampler = replay_sampler(buffer, offline, loop, cfg_k, r.num_envs)
            if ctx.checkpoint is not None:
                ck = ctx.checkpoint
                load_state(algo, ck["algo_state"], "networks", ctx.ck_dir / "latest.pt")
                load_state(env, ck["env_state"], "environments", ctx.ck_dir / "latest.pt")
                obs = obs_to(ck["obs"], ctx.device)
                if ck.get("replay") is not None:
                    buffer.load_state_dict(ck["replay"])
                ctx.restore_rng()
            else:
                obs = env.reset(seed=r.seed)  # [N,O]
            seeds.append(_Seed(ctx, env, algo, buffer, sampler, obs, OwnRNG()))
        marks = [tuple(sd.ctx.counters.get(k, 0) for k in ("iteration", "step", "updates", "credit")) for sd in seeds]
        if len(set(marks)) != 1:
            raise UserInputError(f"the seeds' checkpoints stand at different steps {[m[1] for m in marks]}: "
                                 "expected the directories of one seeds-run, resumed together")
        it, step, updates, credit = marks[0]
        cfg0 = seeds[0].ctx.cfg
        batched = batch_seeds([sd.algo for sd in seeds], layout)
        samplers = SeedSamplers([sd.sampler for sd in seeds])
        B, iterations, ctx0 = loop.batch_size, math.ceil(run0.total_steps / N), seeds[0].ctx
        for sd in seeds:
            sd.ctx.start(iterations * N, step, f"{entry.name} {run0.env} seeds {[r.seed for r in runs]}")
        saved_at, done_iters = it, 0
        infos: list[dict] = [{} for _ in seeds]
        t_log, step_log, upd_log = time.time(), step, updates
        while it < iterations:
            if max_iterations is not None and done_iters >= max_iterations:
                break
            for sd in seeds:
                sd.collect(step)
            it += 1
            done_iters += 1
            step += N
            if step >= loop.learning_starts and len(seeds[0].buffer) >= B:
                credit += loop.utd_ratio * N
                k = int(credit)
                credit -= k
                info: dict = {}
                for _ in range(k):
                    info = entry.update_step(batched, samplers, B, cfg0)
                if k > 0:
                    infos = split_info(info, S)
                updates += k
            postfix = None
            if it % run0.log_every == 0 or it == iterations:
                now = time.time()
                dt = max(now - t_log, 1e-9)
                sps, ups = (step - step_log) / dt, (updates - upd_log) / dt
                t_log, step_log, upd_log = now, step, updates
                for sd, info_k in zip(seeds, infos):
                    vals = sd.ctx.floats(info_k)
                    sd.ctx.check_finite(vals, sd.algo, f"step {step} (update {updates})")
                    s, ln, n, success = sd.tally.pop()
                    if n > 0:
                        sd.last_return = s / n
                    row = {"step": step, "wall_time": round(sd.ctx.wall_time(), 3), "iteration": it,
                           "updates": updates, "episode_return": (s / n) if n > 0 else None,
                           "episode_length": (ln / n) if n > 0 else None, "episodes": n, "sps": round(sps, 1),
                           "updates_per_s": round(ups, 1), "replay_size": len(sd.buffer), **vals}
                    if success is not None:
                        row["success_rate"] = success
                    if sd.ctx.run.eval_every and it == iterations:
                        row.update(sd.evaluate())
                        sd.next_eval = step + sd.ctx.run.eval_every
                    sd.ctx.log(row)
                last = seeds[0].last_return
                postfix = f"sps={sps:,.0f} ups={ups:,.0f} return={'-' if math.isnan(last) else f'{last:.1f}'}"
            ctx0.advance(N, postfix)
            counters = {"iteration": it, "step": step, "updates": updates, "credit": credit}
            if loop.keep_every and it % loop.keep_every == 0:
                for sd in seeds:
                    sd.checkpoint(counters, snapshot=True)
            if it % run0.checkpoint_every == 0 or it == iterations:
                for sd in seeds:
                    sd.checkpoint(counters)
                saved_at = it
        if done_iters > 0 and saved_at != it:  # an early stop (max_iterations) leaves a resumable checkpoint
            for sd in seeds:
                sd.checkpoint({"iteration": it, "step": step, "updates": updates, "credit": credit})
        return [TrainResult(sd.ctx.run_dir, step, it, sd.last_return, sd.ctx.wall_time(), sd.algo) for sd in seeds]


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_offpolicy(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "off-policy", OffPolicyLoopConfig, _train, train_seeds=train_offpolicy_seeds,
    summary="envs -> replay buffer -> update(batch) x UTD"))
