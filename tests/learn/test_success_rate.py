"""Success rates of tasks that report ``info["success"]``: per episode in EpisodeStats, in evaluation and in the
training logs."""

import json

import torch

from ctrl_rl.cli import main
from ctrl_rl.envs.manipulation.experts import ScriptedExpert
from ctrl_rl.envs.registry import make_env
from ctrl_rl.envs.wrappers import EpisodeStats
from ctrl_rl.learn.evaluate import run_episodes


def test_the_expert_succeeds_and_a_still_policy_does_not():
    env = EpisodeStats(make_env("manip:Reach", num_envs=3, seed=1))
    try:
        expert = ScriptedExpert("Reach")
        _, lengths, success = run_episodes(lambda o: expert(o), env, seed=1)
        assert success is not None and bool(success.all()) and lengths.numel() == 3
        _, _, success = run_episodes(lambda o: torch.zeros(o.shape[0], 7), env, seed=2)
        assert not bool(success.any())  # the targets are never at the home pose
    finally:
        env.close()


def test_envs_without_success_report_none():
    env = EpisodeStats(make_env("torch:Pendulum", num_envs=2, seed=0))
    assert run_episodes(lambda o: torch.zeros(o.shape[0], 1), env, seed=0)[2] is None


def test_training_and_eval_log_the_success_rate(tmp_path, capsys):
    d = tmp_path / "ppo"
    assert main(["train", "ppo", "--env", "manip:Reach", "--num-envs", "4", "--total-steps", "512", "--rollout-steps",
                 "32", "--minibatch-size", "64", "--epochs", "1", "--no-progress", "--threads", "1",
                 "--run-dir", str(d)]) == 0
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert all("success_rate" in r for r in rows) and any(r["success_rate"] is not None for r in rows)
    capsys.readouterr()
    assert main(["eval", str(d), "--episodes", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0.0 <= out["success_rate"] <= 1.0
