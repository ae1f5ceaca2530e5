import pytest
import torch

from ctrl_rl.storage.replay import MixedSampler, ReplayBuffer


def _step(buf, start, n=3):
    v = torch.arange(start, start + n, dtype=torch.float32)  # [N] row ids as values
    buf.add(v.view(n, 1), v.view(n, 1).repeat(1, 2), v, v.view(n, 1) + 0.5, v % 2 == 0, v % 3 == 0)


def test_wraps_around_and_keeps_the_newest_rows():
    buf = ReplayBuffer(7, (1,), 2)
    for k in range(4):  # 12 transitions into 7 rows
        _step(buf, 3 * k)
    assert len(buf) == 7 and buf.added == 12 and buf.ptr == 12 % 7
    assert sorted(buf.obs.view(-1).tolist()) == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    t = buf.sample(500, torch.Generator().manual_seed(0))
    assert torch.equal(t.next_obs, t.obs + 0.5) and torch.equal(t.reward, t.obs.view(-1))
    assert torch.equal(t.terminated, t.reward % 2 == 0) and torch.equal(t.truncated, t.reward % 3 == 0)
    assert set(t.reward.tolist()) == {5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0}


def test_samples_only_filled_rows_and_is_seeded():
    buf = ReplayBuffer(100, (1,), 2)
    _step(buf, 0, n=4)
    a = buf.sample(64, torch.Generator().manual_seed(1))
    b = buf.sample(64, torch.Generator().manual_seed(1))
    assert set(a.reward.tolist()) <= {0.0, 1.0, 2.0, 3.0} and torch.equal(a.obs, b.obs)
    with pytest.raises(ValueError):
        ReplayBuffer(5, (1,), 2).sample(4)


def test_state_dict_round_trip_continues_identically():
    buf = ReplayBuffer(10, (1,), 2)
    for k in range(5):
        _step(buf, 3 * k)
    other = ReplayBuffer(10, (1,), 2)
    other.load_state_dict(buf.state_dict())
    _step(buf, 100)
    _step(other, 100)
    for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        assert torch.equal(getattr(buf, f), getattr(other, f))
    assert (buf.ptr, buf.size, buf.added) == (other.ptr, other.size, other.added)


def test_mixed_sampler_draws_the_exact_fraction_from_the_second_buffer():
    online, offline = ReplayBuffer(50, (1,), 2), ReplayBuffer(50, (1,), 2)
    _step(online, 0, n=5)
    _step(offline, 1000, n=5)
    t = MixedSampler(online, offline, 0.25).sample(256, torch.Generator().manual_seed(0))
    assert int((t.reward >= 1000).sum()) == 64 and bool((t.reward[192:] >= 1000).all())


def test_discrete_actions_and_shape_errors():
    buf = ReplayBuffer(8, (3,), 4, discrete=True)
    buf.add(torch.zeros(2, 3), torch.tensor([1, 3]), torch.zeros(2), torch.zeros(2, 3),
            torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
    assert buf.sample(4).action.dtype == torch.int64
    with pytest.raises(ValueError, match="obs"):
        buf.add(torch.zeros(2, 4), torch.tensor([1, 3]), torch.zeros(2), torch.zeros(2, 4),
                torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))


def test_memory_is_preallocated_and_flat():
    buf = ReplayBuffer(1000, (17,), 6)
    ptrs = [buf.obs.data_ptr(), buf.action.data_ptr()]
    for _k in range(300):
        buf.add(torch.randn(8, 17), torch.randn(8, 6), torch.randn(8), torch.randn(8, 17),
                torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.bool))
    assert [buf.obs.data_ptr(), buf.action.data_ptr()] == ptrs and buf.obs.shape == (1000, 17)
