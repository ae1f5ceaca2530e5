"""Off-policy loop end to end: warm-up, UTD accounting, seeded bit-equality, resume with and without replay."""

import json

import pytest
import torch

from ctrl_rl.algos.sac import SACConfig
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OffPolicyLoopConfig, RunConfig
from ctrl_rl.learn.offpolicy import train_offpolicy

CFG = SACConfig(actor_hidden=(32, 32), critic_hidden=(32, 32))
LOOP = dict(batch_size=32, learning_starts=64, buffer_size=1000)


def _run(total=8 * 40, loop=None, **kw):
    base = dict(env="torch:Pendulum", num_envs=8, total_steps=total, seed=5, progress=False, log_every=5,
                checkpoint_every=10, threads=1)
    return RunConfig(**{**base, **kw}, loop=OffPolicyLoopConfig(**{**LOOP, **(loop or {})}))


def _params(res):
    a = res.algo
    return [t.detach().clone() for t in (*a.actor.state_dict().values(), *a.critic.state_dict().values(),
                                         *a.critic_target.state_dict().values(), a.log_alpha)]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(_params(a), _params(b)))


def test_warmup_utd_and_run_directory(tmp_path):
    res = train_offpolicy(_run(loop={"utd_ratio": 0.25}), "sac", CFG, tmp_path / "r")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [40 * i for i in range(1, 9)]
    # random actions and no update until learning_starts (64 steps = 8 iterations of 8 envs) are collected;
    # from the 8th iteration on, 0.25 * 8 = 2 updates per iteration
    assert rows[0]["updates"] == 0 and rows[-1]["updates"] == (40 - 7) * 2
    for key in ("loss/critic", "loss/actor", "stats/alpha", "sps", "updates_per_s", "replay_size", "wall_time"):
        assert key in rows[-1]
    assert rows[-1]["replay_size"] == 320
    ck = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt", expect_algo="sac")
    assert ck["replay"] is None and ck["counters"]["updates"] == 66
    assert res.step == 320


def test_fractional_utd_carries_over(tmp_path):
    res = train_offpolicy(_run(total=8 * 10, loop={"utd_ratio": 0.3, "learning_starts": 0}), "sac", CFG, tmp_path / "r")
    # the buffer holds 32 = batch_size rows after 4 iterations; 7 iterations x 2.4 updates = 16.8 -> 16
    assert load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")["counters"]["updates"] == 16
    assert res.iterations == 10


def test_same_seed_gives_bit_identical_parameters(tmp_path):
    a = train_offpolicy(_run(), "sac", CFG, tmp_path / "a")
    b = train_offpolicy(_run(), "sac", CFG, tmp_path / "b")
    assert _same(a, b)
    c = train_offpolicy(_run(seed=6), "sac", CFG, tmp_path / "c")
    assert not _same(a, c)


def test_resume_with_saved_replay_equals_uninterrupted(tmp_path):
    run = _run(loop={"save_replay": True})
    full = train_offpolicy(run, "sac", CFG, tmp_path / "full")
    d = tmp_path / "cut"
    part = train_offpolicy(run, "sac", CFG, d, max_iterations=17)  # killed after 17 iterations
    assert part.iterations == 17
    ck = load_checkpoint(d / "checkpoints" / "latest.pt")
    assert ck["replay"]["size"] == 17 * 8
    resumed = train_offpolicy(run, "sac", CFG, d, resume=True)
    assert resumed.step == full.step and _same(full, resumed)
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [40 * i for i in range(1, 9)]


def test_resume_without_replay_restarts_the_buffer(tmp_path):
    run = _run()
    d = tmp_path / "cut"
    train_offpolicy(run, "sac", CFG, d, max_iterations=20)
    resumed = train_offpolicy(run, "sac", CFG, d, resume=True)
    assert resumed.step == 320
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["replay_size"] == 20 * 8  # only what was collected after the resume


def test_crossq_trains_without_a_target_network(tmp_path):
    cfg = SACConfig(**{**CFG.__dict__, "crossq": True, "actor_batch_renorm": True, "policy_delay": 3,
                       "adam_beta1": 0.5, "renorm_warmup": 10})
    res = train_offpolicy(_run(), "sac", cfg, tmp_path / "r")
    assert res.algo.critic_target is None and res.algo.critic_updates == 33 * 8
    assert res.algo.parameters_finite()


def test_discrete_env_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="continuous actions"):
        train_offpolicy(_run(env="torch:CartPole"), "sac", CFG, tmp_path / "r")
    assert not (tmp_path / "r").exists()
