"""SAC's parts of the FastSAC recipe: running observation normalization (update, act, checkpoint, export) and n-step
batches' per-transition bootstrap discount."""

import dataclasses

import pytest
import torch

from ctrl_rl.algos.sac import SAC, SACConfig
from ctrl_rl.core.losses import td_target
from ctrl_rl.core.protocols import ObservationStatistics
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError

SPEC = EnvSpec("synthetic:cont", (5,), False, 2, (-1.0, -1.0), (1.0, 1.0))
CFG = SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), obs_norm=True, layer_norm=True, actor_layer_norm=True)


def _batch(B=32, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return Transition(torch.randn(B, 5, generator=g) * scale + shift, torch.rand(B, 2, generator=g) * 2 - 1,
                      torch.randn(B, generator=g), torch.randn(B, 5, generator=g) * scale + shift,
                      torch.rand(B, generator=g) < 0.1, torch.zeros(B, dtype=torch.bool))


def _fed(seed=0):
    sac = SAC(CFG, SPEC, "cpu", torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        sac.update_obs_stats(torch.randn(8, 5, generator=g) * 50 + 100)  # [N,O] far from unit scale
    return sac


def test_obs_norm_statistics_normalize_acting_and_updates():
    sac = _fed()
    assert isinstance(sac, ObservationStatistics)
    norm = sac.obs_norm
    assert norm is not None and float(norm.count) == pytest.approx(32)
    x = torch.randn(6, 5) * 50 + 100
    z = (x - norm.mean) / torch.sqrt(norm.var + norm.eps)
    assert torch.allclose(sac.encode(x), z.clamp(-10, 10))
    assert z.abs().mean() < 3  # the raw observations are ~100 away from 0
    # the deterministic action is the actor's mode of the normalized observation, and so is the exported policy
    want = sac.actor.mode(z)
    assert torch.allclose(sac.act(x, deterministic=True), want, atol=1e-6)
    assert torch.allclose(sac.exportable()(x), want, atol=1e-6)  # ONNX / pt2 parity: tests/export/test_onnx.py
    # updates see normalized observations: the critic step's features are norm(obs), norm(next_obs)
    b = _batch(scale=50, shift=100)
    f, f_next = sac.features(b)
    assert torch.allclose(f, norm(b.obs)) and torch.allclose(f_next, norm(b.next_obs))


def test_obs_norm_off_feeds_nothing_and_keeps_the_old_state_layout():
    sac = SAC(dataclasses.replace(CFG, obs_norm=False), SPEC, "cpu")
    sac.update_obs_stats(torch.randn(4, 5))  # a no-op
    assert sac.obs_norm is None and "obs_norm" not in sac.state_dict()
    x = torch.randn(3, 5)
    assert torch.equal(sac.encode(x), x)


def test_obs_norm_statistics_travel_with_the_state():
    a = _fed()
    a.update(_batch(scale=50, shift=100))
    b = SAC(CFG, SPEC, "cpu")
    b.load_state_dict(a.state_dict())
    assert b.obs_norm is not None and a.obs_norm is not None
    assert torch.equal(b.obs_norm.mean, a.obs_norm.mean) and torch.equal(b.obs_norm.var, a.obs_norm.var)
    x = torch.randn(4, 5) * 50 + 100
    assert torch.equal(a.act(x, deterministic=True), b.act(x, deterministic=True))
    plain = SAC(dataclasses.replace(CFG, obs_norm=False), SPEC, "cpu")
    with pytest.raises(KeyError, match="obs-norm"):
        b.load_state_dict(plain.state_dict())


def test_obs_norm_needs_flat_observations_and_sacs_own_actor():
    from ctrl_rl.algos.sac import Actor

    with pytest.raises(UserInputError, match="--obs-norm"):
        SAC(CFG, SPEC, "cpu", actor=Actor(CFG, SPEC))


def test_update_with_obs_norm_is_finite_and_seeded():
    infos = []
    for _ in range(2):
        torch.manual_seed(0)
        sac = _fed(seed=1)
        for k in range(3):
            info = sac.update(_batch(seed=k, scale=50, shift=100))
        infos.append({k: float(v) for k, v in info.items()})
    assert infos[0] == infos[1] and all(v == v and abs(v) < 1e6 for v in infos[0].values())


def test_nstep_discount_replaces_gamma_in_the_target():
    q_next = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, 5.0]])  # [E=2,B=3]
    reward = torch.tensor([1.0, 1.0, 1.0])
    term = torch.tensor([False, True, False])
    logp, alpha = torch.zeros(3), torch.tensor(0.0)
    disc = torch.tensor([0.5, 0.25, 0.125])
    y = td_target(q_next, None, reward, term, logp, alpha, disc, True)
    assert y.tolist() == [1.0 + 0.5 * 1.0, 1.0, 1.0 + 0.125 * 3.0]


def test_sac_update_uses_the_batch_discount():
    """An n-step batch whose discount equals gamma everywhere trains exactly as the one-step batch; another discount
    changes the critic step."""
    losses = []
    for disc in (None, 0.99, 0.5):
        torch.manual_seed(0)
        sac = SAC(dataclasses.replace(CFG, obs_norm=False), SPEC, "cpu", torch.Generator().manual_seed(2))
        b = _batch()
        if disc is not None:
            b = dataclasses.replace(b, discount=torch.full((32,), disc))
        losses.append(float(sac.update(b)["loss/critic"]))
    assert losses[0] == pytest.approx(losses[1], abs=1e-7) and losses[2] != pytest.approx(losses[0], abs=1e-4)
