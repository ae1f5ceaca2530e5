"""DoMo-AC's shipped defaults make it a different algorithm from IMPALA (issue 29): its update differs from
IMPALA's at IMPALA's defaults and from kappa = 0 at its own trace, on off-policy segments and on segments from the
current policy alike; the limiting cases stay in tests/core/test_returns.py."""

from types import SimpleNamespace

import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.algos.impala import vtrace_losses

T, N = 16, 4


def segment(off_policy: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(T, N, generator=g).mul(0.3).sub(1.0).requires_grad_()
    behaviour = logp.detach() + (torch.randn(T, N, generator=g) * 0.5 if off_policy else 0.0)
    value = torch.randn(T, N, generator=g).requires_grad_()
    next_value = torch.cat([value.detach()[1:], torch.randn(1, N, generator=g)])
    term = torch.zeros(T, N, dtype=torch.bool)
    term[7, 1] = True
    batch = SimpleNamespace(reward=torch.randn(T, N, generator=g), terminated=term,
                            truncated=torch.zeros(T, N, dtype=torch.bool))  # the fields vtrace_losses reads
    return logp, value, behaviour, next_value, batch


def policy_grad(cfg, off_policy: bool) -> torch.Tensor:
    logp, value, behaviour, next_value, batch = segment(off_policy)
    loss, _ = vtrace_losses(cfg, logp, torch.zeros(T, N), value, behaviour, next_value, batch)
    (g,) = torch.autograd.grad(loss, logp)
    return g


@pytest.mark.parametrize("off_policy", [True, False])
def test_domo_ac_defaults_update_differently_from_impala(off_policy):
    domo, impala = registry.get("domo_ac").default_config(), registry.get("impala").default_config()
    assert domo.kappa == 0.5 and domo.trace_lambda == 0.95 and impala.kappa == 0 and impala.trace_lambda == 1
    g_domo, g_impala = policy_grad(domo, off_policy), policy_grad(impala, off_policy)
    g_kappa0 = policy_grad(registry.get("domo_ac").default_config(kappa=0.0), off_policy)
    assert (g_domo - g_impala).abs().max() > 1e-3  # not IMPALA at its defaults
    assert (g_domo - g_kappa0).abs().max() > 1e-3  # and kappa acts at DoMo-AC's own trace


def test_at_full_traces_on_policy_domo_ac_is_impala():
    """Why lambda moved: at lambda = 1 on the current policy's data kappa changes nothing (the old defaults)."""
    full = registry.get("domo_ac").default_config(trace_lambda=1.0)
    impala = registry.get("impala").default_config()
    assert torch.allclose(policy_grad(full, off_policy=False), policy_grad(impala, off_policy=False), atol=1e-6)
