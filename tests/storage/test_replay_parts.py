"""Replay, rollout storage and offline datasets with observations made of several parts (images uint8)."""

import pytest
import torch

from ctrl_rl.core.obs import ObsPart, obs_equal
from ctrl_rl.envs.protocol import EnvSpec, StepOut
from ctrl_rl.storage.datasets.offline import OfflineDataset, to_replay
from ctrl_rl.storage.replay import MixedSampler, ReplayBuffer
from ctrl_rl.storage.rollout import RolloutStorage

PARTS = (ObsPart("image/top", (3, 5, 4), torch.uint8), ObsPart("state", (2,), torch.float32))
SPEC = EnvSpec("test:parts", (2,), False, 1, (-1.0,), (1.0,), obs_parts=PARTS)


def _obs(ids: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Random images and a state whose first column is the row id, so a sampled row can be traced back."""
    n = ids.numel()
    return {"image/top": torch.randint(0, 256, (n, 3, 5, 4), generator=g, dtype=torch.uint8),
            "state": torch.stack([ids.float(), torch.randn(n, generator=g)], 1)}


def _fill(buf: ReplayBuffer, steps: int, n: int = 3, seed: int = 0) -> dict[int, tuple[dict, dict]]:
    """Adds ``steps`` steps of ``n`` envs; returns every transition's (obs, next_obs) by row id."""
    g, rows = torch.Generator().manual_seed(seed), {}
    for k in range(steps):
        ids = torch.arange(k * n, (k + 1) * n)  # [N]
        obs, nxt = _obs(ids, g), _obs(ids, g)
        buf.add(obs, ids.float().view(n, 1), ids.float(), nxt, ids % 2 == 0, ids % 3 == 0)
        for i, r in enumerate(ids.tolist()):
            rows[r] = ({k_: v[i] for k_, v in obs.items()}, {k_: v[i] for k_, v in nxt.items()})
    return rows


def test_images_are_stored_and_sampled_back_bit_exactly_as_uint8():
    buf = ReplayBuffer(7, (2,), 1, obs_parts=PARTS)
    assert not buf.flat and buf.obs["image/top"].dtype == torch.uint8 and buf.obs["image/top"].shape == (7, 3, 5, 4)
    rows = _fill(buf, 4)  # 12 transitions into 7 rows: wraps around
    t = buf.sample(200, torch.Generator().manual_seed(0))
    assert t.obs["image/top"].dtype == t.next_obs["image/top"].dtype == torch.uint8
    assert set(t.reward.long().tolist()) == set(range(5, 12))  # only the 7 newest survive
    for i, r in enumerate(t.reward.long().tolist()):
        want_obs, want_next = rows[r]
        assert (torch.equal(t.obs["image/top"][i], want_obs["image/top"])
                and torch.equal(t.obs["state"][i], want_obs["state"]))
        assert torch.equal(t.next_obs["image/top"][i], want_next["image/top"])
        assert torch.equal(t.next_obs["state"][i], want_next["state"])
    assert torch.equal(t.terminated, t.reward.long() % 2 == 0) and torch.equal(t.truncated, t.reward.long() % 3 == 0)


def test_dict_state_dict_round_trip_continues_identically():
    buf = ReplayBuffer(10, (2,), 1, obs_parts=PARTS)
    _fill(buf, 5)
    state = buf.state_dict()
    assert set(state["obs"]) == {"image/top", "state"} and state["obs"]["image/top"].shape == (10, 3, 5, 4)
    assert state["obs"]["image/top"].dtype == torch.uint8
    other = ReplayBuffer(10, (2,), 1, obs_parts=PARTS)
    other.load_state_dict(state)
    _fill(buf, 2, seed=1)
    _fill(other, 2, seed=1)
    for f in ("obs", "next_obs"):
        assert obs_equal(getattr(buf, f), getattr(other, f))
    for f in ("action", "reward", "terminated", "truncated"):
        assert torch.equal(getattr(buf, f), getattr(other, f))
    assert (buf.ptr, buf.size, buf.added) == (other.ptr, other.size, other.added)
    a, b = (x.sample(32, torch.Generator().manual_seed(3)) for x in (buf, other))
    assert obs_equal(a.obs, b.obs) and obs_equal(a.next_obs, b.next_obs)

    flat = ReplayBuffer(10, (2,), 1)
    with pytest.raises(ValueError, match="holds the parts .* expects flat observations"):
        flat.load_state_dict(state)
    with pytest.raises(ValueError, match="holds flat observations"):
        other.load_state_dict(flat.state_dict())


def test_flat_buffer_is_unchanged_by_parts():
    buf = ReplayBuffer(4, (3,), 2, obs_parts=(ObsPart("state", (3,), torch.float32),))  # spec.parts of a flat env
    assert buf.flat and isinstance(buf.obs, torch.Tensor) and buf.obs.dtype == torch.float32
    buf.add(torch.ones(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool))
    assert set(buf.state_dict()) == {"capacity", "ptr", "size", "added", "obs", "action", "reward", "next_obs",
                                     "terminated", "truncated"}
    assert isinstance(buf.state_dict()["obs"], torch.Tensor)


def test_add_refuses_observations_that_do_not_match_the_parts():
    buf = ReplayBuffer(8, (2,), 1, obs_parts=PARTS)
    g = torch.Generator().manual_seed(0)
    good, ids = _obs(torch.arange(2), g), torch.arange(2)
    args = (torch.zeros(2, 1), torch.zeros(2))
    flags = (torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="dict of the parts"):
        buf.add({"state": good["state"]}, *args, good, *flags)
    with pytest.raises(ValueError, match="'image/top' as torch.uint8"):
        buf.add({**good, "image/top": good["image/top"].long()}, *args, good, *flags)  # no silent wrap-around
    with pytest.raises(ValueError, match="'state' as torch.float32 of shape"):
        buf.add(good, *args, {**good, "state": torch.zeros(2, 3)}, *flags)
    buf.add({**good, "state": good["state"].double()}, *args, good, *flags)  # float parts are cast, as for flat obs
    assert buf.obs["state"].dtype == torch.float32 and len(buf) == len(ids)
    with pytest.raises(ValueError, match="'state' part"):
        ReplayBuffer(8, (5,), 1, obs_parts=PARTS)


def test_memory_of_an_image_buffer_is_the_uint8_size():
    # 10^5 transitions of 3x84x84 images, obs and next_obs: 2 * 10^5 * 21168 bytes = 4.2 GB of uint8
    # (float32 would be 16.9 GB). torch.empty leaves the pages untouched, so this costs no RAM.
    capacity, frame = 100_000, 3 * 84 * 84
    buf = ReplayBuffer(capacity, (), 6, obs_parts=(ObsPart("image/front", (3, 84, 84), torch.uint8),))
    image_bytes = sum(v.untyped_storage().nbytes() for f in (buf.obs, buf.next_obs) for v in f.values())
    assert image_bytes == 2 * capacity * frame
    rest = sum(t.untyped_storage().nbytes() for t in (buf.action, buf.reward, buf.terminated, buf.truncated))
    assert image_bytes + rest <= 1.1 * 2 * capacity * frame
    assert buf.obs["image/front"].dtype == torch.uint8


def test_mixed_sampler_concatenates_parts():
    online, offline = ReplayBuffer(20, (2,), 1, obs_parts=PARTS), ReplayBuffer(20, (2,), 1, obs_parts=PARTS)
    _fill(online, 2)
    _fill(offline, 2, seed=1)
    offline.reward += 1000
    t = MixedSampler(online, offline, 0.25).sample(64, torch.Generator().manual_seed(0))
    assert t.obs["image/top"].shape == (64, 3, 5, 4) and t.obs["image/top"].dtype == torch.uint8
    assert bool((t.reward[48:] >= 1000).all()) and bool((t.reward[:48] < 1000).all())
    flat = ReplayBuffer(5, (2,), 1)
    flat.add(torch.zeros(2, 2), torch.zeros(2, 1), torch.zeros(2), torch.zeros(2, 2), torch.zeros(2, dtype=torch.bool),
             torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="one form"):
        MixedSampler(flat, online, 0.5).sample(4)


def test_rollout_storage_keeps_each_part_in_its_dtype():
    T, N = 3, 2
    store = RolloutStorage(T, N, SPEC, torch.device("cpu"))
    assert store.obs["image/top"].shape == (T, N, 3, 5, 4) and store.obs["image/top"].dtype == torch.uint8
    g = torch.Generator().manual_seed(0)
    written = []
    for t in range(T):
        obs, final = _obs(torch.arange(N) + 10 * t, g), _obs(torch.arange(N) + 10 * t + 5, g)
        out = StepOut(obs, torch.ones(N), torch.zeros(N, dtype=torch.bool), torch.zeros(N, dtype=torch.bool), final)
        store.add(t, obs, torch.zeros(N, 1), torch.zeros(N), out)
        written.append((obs, final))
    r = store.rollout()
    for t, (obs, final) in enumerate(written):
        assert torch.equal(r.obs["image/top"][t], obs["image/top"]) and torch.equal(r.obs["state"][t], obs["state"])
        assert torch.equal(r.final_obs["image/top"][t], final["image/top"])
    flat = RolloutStorage(T, N, EnvSpec("test:flat", (4,), False, 1), torch.device("cpu"))
    assert isinstance(flat.obs, torch.Tensor) and flat.obs.shape == (T, N, 4)


def test_offline_dataset_with_images_goes_to_replay():
    S = 6
    g = torch.Generator().manual_seed(0)
    obs, nxt = _obs(torch.arange(S), g), _obs(torch.arange(S), g)
    valid = torch.tensor([True, True, False, True, True, True])
    ds = OfflineDataset(obs, torch.zeros(S, 1), torch.arange(S).float(), nxt, torch.zeros(S, dtype=torch.bool),
                        torch.zeros(S, dtype=torch.bool), torch.tensor([0, 3, 6]), valid)
    assert len(ds) == S and ds.obs_dim == 2 and ds.obs_parts == PARTS
    buf = to_replay(ds)
    assert len(buf) == 5 and buf.obs["image/top"].dtype == torch.uint8
    assert (torch.equal(buf.obs["image/top"], obs["image/top"][valid])
            and torch.equal(buf.next_obs["state"], nxt["state"][valid]))
    assert torch.equal(buf.reward, torch.tensor([0.0, 1.0, 3.0, 4.0, 5.0]))
    # a dict with only a float32 state part is flat data: the buffer is the flat one
    flat = OfflineDataset({"state": obs["state"]}, torch.zeros(S, 1), torch.zeros(S), {"state": nxt["state"]},
                          torch.zeros(S, dtype=torch.bool), torch.zeros(S, dtype=torch.bool), torch.tensor([0, 6]),
                         valid)
    fbuf = to_replay(flat)
    assert fbuf.flat and torch.equal(fbuf.obs, obs["state"][valid])
