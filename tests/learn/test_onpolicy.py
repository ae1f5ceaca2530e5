"""End-to-end loop: seeded bit-equality, resume equality, logging and checkpoint contents."""

import json

import pytest
import torch

from ctrl_rl.algos.ppo import PPOConfig
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OnPolicyLoopConfig, RunConfig
from ctrl_rl.learn.onpolicy import train_onpolicy
from ctrl_rl.learn.runtime import TrainingDiverged

CFG = PPOConfig(rollout_steps=8, epochs=2, minibatch_size=128)


def _run(tmp_path, name, env="torch:Pendulum", total=8 * 64 * 4, **kw):
    run = RunConfig(env=env, num_envs=64, total_steps=total, seed=3, progress=False, checkpoint_every=2, **kw)
    return run, tmp_path / name


def _params(res):
    return [p.detach().clone() for p in res.algo.ac.state_dict().values()]


@pytest.mark.parametrize("env", ["torch:Pendulum", "torch:CartPole"])
def test_same_seed_gives_bit_identical_parameters(tmp_path, env):
    run, d1 = _run(tmp_path, "a", env)
    a = train_onpolicy(run, "ppo", CFG, d1)
    b = train_onpolicy(run, "ppo", CFG, tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b)))
    run2 = RunConfig(**{**run.__dict__, "seed": 4})
    c = train_onpolicy(run2, "ppo", CFG, tmp_path / "c")
    assert not all(torch.equal(x, y) for x, y in zip(_params(a), _params(c)))


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    run, d = _run(tmp_path, "full", total=8 * 64 * 5)
    full = train_onpolicy(run, "ppo", CFG, d)
    d2 = tmp_path / "interrupted"
    part = train_onpolicy(run, "ppo", CFG, d2, max_iterations=3)  # "killed" after 3 updates, checkpoint at 3
    assert part.iterations == 3
    resumed = train_onpolicy(run, "ppo", CFG, d2, resume=True)
    assert resumed.step == full.step
    assert all(torch.equal(x, y) for x, y in zip(_params(full), _params(resumed)))
    rows = [json.loads(line) for line in (d2 / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [8 * 64 * i for i in range(1, 6)]


def test_run_directory_contents(tmp_path):
    run, d = _run(tmp_path, "r", reward_scale=True)
    train_onpolicy(run, "ppo", CFG, d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["algo"] == "ppo" and cfg["run"]["env"] == "torch:Pendulum" and cfg["config"]["epochs"] == 2
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    for key in ("step", "wall_time", "episode_return", "sps", "stats/approx_kl", "stats/grad_steps"):
        assert key in rows[-1]
    assert any(p.name.startswith("events.out.tfevents") for p in d.iterdir())
    ck = load_checkpoint(d / "checkpoints" / "latest.pt", expect_algo="ppo")
    assert ck["counters"]["step"] == 8 * 64 * 4
    assert "norm.mean" in ck["algo_state"]["ac"] and "opt" in ck["algo_state"]
    assert ck["env_state"]["groups"][0]["own"]  # reward-scale statistics travel with the checkpoint
    assert not list((d / "checkpoints").glob(".*tmp*"))


def test_divergence_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    from ctrl_rl.algos.ppo import PPO

    real_update, calls = PPO.update, []

    def update(self, batch):
        calls.append(1)
        info = real_update(self, batch)
        if len(calls) == 3:  # the third update produces a NaN loss
            info["loss/value"] = info["loss/value"] * float("nan")
        return info

    monkeypatch.setattr(PPO, "update", update)
    run, d = _run(tmp_path, "nan", total=8 * 64 * 6)
    with pytest.raises(TrainingDiverged, match=rf"step {8 * 64 * 3} .*loss/value"):
        train_onpolicy(run, "ppo", CFG, d)
    ck = load_checkpoint(d / "checkpoints" / "latest.pt")
    assert ck["counters"]["step"] == 8 * 64 * 2  # the checkpoint before the divergence is kept


class _AsyncTorchEnv:
    """A torch-native env with envpool's split step API, to test the pipelined collector exactly."""

    def __init__(self, env):
        self.env, self.num_envs, self.spec, self.device = env, env.num_envs, env.spec, env.device
        self._pending = None

    def reset(self, seed=None):
        return self.env.reset(seed)

    def step(self, action):
        return self.env.step(action)

    def step_async(self, action):
        self._pending = action.clone()

    def step_wait(self):
        out, self._pending = self.env.step(self._pending), None
        return out

    def close(self):
        pass


class _DeterministicPolicy:
    def sample(self, obs):
        return torch.tanh(obs[:, :1] * 3.0), obs[:, 0].clone()


def test_pipelined_collector_writes_the_same_rollout_as_stepping_each_group_in_turn():
    from ctrl_rl.envs.torch_envs import Pendulum
    from ctrl_rl.envs.wrappers import EpisodeStats
    from ctrl_rl.learn.onpolicy import Collector
    from ctrl_rl.storage.rollout import RolloutStorage

    def group(seed):
        return EpisodeStats(_AsyncTorchEnv(Pendulum(3, seed=seed, max_episode_steps=5)))

    col = Collector([group(1), group(2)], torch.device("cpu"))
    assert col.envs[0].supports_async
    storage = RolloutStorage(7, 6, col.spec, torch.device("cpu"))
    obs = col.reset(seed=10)
    last = col.collect(_DeterministicPolicy(), storage, obs)

    ref = [group(1), group(2)]
    pol = _DeterministicPolicy()
    for g, env in enumerate(ref):
        o = env.reset(seed=10 + 7919 * g)
        for t in range(7):
            a, lp = pol.sample(o)
            out = env.step(a)
            sl = slice(3 * g, 3 * g + 3)
            assert torch.equal(storage.obs[t, sl], o) and torch.equal(storage.action[t, sl], a)
            assert torch.equal(storage.logp[t, sl], lp) and torch.equal(storage.reward[t, sl], out.reward)
            assert torch.equal(storage.final_obs[t, sl], out.final_obs)
            assert torch.equal(storage.truncated[t, sl], out.truncated)
            o = out.obs
        assert torch.equal(last[3 * g:3 * g + 3], o)
    assert col.stats[2] == 6  # each of the 6 envs finished one 5-step episode


def test_envpool_training_is_pipelined_and_resumes(tmp_path):
    run = RunConfig(env="envpool:Pendulum-v1", num_envs=8, total_steps=8 * 8 * 3, seed=0, progress=False,
                    checkpoint_every=1, loop=OnPolicyLoopConfig(pipeline=True))
    threads = torch.get_num_threads()
    res = train_onpolicy(run, "ppo", CFG, tmp_path / "p")
    assert torch.get_num_threads() == threads  # the loop's per-phase thread settings do not leak out
    ck = load_checkpoint(tmp_path / "p" / "checkpoints" / "latest.pt")
    assert len(ck["env_state"]["groups"]) == 2 and ck["obs"].shape == (8, 3)
    run2 = RunConfig(**{**run.__dict__, "total_steps": 8 * 8 * 5})
    res2 = train_onpolicy(run2, "ppo", CFG, tmp_path / "p", resume=True)
    assert res2.step == 8 * 8 * 5 and res.step == 8 * 8 * 3
