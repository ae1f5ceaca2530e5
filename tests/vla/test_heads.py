import math

import pytest
import torch

from ctrl_rl.vla.heads import (
    ActionNormalizer,
    FlowHead,
    RegressionHead,
    TokenBins,
    sample_bins,
    token_log_prob,
    token_loss,
)

D, H, A = 8, 4, 2


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _tokens(n, g):
    """Standardised query states ``[n,H,D]``: the heads LayerNorm their input (as OpenVLA-OFT), so a synthetic map
    of cond must not depend on a token's mean or scale to be learnable."""
    c = torch.randn(n, H, D, generator=g)
    return (c - c.mean(-1, keepdim=True)) / c.std(-1, unbiased=False, keepdim=True)


# ----- ActionNormalizer -----

def test_normalizer_quantiles_round_trip_and_clipping():
    g = _gen()
    acts = torch.randn(1000, 3, generator=g) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([0.0, 5.0, -2.0])
    norm = ActionNormalizer.from_actions(acts)
    assert torch.allclose(norm.q01, torch.quantile(acts, 0.01, dim=0), atol=1e-5)
    assert torch.allclose(norm.q99, torch.quantile(acts, 0.99, dim=0), atol=1e-5)
    inside = acts[((acts >= norm.q01) & (acts <= norm.q99)).all(1)]  # [S',3]
    x = norm.normalize(inside)
    assert x.min() >= -1 and x.max() <= 1
    assert torch.allclose(norm.unnormalize(x), inside, atol=1e-4)
    # q01 -> -1, q99 -> 1, beyond the quantiles clipped
    assert torch.allclose(norm.normalize(torch.stack([norm.q01, norm.q99])), torch.tensor([[-1.0] * 3, [1.0] * 3]))
    far = norm.normalize(torch.stack([norm.q01 - 100, norm.q99 + 100]))
    assert torch.equal(far, torch.tensor([[-1.0] * 3, [1.0] * 3]))


def test_normalizer_zero_range_dim_maps_to_zero_and_back_to_q01():
    acts = torch.stack([torch.linspace(-3, 3, 101), torch.full((101,), 0.7)], 1)  # [S,2], dim 1 constant
    norm = ActionNormalizer(2)
    norm.fit(acts)
    x = norm.normalize(torch.tensor([[0.0, 0.7], [1.0, 5.0]]))
    assert torch.equal(x[:, 1], torch.zeros(2)) and torch.isfinite(x).all()
    a = norm.unnormalize(torch.tensor([[0.0, 0.3], [1.0, -1.0]]))
    assert torch.allclose(a[:, 1], torch.tensor([0.7, 0.7]))
    assert torch.allclose(a[:, 0], torch.stack([(norm.q01[0] + norm.q99[0]) / 2, norm.q99[0]]))


def test_normalizer_unfitted_is_identity_and_rejects_bad_input():
    norm = ActionNormalizer(2)
    x = torch.tensor([[-0.5, 0.25]])
    assert torch.allclose(norm.normalize(x), x) and torch.allclose(norm.unnormalize(x), x)
    with pytest.raises(ValueError, match="finite"):
        norm.fit(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match=r"\[S,2\]"):
        norm.fit(torch.zeros(5, 3))


# ----- tokens -----

def test_bins_round_trip_within_half_a_bin_and_ids_are_the_last_256():
    V = 1000
    bins = TokenBins(V)
    x = torch.rand(5, H, A, generator=_gen()) * 2 - 1
    x[0, 0] = torch.tensor([-1.0, 1.0])
    b = bins.encode(x)  # [5,H*A]
    assert b.shape == (5, H * A) and b.dtype == torch.int64
    assert b[0, 0] == 0 and b[0, 1] == 255
    assert (bins.decode(b, H, A) - x).abs().max() <= 1 / 256 + 1e-6
    ids = bins.to_ids(b)
    assert ids.min() >= V - 256 and ids.max() < V
    assert torch.equal(bins.to_bins(ids), b)
    # row-major: token h*A + a is x[:, h, a]
    assert torch.equal(b.view(5, H, A)[:, 2, 1], bins.encode(x[:, 2:3, 1:2]).view(5))
    logits = torch.randn(2, 3, V)
    assert torch.equal(bins.bin_logits(logits), logits[..., V - 256:])


def test_token_loss_matches_hand_numbers_and_weights():
    # sample 0: logits (0, ln 3), target 1 -> p = 3/4; sample 1: logits (0, 0), target 0 -> p = 1/2
    logits = torch.tensor([[[0.0, math.log(3.0)]], [[0.0, 0.0]]])  # [B=2,M=1,n=2]
    target = torch.tensor([[1], [0]])
    ce0, ce1 = -math.log(0.75), math.log(2.0)
    assert torch.allclose(token_loss(logits, target), torch.tensor((ce0 + ce1) / 2))
    w = torch.tensor([3.0, 1.0])
    assert torch.allclose(token_loss(logits, target, w), torch.tensor((3 * ce0 + ce1) / 4))
    assert torch.allclose(token_loss(logits, target, torch.full((2,), 0.3)), token_loss(logits, target))
    assert torch.allclose(token_loss(logits, target, torch.tensor([1.0, 0.0])), torch.tensor(ce0))
    # averaged over tokens within a sample: two tokens with CEs ce0, ce1 -> their mean
    two = torch.cat([logits[:1], logits[1:]], 1)  # [1,2,2]
    assert torch.allclose(token_loss(two, torch.tensor([[1, 0]])), torch.tensor((ce0 + ce1) / 2))
    assert torch.allclose(token_log_prob(two, torch.tensor([[1, 0]])), torch.tensor([math.log(0.75 * 0.5)]))
    with pytest.raises(ValueError, match="weights"):
        token_loss(logits, target, torch.ones(3))


def test_sample_bins_argmax_frequencies_and_seeding():
    logits = torch.tensor([[0.0, 2.0, -1.0], [5.0, 0.0, 0.0]])
    assert torch.equal(sample_bins(logits, None, 0.0), torch.tensor([1, 0]))
    two = torch.log(torch.tensor([[0.25, 0.75]])).expand(4000, 2)
    freq = sample_bins(two, _gen(), 1.0).float().mean()
    assert abs(freq - 0.75) < 0.03
    assert torch.equal(sample_bins(two, _gen(3), 1.0), sample_bins(two, _gen(3), 1.0))
    # high temperature flattens towards uniform
    assert abs(sample_bins(two, _gen(), 100.0).float().mean() - 0.5) < 0.05


# ----- regression head -----

def test_regression_loss_log_prob_entropy_by_hand():
    torch.manual_seed(0)
    head = RegressionHead(D, A, H, mlp_hidden=16, init_log_std=math.log(0.3))
    cond, target = torch.randn(3, H, D), torch.rand(3, H, A) * 2 - 1
    mean = head(cond)
    l1 = (mean - target).abs().mean((1, 2))  # [3]
    assert torch.allclose(head.loss(cond, target), l1.mean())
    w = torch.tensor([1.0, 0.0, 2.0])
    assert torch.allclose(head.loss(cond, target, w), (l1[0] + 2 * l1[2]) / 3)
    dist = torch.distributions.Normal(mean, head.log_std.exp())
    assert torch.allclose(head.log_prob(cond, target), dist.log_prob(target).sum((1, 2)), atol=1e-5)
    assert torch.allclose(head.entropy(), dist.entropy()[0].sum(), atol=1e-5)
    assert torch.equal(head.sample(cond, None, deterministic=True), mean)
    s1, s2 = head.sample(cond, _gen(1)), head.sample(cond, _gen(1))
    assert torch.equal(s1, s2) and not torch.equal(s1, mean)
    with pytest.raises(ValueError, match=r"cond \[B,4,8\]"):
        head(torch.randn(3, H + 1, D))


def test_regression_head_fits_a_fixed_map():
    torch.manual_seed(0)
    g = _gen()
    W = torch.randn(D, A, generator=g)
    head = RegressionHead(D, A, H, mlp_hidden=64)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(300):
        cond = _tokens(64, g)
        loss = head.loss(cond, torch.tanh(cond @ W / 2))
        opt.zero_grad()
        loss.backward()
        opt.step()
    cond = _tokens(256, g)
    assert head.loss(cond, torch.tanh(cond @ W / 2)) < 0.03


# ----- flow head -----

def _flow(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return FlowHead(D, A, H, width=64, time_dim=16, steps=10).to(dtype)


def test_flow_learns_a_bimodal_chunk_coherently():
    # the chunk is all +0.6 or all -0.6 (one mode per sample): samples must land near a mode at every position
    head = _flow()
    g = _gen()
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    cond = torch.randn(1, H, D, generator=g).expand(128, H, D)
    losses = []
    for _ in range(300):
        sign = torch.randint(0, 2, (128, 1, 1), generator=g).float() * 2 - 1
        loss = head.loss(cond, 0.6 * sign.expand(128, H, A), g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:20]) / 20
    with torch.no_grad():
        x = head.sample(cond, _gen(1))  # [128,H,A]
    mode = x.mean((1, 2), keepdim=True).sign() * 0.6  # [128,1,1]
    assert (x - mode).abs().mean() < 0.12
    assert 0.25 < (mode > 0).float().mean() < 0.75  # both modes are produced


def test_flow_learns_a_map_from_cond():
    head = _flow()
    g = _gen()
    W = torch.randn(D, A, generator=g)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(300):
        cond = _tokens(64, g)
        loss = head.loss(cond, torch.tanh(cond @ W / 2), g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    cond = _tokens(256, g)
    with torch.no_grad():
        err = (head.sample(cond, _gen(1)) - torch.tanh(cond @ W / 2)).abs().mean()
    assert err < 0.15


def test_flow_sampling_is_deterministic_given_noise_or_seed():
    head = _flow()
    cond, noise = torch.randn(3, H, D), torch.randn(3, H, A)
    with torch.no_grad():
        a, b = head.sample(cond, _gen(1), noise=noise), head.sample(cond, _gen(2), noise=noise)
        assert torch.equal(a, b)
        assert torch.equal(head.sample(cond, _gen(5)), head.sample(cond, _gen(5)))
        assert not torch.equal(head.sample(cond, _gen(5)), head.sample(cond, _gen(6)))
        # Euler by hand, K = 2 steps
        ctx = head.context(cond)
        x = noise - 0.5 * head.velocity(ctx, noise, torch.tensor(1.0))
        x = x - 0.5 * head.velocity(ctx, x, torch.tensor(0.5))
        assert torch.allclose(head.sample(cond, None, steps=2, noise=noise), x, atol=1e-6)
    assert torch.equal(head.loss(cond, noise.tanh(), _gen(4)), head.loss(cond, noise.tanh(), _gen(4)))
    assert not torch.equal(head.loss(cond, noise.tanh(), _gen(4)), head.loss(cond, noise.tanh(), _gen(7)))


def test_flow_loss_by_hand_and_weights():
    head = _flow()
    cond, target = torch.randn(3, H, D), torch.rand(3, H, A) * 2 - 1
    g = _gen(9)
    u01 = torch.rand(3, generator=g)
    eps = torch.randn(3, H, A, generator=g)
    t = 0.001 + 0.999 * u01 ** (2 / 3)
    tt = t[:, None, None]
    v = head.velocity(head.context(cond), tt * eps + (1 - tt) * target, t)
    per = (v - (eps - target)).square().mean((1, 2))  # [3]
    assert torch.allclose(head.loss(cond, target, _gen(9)), per.mean(), atol=1e-6)
    assert torch.allclose(head.loss(cond, target, _gen(9), torch.tensor([0.0, 1.0, 1.0])), per[1:].mean(), atol=1e-6)


def test_flow_chain_log_prob_matches_sampling_and_moves_with_parameters():
    head = _flow(dtype=torch.float64)  # float64: the sum of 80 log-densities ~ 150 is compared at atol 1e-5
    cond = torch.randn(5, H, D, dtype=torch.float64)
    x, chain, logp = head.sample_chain(cond, _gen(2), sigma=0.1)
    assert chain.shape == (5, 11, H, A) and logp.shape == (5,)
    assert torch.equal(chain[:, -1], x)
    new = head.chain_log_prob(cond, chain, 0.1)
    assert torch.allclose(new, logp, atol=1e-5)
    assert torch.allclose(torch.exp(new - logp), torch.ones(5, dtype=torch.float64), atol=1e-5)  # PPO ratio 1
    # by hand: sum_k log N(x_{k+1}; x_k - dt v(x_k, t_k), sigma^2 dt), one step at a time
    with torch.no_grad():
        ctx, ref = head.context(cond), torch.zeros(5, dtype=torch.float64)
        for k in range(10):
            m = chain[:, k] - 0.1 * head.velocity(ctx, chain[:, k], torch.tensor(1 - k / 10, dtype=torch.float64))
            ref += torch.distributions.Normal(m, 0.1 * math.sqrt(0.1)).log_prob(chain[:, k + 1]).sum((1, 2))
    assert torch.allclose(new.detach(), ref, atol=1e-8)
    new.sum().backward()
    assert head.out[-1].weight.grad.abs().sum() > 0
    x2, chain2, logp2 = head.sample_chain(cond, _gen(2), sigma=0.1)
    assert torch.equal(chain2, chain) and torch.equal(logp2, logp)
    with torch.no_grad():
        head.out[-1].bias.add_(0.05)
    assert (head.chain_log_prob(cond, chain, 0.1) - logp).abs().min() > 1e-3
    with pytest.raises(ValueError, match="sigma"):
        head.sample_chain(cond, None, sigma=0.0)
    with pytest.raises(ValueError, match="chain"):
        head.chain_log_prob(cond, chain[:, :, :2], 0.1)


def test_flow_chain_ratio_is_one_in_float32():
    # float32 rounding of ~160-nat sums leaves |log ratio| ~ 1e-5 at the sampling parameters
    head = _flow()
    cond = torch.randn(64, H, D)
    _, chain, logp = head.sample_chain(cond, _gen(2), sigma=0.1)
    assert (head.chain_log_prob(cond, chain, 0.1) - logp).abs().max() < 1e-3
