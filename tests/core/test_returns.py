import torch

from ctrl_rl.core.returns import discounted_returns, gae, polyak_


def _col(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype).view(-1, 1)  # [T,1]


def _flags(*v):
    return torch.tensor(v, dtype=torch.bool).view(-1, 1)


R, V, NV = _col(1.0, 2.0, 3.0), _col(0.5, 1.0, 1.5), _col(1.0, 1.5, 2.0)


def test_gae_no_episode_end_matches_hand_numbers():
    # gamma = lam = 0.5: deltas 1.0, 1.75, 2.5; A2 = 2.5, A1 = 1.75 + .25 * 2.5, A0 = 1 + .25 * A1
    adv, ret = gae(R, V, NV, _flags(0, 0, 0), _flags(0, 0, 0), 0.5, 0.5)
    assert torch.allclose(adv.squeeze(1), torch.tensor([1.59375, 2.375, 2.5]))
    assert torch.allclose(ret, adv + V)


def test_gae_truncation_bootstraps_from_final_obs_value_and_cuts_the_trace():
    nv = NV.clone()
    nv[1] = 4.0  # V(final_obs) of the truncated episode
    adv, _ = gae(R, V, nv, _flags(0, 0, 0), _flags(0, 1, 0), 0.5, 0.5)
    # delta1 = 2 + .5 * 4 - 1 = 3 (bootstrapped), no carry from t=2; A0 = 1 + .25 * 3
    assert torch.allclose(adv.squeeze(1), torch.tensor([1.75, 3.0, 2.5]))


def test_gae_termination_does_not_bootstrap():
    adv, _ = gae(R, V, NV, _flags(0, 1, 0), _flags(0, 1, 0), 0.5, 0.5)
    # delta1 = 2 + 0 - 1 = 1; A0 = 1 + .25 * 1
    assert torch.allclose(adv.squeeze(1), torch.tensor([1.25, 1.0, 2.5]))


def test_gae_columns_are_independent_envs():
    r = torch.cat([R, R], 1)
    v = torch.cat([V, V], 1)
    nv = torch.cat([NV, NV], 1)
    term = torch.cat([_flags(0, 0, 0), _flags(0, 1, 0)], 1)
    adv, _ = gae(r, v, nv, term, term, 0.5, 0.5)
    assert torch.allclose(adv[:, 0], torch.tensor([1.59375, 2.375, 2.5]))
    assert torch.allclose(adv[:, 1], torch.tensor([1.25, 1.0, 2.5]))


def test_gae_lambda_one_is_monte_carlo_with_bootstrap():
    adv, ret = gae(R, V, NV, _flags(0, 0, 0), _flags(0, 0, 0), 0.9, 1.0)
    mc = discounted_returns(R, _flags(0, 0, 0), _flags(0, 0, 0), NV, 0.9)
    assert torch.allclose(ret, mc)
    # by hand: G2 = 3 + .9 * 2 = 4.8, G1 = 2 + .9 * 4.8 = 6.32, G0 = 1 + .9 * 6.32 = 6.688
    assert torch.allclose(mc.squeeze(1), torch.tensor([6.688, 6.32, 4.8]))


def test_discounted_returns_truncation_and_termination():
    boot = _col(10.0, 20.0, 30.0)
    g = discounted_returns(R, _flags(0, 0, 1), _flags(0, 1, 1), boot, 0.5)
    # t2 terminated: 3; t1 truncated: 2 + .5 * 20 = 12; t0: 1 + .5 * 12 = 7
    assert torch.allclose(g.squeeze(1), torch.tensor([7.0, 12.0, 3.0]))


def test_polyak_moves_targets_by_tau():
    tgt, src = [torch.zeros(3)], [torch.ones(3)]
    polyak_(tgt, src, 0.25)
    assert torch.allclose(tgt[0], torch.full((3,), 0.25))
