"""The faster ``SAC.update`` computes what the straightforward one did (experiments/sac_default_speed --ab-before).

``_ref_update`` below is ``SAC.update`` (flat observations, target network, SAC's Gaussian actor) as it was at commit
789e046, before the overhead work, written over an agent's own modules and optimizers: both actor samples from one
forward of the joint ``[s'; s]`` batch, the critic input as ``cat(obs, action)``, the target's min through
``index_select``, ``std`` for the member spread, Adam through the optimizers' ``step``. Two agents built from the same
seed take the same batches, one through ``update`` and one through the reference; losses, statistics and every
parameter (actor, critics, targets, temperature) agree within 1e-9 relative after a few updates, in float64: the fast
path adds the same terms in another order, and in float32 Adam turns that rounding into parameter steps of a fraction
of the learning rate wherever a gradient element is near zero (EDAC's 10 critics after 4 updates: 7e-4 relative on
an AMD AVX2 CPU, under 1e-5 on an Intel AVX-512 one), so float32 would test the CPU's summation order, not the
algebra. With ``update_order="actor_first"`` (RAVL's default) the reference is
RAVL's official order instead (``_ref_actor_first``).
"""

import pytest
import torch

from ctrl_rl.algos.ravl import RAVL_SAC
from ctrl_rl.algos.sac import SAC, SACConfig
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec

SPEC = EnvSpec("synthetic:halfcheetah", (17,), False, 6, (-1.0,) * 6, (1.0,) * 6)
CONFIGS = {
    "sac_defaults": {},
    "ravl": RAVL_SAC,  # EDAC's update order (actor_first): the reference follows RAVL's official code
    "ravl_critic_first": {**RAVL_SAC, "update_order": "critic_first"},
    # REDQ-style subset, mean over members for the actor, a policy delay, LayerNorm critics and actor, no backup
    # entropy, a fixed temperature: the other branches of the update
    "redq_delay_norms": {"num_critics": 4, "target_subset": 2, "actor_q": "mean", "policy_delay": 2,
                         "layer_norm": True, "actor_layer_norm": True, "critic_hidden": (64, 64)},
    "fixed_alpha": {"learn_alpha": False, "backup_entropy": False, "init_alpha": 0.2, "critic_reduction": "sum"},
    # EDAC with LayerNorm critics: the action-gradients through autograd's double backward, as before
    "edac_layer_norm": {**RAVL_SAC, "update_order": "critic_first", "layer_norm": True, "num_critics": 3,
                        "target_subset": 3, "critic_hidden": (64, 64)},
}


# ----- SAC.update at commit 789e046, over an agent's modules and optimizers -----

def _flat(batch: Transition) -> tuple[torch.Tensor, torch.Tensor]:
    assert isinstance(batch.obs, torch.Tensor) and isinstance(batch.next_obs, torch.Tensor)
    return batch.obs, batch.next_obs


def _ref_critic(algo: SAC, batch: Transition, next_sample: tuple[torch.Tensor, torch.Tensor] | None) -> dict:
    c = algo.config
    f, f_next = _flat(batch)
    subset = (torch.arange(c.num_critics) if c.target_subset == c.num_critics else
              torch.randperm(c.num_critics, generator=algo.gen)[: c.target_subset])
    if next_sample is None:  # drawn after the subset
        with torch.no_grad():
            next_sample = algo.actor.sample(f_next, algo.gen)
    next_a, next_logp = next_sample
    assert algo.critic_target is not None
    with torch.no_grad():
        q_next = algo.critic_target(torch.cat([f_next, next_a], -1)).squeeze(-1)  # [E,B]
    E = c.num_critics
    if c.edac_eta > 0:
        a_e = batch.action.unsqueeze(0).expand(E, *batch.action.shape).clone().requires_grad_(True)
        q = algo.critic(torch.cat([f.unsqueeze(0).expand(E, *f.shape), a_e], -1)).squeeze(-1)
    else:
        q = algo.critic(torch.cat([f, batch.action], -1)).squeeze(-1)
    alpha = algo.log_alpha.detach().exp()
    q_t = q_next.index_select(0, subset).min(0).values
    if c.backup_entropy:
        q_t = q_t - alpha * next_logp
    y = batch.reward + c.gamma * (~batch.terminated).to(batch.reward.dtype) * q_t
    sq = (q - y).square()
    loss = sq.mean() if c.critic_reduction == "mean" else sq.mean(1).sum()
    qd = q.detach()
    info = {"stats/q_max": qd.max(), "stats/q_member_std": qd.std(0).mean()}
    if c.edac_eta > 0:
        g = torch.autograd.grad(q.sum(), a_e, create_graph=True)[0]
        g = g / (g.norm(dim=-1, keepdim=True) + 1e-10)
        gram = torch.einsum("iba,jba->bij", g, g)
        div = (gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)).mean() / (E - 1)
        loss = loss + c.edac_eta * div
        info["loss/edac_div"] = div.detach()
    algo.critic_opt.zero_grad(set_to_none=True)
    loss.backward()
    algo.critic_opt.step()
    polyak_(list(algo.critic_target.parameters()), list(algo.critic.parameters()), c.tau)
    algo.critic_updates += 1
    return {"loss/critic": loss.detach(), "stats/q_mean": qd.mean(), "stats/target_mean": y.mean(), **info}


def _ref_alpha(algo: SAC, logp: torch.Tensor) -> dict:
    """The temperature step towards the target entropy (none with a fixed temperature)."""
    if algo.alpha_opt is None:
        return {}
    alpha_loss = -(algo.log_alpha * (logp.detach() + algo.target_entropy)).mean()
    algo.alpha_opt.zero_grad(set_to_none=True)
    alpha_loss.backward()
    algo.alpha_opt.step()
    return {"loss/alpha": alpha_loss.detach()}


def _ref_actor(algo: SAC, batch: Transition, a: torch.Tensor, logp: torch.Tensor) -> dict:
    c = algo.config
    q = algo.critic(torch.cat([_flat(batch)[0], a], -1)).squeeze(-1)
    q_agg = q.min(0).values if c.actor_q == "min" else q.mean(0)
    alpha = algo.log_alpha.detach().exp()
    loss = (alpha * logp - q_agg).mean()
    params = list(algo.actor.parameters())
    for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True)):
        p.grad = g
    algo.actor_opt.step()
    info = {"loss/actor": loss.detach(), "stats/entropy": -logp.detach().mean(), "stats/alpha": alpha}
    info.update(_ref_alpha(algo, logp))
    return info


def _ref_actor_first(algo: SAC, batch: Transition) -> dict:
    """RAVL's official order (anyasims/edge-of-reach ``agent.update``, CORL's EDAC): the temperature step, the actor
    step with the updated temperature on the critics before this update, then the critic step, whose target draws a'
    from the updated actor."""
    c = algo.config
    f = _flat(batch)[0]
    a, logp = algo.actor.sample(f, algo.gen)  # [B,A], [B]
    info = _ref_alpha(algo, logp)
    alpha = algo.log_alpha.detach().exp()
    q = algo.critic(torch.cat([f, a], -1)).squeeze(-1)
    loss = (alpha * logp - (q.min(0).values if c.actor_q == "min" else q.mean(0))).mean()
    params = list(algo.actor.parameters())
    for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True)):
        p.grad = g
    algo.actor_opt.step()
    info.update({"loss/actor": loss.detach(), "stats/entropy": -logp.detach().mean(), "stats/alpha": alpha})
    info.update(_ref_critic(algo, batch, None))
    return info


def _ref_update(algo: SAC, batch: Transition) -> dict:
    if algo.config.update_order == "actor_first":
        return _ref_actor_first(algo, batch)
    f, f_next = _flat(batch)
    if (algo.critic_updates + 1) % algo.config.policy_delay == 0:
        B = f.shape[0]
        a, logp = algo.actor.sample(torch.cat([f_next, f]), algo.gen)  # [2B,A], [2B]
        info = _ref_critic(algo, batch, (a[:B].detach(), logp[:B].detach()))
        info.update(_ref_actor(algo, batch, a[B:], logp[B:]))
        return info
    return _ref_critic(algo, batch, None)


# ----- the comparison -----

def _batches(n: int, batch: int = 64) -> list[Transition]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        obs = torch.randn(batch, 17, generator=g)
        out.append(Transition(obs, torch.rand(batch, 6, generator=g) * 2 - 1, torch.randn(batch, generator=g),
                              obs + 0.1 * torch.randn(batch, 17, generator=g), torch.rand(batch, generator=g) < 0.2,
                              torch.zeros(batch, dtype=torch.bool)))
    return out


@pytest.fixture(autouse=True)
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # agents and batches
    yield
    torch.set_default_dtype(before)


def _agent(overrides: dict) -> SAC:
    torch.manual_seed(0)
    return SAC(SACConfig(**overrides), SPEC, generator=torch.Generator().manual_seed(1))


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * max(float(b.abs().max()), 1e-3), msg=what)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_update_matches_the_code_before_the_speed_work(name: str) -> None:
    new, ref = _agent(CONFIGS[name]), _agent(CONFIGS[name])
    for n, b in enumerate(_batches(4)):
        got, want = new.update(b), _ref_update(ref, b)
        assert got.keys() == want.keys(), f"update {n}: keys {sorted(got)} vs {sorted(want)}"
        for k in want:
            _close(got[k], want[k], f"{name}, update {n}: {k}")
    assert new.critic_target is not None and ref.critic_target is not None
    for part in ("actor", "critic", "critic_target"):
        for (pn, p), (_, q) in zip(getattr(new, part).named_parameters(), getattr(ref, part).named_parameters()):
            _close(p.detach(), q.detach(), f"{name}: {part}.{pn}")
    _close(new.log_alpha.detach(), ref.log_alpha.detach(), f"{name}: log_alpha")
    assert new.critic_updates == ref.critic_updates == 4
    # the updates moved the parameters (the comparison is not between two untouched agents)
    assert not torch.equal(next(new.actor.parameters()), next(_agent(CONFIGS[name]).actor.parameters()))
