"""Slow: SAC solves torch-native Pendulum on CPU (deterministic evaluation >= -250 over 10 episodes)."""

import pytest

from ctrl_rl.algos.sac import SACConfig
from ctrl_rl.learn.config import OffPolicyLoopConfig, RunConfig
from ctrl_rl.learn.evaluate import EvalOptions, evaluate_checkpoint
from ctrl_rl.learn.offpolicy import train_offpolicy


@pytest.mark.slow
def test_sac_solves_pendulum(tmp_path):
    run = RunConfig(env="torch:Pendulum", num_envs=1, total_steps=10_000, seed=0, progress=False, log_every=1000,
                    checkpoint_every=10_000, threads=1, loop=OffPolicyLoopConfig(learning_starts=1000))
    cfg = SACConfig(actor_hidden=(64, 64), critic_hidden=(64, 64))
    train_offpolicy(run, "sac", cfg, tmp_path / "r")
    res = evaluate_checkpoint(str(tmp_path / "r"), EvalOptions(episodes=10))
    assert res["return_mean"] >= -250, res
