"""The faster SAC Flow rollout computes what the straightforward one did (experiments/sac_flow_speed).

The reference functions below are the forward passes of ``ctrl_rl/algos/sac_flow.py`` and ``BatchRenorm`` as they
were at commit 29978ca, before the speed work, written over the same modules' parameters: one velocity call per
step on the whole input, the time embedding per row, attention as ``out(value(.))``, PyTorch's tanh GELU,
BatchRenorm with ``torch.var``. Every test draws the same noise for both and compares outputs, log-likelihoods,
gradients of the parameters and the BatchRenorm running statistics within 1e-5 relative (float rounding: the fast
path adds the same terms in another order).
"""

import copy
import math
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from ctrl_rl.algos.sac_flow import (
    DecodedVelocity,
    GatedVelocity,
    NaiveVelocity,
    SACFlow,
    SACFlowConfig,
    squash_log_std,
)
from ctrl_rl.core.distributions import tanh_log_det
from ctrl_rl.core.nets import BatchRenorm
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec

SPEC = EnvSpec("synthetic:hopper", (11,), False, 3, (-1.0,) * 3, (1.0,) * 3)
VELOCITIES = ("gated", "decoded", "naive")
SMALL = dict(critic_hidden=(64, 64), flow_hidden=64, noise_hidden=(64, 64), d_model=32, n_layers=2)
_LOG_2PI = math.log(2 * math.pi)


# ----- the code before the speed work (commit 29978ca), over the same modules -----

def _ref_brn(m: Any, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(m, BatchRenorm):
        return m(x)  # Identity or LayerNorm
    if not m.training:
        x_hat = (x - m.running_mean) * torch.rsqrt(m.running_var + m.eps)
        return x_hat * m.weight + m.bias
    dims = (-2,) if m.members else tuple(range(x.dim() - 1))
    mean = x.mean(dims, keepdim=bool(m.members))
    var = x.var(dims, unbiased=False, keepdim=bool(m.members))
    std = (var + m.eps).sqrt()
    with torch.no_grad():
        run_std = (m.running_var + m.eps).sqrt()
        active = (m.steps >= m.warmup_steps).to(x.dtype)
        r = 1 + active * ((std / run_std).clamp(1 / m.r_max, m.r_max) - 1)
        d = active * ((mean - m.running_mean) / run_std).clamp(-m.d_max, m.d_max)
        m.running_mean.lerp_(mean, 1 - m.momentum)
        m.running_var.lerp_(var, 1 - m.momentum)
        m.steps += 1
    x_hat = (x - mean) / std * r + d
    return x_hat * m.weight + m.bias


def _ref_context(field: Any, obs: torch.Tensor) -> torch.Tensor:
    if isinstance(field, GatedVelocity):
        return squash_log_std(field.noise(obs), *field.log_std_range)
    if isinstance(field, DecodedVelocity):
        tok = field.obs_enc(_ref_brn(field.obs_norm, obs))
        blocks: list[Any] = list(field.blocks)
        return torch.stack([b.cross_attn.out(b.cross_attn.value(tok)) for b in blocks])
    return obs[:, :0]


def _ref_field(field: Any, obs: torch.Tensor, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(field, GatedVelocity):
        z = t * field.time.freq
        h = torch.cat([_ref_brn(field.norm, torch.cat([obs, x], -1)),
                       field.time.mlp(torch.cat([z.sin(), z.cos()], -1))], -1)
        return torch.sigmoid(field.gate(h)) * (field.cand(h) - x), ctx
    if isinstance(field, DecodedVelocity):
        tok = field.act_proj(_ref_brn(field.act_norm, x)) + field.time(t)
        blocks: list[Any] = list(field.blocks)
        for i, b in enumerate(blocks):
            tok = _ref_brn(b.norms[0], tok + b.self_attn.out(b.self_attn.value(tok)))
            tok = _ref_brn(b.norms[1], tok + ctx[i])
            tok = _ref_brn(b.norms[2], tok + b.ffn[2](F.gelu(b.ffn[0](tok), approximate="tanh")))
        mean, h = field.head(tok).chunk(2, -1)
        return mean, squash_log_std(h, *field.log_std_range)
    assert isinstance(field, NaiveVelocity)
    mean, h = field.net(_ref_brn(field.norm, torch.cat([obs, x, t], -1))).chunk(2, -1)
    return mean, squash_log_std(h, *field.log_std_range)


def _ref_transition(actor: Any, obs: torch.Tensor, ctx: torch.Tensor, x: torch.Tensor, i: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    dt = 1.0 / actor.steps
    v, log_sigma = _ref_field(actor.field, obs, ctx, x, torch.full_like(x[:, :1], i * dt))
    log_s = log_sigma + math.log(dt) if actor.field.noise_on_velocity else log_sigma
    return x + dt * v, log_s


def _ref_sample(actor: Any, obs: torch.Tensor, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    K, A = actor.steps, actor.action_dim
    noise = torch.randn((K + 1, obs.shape[0], A), generator=generator, dtype=obs.dtype)
    ctx = _ref_context(actor.field, obs)
    x = noise[0]
    sq = noise.square().sum((0, 2))
    log_s_sum = torch.zeros_like(sq)
    for i in range(K):
        m, log_s = _ref_transition(actor, obs, ctx, x, i)
        x = m + log_s.exp() * noise[i + 1]
        log_s_sum = log_s_sum + log_s.sum(-1)
    log_p = -0.5 * sq - log_s_sum - 0.5 * (K + 1) * A * _LOG_2PI
    return torch.tanh(x), log_p - tanh_log_det(x)


def _ref_mode(actor: Any, obs: torch.Tensor) -> torch.Tensor:
    ctx = _ref_context(actor.field, obs)
    x = obs.new_zeros(obs.shape[0], actor.action_dim)
    for i in range(actor.steps):
        x = _ref_transition(actor, obs, ctx, x, i)[0]
    return torch.tanh(x)


# ----- comparisons -----

def _close(a, b, what, floor=1e-12):
    """``a`` equals ``b`` within 1e-5 relative to the largest entry of ``b`` (or ``floor``, if larger)."""
    a, b = a.detach(), b.detach()
    scale = b.abs().max().clamp_min(floor)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(scale)), (
        f"{what}: max abs diff {(a - b).abs().max():.3g} (scale {scale:.3g})")


def _agents(velocity, **kw):
    torch.manual_seed(0)
    algo = SACFlow(SACFlowConfig(**{**SMALL, "velocity": velocity, **kw}), SPEC,
                   generator=torch.Generator().manual_seed(1))
    ref = copy.deepcopy(algo)
    return algo, ref


def _buffers_close(m1, m2):
    for (name, b1), (_, b2) in zip(m1.named_buffers(), m2.named_buffers(), strict=True):
        if b1.dtype.is_floating_point:
            _close(b1, b2, f"buffer {name}")
        else:
            assert torch.equal(b1, b2), name


@pytest.mark.parametrize("velocity", VELOCITIES)
@pytest.mark.parametrize("warmup", [100_000, 0, 2])
@pytest.mark.parametrize("brn", [True, False])
def test_sample_and_gradients_match_reference(velocity, warmup, brn):
    """Train-mode sample (the actor loss's): actions, log pi, parameter gradients and running statistics."""
    algo, ref = _agents(velocity, renorm_warmup=warmup, flow_batch_renorm=brn)
    g = torch.Generator().manual_seed(5)
    obs = torch.randn(256, 11, generator=g) * 2 + 0.5
    w = torch.randn(256, 3, generator=g)
    outs = []
    old: Any = ref.actor
    for actor, fn in ((algo.actor, algo.actor.sample), (old, lambda o, gen: _ref_sample(old, o, gen))):
        gen = torch.Generator().manual_seed(9)
        for _ in range(2):  # twice: the second call sees moved running statistics
            a, logp = fn(obs, gen)
        loss = (a * w).sum() + logp.mean()
        grads = torch.autograd.grad(loss, list(actor.parameters()), allow_unused=True)
        outs.append((a, logp, grads))
    (a1, l1, g1), (a2, l2, g2) = outs
    # a gradient that is zero in exact arithmetic (a bias whose shift the next batch norm removes) is rounding noise
    # in both: every gradient is compared within 1e-5 of its own largest entry or 1e-6 of the actor's largest one
    floor = 0.1 * max(float(y.abs().max()) for y in g2 if y is not None)
    _close(a1, a2, "action")
    _close(l1, l2, "log pi")
    for (name, _), x, y in zip(algo.actor.named_parameters(), g1, g2, strict=True):
        if y is None:
            assert x is None or not x.any(), name
        else:
            assert x is not None, name
            _close(x, y, f"grad {name}", floor)
    _buffers_close(algo.actor, ref.actor)


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_eval_sample_and_mode_match_reference(velocity):
    """Evaluation-mode sample without gradient (the critic target's) and the deterministic action."""
    algo, ref = _agents(velocity, renorm_warmup=0)
    obs = torch.randn(256, 11)
    for actor in (algo.actor, ref.actor):  # non-trivial running statistics first
        actor.sample(obs * 3 + 1, torch.Generator().manual_seed(3))
        actor.eval()
    with torch.no_grad():
        a1, l1 = algo.actor.sample(obs, torch.Generator().manual_seed(4))
        a2, l2 = _ref_sample(ref.actor, obs, torch.Generator().manual_seed(4))
        _close(a1, a2, "action")
        _close(l1, l2, "log pi")
        _close(algo.actor.mode(obs), _ref_mode(ref.actor, obs), "mode")


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_update_matches_reference(velocity):
    """One SAC Flow update on a fixed batch: every loss and statistic it returns, then the critic's gradients of
    the next critic loss (which reads the updated actor's target sample)."""
    algo, ref = _agents(velocity)
    old: Any = ref.actor
    old.sample = lambda obs, generator: _ref_sample(old, obs, generator)  # the old rollout, on the same modules
    g = torch.Generator().manual_seed(2)
    B = 256
    batch = Transition(torch.randn(B, 11, generator=g), torch.rand(B, 3, generator=g) * 2 - 1,
                       torch.randn(B, generator=g), torch.randn(B, 11, generator=g),
                       torch.rand(B, generator=g) < 0.05, torch.zeros(B, dtype=torch.bool))
    i1, i2 = algo.update(batch), ref.update(batch)
    assert i1.keys() == i2.keys()
    for k in i1:
        _close(i1[k], i2[k], k)
    _buffers_close(algo.actor, ref.actor)


@pytest.mark.parametrize("members", [0, 2])
@pytest.mark.parametrize("warmup", [0, 100_000])
def test_batch_renorm_matches_reference(members, warmup):
    torch.manual_seed(0)
    m = BatchRenorm(8, members=members, warmup_steps=warmup)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_()
        m.running_mean.normal_()
        m.running_var.uniform_(0.5, 2.0)
    r = copy.deepcopy(m)
    x = torch.randn(*((members,) if members else ()), 64, 8) * 3 + 1
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    for _ in range(3):
        y1, y2 = m(x1), _ref_brn(r, x2)
    w = torch.randn_like(y1)
    g1 = torch.autograd.grad((y1 * w).sum(), [x1, m.weight, m.bias])
    g2 = torch.autograd.grad((y2 * w).sum(), [x2, r.weight, r.bias])
    _close(y1, y2, "output")
    for a, b in zip(g1, g2, strict=True):
        _close(a, b, "grad")
    _buffers_close(m, r)
    m.eval()
    r.eval()
    _close(m(x), _ref_brn(r, x), "eval output")
