"""Slow learning tests (pytest -m slow): small tasks reach a return threshold on CPU with fixed seeds."""

import pytest

from ctrl_rl.algos.ppo import PPOConfig
from ctrl_rl.learn.config import RunConfig, default_preset, from_dict
from ctrl_rl.learn.onpolicy import train_onpolicy

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [0, 1])
def test_default_preset_solves_torch_pendulum(tmp_path, seed):
    # two threads, fixed: with the default (auto) the count follows the machine's load, and so do the run's float
    # rounding and outcome (on an AMD AVX2 CPU at two threads: seed 0 -182, seed 1 -162; seed 1 ended below -250
    # once under load)
    run = from_dict(RunConfig, {**default_preset().run, "seed": seed, "progress": False, "threads": 2})
    cfg = from_dict(PPOConfig, default_preset().config)
    res = train_onpolicy(run, "ppo", cfg, tmp_path / "r")
    assert res.last_return >= -250, res.last_return


def test_cartpole_deterministic_policy_reaches_475(tmp_path):
    from ctrl_rl.learn.evaluate import EvalOptions, evaluate_checkpoint

    run = RunConfig(env="torch:CartPole", num_envs=256, total_steps=1_000_000, seed=0, progress=False)
    cfg = PPOConfig(rollout_steps=32, minibatch_size=2048, epochs=8, lr=1e-3)
    train_onpolicy(run, "ppo", cfg, tmp_path / "r")
    out = evaluate_checkpoint(str(tmp_path / "r"), EvalOptions(episodes=16))
    assert out["episodes"] == 16 and out["return_mean"] >= 475, out
