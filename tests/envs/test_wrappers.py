"""Wrappers: episode statistics, action rescaling, observation normalization, reward scaling."""

import torch

from ctrl_rl.envs.protocol import EnvSpec, StepOut
from ctrl_rl.envs.torch_envs import Pendulum
from ctrl_rl.envs.wrappers import ActionRescale, EpisodeStats, ObsNormalize, RewardScale


class _Recorder:
    """A 2-env continuous env with bounds [-2, 2] x [0, 10] that records actions and ends every 3 steps."""

    def __init__(self):
        self.num_envs, self.device = 2, torch.device("cpu")
        self.spec = EnvSpec("test:rec", (1,), False, 2, (-2.0, 0.0), (2.0, 10.0), max_episode_steps=3)
        self.actions, self.t = [], 0

    def reset(self, seed=None):
        self.t = 0
        return torch.zeros(2, 1)

    def step(self, action):
        self.actions.append(action.clone())
        self.t += 1
        done = torch.full((2,), self.t % 3 == 0)
        obs = torch.full((2, 1), float(self.t))
        return StepOut(obs, torch.tensor([1.0, 2.0]), torch.zeros(2, dtype=torch.bool), done, obs.clone())

    def close(self):
        pass


def test_episode_stats_report_return_and_length_at_episode_end_only():
    env = EpisodeStats(_Recorder())
    env.reset()
    outs = [env.step(torch.zeros(2, 2)) for _ in range(6)]
    assert [bool(o.info["episode_done"][0]) for o in outs] == [False, False, True, False, False, True]
    assert outs[2].info["episode_return"].tolist() == [3.0, 6.0] and outs[2].info["episode_length"].tolist() == [3, 3]
    assert outs[1].info["episode_return"].tolist() == [0.0, 0.0]
    assert outs[5].info["episode_return"].tolist() == [3.0, 6.0]  # the accumulator restarted after the first end


def test_action_rescale_maps_unit_box_to_bounds_and_clips():
    rec = _Recorder()
    env = ActionRescale(rec)
    assert env.spec.action_low == (-1.0, -1.0) and env.spec.action_high == (1.0, 1.0)
    env.step(torch.tensor([[-1.0, -1.0], [0.5, 3.0]]))
    assert torch.allclose(rec.actions[-1], torch.tensor([[-2.0, 0.0], [1.0, 10.0]]))


def test_action_rescale_passes_unbounded_dimensions_through():
    rec = _Recorder()
    rec.spec = EnvSpec("test:rec", (1,), False, 2, (float("-inf"), 0.0), (float("inf"), 10.0), max_episode_steps=3)
    env = ActionRescale(rec)
    env.reset()
    env.step(torch.tensor([[3.0, 3.0], [-0.5, -1.0]]))
    assert torch.equal(rec.actions[-1], torch.tensor([[3.0, 10.0], [-0.5, 0.0]]))  # dim 0 as is, dim 1 clipped


def test_obs_normalize_uses_one_set_of_statistics_and_round_trips():
    env = ObsNormalize(Pendulum(256, seed=0))
    env.reset(seed=0)
    for _ in range(50):
        out = env.step(torch.zeros(256, 1))
    assert out.obs.mean(0).abs().max() < 0.5 and (out.obs.std(0) - 1).abs().max() < 0.5
    state = env.state_dict()
    other = ObsNormalize(Pendulum(256, seed=0))
    other.load_state_dict(state)
    a, b = env.step(torch.ones(256, 1)), other.step(torch.ones(256, 1))
    assert torch.equal(a.obs, b.obs) and torch.equal(a.final_obs, b.final_obs)


def test_reward_scale_divides_by_the_std_of_the_discounted_return():
    env = RewardScale(_Recorder(), gamma=0.5)
    env.reset()
    out = [env.step(torch.zeros(2, 2)) for _ in range(3)]
    # env 0 rewards are 1: discounted returns 1, 1.5, 1.75; env 1 rewards 2: 2, 3, 3.5
    seen = torch.tensor([1.0, 2.0, 1.5, 3.0, 1.75, 3.5], dtype=torch.float64)
    expected = torch.tensor([1.0, 2.0]) / torch.sqrt(seen.var(unbiased=False) + 1e-8).float()
    assert torch.allclose(out[-1].reward, expected, atol=1e-3)
    assert env.acc.abs().sum() == 0  # the accumulator restarted at the episode end


def test_reward_scale_statistics_equal_a_running_norm_of_the_discounted_return():
    # RewardScale updates its statistics in place; they must be those of RunningNorm.update applied to
    # the discounted-return accumulator, bit for bit.
    from ctrl_rl.core.nets import RunningNorm

    env = RewardScale(_Recorder(), gamma=0.9)
    env.reset()
    ref, acc = RunningNorm((), clip=float("inf")), torch.zeros(2)
    for _ in range(6):
        out = env.step(torch.zeros(2, 2))
        acc = acc * 0.9 + torch.tensor([1.0, 2.0])
        ref.update(acc)
        assert torch.equal(out.reward, (torch.tensor([1.0, 2.0]) * torch.rsqrt(ref.var + 1e-8)).clamp(-10, 10))
        acc = acc.masked_fill(out.terminated | out.truncated, 0.0)
    assert torch.equal(env.norm.mean, ref.mean) and torch.equal(env.norm.var, ref.var)
    assert torch.equal(env.norm.count, ref.count)


def test_split_step_through_wrappers_equals_step():
    def make():
        return RewardScale(ActionRescale(EpisodeStats(_AsyncPendulum(Pendulum(8, seed=3)))))

    a, b = make(), make()
    assert a.supports_async
    a.reset(seed=1), b.reset(seed=1)
    for _ in range(5):
        act = torch.linspace(-1.5, 1.5, 8).view(8, 1)
        x = a.step(act)
        b.step_async(act)
        y = b.step_wait()
        assert torch.equal(x.obs, y.obs) and torch.equal(x.reward, y.reward)
        assert torch.equal(x.info["episode_return"], y.info["episode_return"])


class _AsyncPendulum:
    def __init__(self, env):
        self.env, self.num_envs, self.spec, self.device = env, env.num_envs, env.spec, env.device

    def reset(self, seed=None):
        return self.env.reset(seed)

    def step(self, action):
        return self.env.step(action)

    def step_async(self, action):
        self._a = action

    def step_wait(self):
        return self.env.step(self._a)

    def close(self):
        pass
