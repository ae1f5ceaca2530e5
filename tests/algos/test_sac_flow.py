import math

import pytest
import torch
from torch.distributions import Normal, TanhTransform

from ctrl_rl.algos.sac_flow import (
    SACFlow,
    SACFlowConfig,
    flow_matching_loss,
    o2o_actor_loss,
    o2o_update,
    pre_tanh_action,
    pretrain_step,
)
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.storage.replay import ReplayBuffer

SPEC = EnvSpec("synthetic:cont", (5,), False, 2, (-1.0, -1.0), (1.0, 1.0))
VELOCITIES = ("gated", "decoded", "naive")
SMALL = dict(critic_hidden=(32, 32), flow_hidden=32, noise_hidden=(32,), time_embed_dim=8, d_model=16,
             n_layers=2)


def _cfg(velocity="gated", **kw):
    return SACFlowConfig(**{**SMALL, "velocity": velocity, **kw})


def _batch(B=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transition(torch.randn(B, 5, generator=g), torch.rand(B, 2, generator=g) * 2 - 1,
                      torch.randn(B, generator=g), torch.randn(B, 5, generator=g), torch.rand(B, generator=g) < 0.1,
                      torch.zeros(B, dtype=torch.bool))


def _brute_force(actor, obs, velocity, gen_state):
    """Re-draw the noise from the same generator state and score the path step by step with torch.distributions."""
    g = torch.Generator().set_state(gen_state)
    K, A, B = actor.steps, actor.action_dim, obs.shape[0]
    dt = 1.0 / K
    noise = torch.randn((K + 1, B, A), generator=g)  # documented layout: A_0, then eps_0 .. eps_{K-1}
    x = noise[0]
    logp = Normal(0.0, 1.0).log_prob(x).sum(-1)
    ctx = actor.field.context(obs)
    for i in range(K):
        v, log_sigma = actor.field(obs, ctx, x, torch.full((B, 1), i * dt))
        sigma = log_sigma.exp()
        if velocity == "decoded":  # noise on the velocity: A' = A + dt (mu + sigma eps) ~ N(A + dt mu, (dt sigma)^2)
            x_next, step = x + dt * (v + sigma * noise[i + 1]), Normal(x + dt * v, dt * sigma)
        else:  # noise on the state: A' = A + dt v + sigma eps ~ N(A + dt v, sigma^2)
            x_next, step = x + dt * v + sigma * noise[i + 1], Normal(x + dt * v, sigma)
        logp = logp + step.log_prob(x_next).sum(-1)
        x = x_next
    a = torch.tanh(x)
    return a, logp - TanhTransform().log_abs_det_jacobian(x, a).sum(-1)


@pytest.mark.parametrize("velocity", VELOCITIES)
@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("brn", [False, True])
def test_path_log_likelihood_matches_brute_force(velocity, K, brn):
    torch.manual_seed(0)
    algo = SACFlow(_cfg(velocity, flow_steps=K, flow_batch_renorm=brn), SPEC)
    obs = torch.randn(32, 5)
    if brn:  # non-trivial running statistics, then score on them (train-mode outputs would match as well)
        algo.actor.sample(torch.randn(64, 5) * 3 + 1, torch.Generator().manual_seed(3))
        algo.actor.eval()
    g = torch.Generator().manual_seed(7)
    state = g.get_state()
    a, logp = algo.actor.sample(obs, g)
    with torch.no_grad():
        a_ref, logp_ref = _brute_force(algo.actor, obs, velocity, state)
    assert a.shape == (32, 2) and logp.shape == (32,)
    assert torch.allclose(a, a_ref, atol=1e-6)
    ok = a_ref.abs().max(-1).values < 0.999  # torch's tanh log-det loses precision near saturation
    assert ok.float().mean() > 0.5
    assert torch.allclose(logp[ok], logp_ref[ok], atol=1e-4)


def test_noise_is_fresh_per_call_and_reproducible_from_the_generator_state():
    torch.manual_seed(0)
    actor = SACFlow(_cfg(), SPEC).actor
    obs = torch.randn(16, 5)
    g = torch.Generator().manual_seed(1)
    state = g.get_state()
    a1, lp1 = actor.sample(obs, g)
    a2, lp2 = actor.sample(obs, g)
    assert not torch.allclose(a1, a2) and not torch.allclose(lp1, lp2)
    a3, lp3 = actor.sample(obs, torch.Generator().set_state(state))
    assert torch.equal(a1, a3) and torch.equal(lp1, lp3)


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_mode_is_deterministic_noise_free_path_from_zero(velocity):
    torch.manual_seed(0)
    actor = SACFlow(_cfg(velocity), SPEC).actor.eval()
    obs = torch.randn(16, 5)
    m1, m2 = actor.mode(obs), actor.mode(obs)
    assert torch.equal(m1, m2) and m1.shape == (16, 2) and m1.abs().max() < 1
    x = torch.zeros(16, 2)
    ctx = actor.field.context(obs)
    for i in range(actor.steps):
        v, _ = actor.field(obs, ctx, x, torch.full((16, 1), i / actor.steps))
        x = x + v / actor.steps
    assert torch.allclose(m1, torch.tanh(x), atol=1e-6)


def test_gate_starts_at_sigmoid_of_its_bias():
    torch.manual_seed(0)
    field = SACFlow(_cfg("gated", flow_batch_renorm=False), SPEC).actor.field
    h = torch.randn(10, 5 + 2 + 8)
    assert torch.allclose(torch.sigmoid(field.gate(h)), torch.full((10, 2), 1 / (1 + math.exp(-5.0))))
    obs, x, t = torch.randn(10, 5), torch.randn(10, 2), torch.rand(10, 1)
    h = torch.cat([obs, x, field.time(t)], -1)
    v, _ = field(obs, field.context(obs), x, t)
    assert torch.allclose(v, torch.sigmoid(torch.tensor(5.0)) * (field.cand(h) - x), atol=1e-6)


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_update_moves_actor_critic_and_targets_by_tau(velocity):
    torch.manual_seed(0)
    algo = SACFlow(_cfg(velocity, tau=0.1), SPEC, "cpu", torch.Generator().manual_seed(0))
    assert algo.name == "sac_flow" and algo.target_entropy == 0.0 and torch.isclose(algo.alpha, torch.tensor(0.2))
    actor0 = [p.detach().clone() for p in algo.actor.parameters()]
    critic0 = [p.detach().clone() for p in algo.critic.parameters()]
    tgt0 = [p.detach().clone() for p in algo.critic_target.parameters()]
    info = algo.update(_batch())
    assert all(math.isfinite(v) for v in info.values()) and "loss/actor" in info
    assert any(not torch.equal(a, p) for a, p in zip(actor0, algo.actor.parameters()))
    assert all(not torch.equal(c, p) for c, p in zip(critic0, algo.critic.parameters()))
    for t0, t1, src in zip(tgt0, algo.critic_target.parameters(), algo.critic.parameters()):
        assert torch.allclose(t1, 0.9 * t0 + 0.1 * src.detach(), atol=1e-6)
    assert not torch.isclose(algo.alpha, torch.tensor(0.2))
    assert algo.parameters_finite()


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_actor_loss_reaches_every_flow_parameter_through_the_rollout(velocity):
    torch.manual_seed(0)
    actor = SACFlow(_cfg(velocity, flow_steps=3), SPEC).actor
    a, logp = actor.sample(torch.randn(32, 5), torch.Generator().manual_seed(0))
    (a.square().sum() + logp.sum()).backward()
    grads = {n: p.grad for n, p in actor.named_parameters()}
    assert all(g is not None and g.isfinite().all() for g in grads.values())
    # exempt: the gate's first layer, which sits behind the zero-initialised last layer at the first step
    moving = [n for n, g in grads.items() if g.abs().sum() > 0]
    assert all("gate.0." in n for n in set(grads) - set(moving))
    assert len(moving) >= len(grads) - 2


def test_crossq_backbone_with_batch_renorm_flow_updates():
    torch.manual_seed(0)
    algo = SACFlow(_cfg("decoded", crossq=True, policy_delay=1, adam_beta1=0.5), SPEC, "cpu",
                   torch.Generator().manual_seed(0))
    assert algo.critic_target is None and algo.actor_renorm
    for k in range(2):
        info = algo.update(_batch(seed=k))
    assert all(math.isfinite(v) for v in info.values()) and algo.actor.training


def test_seeded_updates_are_bit_identical():
    def run():
        torch.manual_seed(0)
        algo = SACFlow(_cfg("gated"), SPEC, "cpu", torch.Generator().manual_seed(1))
        buf = _buffer()
        for k in range(2):
            algo.update(_batch(seed=k))
        pretrain_step(algo, buf, 32)
        o2o_update(algo, buf, 32)
        return algo

    a, b = run(), run()
    for m in ("actor", "critic", "critic_target"):
        sa, sb = getattr(a, m).state_dict(), getattr(b, m).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(a.log_alpha, b.log_alpha)


def test_config_validation_speaks_to_the_user():
    with pytest.raises(ValueError, match="velocity"):
        SACFlowConfig(velocity="lstm")
    with pytest.raises(ValueError, match="d_model"):
        SACFlowConfig(d_model=90)
    with pytest.raises(ValueError, match="flow_steps"):
        SACFlowConfig(flow_steps=0)
    with pytest.raises(ValueError, match="flow_batch_renorm"):
        SACFlowConfig(actor_batch_renorm=True)
    with pytest.raises(ValueError, match="target_subset"):  # SAC's own checks still run
        SACFlowConfig(num_critics=2, target_subset=3)
    assert SACFlowConfig().target_entropy == 0.0 and SACFlowConfig().init_alpha == 0.2


# ----- offline-to-online -----

def _expert(obs):
    return torch.tanh(obs[:, :2] - 0.5 * obs[:, 2:4])  # [N,2] a deterministic synthetic behaviour policy


def _buffer(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 5, generator=g)
    buf = ReplayBuffer(n, (5,), 2)
    buf.add(obs, _expert(obs), torch.randn(n, generator=g), torch.randn(n, 5, generator=g),
            torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool))
    return buf


def test_pre_tanh_action_is_finite_at_the_bounds():
    a = torch.tensor([[-1.0, 1.0], [0.5, 0.0]])
    x = pre_tanh_action(a)
    assert x.isfinite().all() and torch.allclose(x[1], torch.atanh(a[1])) and x[0, 1] == -x[0, 0] > 3


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_flow_matching_pretraining_fits_the_data(velocity):
    torch.manual_seed(0)
    algo = SACFlow(_cfg(velocity, actor_lr=3e-3, flow_batch_renorm=False), SPEC, "cpu",
                   torch.Generator().manual_seed(0))
    buf = _buffer()
    obs, act = buf.obs[:256], buf.action[:256]

    def loss():
        with torch.no_grad():
            return flow_matching_loss(algo.actor, obs, act, torch.Generator().manual_seed(9))

    l0, mse0 = loss(), (algo.actor.mode(obs) - act).square().mean()
    assert l0.shape == () and l0.isfinite()
    for _ in range(150):
        info = pretrain_step(algo, buf, 128)
    assert info["loss/flow_matching"].isfinite()
    assert loss() < 0.4 * l0  # measured 0.12-0.16
    assert (algo.actor.mode(obs) - act).square().mean() < 0.1 * mse0  # measured < 0.015: mode lands on the data


def test_o2o_actor_loss_and_update_pull_the_policy_to_the_data():
    torch.manual_seed(0)
    algo = SACFlow(_cfg("gated", actor_lr=3e-3, flow_batch_renorm=False), SPEC, "cpu", torch.Generator().manual_seed(0))
    buf = _buffer()
    fixed = buf.gather(torch.arange(256))

    def reg():
        algo.gen.manual_seed(5)
        with torch.no_grad():
            return o2o_actor_loss(algo, fixed)[1]["loss/action_reg"]

    state = algo.gen.get_state()
    loss, info, logp = o2o_actor_loss(algo, fixed, alpha_reg=100.0)
    assert loss.shape == () and loss.isfinite() and logp.shape == (256,) and not logp.requires_grad
    with torch.no_grad():  # the loss by hand from the same noise: 100 * mean sq. error - mean Q + alpha * log pi
        a, lp = algo.actor.sample(fixed.obs, torch.Generator().set_state(state))
        q = algo.q(algo.critic, fixed.obs, a).mean(0)  # [B] mean over the critic ensemble
        ref = 100.0 * (a - fixed.action).square().mean() - q.mean() + 0.2 * lp.mean()
    assert torch.isclose(loss, ref, rtol=1e-5) and torch.allclose(logp, lp)
    r0 = reg()
    for _ in range(80):
        out = o2o_update(algo, buf, 128)
    assert all(v.isfinite() for v in out.values()) and {"loss/critic", "loss/actor", "loss/alpha"} <= set(out)
    assert reg() < 0.2 * r0  # measured ~0.02: alpha_reg = 100 dominates the loss
