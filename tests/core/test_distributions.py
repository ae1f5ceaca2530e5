"""The tanh-Gaussian sample of the SAC family (core/distributions.py) against torch.distributions and by hand."""

import math

import torch

from ctrl_rl.core.distributions import LOG_STD_MAX, LOG_STD_MIN, tanh_log_det, tanh_normal_sample


def test_tanh_normal_log_prob_matches_torch_distributions():
    mean, log_std = torch.randn(1000, 3), torch.randn(1000, 3) * 0.5
    a, logp = tanh_normal_sample(mean, log_std, torch.Generator().manual_seed(0))
    d = torch.distributions.TransformedDistribution(torch.distributions.Normal(mean, log_std.exp()),
                                                    [torch.distributions.TanhTransform(cache_size=1)])
    ref = d.log_prob(a.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    ok = a.abs().max(-1).values < 0.999  # away from the saturated edge where atanh is ill-conditioned
    assert torch.allclose(logp[ok], ref[ok], atol=1e-3)


def test_tanh_normal_sample_is_the_generators_noise_through_tanh():
    mean, log_std = torch.tensor([[0.5, -1.0]]), torch.tensor([[0.0, math.log(2.0)]])
    a, logp = tanh_normal_sample(mean, log_std, torch.Generator().manual_seed(3))
    eps = torch.randn(1, 2, generator=torch.Generator().manual_seed(3))
    u = mean + eps * torch.tensor([[1.0, 2.0]])
    assert torch.equal(a, torch.tanh(u))
    # log N(u; mean, std) = sum_j -eps_j^2 / 2 - log std_j - log(2 pi) / 2, minus log|d tanh / du|
    want = (-0.5 * eps.square()).sum() - math.log(2.0) - math.log(2 * math.pi) - tanh_log_det(u).sum()
    assert torch.allclose(logp, want.reshape(1), atol=1e-6)


def test_tanh_log_det_is_stable_where_tanh_saturates():
    u = torch.tensor([[0.0, 30.0, -30.0]])
    assert torch.isfinite(tanh_log_det(u)).all()
    assert torch.allclose(tanh_log_det(u[:, :1]), torch.zeros(1))  # 1 - tanh(0)^2 = 1
    assert LOG_STD_MIN < LOG_STD_MAX
