import math

import pytest
import torch

from ctrl_rl.algos.sac import SAC, SACConfig
from ctrl_rl.core.nets import EnsembleMLP
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec

SPEC = EnvSpec("synthetic:cont", (5,), False, 2, (-1.0, -1.0), (1.0, 1.0))


def _batch(B=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transition(torch.randn(B, 5, generator=g), torch.rand(B, 2, generator=g) * 2 - 1,
                      torch.randn(B, generator=g), torch.randn(B, 5, generator=g), torch.rand(B, generator=g) < 0.1,
                      torch.zeros(B, dtype=torch.bool))


def test_ensemble_mlp_equals_independent_members():
    net = EnsembleMLP(3, 4, (8,), 2, "relu")
    x = torch.randn(6, 4)
    out = net(x)  # [3,6,2]
    for e in range(3):
        h = torch.relu(x @ net.layers[0].weight[e] + net.layers[0].bias[e])
        assert torch.allclose(out[e], h @ net.layers[1].weight[e] + net.layers[1].bias[e], atol=1e-6)


@pytest.mark.parametrize("n,m,ln", [(2, 2, False), (10, 2, True)])
def test_update_moves_parameters_and_targets_by_tau(n, m, ln):
    cfg = SACConfig(actor_hidden=(32, 32), critic_hidden=(32, 32), num_critics=n, target_subset=m, layer_norm=ln,
                    tau=0.1)
    sac = SAC(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
    actor0 = [p.detach().clone() for p in sac.actor.parameters()]
    tgt0 = [p.detach().clone() for p in sac.critic_target.parameters()]
    alpha0 = float(sac.alpha)
    info = sac.update(_batch())
    assert all(math.isfinite(v) for v in info.values())
    assert any(not torch.equal(a, p) for a, p in zip(actor0, sac.actor.parameters()))
    for t0, t1, src in zip(tgt0, sac.critic_target.parameters(), sac.critic.parameters()):
        assert torch.allclose(t1, 0.9 * t0 + 0.1 * src.detach(), atol=1e-6)
    assert float(sac.alpha) != alpha0
    assert sac.q(sac.critic, torch.zeros(3, 5), torch.zeros(3, 2)).shape == (n, 3)


def test_seeded_updates_are_bit_identical_and_state_round_trips():
    cfg = SACConfig(actor_hidden=(16,), critic_hidden=(16,))
    torch.manual_seed(0)
    a = SAC(cfg, SPEC, "cpu", torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    b = SAC(cfg, SPEC, "cpu", torch.Generator().manual_seed(1))
    for k in range(3):
        a.update(_batch(seed=k))
        b.update(_batch(seed=k))
    assert all(torch.equal(x, y) for x, y in zip(a.critic.parameters(), b.critic.parameters()))
    torch.manual_seed(5)
    c = SAC(cfg, SPEC, "cpu")
    c.load_state_dict(a.state_dict())
    a.update(_batch(seed=9))
    c.update(_batch(seed=9))
    assert all(torch.equal(x, y) for x, y in zip(a.actor.parameters(), c.actor.parameters()))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_exportable_traces_to_torchscript_with_equal_outputs():
    sac = SAC(SACConfig(actor_hidden=(16, 16)), SPEC, "cpu")
    pol = sac.exportable()
    x = torch.randn(7, 5)
    traced = torch.jit.trace(pol, x)
    assert torch.allclose(traced(x), pol(x), atol=1e-5) and pol(x).abs().max() <= 1


def test_invalid_subset_is_rejected():
    with pytest.raises(ValueError, match="target_subset"):
        SACConfig(num_critics=2, target_subset=3)


def test_policy_delay_and_actor_step_leave_critic_gradients_alone():
    cfg = SACConfig(actor_hidden=(16,), critic_hidden=(16,), policy_delay=3)
    sac = SAC(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
    actor0 = [p.detach().clone() for p in sac.actor.parameters()]
    for k in range(2):
        info = sac.update(_batch(seed=k))
        assert "loss/actor" not in info
    assert all(torch.equal(a, p) for a, p in zip(actor0, sac.actor.parameters()))
    sac.update_critic(_batch(seed=2))
    grads = [p.grad.clone() for p in sac.critic.parameters()]
    sac.update_actor(_batch(seed=2))  # the third critic step's actor step
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, sac.critic.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(actor0, sac.actor.parameters()))


def test_crossq_joint_forward_without_target_network():
    cfg = SACConfig(actor_hidden=(16,), critic_hidden=(16,), crossq=True, actor_batch_renorm=True, renorm_warmup=1)
    sac = SAC(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
    assert sac.critic_target is None and sac.actor_renorm
    brn = sac.critic.renorms[0]
    b = _batch()
    sac.update(b)
    # one joint critic forward in training mode per update; the actor's critic evaluation uses running stats
    assert int(brn.steps) == 1
    # the statistics of the observation inputs cover both halves, s and s'
    torch.testing.assert_close(brn.running_mean[0, 0, :5], 0.01 * torch.cat([b.obs, b.next_obs]).mean(0))
    assert sac.critic.training and sac.actor.training
    a = sac.act(b.obs[:4])
    assert a.shape == (4, 2) and int(sac.actor.net[0].steps) == 1  # acting leaves the actor's statistics alone


def test_every_critic_step_logs_the_ensembles_largest_q_and_member_spread():
    sac = SAC(SACConfig(actor_hidden=(16,), critic_hidden=(16,), num_critics=3, target_subset=2), SPEC, "cpu",
              torch.Generator().manual_seed(0))
    b = _batch()
    q = sac.q(sac.critic, b.obs, b.action).detach()  # [E,B] before the step
    info = sac.update_critic(b)
    assert torch.equal(info["stats/q_max"], q.max()) and torch.equal(info["stats/q_member_std"], q.std(0).mean())
    one = SAC(SACConfig(actor_hidden=(16,), critic_hidden=(16,), num_critics=1, target_subset=1), SPEC, "cpu")
    assert float(one.update_critic(b)["stats/q_member_std"]) == 0.0  # one member: no spread


def _old_edac_init_(critic, actor):
    """RAVL's initialisation as its subclass ran it before EDAC became SAC's settings (the reference)."""
    with torch.no_grad():
        *hidden, last = critic.layers
        for layer in hidden:
            bound = layer.weight.shape[-1] ** -0.5  # the official code's (CORL's) hidden-weight bound, 1/sqrt(out)
            layer.weight.uniform_(-bound, bound)
            layer.bias.fill_(0.1)
        last.weight.uniform_(-3e-3, 3e-3)
        last.bias.uniform_(-3e-3, 3e-3)
        linears = [m for m in actor.net if isinstance(m, torch.nn.Linear)]
        for layer in linears[:-1]:
            layer.bias.fill_(0.1)
        linears[-1].weight.uniform_(-1e-3, 1e-3)
        linears[-1].bias.uniform_(-1e-3, 1e-3)


def test_ravl_settings_give_the_old_subclass_update_bit_for_bit():
    """RAVL = SAC with critic_reduction="sum", edac_eta and edac_init: the initialisation, critic loss, diversity term
    and critic step equal those of the RAVL subclass they replaced, written out here on a copy of the agent (bit for
    bit until the action-gradients were written out beside the forward, ``EnsembleMLP.forward_input_grad``: since then
    within 1e-5 relative, float rounding)."""
    from ctrl_rl.algos import registry

    small = dict(actor_hidden=(16, 16), critic_hidden=(16, 16), num_critics=4, target_subset=4, edac_eta=0.7)
    cfg = registry.get("ravl").default_config(**small)
    assert cfg.critic_reduction == "sum" and cfg.edac_init
    torch.manual_seed(3)
    new = SAC(cfg, SPEC, "cpu", torch.Generator().manual_seed(1))
    torch.manual_seed(3)
    old = SAC(SACConfig(**{**cfg.__dict__, "edac_init": False, "edac_eta": 0.0, "critic_reduction": "mean"}), SPEC,
              "cpu", torch.Generator().manual_seed(1))
    _old_edac_init_(old.critic, old.actor)
    old.critic_target.load_state_dict(old.critic.state_dict())
    for mine, ref in ((new.actor, old.actor), (new.critic, old.critic), (new.critic_target, old.critic_target)):
        assert all(torch.equal(x, y) for x, y in zip(mine.state_dict().values(), ref.state_dict().values()))
    for k in range(3):
        b = _batch(seed=k)
        g = torch.Generator().manual_seed(10 + k)
        next_a, next_logp = torch.rand(64, 2, generator=g) * 2 - 1, torch.randn(64, generator=g)
        info = new.update_critic(b, (next_a, next_logp))
        # the old RAVL critic step: per-member actions, summed member means, the normalised-gradient Gram term
        with torch.no_grad():
            q_next = old.q(old.critic_target, b.next_obs, next_a)  # [E,B]
            y = b.reward + cfg.gamma * (~b.terminated).float() * (q_next.min(0).values - old.alpha * next_logp)
        E = cfg.num_critics
        a = b.action.unsqueeze(0).expand(E, *b.action.shape).clone().requires_grad_(True)  # [E,B,A]
        q = old.critic(torch.cat([b.obs.unsqueeze(0).expand(E, *b.obs.shape), a], -1)).squeeze(-1)  # [E,B]
        loss = (q - y).square().mean(1).sum()
        grad = torch.autograd.grad(q.sum(), a, create_graph=True)[0]
        grad = grad / (grad.norm(dim=-1, keepdim=True) + 1e-10)
        gram = torch.einsum("iba,jba->bij", grad, grad)  # [B,E,E]
        div = (gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)).mean() / (E - 1)
        loss = loss + cfg.edac_eta * div
        old.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        old.critic_opt.step()
        polyak_(old._tgt, old._src, cfg.tau)
        torch.testing.assert_close(info["loss/critic"], loss.detach(), rtol=1e-5, atol=0.0)
        torch.testing.assert_close(info["loss/edac_div"], div.detach(), rtol=1e-5, atol=1e-7)
        for mine, ref in ((new.critic, old.critic), (new.critic_target, old.critic_target)):
            for x, y in zip(mine.parameters(), ref.parameters()):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5 * float(y.abs().max()))


def test_edac_settings_are_checked():
    with pytest.raises(ValueError, match="--edac-eta"):
        SACConfig(edac_eta=-1.0)
    with pytest.raises(ValueError, match="at least 2"):
        SACConfig(num_critics=1, target_subset=1, edac_eta=1.0)
    with pytest.raises(ValueError, match="--crossq"):
        SACConfig(edac_eta=1.0, crossq=True)
    with pytest.raises(ValueError, match="--critic-reduction"):
        SACConfig(critic_reduction="max")
    with pytest.raises(ValueError, match="own actor"):
        SAC(SACConfig(edac_init=True), SPEC, "cpu", actor=torch.nn.Linear(5, 4))
    with pytest.raises(ValueError, match="--update-order 'critic_last'"):
        SACConfig(update_order="critic_last")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--policy-delay 1"):
        SACConfig(update_order="actor_first", policy_delay=2)
    from ctrl_rl.algos.cql import CQLConfig

    with pytest.raises(ValueError, match="for CQL"):
        CQLConfig(update_order="actor_first")
