"""Log-densities, entropies and samples as plain tensor functions (no torch.distributions validation overhead).

The tanh-Gaussian policy of the SAC family (SAC, CQL, RAVL, NeuBay): an MLP gives the mean and the log-std of
``u`` (the log-std clamped to ``[LOG_STD_MIN, LOG_STD_MAX]``), the action is ``a = tanh(u)``, and
``tanh_normal_sample`` draws a reparameterised action with its log-density by the change of variables.
"""

from __future__ import annotations

import math

import torch

from ctrl_rl.core.seeds import Gen, randn

_LOG_2PI = math.log(2 * math.pi)

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""Clamp of a tanh-Gaussian policy's log-std (SAC's and NeuBay's actors)."""


def normal_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of the diagonal Gaussian log-density: ``[...,A] -> [...]``."""
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)


def normal_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last dim."""
    return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)


def normal_kl(mean0: torch.Tensor, log_std0: torch.Tensor, mean1: torch.Tensor, log_std1: torch.Tensor) -> torch.Tensor:
    """KL(N0 || N1) for diagonal Gaussians, summed over the last dim."""
    var0, var1 = torch.exp(2 * log_std0), torch.exp(2 * log_std1)
    return (log_std1 - log_std0 + (var0 + (mean0 - mean1).square()) / (2 * var1) - 0.5).sum(-1)


def categorical_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``logits [...,K]``, integer ``action [...]`` -> ``[...]``."""
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def categorical_sample(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel-max sampling with an explicit generator: ``[...,K] -> [...]`` int64."""
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
    return (logits + gumbel).argmax(-1)


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """``sum_j log(1 - tanh(u_j)^2)`` for ``u [B,A] -> [B]``, as ``2 (log 2 - u - softplus(-2u))``
    (stable for large |u|)."""
    return (2.0 * (math.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u))).sum(-1)


def tanh_normal_sample(mean: torch.Tensor, log_std: torch.Tensor, generator: Gen
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised tanh-Gaussian sample ``[B,A]`` and its log-density ``[B]``: ``a = tanh(mean + eps *
    exp(log_std))``, ``log pi(a) = log N(u; mean, std) - sum_j log(1 - tanh(u_j)^2)`` (change of variables).
    Any leading dims; with a seeds-run's ``SeedGenerators`` the first is the seed's (``core.seeds.randn``)."""
    eps = randn(mean.shape, generator, mean.device, mean.dtype)  # [B,A]
    u = mean + eps * log_std.exp()  # [B,A]
    log_n = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)  # [B]
    return torch.tanh(u), log_n - tanh_log_det(u)
