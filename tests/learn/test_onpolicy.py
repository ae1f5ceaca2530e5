"""End-to-end loop: seeded bit-equality, resume equality, logging and checkpoint contents."""

import json

import pytest
import torch

from ctrl_rl.algos.ppo import PPOConfig
from ctrl_rl.config import RunConfig
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.onpolicy import TrainingDiverged, train_onpolicy

CFG = PPOConfig(rollout_steps=8, epochs=2, minibatch_size=128)


def _run(tmp_path, name, env="torch:Pendulum", total=8 * 64 * 4, **kw):
    run = RunConfig(env=env, num_envs=64, total_steps=total, seed=3, progress=False, checkpoint_every=2, **kw)
    return run, tmp_path / name


def _params(res):
    return [p.detach().clone() for p in res.algo.ac.state_dict().values()]


@pytest.mark.parametrize("env", ["torch:Pendulum", "torch:CartPole"])
def test_same_seed_gives_bit_identical_parameters(tmp_path, env):
    run, d1 = _run(tmp_path, "a", env)
    a = train_onpolicy(run, CFG, d1)
    b = train_onpolicy(run, CFG, tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b)))
    run2 = RunConfig(**{**run.__dict__, "seed": 4})
    c = train_onpolicy(run2, CFG, tmp_path / "c")
    assert not all(torch.equal(x, y) for x, y in zip(_params(a), _params(c)))


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    run, d = _run(tmp_path, "full", total=8 * 64 * 5)
    full = train_onpolicy(run, CFG, d)
    d2 = tmp_path / "interrupted"
    part = train_onpolicy(run, CFG, d2, max_iterations=3)  # "killed" after 3 updates, checkpoint at 3
    assert part.iterations == 3
    resumed = train_onpolicy(run, CFG, d2, resume=True)
    assert resumed.step == full.step
    assert all(torch.equal(x, y) for x, y in zip(_params(full), _params(resumed)))
    rows = [json.loads(line) for line in (d2 / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [8 * 64 * i for i in range(1, 6)]


def test_run_directory_contents(tmp_path):
    run, d = _run(tmp_path, "r", reward_scale=True)
    train_onpolicy(run, CFG, d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["algo"] == "ppo" and cfg["run"]["env"] == "torch:Pendulum" and cfg["config"]["epochs"] == 2
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    for key in ("step", "wall_time", "episode_return", "sps", "stats/approx_kl", "stats/grad_steps"):
        assert key in rows[-1]
    assert any(p.name.startswith("events.out.tfevents") for p in d.iterdir())
    ck = load_checkpoint(d / "checkpoints" / "latest.pt", expect_algo="ppo")
    assert ck["counters"]["step"] == 8 * 64 * 4
    assert "norm.mean" in ck["algo_state"]["ac"] and "opt" in ck["algo_state"]
    assert ck["env_state"]["own"]  # reward-scale statistics travel with the checkpoint
    assert not list((d / "checkpoints").glob(".*tmp*"))


def test_divergence_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    from ctrl_rl.algos.ppo import PPO

    real_update, calls = PPO.update, []

    def update(self, batch):
        calls.append(1)
        info = real_update(self, batch)
        if len(calls) == 3:  # the third update produces a NaN loss
            info["loss/value"] = float("nan")
        return info

    monkeypatch.setattr(PPO, "update", update)
    run, d = _run(tmp_path, "nan", total=8 * 64 * 6)
    with pytest.raises(TrainingDiverged, match=rf"step {8 * 64 * 3} .*loss/value"):
        train_onpolicy(run, CFG, d)
    ck = load_checkpoint(d / "checkpoints" / "latest.pt")
    assert ck["counters"]["step"] == 8 * 64 * 2  # the checkpoint before the divergence is kept
