"""Evaluate a checkpoint's deterministic policy for a number of episodes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ctrl_rl.core.protocols import Recurrent
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import find_checkpoint, load_checkpoint
from ctrl_rl.learn.config import parse_saved
from ctrl_rl.learn.regimes import get_regime
from ctrl_rl.learn.runtime import build_env, setup_device, training_spec
from ctrl_rl.storage.datasets.scores import normalized_score


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
        if self.max_steps < 1:
            raise UserInputError(f"invalid --max-steps {self.max_steps!r}: "
                                 "expected a positive number of steps per episode")


@torch.no_grad()
def run_episodes(policy: Callable[[torch.Tensor], torch.Tensor], env, seed: int, max_steps: int = 100_000,
                 observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One episode per env of ``env`` (an EpisodeStats-wrapped BatchedEnv) under ``policy(obs) -> action``.

    ``observe(reward [N], done [N])``, when given, is called after every step (a recurrent policy's acting state:
    the reward it reads next, and which envs start a new episode). Returns the returns and lengths of the episodes
    that finished within ``max_steps`` steps (CPU tensors).
    """
    obs = env.reset(seed=seed)
    N = env.num_envs
    returns = torch.full((N,), float("nan"))
    lengths = torch.zeros(N, dtype=torch.int64)
    finished = torch.zeros(N, dtype=torch.bool)
    success: torch.Tensor | None = None
    for _ in range(max_steps):
        out = env.step(policy(obs))
        if observe is not None:
            observe(out.reward, out.terminated | out.truncated)
        d = out.info["episode_done"].cpu() & ~finished
        returns[d] = out.info["episode_return"].cpu()[d].float()
        lengths[d] = out.info["episode_length"].cpu()[d]
        if "episode_success" in out.info:
            if success is None:
                success = torch.zeros(N, dtype=torch.bool)
            success[d] = out.info["episode_success"].cpu()[d]
        finished |= d
        obs = out.obs
        if bool(finished.all()):
            break
    return returns[finished], lengths[finished], (success[finished] if success is not None else None)


def _acting_state(algo, n: int):
    """A recurrent policy (one with ``reset_state(n)`` and ``observe(reward, done)``): its acting state reset for n
    fresh episodes, and its ``observe`` for ``run_episodes``; None for a policy of the observation alone."""
    if not isinstance(algo, Recurrent):
        return None
    algo.reset_state(n)
    return algo.observe


def evaluate_policy(algo, run, episodes: int, seed: int) -> tuple[float, float | None, str, float | None]:
    """Mean deterministic return over ``episodes`` episodes in ``run.env``, its normalized score and the table used
    (or, instead of a score, the sentence saying why there is none), and the success rate where the env reports
    success (else None)."""
    env = build_env(dataclasses.replace(run, reward_scale=False), episodes, seed)
    try:
        returns, _, success = run_episodes(lambda o: algo.act(o, deterministic=True), env, seed,
                                           observe=_acting_state(algo, episodes))
    finally:
        env.close()
    mean = float(returns.mean()) if returns.numel() else float("nan")
    rate = float(success.float().mean()) if success is not None and success.numel() else None
    try:
        score, source = normalized_score(run.env, mean)
        return mean, float(score), source, rate
    except UserInputError as e:
        return mean, None, str(e), rate


def load_policy(path: str, device: str = "cpu", env: str | None = None, seed: int = 0):
    """``(algorithm, run config, checkpoint path, checkpoint)`` of a run directory or checkpoint file, the
    algorithm rebuilt through its registry entry with the checkpoint's weights, for ``env`` (default: the run's)."""
    setup_device(device, 0)
    ck_path = find_checkpoint(path)
    ck = load_checkpoint(ck_path)
    saved = ck.get("config")
    if not isinstance(saved, dict):
        saved = {}
    entry, run, cfg = parse_saved({"algo": ck.get("algo"), "run": saved.get("run"), "config": saved.get("algo")},
                                  f"checkpoint {str(ck_path)!r}")
    if not get_regime(entry.regime).has_policy:
        raise UserInputError(f"{str(ck_path)!r} is a dynamics model run, which has no policy: expected the run of an "
                             f"agent (a dynamics run is used by the model-based agents with --model {path})")
    run = dataclasses.replace(run, env=env or run.env, device=device, reward_scale=False)
    spec = training_spec(run)
    algo = entry.make(cfg, spec, torch.device(device), torch.Generator(device))
    algo_state = ck["algo_state"] if "algo_state" in ck else ck["ranks"][0]["algo_state"]
    try:
        algo.load_state_dict(algo_state)
    except (RuntimeError, KeyError, ValueError):
        raise UserInputError(f"env {run.env!r} does not fit the policy in {str(ck_path)!r} (shape mismatch): "
                             "expected an env with the training env's observation and action shapes") from None
    algo.gen.manual_seed(seed)  # the loaded state carries the training generator; evaluation has its own
    return algo, run, ck_path, ck


@torch.no_grad()
def evaluate_checkpoint(path: str, opts: EvalOptions) -> dict:
    algo, run, ck_path, ck = load_policy(path, opts.device, opts.env, opts.seed)
    env = build_env(run, opts.episodes, opts.seed)
    try:
        done, lengths, success = run_episodes(lambda o: algo.act(o, deterministic=not opts.stochastic), env,
                                              opts.seed, opts.max_steps, _acting_state(algo, opts.episodes))
    finally:
        env.close()
    n = done.numel()
    return {
        "checkpoint": str(ck_path), "env": run.env, "step": ck["counters"]["step"], "episodes": n,
        "return_mean": float(done.mean()) if n else None,
        "return_std": float(done.std(unbiased=False)) if n else None,
        "length_mean": float(lengths.float().mean()) if n else None,
        "deterministic": not opts.stochastic,
        **({"success_rate": float(success.float().mean())} if success is not None and success.numel() else {}),
    }
