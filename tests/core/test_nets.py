import torch

from ctrl_rl.core.distributions import (
    categorical_log_prob,
    categorical_sample,
    normal_entropy,
    normal_kl,
    normal_log_prob,
)
from ctrl_rl.core.nets import RunningNorm, mlp


def test_running_norm_matches_full_batch_moments():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0])
    n = RunningNorm((3,))
    for chunk in x.split(137):
        n.update(chunk)
    assert torch.allclose(n.mean, x.mean(0), atol=1e-5)
    assert torch.allclose(n.var, x.var(0, unbiased=False), rtol=1e-4)
    z = n(x)
    assert torch.allclose(z.mean(0), torch.zeros(3), atol=1e-4)


def test_gaussian_functions_match_torch_distributions():
    mean, log_std, x = torch.randn(5, 2), torch.randn(5, 2) * 0.3, torch.randn(5, 2)
    d = torch.distributions.Normal(mean, log_std.exp())
    assert torch.allclose(normal_log_prob(x, mean, log_std), d.log_prob(x).sum(-1), atol=1e-5)
    assert torch.allclose(normal_entropy(log_std), d.entropy().sum(-1), atol=1e-5)
    d2 = torch.distributions.Normal(mean + 0.1, (log_std - 0.2).exp())
    assert torch.allclose(normal_kl(mean, log_std, mean + 0.1, log_std - 0.2),
                          torch.distributions.kl_divergence(d, d2).sum(-1), atol=1e-5)


def test_categorical_sampling_frequencies_follow_probabilities():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(20000, 3)
    a = categorical_sample(logits, torch.Generator().manual_seed(1))
    freq = torch.bincount(a, minlength=3).float() / a.numel()
    assert torch.allclose(freq, torch.tensor([0.2, 0.5, 0.3]), atol=0.02)
    assert torch.allclose(categorical_log_prob(logits[:1], torch.tensor([1])), torch.log(torch.tensor([0.5])))


def test_mlp_shapes():
    net = mlp(4, (8, 8), 2, "tanh", layer_norm=True)
    assert net(torch.zeros(3, 4)).shape == (3, 2)


def test_batch_renorm_warmup_then_renorm_and_eval():
    from ctrl_rl.core.nets import BatchRenorm

    torch.manual_seed(0)
    brn = BatchRenorm(3, momentum=0.9, r_max=2.0, d_max=1.0, warmup_steps=2)
    x = torch.randn(64, 3) * 4 + 10  # [B,F]
    mu, var = x.mean(0), x.var(0, unbiased=False)
    y = brn(x)  # warm-up: plain batch norm with the batch moments
    torch.testing.assert_close(y, (x - mu) / (var + 1e-3).sqrt())
    torch.testing.assert_close(brn.running_mean, 0.1 * mu)
    torch.testing.assert_close(brn.running_var, 0.9 + 0.1 * var)
    brn(x)
    run_mean, run_var = brn.running_mean.clone(), brn.running_var.clone()
    y = brn(x)  # third call: renorm correction active, r and d clipped to their bounds
    std, run_std = (var + 1e-3).sqrt(), (run_var + 1e-3).sqrt()
    r = (std / run_std).clamp(0.5, 2.0)
    d = ((mu - run_mean) / run_std).clamp(-1.0, 1.0)
    torch.testing.assert_close(y, (x - mu) / std * r + d)
    brn.eval()
    torch.testing.assert_close(brn(x), (x - brn.running_mean) / (brn.running_var + 1e-3).sqrt())


def test_ensemble_batch_renorm_keeps_per_member_statistics():
    from ctrl_rl.core.nets import EnsembleMLP

    net = EnsembleMLP(2, 4, (8,), 1, batch_renorm=True)
    x = torch.randn(2, 32, 4)  # [E,B,in]
    x[1] = x[1] * 3 + 5
    net(x)
    m = net.renorms[0].running_mean  # [E,1,in]
    assert m.shape == (2, 1, 4)
    torch.testing.assert_close(m[0, 0], 0.01 * x[0].mean(0))
    torch.testing.assert_close(m[1, 0], 0.01 * x[1].mean(0))
