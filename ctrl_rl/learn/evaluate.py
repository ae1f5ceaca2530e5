"""Evaluate a checkpoint's deterministic policy for a number of episodes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class EvalOptions:
    episodes: int = 10
    """Episodes to run (one per parallel env)."""
    env: str | None = None
    """Evaluate on this env id instead of the one the run trained on (same observation/action shapes)."""
    seed: int = 12345
    """Seed of the evaluation envs (differs from training seeds by default)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Device to run the policy and torch-native envs on."""
    stochastic: bool = False
    """Sample actions instead of taking the deterministic (mean / argmax) action."""
    max_steps: int = 100_000
    """Safety cap on env steps per episode."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise UserInputError(f"invalid --episodes {self.episodes!r}: expected a positive integer")


@torch.no_grad()
def run_episodes(policy: Callable[[torch.Tensor], torch.Tensor], env, seed: int, max_steps: int = 100_000
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One episode per env of ``env`` (an EpisodeStats-wrapped BatchedEnv) under ``policy(obs) -> action``.

    Returns the returns and lengths of the episodes that finished within ``max_steps`` steps (CPU tensors).
    """
    obs = env.reset(seed=seed)
    N = env.num_envs
    returns = torch.full((N,), float("nan"))
    lengths = torch.zeros(N, dtype=torch.int64)
    finished = torch.zeros(N, dtype=torch.bool)
    for _ in range(max_steps):
        out = env.step(policy(obs))
        d = out.info["episode_done"].cpu() & ~finished
        returns[d] = out.info["episode_return"].cpu()[d].float()
        lengths[d] = out.info["episode_length"].cpu()[d]
        finished |= d
        obs = out.obs
        if bool(finished.all()):
            break
    return returns[finished], lengths[finished]


@torch.no_grad()
def evaluate_checkpoint(path: str, opts: EvalOptions) -> dict:
    from ctrl_rl.config import ALGO_CONFIGS, RunConfig, from_dict
    from ctrl_rl.learn.checkpoint import find_checkpoint, load_checkpoint
    from ctrl_rl.learn.onpolicy import build_env

    ck_path = find_checkpoint(path)
    ck = load_checkpoint(ck_path)
    name = ck.get("algo")
    if name not in ALGO_CONFIGS:
        raise UserInputError(f"checkpoint {str(ck_path)!r} holds an unknown algorithm {name!r}: expected one of {sorted(ALGO_CONFIGS)}")
    run = from_dict(RunConfig, ck["config"]["run"], "checkpoint run config")
    cfg = from_dict(ALGO_CONFIGS[name], ck["config"]["algo"], f"checkpoint {name} config")
    run = dataclasses.replace(run, env=opts.env or run.env, device=opts.device, reward_scale=False)
    env = build_env(run, opts.episodes, opts.seed, cfg.gamma)
    algo_state = ck["algo_state"] if "algo_state" in ck else ck["ranks"][0]["algo_state"]
    if name == "ppo":
        from ctrl_rl.algos.ppo import PPO

        probe = PPO(cfg, env.spec, opts.device)
        policy = (lambda o: probe.sample(o)[0]) if opts.stochastic else (lambda o: probe.act(o, deterministic=True))
    else:
        from ctrl_rl.learn.offline import OFFLINE_ALGOS, make_offline_algo
        from ctrl_rl.learn.offpolicy import make_offpolicy_algo

        make = make_offline_algo if name in OFFLINE_ALGOS else make_offpolicy_algo
        probe = make(name, cfg, env.spec, torch.device(opts.device), torch.Generator(opts.device))
        policy = (lambda o: probe.act(o, deterministic=not opts.stochastic))
    try:
        probe.load_state_dict(algo_state)
    except RuntimeError:
        raise UserInputError(f"env {run.env!r} does not fit the policy in {str(ck_path)!r} (shape mismatch): "
                             "expected an env with the training env's observation and action shapes") from None
    if name != "ppo":
        probe.gen.manual_seed(opts.seed)  # the loaded state carries the training generator; evaluation has its own
    done, lengths = run_episodes(policy, env, opts.seed, opts.max_steps)
    env.close()
    n = done.numel()
    return {
        "checkpoint": str(ck_path), "env": run.env, "step": ck["counters"]["step"], "episodes": n,
        "return_mean": float(done.mean()) if n else None,
        "return_std": float(done.std(unbiased=False)) if n else None,
        "length_mean": float(lengths.float().mean()) if n else None,
        "deterministic": not opts.stochastic,
    }
