"""The off-policy training loop: envs -> replay buffer -> algorithm.update x UTD -> logging and checkpoints.

One iteration steps all N envs once (N transitions). The first ``learning_starts`` env steps take
uniformly random actions in ``[-1, 1]^A`` and make no updates; after that the policy samples actions and
every iteration makes ``utd_ratio * N`` updates (fractions carry over to the next iteration), each on a
fresh batch of ``batch_size`` transitions drawn with the algorithm's generator. Updates return device
tensors; the loop syncs with the host once per log step, where it also checks for NaN/inf.

The replay buffer goes into checkpoints only with ``--save-replay`` (it can be GBs); a run resumed
without it starts from an empty buffer and updates again once the buffer holds ``batch_size``
transitions. With the replay saved, a resumed run on torch-native envs equals the uninterrupted run.

Offline-to-online algorithms run in the same loop (``ctrl_rl.algos.wsrl``, ``SACFlowO2OConfig``):
``--init`` starts from a pre-trained checkpoint (its network shape fields replace the config's), ``--dataset``
with ``offline_ratio`` mixes offline data into every batch, ``warmup_actions`` lets the (frozen) policy act
during the first ``learning_starts`` steps, WSRL/RLPD batches are cut into ``critic_splits`` critic minibatches,
and SAC Flow O2O first makes ``offline_steps`` offline gradient steps (logged with ``"phase": "offline"`` at
step 0). With ``--eval-every K`` (env steps) the deterministic policy is evaluated at step 0 (after any
pre-training) and every K steps, logging ``eval_return`` and ``normalized_score``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from ctrl_rl.config import RunConfig, to_dict
from ctrl_rl.core.seeding import seed_everything
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import global_rng_state, load_checkpoint, save_checkpoint, set_global_rng_state
from ctrl_rl.learn.onpolicy import TrainingDiverged, TrainResult, build_env
from ctrl_rl.learn.runtime import open_run_dir, progress_bar, setup_device, single_thread_by_default
from ctrl_rl.storage.replay import ReplayBuffer


INIT_ALGOS = ("cql", "calql", "sac", "wsrl", "rlpd")  # checkpoints whose state loads into SAC


def make_offpolicy_algo(name: str, cfg, spec, device: torch.device, gen: torch.Generator):
    if name in ("sac_flow", "sac_flow_o2o"):
        from ctrl_rl.algos.sac_flow import SACFlow

        return SACFlow(cfg, spec, device, gen)
    if name in ("wsrl", "rlpd"):
        from ctrl_rl.algos.cql import build_sac

        return build_sac(cfg, spec, device, gen)
    from ctrl_rl.algos.sac import SAC

    return SAC(cfg, spec, device, gen)


def read_init(cfg, spec) -> tuple[object, dict, str]:
    """The fine-tuning config with the network shape fields of ``cfg.init``'s checkpoint, that checkpoint's algo
    state and its path. Refuses checkpoints that cannot load into SAC or do not fit the env."""
    from ctrl_rl.learn.checkpoint import find_checkpoint

    path = find_checkpoint(cfg.init)
    ck = load_checkpoint(path)
    if ck.get("algo") not in INIT_ALGOS:
        raise UserInputError(f"--init {str(path)!r} holds a {ck.get('algo')!r} run: expected a checkpoint of one of "
                             f"{list(INIT_ALGOS)} (their actor, critics and temperature load into SAC)")
    return with_network_shape(cfg, ck["config"]["algo"]), ck["algo_state"], str(path)


def with_network_shape(cfg, saved: dict):
    """``cfg`` with the network shape fields (``NETWORK_FIELDS``) of a saved config dict."""
    from ctrl_rl.algos.wsrl import NETWORK_FIELDS

    shape = {k: tuple(saved[k]) if isinstance(saved[k], list) else saved[k] for k in NETWORK_FIELDS if k in saved}
    return dataclasses.replace(cfg, **shape)


def load_init(algo, state: dict, path: str, env_id: str) -> None:
    """Load a pre-trained SAC-compatible state into ``algo``, keeping ``algo``'s own generator state."""
    try:
        algo.load_state_dict({**state, "gen": algo.gen.get_state()})
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserInputError(f"--init {path!r} does not fit env {env_id!r} and this algorithm's networks "
                             f"({str(e).splitlines()[0][:120]}): expected a checkpoint trained on the same task") from None


def open_offline_data(run: RunConfig, cfg, spec, device: torch.device):
    """The offline replay of ``--dataset`` (actions clipped to ``action_clip``), or None; checks the ratio."""
    ratio = getattr(cfg, "offline_ratio", None)
    if run.dataset is None:
        if ratio:
            raise UserInputError(f"--offline-ratio {ratio} needs --dataset PATH_OR_ID: expected a D4RL/ctrl_rl file or "
                                 "dataset id, or --offline-ratio 0")
        return None
    if ratio is None:
        raise UserInputError(f"--dataset is not used by this algorithm: expected no --dataset (offline data mixes into "
                             f"wsrl, rlpd and sac_flow_o2o)")
    if ratio == 0:
        raise UserInputError("--dataset was given with --offline-ratio 0: expected a positive --offline-ratio "
                             "(the fraction of every batch drawn from the dataset)")
    from ctrl_rl.learn.offline import open_dataset
    from ctrl_rl.storage.datasets import to_replay

    return to_replay(open_dataset(run.dataset, spec, cfg.action_clip), device)


class EpisodeTally:
    """Sums of finished episodes' returns and lengths on the device (read at the logging boundary)."""

    def __init__(self, num_envs: int, device: torch.device):
        self.sums = torch.zeros(3, num_envs, device=device)  # [3,N] per-env sums: returns, lengths, episodes

    def add(self, info: dict) -> None:  # three in-place adds, no reduction per step
        ret, length, count = self.sums
        ret += info["episode_return"]
        length += info["episode_length"]
        count += info["episode_done"]

    def pop(self) -> tuple[float, float, int]:
        s, ln, n = self.sums.sum(1).tolist()
        self.sums.zero_()
        return s, ln, int(n)


def train_offpolicy(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                    max_iterations: int | None = None) -> TrainResult:
    """Train SAC, SAC Flow or an offline-to-online algorithm (wsrl, rlpd, sac_flow_o2o). ``resume`` continues
    from ``run_dir/checkpoints/latest.pt``; ``max_iterations`` stops early after that many env steps (or offline
    gradient steps) of this call (simulates an interruption)."""
    threads_on_entry = torch.get_num_threads()  # restored on return
    device = setup_device(run.device, run.threads)
    single_thread_by_default(device, run.threads)
    gen = seed_everything(run.seed, device)
    env = build_env(run, run.num_envs, run.seed, cfg.gamma)
    try:
        if env.spec.discrete:
            raise UserInputError(f"{algo_name} needs continuous actions: env {run.env!r} has discrete actions")
        N, A = run.num_envs, env.spec.action_dim
        if cfg.buffer_size < N:
            raise UserInputError(f"--buffer-size {cfg.buffer_size} is smaller than one step of {N} envs: expected >= {N}")
        init = None
        if getattr(cfg, "init", None) is not None and resume:  # the shapes this run took from its --init
            cfg = with_network_shape(cfg, load_checkpoint(run_dir / "checkpoints" / "latest.pt")["config"]["algo"])
        elif getattr(cfg, "init", None) is not None:
            cfg, init_state, init_path = read_init(cfg, env.spec)
            init = (init_state, init_path)
        elif algo_name == "wsrl" and cfg.init is None:
            raise UserInputError("`ctrl-rl train wsrl` needs --init RUN_DIR_OR_CHECKPOINT: expected a cql, calql or sac "
                                 "run to fine-tune (without pre-training use `ctrl-rl train rlpd`)")
        if algo_name == "sac_flow_o2o" and run.dataset is None:
            raise UserInputError("`ctrl-rl train sac_flow_o2o` needs --dataset PATH_OR_ID: expected the offline data "
                                 "it pre-trains on")
        offline = open_offline_data(run, cfg, env.spec, device)
        algo = make_offpolicy_algo(algo_name, cfg, env.spec, device, gen)
        if init is not None:
            load_init(algo, *init, run.env)
    except BaseException:
        env.close()
        raise
    buffer = ReplayBuffer(cfg.buffer_size, (env.spec.obs_dim,), A, device)
    sampler = buffer
    if offline is not None:
        from ctrl_rl.storage.replay import MixedSampler

        sampler = MixedSampler(buffer, offline, cfg.offline_ratio)
    update = _update_rule(algo_name, algo, cfg, sampler)
    random_warmup = getattr(cfg, "warmup_actions", "random") == "random"
    clip = getattr(cfg, "action_clip", None)
    offline_total = getattr(cfg, "offline_steps", 0)
    iterations = math.ceil(run.total_steps / N)

    ck_dir = run_dir / "checkpoints"
    it, step, updates, credit, wall0, last_return = 0, 0, 0, 0.0, 0.0, float("nan")
    pre, next_eval = 0, 0
    if resume:
        ck = load_checkpoint(ck_dir / "latest.pt", expect_algo=algo_name)
        algo.load_state_dict(ck["algo_state"])
        env.load_state_dict(ck["env_state"])
        obs = ck["obs"].to(device)
        if ck.get("replay") is not None:
            buffer.load_state_dict(ck["replay"])
        set_global_rng_state(ck["rng"])
        c = ck["counters"]
        it, step, updates, credit = c["iteration"], c["step"], c["updates"], c["credit"]
        wall0, last_return = c["wall_time"], c["last_return"]
        pre, next_eval = c.get("offline_step", 0), c.get("next_eval", 0)
    else:
        obs = env.reset(seed=run.seed)  # [N,O]

    logger = open_run_dir(run_dir, algo_name, run, cfg, step if resume else None)
    bar = progress_bar(run.progress, iterations * N, step, f"{algo_name} {run.env}")

    def check_finite(info: dict[str, float], where: str) -> None:
        bad = [k for k, v in info.items() if not math.isfinite(v)]
        if bad or not algo.parameters_finite():
            what = f"loss {bad[0]}" if bad else "a network parameter"
            raise TrainingDiverged(f"training diverged at {where}: {what} became NaN/inf; "
                                   f"the last good checkpoint is {ck_dir / 'latest.pt'}")

    saved_at = (pre, it)

    def checkpoint(snapshot: bool = False) -> None:
        nonlocal saved_at
        check_finite({}, f"step {step}")
        payload = {
            "algo": algo_name, "config": {"run": to_dict(run), "algo": to_dict(cfg)},
            "algo_state": algo.state_dict(), "env_state": env.state_dict(), "obs": obs.detach().cpu(),
            "replay": None, "rng": global_rng_state(),
            "counters": {"iteration": it, "step": step, "updates": updates, "credit": credit,
                         "wall_time": wall0 + time.time() - t_start, "last_return": last_return,
                         "offline_step": pre, "next_eval": next_eval}}
        if snapshot:
            save_checkpoint(ck_dir / f"step_{step:09d}.pt", payload)
            return
        if run.save_replay:
            payload["replay"] = buffer.state_dict()
        save_checkpoint(ck_dir / "latest.pt", payload)
        saved_at = (pre, it)

    def evaluate() -> dict:
        from ctrl_rl.learn.offline import evaluate_policy

        ret, score, source = evaluate_policy(algo, run, run.eval_episodes, run.seed + 10_000)
        return {"eval_return": ret, "normalized_score": score, "score_reference": source}

    tally = EpisodeTally(N, device)
    info: dict[str, torch.Tensor] = {}
    t_start = time.time()
    done_iters = 0
    try:
        if pre < offline_total:  # SAC Flow O2O: offline gradient steps first
            from ctrl_rl.algos.sac_flow import offline_step

            t_log, pre_log = time.time(), pre
            while pre < offline_total:
                if max_iterations is not None and done_iters >= max_iterations:
                    break
                info = offline_step(algo, offline, cfg.batch_size)
                pre += 1
                done_iters += 1
                last = pre == offline_total
                if pre % run.log_every == 0 or last:
                    vals = dict(zip(info, torch.stack([v.float() for v in info.values()]).tolist()))
                    check_finite(vals, f"offline gradient step {pre}")
                    now = time.time()
                    row = {"step": 0, "phase": "offline", "offline_step": pre, "wall_time": round(wall0 + now - t_start, 3),
                           "updates_per_s": round((pre - pre_log) / max(now - t_log, 1e-9), 1), **vals}
                    t_log, pre_log = now, pre
                    if run.eval_every and (pre % run.eval_every == 0 or last):
                        row.update(evaluate())
                    logger.log(row)
                if pre % run.checkpoint_every == 0 or last:
                    checkpoint()
        t_log, step_log, upd_log = time.time(), step, updates
        while it < iterations and pre >= offline_total:
            if max_iterations is not None and done_iters >= max_iterations:
                break
            if run.eval_every and step >= next_eval:
                logger.log({"step": step, "wall_time": round(wall0 + time.time() - t_start, 3), **evaluate()})
                next_eval += run.eval_every
            if step < cfg.learning_starts and random_warmup:
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
            if step >= cfg.learning_starts and len(buffer) >= cfg.batch_size:
                credit += cfg.utd_ratio * N
                k = int(credit)
                credit -= k
                for _ in range(k):
                    info = update()
                updates += k
            if it % run.log_every == 0 or it == iterations:
                vals = dict(zip(info, torch.stack([v.float() for v in info.values()]).tolist())) if info else {}
                check_finite(vals, f"step {step} (update {updates})")
                s, ln, n = tally.pop()
                if n > 0:
                    last_return = s / n
                now = time.time()
                dt = max(now - t_log, 1e-9)
                sps, ups = (step - step_log) / dt, (updates - upd_log) / dt
                t_log, step_log, upd_log = now, step, updates
                row = {"step": step, "wall_time": round(wall0 + now - t_start, 3), "iteration": it,
                       "updates": updates, "episode_return": (s / n) if n > 0 else None,
                       "episode_length": (ln / n) if n > 0 else None, "episodes": n, "sps": round(sps, 1),
                       "updates_per_s": round(ups, 1), "replay_size": len(buffer), **vals}
                if run.eval_every and it == iterations:
                    row.update(evaluate())
                    next_eval = step + run.eval_every
                logger.log(row)
                if bar is not None:
                    bar.set_postfix_str(f"sps={sps:,.0f} ups={ups:,.0f} return="
                                        f"{'-' if math.isnan(last_return) else f'{last_return:.1f}'}", refresh=False)
            if bar is not None:
                bar.update(N)
            if run.keep_every and it % run.keep_every == 0:
                checkpoint(snapshot=True)
            if it % run.checkpoint_every == 0 or it == iterations:
                checkpoint()
        if done_iters > 0 and saved_at != (pre, it):
            checkpoint()  # an early stop (max_iterations) leaves a resumable checkpoint
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        env.close()
        torch.set_num_threads(threads_on_entry)
    return TrainResult(run_dir, step, it, last_return, wall0 + time.time() - t_start, algo)


def _update_rule(algo_name: str, algo, cfg, sampler):
    """The loop's update: ``update() -> info`` (device tensors) drawing its batches from ``sampler``."""
    B = cfg.batch_size
    if algo_name in ("wsrl", "rlpd"):
        k = cfg.critic_splits
        return lambda: algo.update_split([sampler.sample(B // k, algo.gen) for _ in range(k)], sync=False)
    if algo_name == "sac_flow_o2o":
        from ctrl_rl.algos.sac_flow import o2o_update

        return lambda: o2o_update(algo, sampler, B, cfg.alpha_reg)
    gen = algo.gen
    return lambda: algo.update(sampler.sample(B, gen), sync=False)
