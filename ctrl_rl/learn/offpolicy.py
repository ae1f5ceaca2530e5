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
deterministic policy is evaluated at step 0 and every K steps, logging ``eval_return`` and ``normalized_score``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.obs import obs_map, obs_nbytes, obs_to
from ctrl_rl.core.protocols import Algorithm
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
from ctrl_rl.storage.datasets import open_dataset, to_replay
from ctrl_rl.storage.replay import MixedSampler, ReplayBuffer


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
    sampler = (buffer if offline is None or loop.offline_ratio == 0
               else MixedSampler(buffer, offline, loop.offline_ratio))
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
        ret, score, source, success = evaluate_policy(algo, run, run.eval_episodes, run.seed + 10_000)
        row = {"eval_return": ret, "normalized_score": score, "score_reference": source}
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


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_offpolicy(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "off-policy", OffPolicyLoopConfig, _train,
    summary="envs -> replay buffer -> update(batch) x UTD"))
