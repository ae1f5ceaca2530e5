import torch

from ctrl_rl.core.distributions import categorical_log_prob, categorical_sample, normal_entropy, normal_kl, normal_log_prob
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
