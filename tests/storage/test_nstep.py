"""n-step returns: the pure function against hand-computed numbers, and NStepSampler's strided chains through a
replay buffer of several envs (episode ends, truncation, the newest step, wrap-around)."""

import pytest
import torch

from ctrl_rl.core.returns import nstep_return
from ctrl_rl.storage.replay import NStepSampler, ReplayBuffer

T, F = True, False


def test_nstep_return_by_hand():
    g = 0.5
    reward = torch.tensor([[1.0, 2.0, 4.0]] * 5)  # [B=5,n=3]
    term = torch.tensor([[F, F, F], [F, T, F], [F, F, F], [F, F, F], [F, F, T]])
    trunc = torch.tensor([[F, F, F], [F, F, F], [T, F, F], [F, F, F], [F, F, F]])
    valid = torch.tensor([[T, T, T], [T, T, T], [T, T, T], [T, T, F], [T, T, T]])
    ret, last, disc = nstep_return(reward, term, trunc, valid, g)
    # 0: whole chain 1 + 0.5*2 + 0.25*4 = 3, bootstrap gamma^3
    # 1: terminated at step 1: 1 + 1 = 2, discount 0.25 (the caller zeroes it: terminated)
    # 2: truncated at step 0: 1, bootstrap from its final_obs with gamma
    # 3: step 2 not stored yet: 1 + 1 = 2, bootstrap gamma^2 from step 1's next obs
    # 4: terminated at the last step: 3, discount 0.125
    assert ret.tolist() == [3.0, 2.0, 1.0, 2.0, 3.0]
    assert last.tolist() == [2, 1, 0, 1, 2]
    assert disc.tolist() == [0.125, 0.25, 0.5, 0.25, 0.125]


def test_nstep_return_with_one_step_is_the_transition():
    r = torch.tensor([[3.0], [-1.0]])
    ones = torch.ones(2, 1, dtype=torch.bool)
    ret, last, disc = nstep_return(r, torch.tensor([[T], [F]]), torch.tensor([[F], [T]]), ones, 0.9)
    assert ret.tolist() == [3.0, -1.0] and last.tolist() == [0, 0]
    assert torch.allclose(disc, torch.tensor([0.9, 0.9]))


def test_nstep_return_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="equal"):
        nstep_return(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool),
                     torch.ones(2, 3, dtype=torch.bool), 0.9)


def _fill(buf, steps, n_envs=2, ends=()):
    """Step ``steps`` times with ``n_envs`` envs: obs of env i at step t is 10 t + i (next obs 10 t + i + 5), reward
    t + 100 i; ``ends`` holds (t, i, 'term'|'trunc')."""
    for t in range(steps):
        i = torch.arange(n_envs, dtype=torch.float32)
        obs = (10 * t + i).unsqueeze(1)  # [N,1]
        term = torch.tensor([(t, k, "term") in ends for k in range(n_envs)])
        trunc = torch.tensor([(t, k, "trunc") in ends for k in range(n_envs)])
        buf.add(obs, torch.zeros(n_envs, 1), t + 100 * i, obs + 5, term, trunc)


def _sample_rows(sampler, rows):
    """The sampler's batch whose first transitions are ``rows`` (the buffer's random draw replaced), with its flat
    observations as lists."""
    sampler.buffer.sample_indices = lambda b, g: torch.tensor(rows)
    b = sampler.sample(len(rows))
    assert isinstance(b.obs, torch.Tensor) and isinstance(b.next_obs, torch.Tensor)  # a flat buffer
    return b, b.obs.squeeze(1).tolist(), b.next_obs.squeeze(1).tolist()


def test_sampler_follows_each_env_and_stops_at_episode_ends():
    buf = ReplayBuffer(100, (1,), 1)
    # env 0 terminates at t=1, env 1 is truncated at t=2
    _fill(buf, 5, ends={(1, 0, "term"), (2, 1, "trunc")})
    s = NStepSampler(buf, 3, 0.5, stride=2)
    # rows: t * 2 + i. row 0 = (t0, env0): t0, t1 (terminated) -> 0 + 0.5*1 = 0.5, next obs of t1 = 15, terminated
    # row 1 = (t0, env1): rewards 100, 101, 102 (t2 truncated: ends the chain there anyway) = 100 + 50.5 + 25.5
    # row 4 = (t2, env0): t2, t3, t4: 2 + 1.5 + 1 = 4.5, next obs of t4 = 45
    # row 5 = (t2, env1): truncated at once: 102, next obs 30, bootstrap gamma
    # row 8 = (t4, env0): the newest step: 4, next obs 45, gamma
    b, obs, next_obs = _sample_rows(s, [0, 1, 4, 5, 8])
    assert obs == [0.0, 1.0, 20.0, 21.0, 40.0]
    assert b.reward.tolist() == [0.5, 176.0, 4.5, 102.0, 4.0]
    assert next_obs == [15.0, 26.0, 45.0, 26.0, 45.0]
    assert b.terminated.tolist() == [T, F, F, F, F]
    assert b.truncated.tolist() == [F, T, F, T, F]
    assert b.discount is not None and b.discount.tolist() == [0.25, 0.125, 0.125, 0.5, 0.5]


def test_sampler_wraps_around_a_full_buffer():
    buf = ReplayBuffer(7, (1,), 1)  # 7 rows, 3 envs: steps wrap at odd places
    _fill(buf, 5, n_envs=3)  # 15 rows added: the buffer holds t=2 (env 2) .. t=4; ptr = 15 % 7 = 1
    s = NStepSampler(buf, 2, 0.5, stride=3)
    # row 2 holds (t=4, env 2)? rows are written at (added) % 7: t=4 env i -> (12 + i) % 7 = 5, 6, 0
    # t=3 env i -> (9 + i) % 7 = 2, 3, 4;  t=2 env 2 -> 8 % 7 = 1
    b, obs, next_obs = _sample_rows(s, [2, 1, 0])
    # row 2 (t3, env0): r 3 + 0.5*4 = 5, next obs 45; row 1 (t2, env2): 202 + 0.5*203 = 303.5, next 10*3+2+5 = 37;
    # row 0 (t4, env2): the newest: 204, next 47
    assert obs == [30.0, 22.0, 42.0]
    assert b.reward.tolist() == [5.0, 303.5, 204.0]
    assert next_obs == [45.0, 37.0, 47.0]
    assert b.discount is not None and b.discount.tolist() == [0.25, 0.25, 0.5]


def test_one_step_sampler_equals_the_buffer():
    buf = ReplayBuffer(64, (1,), 1)
    _fill(buf, 20, n_envs=4, ends={(3, 1, "term"), (5, 2, "trunc")})
    s = NStepSampler(buf, 1, 0.99, stride=4)
    a = buf.sample(32, torch.Generator().manual_seed(0))
    b = s.sample(32, torch.Generator().manual_seed(0))
    for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert b.discount is not None and torch.allclose(b.discount, torch.full((32,), 0.99))


def test_sampler_refuses_a_buffer_filled_with_another_stride():
    buf = ReplayBuffer(64, (1,), 1)
    _fill(buf, 3, n_envs=3)
    with pytest.raises(ValueError, match="stride 2"):
        NStepSampler(buf, 3, 0.9, stride=2).sample(4)
