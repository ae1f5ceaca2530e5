import pytest
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


def _vt(log_rho, r, v, nv, term, done, **kw):
    from ctrl_rl.core.returns import vtrace

    t = lambda x, dt=torch.float64: torch.tensor(x, dtype=dt).reshape(-1, 1)  # noqa: E731
    return vtrace(t(log_rho), t(r), t(v), t(nv), t(term, torch.bool), t(done, torch.bool), **kw)


def test_vtrace_matches_hand_numbers_off_policy():
    # T=3, gamma 0.9, ratios 2, 0.5, 1 (log), rho_bar = c_bar = 1 -> rho = c = (1, 0.5, 1)
    import math
    vs, adv = _vt([math.log(2), math.log(0.5), 0.0], [1.0, 2.0, 3.0], [0.5, 1.0, 2.0], [1.0, 2.0, 4.0],
                  [0, 0, 0], [0, 0, 0], gamma=0.9)
    # deltas: d0 = 1*(1 + 0.9*1 - 0.5) = 1.4; d1 = 0.5*(2 + 0.9*2 - 1) = 1.4; d2 = 1*(3 + 0.9*4 - 2) = 4.6
    # corr2 = 4.6; corr1 = 1.4 + 0.9*0.5*4.6 = 3.47; corr0 = 1.4 + 0.9*1*3.47 = 4.523
    assert torch.allclose(vs.flatten(), torch.tensor([0.5 + 4.523, 1.0 + 3.47, 2.0 + 4.6], dtype=torch.float64))
    # pg advantages: ratio clipped at 1: (1, 0.5, 1); v'_0 = v_1 = 4.47, v'_1 = v_2 = 6.6, v'_2 = next_value = 4
    want = [1 * (1 + 0.9 * 4.47 - 0.5), 0.5 * (2 + 0.9 * 6.6 - 1), 1 * (3 + 0.9 * 4 - 2)]
    assert torch.allclose(adv.flatten(), torch.tensor(want, dtype=torch.float64))


def test_vtrace_episode_ends_cut_the_trace_truncation_bootstraps_termination_does_not():
    vs, adv = _vt([0.0] * 3, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [5.0, 7.0, 9.0], [0, 1, 0], [1, 1, 0], gamma=0.5)
    # t0 truncated: 1 + 0.5*5; t1 terminated: 1; t2: 1 + 0.5*9
    assert torch.allclose(vs.flatten(), torch.tensor([3.5, 1.0, 5.5], dtype=torch.float64))
    assert torch.allclose(adv.flatten(), torch.tensor([3.5, 1.0, 5.5], dtype=torch.float64))


def test_vtrace_on_policy_is_the_lambda_return_of_gae():
    g = torch.Generator().manual_seed(0)
    T, N = 7, 4
    r, v, nv = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    term = torch.rand(T, N, generator=g) < 0.2
    done = term | (torch.rand(T, N, generator=g) < 0.2)
    from ctrl_rl.core.returns import vtrace

    for lam in (0.0, 0.7, 1.0):
        vs, adv = vtrace(torch.zeros(T, N), r, v, nv, term, done, 0.95, lam=lam)
        adv_gae, ret = gae(r, v, nv, term, done, 0.95, lam)
        assert torch.allclose(vs, ret, atol=1e-5)
    # lam = 0: one-step TD targets
    vs, _ = vtrace(torch.zeros(T, N), r, v, nv, term, done, 0.95, lam=0.0)
    assert torch.allclose(vs, r + 0.95 * (~term).float() * nv, atol=1e-6)


def test_vtrace_clips_large_ratios():
    vs, adv = _vt([5.0], [1.0], [0.0], [0.0], [0], [0], gamma=0.9, rho_bar=1.0, pg_rho_bar=1.0)
    assert float(vs) == 1.0 and float(adv) == 1.0


def _segment(T=8, N=5, seed=0, off_policy=True):
    g = torch.Generator().manual_seed(seed)
    r, v, nv = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    # next_value inside an episode is the next row's value (a consistent segment); episode ends bootstrap
    term = torch.rand(T, N, generator=g) < 0.15
    done = term | (torch.rand(T, N, generator=g) < 0.15)
    nv = torch.where(done, nv, torch.cat([v[1:], nv[-1:]]))
    log_rho = torch.randn(T, N, generator=g) * 0.5 if off_policy else torch.zeros(T, N)
    return log_rho, r, v, nv, term, done


def test_domo_kappa_zero_is_the_vtrace_policy_gradient_advantage():
    from ctrl_rl.core.returns import domo_advantage, vtrace

    log_rho, r, v, nv, term, done = _segment()
    for lam in (0.0, 0.9, 1.0):
        vs, adv = vtrace(log_rho, r, v, nv, term, done, 0.97, lam=lam)
        dom = domo_advantage(log_rho, r, v, nv, vs, term, done, 0.97, kappa=0.0)
        assert torch.allclose(dom, adv, atol=1e-6)


def test_domo_on_policy_with_full_traces_is_the_monte_carlo_advantage_for_every_kappa():
    from ctrl_rl.core.returns import domo_advantage, vtrace

    log_rho, r, v, nv, term, done = _segment(off_policy=False)
    vs, _ = vtrace(log_rho, r, v, nv, term, done, 0.9, lam=1.0)
    mc = discounted_returns(r, term, done, nv, 0.9)  # bootstraps from next_value at truncations and the end
    for kappa in (0.0, 0.3, 0.7, 1.0):
        adv = domo_advantage(log_rho, r, v, nv, vs, term, done, 0.9, kappa=kappa)
        assert torch.allclose(adv, mc - v, atol=1e-5)


def test_domo_kappa_one_is_the_trace_weighted_sum_of_td_errors_by_hand():
    from ctrl_rl.core.returns import domo_advantage

    # T=2, gamma 0.5, ratios (1, 0.5): c_1 = 0.5; d_t = r + 0.5 * next_value - value
    t = lambda x, dt=torch.float64: torch.tensor(x, dtype=dt).reshape(-1, 1)  # noqa: E731
    import math
    log_rho, r, v, nv = t([0.0, math.log(0.5)]), t([1.0, 2.0]), t([0.0, 1.0]), t([1.0, 4.0])
    no = t([0, 0], torch.bool)
    adv = domo_advantage(log_rho, r, v, nv, t([9.0, 9.0]), no, no, 0.5, kappa=1.0)
    d0, d1 = 1 + 0.5 * 1 - 0, 2 + 0.5 * 4 - 1  # 1.5, 3
    assert torch.allclose(adv.flatten(), torch.tensor([d0 + 0.5 * 0.5 * d1, 0.5 * d1], dtype=torch.float64))


def test_group_relative_advantages_by_hand():
    from ctrl_rl.core.returns import group_relative_advantages

    # envs (0, 1) end episodes at steps 1 and 3, envs (2, 3) only at step 3
    r = torch.tensor([[1.0, 2, 0, 0], [1, 0, 3, 1], [0, 5, 0, 0], [2, 2, 1, 1]])
    e = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    # returns: first episodes (2, 2) -> (0, 0); second (2, 7) -> mean 4.5; (4, 2) -> mean 3
    want = torch.tensor([[0.0, 0, 1, -1], [0, 0, 1, -1], [-2.5, 2.5, 1, -1], [-2.5, 2.5, 1, -1]])
    assert torch.equal(group_relative_advantages(r, e, 2), want)
    assert torch.allclose(group_relative_advantages(r, e, 1), torch.zeros(4, 4))  # a group of one has no signal


def test_group_relative_advantages_refuse_unpaired_episodes():
    from ctrl_rl.core.returns import group_relative_advantages

    r = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="still running"):
        group_relative_advantages(r, torch.tensor([[1, 1], [0, 0]], dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="same steps"):
        group_relative_advantages(r, torch.tensor([[1, 0], [1, 1]], dtype=torch.bool), 2)


def test_successful_episode_steps_by_hand():
    from ctrl_rl.core.returns import successful_episode_steps

    # env 0: episode ends at step 1 (success), next one runs past the window; env 1: ends at step 2 (success)
    # and at step 3 (failure); env 2: ends at step 3 (success) but began before the window
    e = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)
    s = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=torch.bool)
    want = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(successful_episode_steps(e, s, torch.tensor([True, True, False])), want)
    # a window of one step: only an episode that began and succeeded in it
    one = successful_episode_steps(e[1:2], s[1:2], torch.tensor([True, False, True]))
    assert one.tolist() == [[True, False, False]]
