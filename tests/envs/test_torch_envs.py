"""Torch-native batched simulators: equivalence with gymnasium, auto-reset, seeding, checkpoints, API."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from ctrl_rl.envs.protocol import BatchedEnv
from ctrl_rl.envs.torch_envs import TORCH_ENVS, CartPole, MountainCarContinuous, Pendulum, Reacher
from ctrl_rl.envs.torch_envs.gym_wrapper import SingleEnvGym

GYM_IDS = {Pendulum: "Pendulum-v1", CartPole: "CartPole-v1", MountainCarContinuous: "MountainCarContinuous-v0"}


def _set_state(env, states) -> None:
    """Put per-env states ``[N,S]`` (NumPy, e.g. copied from gymnasium) into a torch env."""
    state = torch.as_tensor(np.asarray(states, dtype=np.float64), dtype=env.dtype)
    env.state = state.reshape(env.num_envs, -1).T.contiguous()


def _torch_action(env, a) -> torch.Tensor:
    if env.discrete:
        return torch.as_tensor(np.asarray(a, dtype=np.int64)).reshape(env.num_envs)  # [N]
    return torch.as_tensor(np.asarray(a, dtype=np.float32)).reshape(env.num_envs, -1)  # [N,A]


def _random_actions(env, gen: torch.Generator) -> torch.Tensor:
    n = env.num_envs
    if env.discrete:
        return torch.randint(0, env.action_dim, (n,), generator=gen)  # [N]
    low, high = torch.tensor(env.action_low), torch.tensor(env.action_high)  # [A], [A]
    return low + (high - low) * torch.rand(n, env.action_dim, generator=gen)  # [N,A]


# ---- step-by-step equivalence with gymnasium ----------------------------------------------------


def _pendulum_policy(rng, obs):
    return rng.uniform(-2.5, 2.5, size=1).astype(np.float32)  # exceeds [-2, 2]: exercises the clip


def _cartpole_policy(rng, obs):
    return int(rng.integers(2))


def _car_random_policy(rng, obs):
    return rng.uniform(-1.5, 1.5, size=1).astype(np.float32)  # cost uses the unclipped action


def _car_pump_policy(rng, obs):
    # Push along the velocity: reaches the goal in ~100-150 steps, so episodes terminate.
    return np.array([1.0 if obs[1] >= 0 else -1.0], dtype=np.float32) * np.float32(rng.uniform(0.6, 1.3))


@pytest.mark.parametrize(
    ("cls", "policy", "steps", "min_terminations", "min_truncations"),
    [
        (Pendulum, _pendulum_policy, 450, 0, 2),
        (CartPole, _cartpole_policy, 300, 5, 0),
        (MountainCarContinuous, _car_random_policy, 1100, 0, 1),
        (MountainCarContinuous, _car_pump_policy, 600, 3, 0),
    ],
    ids=["pendulum", "cartpole", "car-random", "car-pump"],
)
def test_trajectory_matches_gymnasium(cls, policy, steps, min_terminations, min_truncations):
    # float64 state so a long trajectory can be compared against gymnasium's float64 arithmetic
    # without float32 drift (float32 is checked one step at a time below).
    genv = gym.make(GYM_IDS[cls])
    env = cls(1, dtype=torch.float64)
    rng = np.random.default_rng(0)
    obs, _ = genv.reset(seed=3)
    env.reset(seed=3)
    _set_state(env, genv.unwrapped.state)
    n_term = n_trunc = 0
    for _ in range(steps):
        a = policy(rng, obs)
        obs, rew, term, trunc, _ = genv.step(a)
        out = env.step(_torch_action(env, a))
        np.testing.assert_allclose(out.final_obs[0].numpy(), obs, atol=2e-5, rtol=0)
        np.testing.assert_allclose(out.reward[0].item(), rew, atol=2e-5, rtol=1e-6)
        assert bool(out.terminated[0]) == term and bool(out.truncated[0]) == trunc
        if term or trunc:
            n_term, n_trunc = n_term + term, n_trunc + trunc
            assert int(env.elapsed_steps[0]) == 0
            obs, _ = genv.reset()
            _set_state(env, genv.unwrapped.state)
        else:
            torch.testing.assert_close(out.obs, out.final_obs, rtol=0, atol=0)
    assert n_term >= min_terminations and n_trunc >= min_truncations


def _sample_states(cls, rng, m):
    if cls is Pendulum:
        return np.stack([rng.uniform(-3 * np.pi, 3 * np.pi, m), rng.uniform(-8, 8, m)], -1)
    if cls is CartPole:
        return np.stack([rng.uniform(-2.4, 2.4, m), rng.uniform(-3, 3, m), rng.uniform(-0.2, 0.2, m),
                         rng.uniform(-3, 3, m)], -1)
    states = np.stack([rng.uniform(-1.2, 0.6, m), rng.uniform(-0.07, 0.07, m)], -1)
    states[:16] = [-1.18, -0.06]  # hits the left wall: position clipped, velocity zeroed
    states[16:32] = [0.44, 0.03]  # reaches the goal
    return states


def _sample_gym_actions(cls, rng, m):
    if cls is CartPole:
        return rng.integers(0, 2, m)
    bound = 3.0 if cls is Pendulum else 1.5
    return rng.uniform(-bound, bound, (m, 1)).astype(np.float32)


@pytest.mark.parametrize("cls", [Pendulum, CartPole, MountainCarContinuous])
def test_one_step_float32_matches_gymnasium(cls):
    m = 512
    rng = np.random.default_rng(1)
    states, actions = _sample_states(cls, rng, m), _sample_gym_actions(cls, rng, m)
    genv = gym.make(GYM_IDS[cls]).unwrapped
    genv.reset(seed=0)
    want = []
    for s, a in zip(states, actions):
        genv.state = s.copy()
        genv.steps_beyond_terminated = None  # CartPole: a fresh episode, not steps past a termination
        obs, rew, term, _, _ = genv.step(a)
        want.append((obs, rew, term))
    env = cls(m)  # float32
    _set_state(env, states)
    out = env.step(_torch_action(env, actions))
    np.testing.assert_allclose(out.final_obs.numpy(), np.stack([w[0] for w in want]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.reward.numpy(), np.array([w[1] for w in want]), atol=1e-5, rtol=1e-6)
    term = np.array([w[2] for w in want])
    np.testing.assert_array_equal(out.terminated.numpy(), term)
    assert not out.truncated.any()
    if cls is not Pendulum:
        assert 0 < term.sum() < m  # the sampled states exercise both outcomes


def test_reacher_one_step_tracks_mujoco():
    pytest.importorskip("mujoco")
    genv = gym.make("Reacher-v5").unwrapped
    genv.reset(seed=0)
    m = 64
    rng = np.random.default_rng(2)
    q = np.stack([rng.uniform(-np.pi, np.pi, m), rng.uniform(-2.5, 2.5, m)], -1)  # elbow away from its +-3 stop
    qd = rng.uniform(-10, 10, (m, 2))
    radius, angle = 0.2 * np.sqrt(rng.uniform(size=m)), rng.uniform(0, 2 * np.pi, m)
    target = np.stack([radius * np.cos(angle), radius * np.sin(angle)], -1)
    actions = rng.uniform(-1.3, 1.3, (m, 2)).astype(np.float32)  # ctrl is clipped to [-1, 1]
    want_obs, want_rew = [], []
    for i in range(m):
        genv.set_state(np.concatenate([q[i], target[i]]), np.concatenate([qd[i], [0.0, 0.0]]))
        obs, rew, _, _, _ = genv.step(actions[i])
        want_obs.append(obs)
        want_rew.append(rew)
    # reward_control_weight=1.0 is what gymnasium's Reacher-v5 actually uses (see the reacher docstring).
    env = Reacher(m, dtype=torch.float64, reward_control_weight=1.0)
    _set_state(env, np.concatenate([q, qd, target], -1))
    out = env.step(torch.as_tensor(actions))
    np.testing.assert_allclose(out.final_obs.numpy(), np.stack(want_obs), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.reward.numpy(), np.array(want_rew), atol=1e-5, rtol=1e-6)


# ---- batched semantics ----------------------------------------------------------------------------


def test_auto_reset_on_termination():
    n = 512
    env = CartPole(n, seed=1)
    gen = torch.Generator().manual_seed(0)
    env.reset()
    prev_steps = env.elapsed_steps.clone()
    n_done = 0
    for _ in range(60):
        out = env.step(_random_actions(env, gen))
        done = out.done
        assert not (out.terminated & out.truncated).any()
        torch.testing.assert_close(out.obs[~done], out.final_obs[~done], rtol=0, atol=0)
        # Ended episodes: final_obs is past a threshold, obs is a fresh start in [-0.05, 0.05]^4.
        fo = out.final_obs[done]
        assert ((fo[:, 0].abs() > 2.4) | (fo[:, 2].abs() > 12 * 2 * math.pi / 360)).all()
        assert (out.obs[done].abs() <= 0.05).all()
        assert (env.elapsed_steps[done] == 0).all()
        assert torch.equal(env.elapsed_steps[~done], prev_steps[~done] + 1)
        prev_steps = env.elapsed_steps.clone()
        n_done += int(done.sum())
    assert n_done > n  # many episodes ended, at different steps


def test_truncation_keeps_final_obs_and_terminated_wins():
    n, limit = 64, 5
    env = Pendulum(n, seed=4, max_episode_steps=limit)
    twin = Pendulum(n, max_episode_steps=1000)  # same dynamics, no cut in sight
    env.reset()
    gen = torch.Generator().manual_seed(1)
    for t in range(1, 2 * limit + 1):
        twin.load_state_dict(env.state_dict())
        a = _random_actions(env, gen)
        out, ref = env.step(a), twin.step(a)
        torch.testing.assert_close(out.final_obs, ref.obs, rtol=0, atol=0)  # pre-reset obs of the episode
        assert bool(out.truncated.all()) == (t % limit == 0)
        assert not out.terminated.any()
        if t % limit == 0:
            assert not torch.equal(out.obs, out.final_obs) and (out.obs[:, 2].abs() <= 1).all()
            assert (env.elapsed_steps == 0).all()

    # A terminal state reached on the last allowed step is terminated, not truncated.
    car = MountainCarContinuous(2, max_episode_steps=1)
    car.state = torch.tensor([[0.449, -0.5], [0.069, 0.0]])  # [S,N]: env 0 reaches the goal
    out = car.step(torch.ones(2, 1))
    assert out.terminated.tolist() == [True, False] and out.truncated.tolist() == [False, True]
    assert out.reward[0] > 99


# ---- seeding and checkpoints ----------------------------------------------------------------------


def _rollout(env, steps, action_seed=0):
    gen = torch.Generator().manual_seed(action_seed)
    outs = []
    for _ in range(steps):
        out = env.step(_random_actions(env, gen))
        outs.append(torch.cat([out.obs, out.final_obs, out.reward[:, None], out.done[:, None].float()], -1))
    return torch.stack(outs)  # [T,N,2O+2]


@pytest.mark.parametrize("name", list(TORCH_ENVS))
def test_seeding_is_deterministic(name):
    cls = TORCH_ENVS[name]
    limit = 7  # forces auto-resets, which draw from the generator
    a, b, c = (cls(16, seed=s, max_episode_steps=limit) for s in (5, 5, 6))
    assert torch.equal(a.reset(), b.reset()) and not torch.equal(a.reset(seed=5), c.reset())
    a.reset(seed=11)
    b.reset(seed=11)
    ra, rb = _rollout(a, 20), _rollout(b, 20)
    assert torch.equal(ra, rb)
    c.reset(seed=12)
    assert not torch.equal(ra, _rollout(c, 20))


@pytest.mark.parametrize("name", list(TORCH_ENVS))
def test_state_dict_round_trip_continues_identically(name):
    cls = TORCH_ENVS[name]
    env = cls(32, seed=0, max_episode_steps=9)
    env.reset()
    _rollout(env, 13)
    snapshot = env.state_dict()
    expected = _rollout(env, 25, action_seed=1)  # mutates env after the snapshot was taken
    other = cls(32, seed=123, max_episode_steps=9)
    other.load_state_dict(snapshot)
    assert torch.equal(_rollout(other, 25, action_seed=1), expected)

    with pytest.raises(ValueError, match="num_envs"):
        cls(8).load_state_dict(snapshot)
    wrong = TORCH_ENVS["CartPole" if name != "CartPole" else "Pendulum"](32)
    with pytest.raises(ValueError, match="state_dict is for env"):
        wrong.load_state_dict(snapshot)


# ---- API ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TORCH_ENVS))
def test_batch_api_and_action_validation(name):
    cls = TORCH_ENVS[name]
    n = 4096
    env = cls(n, seed=0)
    assert isinstance(env, BatchedEnv)
    spec = env.spec
    assert spec.env_id == f"torch:{name}" and spec.backend == "torch" and spec.discrete == cls.discrete
    assert spec.max_episode_steps == cls.default_max_episode_steps
    assert cls(2, max_episode_steps=3).spec.max_episode_steps == 3
    obs = env.reset(seed=0)
    assert obs.shape == (n, spec.obs_dim) and obs.dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        out = env.step(_random_actions(env, gen))
    assert out.obs.shape == out.final_obs.shape == (n, spec.obs_dim)
    assert out.obs.dtype == out.final_obs.dtype == torch.float32
    assert out.reward.shape == (n,) and out.reward.dtype == torch.float32
    assert out.terminated.dtype == out.truncated.dtype == torch.bool and out.terminated.shape == (n,)
    assert torch.isfinite(out.obs).all() and torch.isfinite(out.reward).all()

    if cls.discrete:
        bad = [torch.zeros(n - 1, dtype=torch.int64), torch.zeros(n, 1, dtype=torch.int64), torch.zeros(n)]
    else:
        bad = [torch.zeros(n), torch.zeros(n, spec.action_dim + 1), torch.zeros(n - 1, spec.action_dim)]
    for action in bad:
        with pytest.raises(ValueError, match=f"torch:{name}"):
            env.step(action)
    env.close()


@pytest.mark.filterwarnings("ignore:.*Box (action|observation) space:UserWarning")
@pytest.mark.parametrize("name", list(TORCH_ENVS))
def test_single_env_gym_passes_check_env(name):
    check_env(SingleEnvGym(name), skip_render_check=True)


def test_single_env_gym_returns_final_obs_not_reset_obs():
    genv = SingleEnvGym("Pendulum", max_episode_steps=3)
    twin = Pendulum(1, max_episode_steps=100)
    genv.reset(seed=0)
    twin.load_state_dict(genv.torch_env.state_dict())
    for t in range(3):
        a = np.array([0.5 * t], dtype=np.float32)
        obs, rew, term, trunc, info = genv.step(a)
        ref = twin.step(torch.as_tensor(a)[None])
        np.testing.assert_array_equal(obs, ref.obs[0].numpy())
        assert isinstance(rew, float) and not term and trunc == (t == 2) and info == {}
    assert genv.observation_space.contains(obs) and genv.action_space == gym.spaces.Box(-2, 2, (1,), np.float32)
    cart = SingleEnvGym("CartPole", seed=3)
    assert cart.action_space == gym.spaces.Discrete(2)
    cart.reset(seed=1)
    cart.step(np.int64(1))
    with pytest.raises(ValueError, match="num_envs=1"):
        SingleEnvGym(Pendulum(2))
    with pytest.raises(ValueError, match="Unknown torch env"):
        SingleEnvGym("Acrobot")
