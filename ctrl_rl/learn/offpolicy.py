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

A single run and a seeds-run (``--seeds``, ``train_offpolicy_seeds``) are one loop, ``_drive``, over a list of
``_Seed`` (one run's envs, replay, agent; built by ``_open_seed``): a single run is the one-seed case, updating its
own agent; a seeds-run updates the seeds' agents batched (``learn/seeds.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
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


def _check_run(entry, run: RunConfig) -> None:
    """What an off-policy run needs before anything is built: ``--init``, ``--dataset``, a buffer of one step."""
    loop = run.loop
    assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop: the off-policy regime's loop config
    if entry.requires_init and loop.init is None:
        raise UserInputError(f"`ctrl-rl train {entry.name}` needs --init RUN_DIR_OR_CHECKPOINT: expected a run of one "
                             f"of {list(entry.init_from)} to fine-tune")
    if entry.requires_dataset and run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {entry.name}` needs --dataset PATH_OR_ID: expected a D4RL or ctrl_rl "
                             ".hdf5 file, a generated dataset id or a Minari dataset id")
    N = run.num_envs
    if loop.buffer_size < N:
        raise UserInputError(f"--buffer-size {loop.buffer_size} is smaller than one step of {N} envs: expected >= {N}")


def train_offpolicy(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                    max_iterations: int | None = None) -> TrainResult:
    """Train an off-policy or offline-to-online algorithm. ``resume`` continues from
    ``run_dir/checkpoints/latest.pt``; ``max_iterations`` stops early after that many env steps of all envs
    of this call (simulates an interruption). The one-seed case of ``_drive``."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    _check_run(entry, run)
    with contextlib.ExitStack() as stack:
        ctx = stack.enter_context(RunContext(algo_name, run, cfg, run_dir, resume))
        sd = _open_seed(entry, ctx, cfg, stack, 1, lambda spec: open_offline_data(entry, run, spec, ctx.device))
        return _drive(entry, [sd], sd.algo, sd.sampler, lambda info: [info], max_iterations,
                      f"{entry.name} {run.env}")[0]


def train_offpolicy_seeds(runs: Sequence[RunConfig], algo_name: str, cfg, run_dirs: Sequence[Path],
                          resume: bool = False, max_iterations: int | None = None) -> list[TrainResult]:
    """``train_offpolicy`` of every run of ``runs`` (one per seed, alike but for ``seed`` and the directory) in one
    process: each seed's envs (seeded as alone), replay buffer, agent and generator built, collected with, evaluated
    and checkpointed as its run alone; every update trains all seeds at once, the entry's ``update_step`` on the
    agents batched by the entry's seed layout (``core.seeds``) drawing each seed's batch from its own replay
    (``learn.seeds.SeedSamplers``). ``--dataset`` (offline data mixed into every batch) is loaded once and shared."""
    entry = registry.get(algo_name)
    runs = [ensure_loop(entry, r) for r in runs]
    layout = entry.seed_layout
    if layout is None or entry.pretrain_step is not None:
        raise UserInputError(f"--seeds is not available for {algo_name!r}: expected an algorithm with a seed layout "
                             "and no offline pre-training phase")
    _check_run(entry, runs[0])
    offline: list = []  # the offline data, read once (at the first seed, where its run alone reads it) for every seed

    def open_offline(run: RunConfig, spec, device: torch.device):
        if not offline:
            offline.append(open_offline_data(entry, run, spec, device))
        return offline[0]

    with contextlib.ExitStack() as stack:
        seeds: list[_Seed] = []
        for r, d in zip(runs, run_dirs):
            # the first context sets threads (a governor under --threads 0); the others keep what it set
            fixed = r if not seeds else dataclasses.replace(r, threads=torch.get_num_threads())
            ctx = stack.enter_context(RunContext(algo_name, fixed, cfg, d, resume))
            ctx.run = r  # config.json and the checkpoints record the seed's own run
            seeds.append(_open_seed(entry, ctx, cfg, stack, len(runs),
                                    lambda spec, r=r, ctx=ctx: open_offline(r, spec, ctx.device)))
        return _drive(entry, seeds, batch_seeds([sd.algo for sd in seeds], layout),
                      SeedSamplers([sd.sampler for sd in seeds]), lambda info: split_info(info, len(seeds)),
                      max_iterations, f"{entry.name} {runs[0].env} seeds {[r.seed for r in runs]}")


class _Seed:
    """One run of the loop (one seed of a seeds-run): its context, envs, replay, sampler, agent, last observation,
    tally and evaluation schedule, collected with, evaluated and checkpointed as that run alone; ``rng`` holds its
    global RNG state in a seeds-run (``learn.seeds.OwnRNG``) and is a no-op context for a single run."""

    def __init__(self, ctx: RunContext, env, algo: Algorithm, buffer: ReplayBuffer, sampler, obs,
                 rng: contextlib.AbstractContextManager):
        self.ctx, self.env, self.algo, self.buffer, self.sampler, self.obs, self.rng = (ctx, env, algo, buffer, sampler,
                                                                                         obs, rng)
        self.stats = algo if isinstance(algo, ObservationStatistics) else None  # running observation statistics
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
               "eval_s": round(time.perf_counter() - t0, 3)}  # wall time of this evaluation (benchmarks subtract it)
        return row if success is None else {**row, "eval_success_rate": success}

    def collect(self, step: int) -> None:
        """One step of the N envs into the replay (evaluation first when due)."""
        ctx, run = self.ctx, self.ctx.run
        loop = run.loop
        assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop ran
        if run.eval_every and step >= self.next_eval:
            ctx.log({"step": step, "wall_time": round(ctx.wall_time(), 3), **self.evaluate()})
            self.next_eval += run.eval_every
        N, A = run.num_envs, self.env.spec.action_dim
        if self.stats is not None:
            self.stats.update_obs_stats(self.obs)
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

    def log(self, vals: dict, counters: dict, rates: tuple[float, float], final: bool) -> None:
        """The log row of this step: the finished episodes, the rates, the update's ``vals`` (an evaluation at the
        ``final`` step)."""
        run = self.ctx.run
        s, ln, n, success = self.tally.pop()
        if n > 0:
            self.last_return = s / n
        step = counters["step"]
        row = {"step": step, "wall_time": round(self.ctx.wall_time(), 3), "iteration": counters["iteration"],
               "updates": counters["updates"], "episode_return": (s / n) if n > 0 else None,
               "episode_length": (ln / n) if n > 0 else None, "episodes": n, "sps": round(rates[0], 1),
               "updates_per_s": round(rates[1], 1), "replay_size": len(self.buffer), **vals}
        if success is not None:
            row["success_rate"] = success
        if run.eval_every and final:
            row.update(self.evaluate())
            self.next_eval = step + run.eval_every
        self.ctx.log(row)

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


def _open_seed(entry, ctx: RunContext, cfg, stack: contextlib.ExitStack, seeds: int, open_offline) -> _Seed:
    """One run's envs (closed by ``stack``), agent (from ``--init``), replay and sampler, resumed from its checkpoint,
    in the order of global RNG draws its run alone makes; memory is checked for ``seeds`` such runs, and the offline
    data comes from ``open_offline(spec)``."""
    run, N = ctx.run, ctx.run.num_envs
    loop = run.loop
    assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop ran
    gen = ctx.seed(run.seed)
    spec = probe_spec(run)
    if seeds > 1 and not spec.is_flat:
        raise UserInputError(f"--seeds trains agents of flat state observations: env {run.env!r} has the parts "
                             f"{[p.name for p in spec.parts]} (expected one process per seed with --seed K)")
    check_env_memory(run, spec, seeds * N, ctx.device)
    A = 1 if spec.discrete else spec.action_dim
    check_memory(seeds * loop.buffer_size * (2 * obs_nbytes(spec.parts) + 4 * A + 6),
                 f"--buffer-size {loop.buffer_size} of {run.env}" + (f" for {seeds} seeds" if seeds > 1 else ""),
                 "--buffer-size", ctx.device)
    env = build_env(run, N, run.seed, getattr(cfg, "gamma", 0.99))
    stack.callback(env.close)
    if entry.continuous_only and env.spec.discrete:
        raise UserInputError(f"{entry.name} needs continuous actions: env {run.env!r} has discrete actions")
    init = None
    if loop.init is not None and ctx.checkpoint is not None:  # the shapes this run took from its --init
        cfg = with_network_shape(cfg, ctx.checkpoint["config"]["algo"], entry.init_fields)
    elif loop.init is not None:
        cfg, init_state, init_path = read_init(entry, cfg, loop.init)
        init = (init_state, init_path)
    ctx.cfg = cfg
    offline = open_offline(env.spec)
    algo = entry.make(cfg, env.spec, ctx.device, gen)
    if not isinstance(algo, Algorithm):
        raise TypeError(f"{entry.name} runs in the off-policy loop but builds a {type(algo).__name__}, "
                        "not an Algorithm")
    if init is not None:
        load_init(algo, *init, run.env)
    buffer = ReplayBuffer(loop.buffer_size, env.spec.obs_shape, env.spec.action_dim, ctx.device,
                          obs_parts=env.spec.parts)
    sampler = replay_sampler(buffer, offline, loop, cfg, N)
    if ctx.checkpoint is not None:
        ck = ctx.checkpoint
        load_state(algo, ck["algo_state"], "networks", ctx.ck_dir / "latest.pt")
        load_state(env, ck["env_state"], "environments", ctx.ck_dir / "latest.pt")
        obs = obs_to(ck["obs"], ctx.device)
        if ck.get("replay") is not None:
            buffer.load_state_dict(ck["replay"])
        ctx.restore_rng()
    else:
        obs = env.reset(seed=run.seed)  # [N,O]
    return _Seed(ctx, env, algo, buffer, sampler, obs, OwnRNG() if seeds > 1 else contextlib.nullcontext())


def _drive(entry, seeds: list[_Seed], agent, sampler, split: Callable[[dict], list[dict]],
           max_iterations: int | None, desc: str) -> list[TrainResult]:
    """The loop over ``seeds`` (one for a single run): each iteration steps every seed's envs once, then makes the
    update credit's updates, the entry's ``update_step`` on ``agent`` (the seed's own, or the seeds' batched) with
    ``sampler`` (the seed's, or ``SeedSamplers``), ``split`` giving each seed's info of the last one; it logs and
    checkpoints every seed. ``max_iterations`` stops early (counted in this call) with a resumable checkpoint."""
    run0 = seeds[0].ctx.run
    loop = run0.loop
    assert isinstance(loop, OffPolicyLoopConfig)  # ensure_loop ran
    marks = [tuple(sd.ctx.counters.get(k, 0) for k in ("iteration", "step", "updates")) +
             (sd.ctx.counters.get("credit", 0.0),) for sd in seeds]
    if len(set(marks)) != 1:
        raise UserInputError(f"the seeds' checkpoints stand at different steps {[m[1] for m in marks]}: "
                             "expected the directories of one seeds-run, resumed together")
    it, step, updates, credit = marks[0]
    N, B, cfg = run0.num_envs, loop.batch_size, seeds[0].ctx.cfg
    iterations = math.ceil(run0.total_steps / N)
    for sd in seeds:
        sd.ctx.start(iterations * N, step, desc)
    saved_at, done_iters = it, 0
    infos: list[dict] = [{} for _ in seeds]
    t_log, step_log, upd_log = time.time(), step, updates

    def checkpoint(snapshot: bool = False) -> None:
        nonlocal saved_at
        counters = {"iteration": it, "step": step, "updates": updates, "credit": credit}
        for sd in seeds:
            sd.checkpoint(counters, snapshot)
        if not snapshot:
            saved_at = it

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
                info = entry.update_step(agent, sampler, B, cfg)
            if k > 0:
                infos = split(info)
            updates += k
        postfix = None
        if it % run0.log_every == 0 or it == iterations:
            counters = {"iteration": it, "step": step, "updates": updates}
            rates = (0.0, 0.0)
            for i, (sd, info_k) in enumerate(zip(seeds, infos)):
                vals = sd.ctx.floats(info_k)  # the host sync of this log step
                sd.ctx.check_finite(vals, sd.algo, f"step {step} (update {updates})")
                if i == 0:  # timed after the first sync, so the updates' device time falls in this interval
                    now = time.time()
                    dt = max(now - t_log, 1e-9)
                    rates = (step - step_log) / dt, (updates - upd_log) / dt
                    t_log, step_log, upd_log = now, step, updates
                sd.log(vals, counters, rates, final=it == iterations)
            last = seeds[0].last_return
            postfix = f"sps={rates[0]:,.0f} ups={rates[1]:,.0f} return={'-' if math.isnan(last) else f'{last:.1f}'}"
        seeds[0].ctx.advance(N, postfix)
        if loop.keep_every and it % loop.keep_every == 0:
            checkpoint(snapshot=True)
        if it % run0.checkpoint_every == 0 or it == iterations:
            checkpoint()
    if done_iters > 0 and saved_at != it:
        checkpoint()  # an early stop (max_iterations) leaves a resumable checkpoint
    return [TrainResult(sd.ctx.run_dir, step, it, sd.last_return, sd.ctx.wall_time(), sd.algo) for sd in seeds]


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_offpolicy(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "off-policy", OffPolicyLoopConfig, _train, train_seeds=train_offpolicy_seeds,
    summary="envs -> replay buffer -> update(batch) x UTD"))
