"""The off-policy training loop: envs -> replay buffer -> algorithm.update x UTD -> logging and checkpoints.

One iteration steps all N envs once (N transitions). The first ``learning_starts`` env steps take
uniformly random actions in ``[-1, 1]^A`` and make no updates; after that the policy samples actions and
every iteration makes ``utd_ratio * N`` updates (fractions carry over to the next iteration), each on a
fresh batch of ``batch_size`` transitions drawn with the algorithm's generator. Updates return device
tensors; the loop syncs with the host once per log step, where it also checks for NaN/inf.

The replay buffer goes into checkpoints only with ``--save-replay`` (it can be GBs); a run resumed
without it starts from an empty buffer and updates again once the buffer holds ``batch_size``
transitions. With the replay saved, a resumed run on torch-native envs equals the uninterrupted run.
"""

from __future__ import annotations

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


def make_offpolicy_algo(name: str, cfg, spec, device: torch.device, gen: torch.Generator):
    if name == "sac_flow":
        from ctrl_rl.algos.sac_flow import SACFlow

        return SACFlow(cfg, spec, device, gen)
    from ctrl_rl.algos.sac import SAC

    return SAC(cfg, spec, device, gen)


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
    """Train SAC or SAC Flow. ``resume`` continues from ``run_dir/checkpoints/latest.pt``;
    ``max_iterations`` stops early after that many env steps of this call (simulates an interruption)."""
    threads_on_entry = torch.get_num_threads()  # restored on return
    device = setup_device(run.device, run.threads)
    single_thread_by_default(device, run.threads)
    gen = seed_everything(run.seed, device)
    env = build_env(run, run.num_envs, run.seed, cfg.gamma)
    if env.spec.discrete:
        env.close()
        raise UserInputError(f"{algo_name} needs continuous actions: env {run.env!r} has discrete actions")
    N, A = run.num_envs, env.spec.action_dim
    if cfg.buffer_size < N:
        env.close()
        raise UserInputError(f"--buffer-size {cfg.buffer_size} is smaller than one step of {N} envs: expected >= {N}")
    algo = make_offpolicy_algo(algo_name, cfg, env.spec, device, gen)
    buffer = ReplayBuffer(cfg.buffer_size, (env.spec.obs_dim,), A, device)
    iterations = math.ceil(run.total_steps / N)

    ck_dir = run_dir / "checkpoints"
    it, step, updates, credit, wall0, last_return = 0, 0, 0, 0.0, 0.0, float("nan")
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
    else:
        obs = env.reset(seed=run.seed)  # [N,O]

    logger = open_run_dir(run_dir, algo_name, run, cfg, step if resume else None)
    bar = progress_bar(run.progress, iterations * N, step, f"{algo_name} {run.env}")

    def check_finite(info: dict[str, float]) -> None:
        bad = [k for k, v in info.items() if not math.isfinite(v)]
        if bad or not algo.parameters_finite():
            what = f"loss {bad[0]}" if bad else "a network parameter"
            raise TrainingDiverged(f"training diverged at step {step} (update {updates}): {what} became NaN/inf; "
                                   f"the last good checkpoint is {ck_dir / 'latest.pt'}")

    def checkpoint() -> None:
        check_finite({})
        save_checkpoint(ck_dir / "latest.pt", {
            "algo": algo_name, "config": {"run": to_dict(run), "algo": to_dict(cfg)},
            "algo_state": algo.state_dict(), "env_state": env.state_dict(), "obs": obs.detach().cpu(),
            "replay": buffer.state_dict() if run.save_replay else None, "rng": global_rng_state(),
            "counters": {"iteration": it, "step": step, "updates": updates, "credit": credit,
                         "wall_time": wall0 + time.time() - t_start, "last_return": last_return}})

    tally = EpisodeTally(N, device)
    info: dict[str, torch.Tensor] = {}
    t_start = time.time()
    t_log, step_log, upd_log = t_start, step, updates
    done_iters = 0
    try:
        while it < iterations:
            if max_iterations is not None and done_iters >= max_iterations:
                break
            if step < cfg.learning_starts:
                action = torch.rand((N, A), generator=gen, device=device) * 2 - 1  # [N,A] uniform in [-1, 1]
            else:
                action = algo.act(obs)  # [N,A]
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
                    info = algo.update(buffer.sample(cfg.batch_size, gen), sync=False)
                updates += k
            if it % run.log_every == 0 or it == iterations:
                vals = dict(zip(info, torch.stack([v.float() for v in info.values()]).tolist())) if info else {}
                check_finite(vals)
                s, ln, n = tally.pop()
                if n > 0:
                    last_return = s / n
                now = time.time()
                dt = max(now - t_log, 1e-9)
                sps, ups = (step - step_log) / dt, (updates - upd_log) / dt
                t_log, step_log, upd_log = now, step, updates
                logger.log({"step": step, "wall_time": round(wall0 + now - t_start, 3), "iteration": it,
                            "updates": updates, "episode_return": (s / n) if n > 0 else None,
                            "episode_length": (ln / n) if n > 0 else None, "episodes": n, "sps": round(sps, 1),
                            "updates_per_s": round(ups, 1), "replay_size": len(buffer), **vals})
                if bar is not None:
                    bar.set_postfix_str(f"sps={sps:,.0f} ups={ups:,.0f} return="
                                        f"{'-' if math.isnan(last_return) else f'{last_return:.1f}'}", refresh=False)
            if bar is not None:
                bar.update(N)
            if it % run.checkpoint_every == 0 or it == iterations:
                checkpoint()
        if done_iters > 0 and it % run.checkpoint_every != 0 and it != iterations:
            checkpoint()  # an early stop (max_iterations) leaves a resumable checkpoint
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        env.close()
        torch.set_num_threads(threads_on_entry)
    return TrainResult(run_dir, step, it, last_return, wall0 + time.time() - t_start, algo)
