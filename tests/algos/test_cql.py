import copy
import math
from collections.abc import Sequence
from typing import cast

import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.algos.cql import (
    CQL,
    MCTransition,
    calql_lower_bound,
    cql_regularizer,
    dataset_mc_returns,
    discounted_returns_to_go,
    ensemble_forward,
    max_backup_target,
)
from ctrl_rl.algos.sac import SAC
from ctrl_rl.core.nets import EnsembleMLP
from ctrl_rl.core.seeds import batch_seeds, seed_stack
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.learn.seeds import stack_batches
from ctrl_rl.storage.datasets import OfflineDataset, to_replay
from tests.learn.test_seeds import _same_state

SPEC = EnvSpec("synthetic:cont", (5,), False, 2, (-1.0, -1.0), (1.0, 1.0))
TINY = dict(actor_hidden=(16, 16), critic_hidden=(16, 16))
cql_config = registry.get("cql").default_config  # CQLConfig with WSRL's pre-training settings, as `ctrl-rl train cql`


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks: one intra-op thread (on a loaded 2-core machine, 2 threads made the loops 10-50x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _batch(B=32, seed=0, O=5, A=2):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(B, A, generator=g) * 2 - 1
    a[0] = 1.0  # a saturated dataset action (clipped to 0.99999 inside)
    return Transition(torch.randn(B, O, generator=g), a, torch.randn(B, generator=g), torch.randn(B, O, generator=g),
                      torch.rand(B, generator=g) < 0.2, torch.zeros(B, dtype=torch.bool))


def _tanh_normal_logp(mean, std, u):
    """Independent reference: Normal log-density of u minus log(1 - tanh(u)^2)."""
    return float(torch.distributions.Normal(mean, std).log_prob(u).sum() - torch.log(1 - torch.tanh(u) ** 2).sum())


# ----- pure functions vs hand numbers / loops -----

def test_discounted_returns_to_go_with_terminal_and_timeout_episode():
    # episode 0 terminates after rewards 1, 2, 3; episode 1 is cut by a time limit after 4, 5 (no bootstrap)
    G = discounted_returns_to_go(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([0, 3, 5]), 0.5)
    torch.testing.assert_close(G, torch.tensor([1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0, 4 + 0.5 * 5, 5.0]))
    # an all-failure sparse episode gets r_neg / (1 - gamma); the other keeps its sum
    G2 = discounted_returns_to_go(torch.tensor([-1.0, -1.0, -1.0, 0.0]), torch.tensor([0, 2, 4]), 0.5,
                                  sparse_negative_reward=-1.0)
    torch.testing.assert_close(G2, torch.tensor([-2.0, -2.0, -1.0, 0.0]))


def test_dataset_mc_returns_follow_the_rows_to_replay_keeps():
    obs = torch.arange(5.0)[:, None].repeat(1, 5)
    ds = OfflineDataset(obs, torch.zeros(5, 2), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), obs + 1,
                        torch.tensor([0, 0, 1, 0, 0]).bool(), torch.tensor([0, 0, 0, 0, 1]).bool(),
                        torch.tensor([0, 3, 5]), torch.tensor([1, 1, 1, 1, 0]).bool())
    mc = dataset_mc_returns(ds, 0.5)  # the last row (no next obs) is dropped, as by to_replay / d4rl's qlearning rows
    buf = to_replay(ds)
    assert mc.shape == (len(buf),)
    torch.testing.assert_close(mc, torch.tensor([2.75, 3.5, 3.0, 4.0]))


def test_cql_regularizer_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    M, B, N = 2, 3, 6
    qs, qd, logd = torch.randn(M, B, N, generator=g), torch.randn(M, B, generator=g), torch.randn(B, N, generator=g)
    diff, ood = cql_regularizer(qs, qd, logd)
    diff_nois, _ = cql_regularizer(qs, qd, None)
    for m in range(M):
        for b in range(B):
            ref = math.log(sum(math.exp(qs[m, b, n] - logd[b, n]) for n in range(N)))
            assert abs(ood[m, b] - ref) < 1e-5 and abs(diff[m, b] - (ref - qd[m, b])) < 1e-5
            vals = [float(qs[m, b, n]) for n in range(N)] + [float(qd[m, b])]
            ref2 = math.log(sum(math.exp(v) for v in vals) / (N + 1)) - float(qd[m, b])
            assert abs(diff_nois[m, b] - ref2) < 1e-5


def test_max_backup_target_is_subset_min_then_max_over_samples():
    q_next = torch.tensor([[[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]],
                           [[2.0, 4.0, 0.0], [1.0, -2.0, -5.0]]])  # [M=2,B=2,Kt=3]
    y = max_backup_target(q_next, torch.tensor([1.0, 1.0]), torch.tensor([False, True]), torch.zeros(2, 3),
                          torch.tensor(0.0), 0.5, False)
    # row 0: mins over members (1, 4, 0) -> max 4; row 1 terminated -> r
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.5 * 4.0, 1.0]))


def test_calql_lower_bound_only_on_policy_samples():
    q = torch.tensor([[[0.0, 0.0, 5.0, -3.0], [1.0, -9.0, -9.0, 2.0]]])  # [M=1,B=2,N=4], first 2 uniform
    out = calql_lower_bound(q, torch.tensor([1.0, -1.0]), 2)
    torch.testing.assert_close(out, torch.tensor([[[0.0, 0.0, 5.0, 1.0], [1.0, -9.0, -1.0, 2.0]]]))


def test_ensemble_forward_equals_the_subset_of_the_full_forward_with_gradients():
    net = EnsembleMLP(4, 6, (8, 8), 1, "relu", layer_norm=True)
    with torch.no_grad():
        for p in net.norm_scale:
            p.uniform_(0.5, 1.5)
    x, members = torch.randn(5, 6), torch.tensor([3, 1])
    out = ensemble_forward(net, x, members)
    torch.testing.assert_close(out, net(x)[members])
    out.sum().backward()
    g = net.layers[0].weight.grad
    assert g[0].abs().sum() == 0 and g[2].abs().sum() == 0 and g[1].abs().sum() > 0 and g[3].abs().sum() > 0


def test_ensemble_forward_gives_each_seed_its_own_members_bit_for_bit():
    """Seed-batched (``core.seeds``): ``x [S,B,in]`` and each seed's ``members [S,M]`` on the seeds' stacked
    critics equal each seed's call alone, forward and backward, for M = 2 and the single-member width-1 path."""
    nets = []
    for s in range(3):
        torch.manual_seed(s)
        nets.append(EnsembleMLP(4, 6, (8, 8), 1, "relu", layer_norm=True))
    alone = copy.deepcopy(nets)
    stacked = seed_stack(nets)
    x = torch.randn(3, 5, 6)  # [S,B,in]
    for members in (torch.tensor([[3, 1], [0, 2], [2, 3]]), torch.tensor([[1], [3], [0]])):  # [S,M]
        for n in [*nets, *alone]:
            n.zero_grad()
        out = ensemble_forward(cast(EnsembleMLP, stacked), x, members)  # [S,M,B,1]
        out.square().sum((-3, -2, -1)).sum().backward()
        for k, net in enumerate(alone):
            ref = ensemble_forward(net, x[k], members[k])
            assert torch.equal(out[k], ref)
            ref.square().sum().backward()
            for p, q in zip(net.parameters(), nets[k].parameters()):
                assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)


# ----- seeds-runs: S CQLs batched, each seed bit for bit its update alone -----

def _stacked(batches: Sequence[Transition]) -> Transition:
    return stack_batches(batches)  # field by field, an unset optional field (Transition.discount) left None


@pytest.mark.parametrize("kw", [dict(), dict(lagrange=True, policy_delay=2), dict(calql=True),
                                dict(num_critics=3, target_subset=1, importance_sampling=False,
                                     max_target_backup=False, backup_entropy=True)])
def test_seed_batched_updates_equal_each_seeds_updates_alone(kw):
    # 64 wide, batch 64: at a few units or rows (TINY) nn.Linear's addmm takes a small-matrix path whose sums round
    # unlike baddbmm's slices, so bit-identity is a property of realistic sizes (core.seeds)
    cfg = cql_config(actor_hidden=(64, 64), critic_hidden=(64, 64), **kw)
    seeds = (0, 4, 9)

    def make(seed):
        torch.manual_seed(seed)
        return CQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(seed))

    members, alone = [make(s) for s in seeds], [make(s) for s in seeds]
    layout = registry.get("cql").seed_layout
    assert layout is not None
    batched = batch_seeds(members, layout)
    for step in range(3):
        batches = [_batch(B=64, seed=10 * step + s) for s in seeds]
        if cfg.calql:
            batches = [MCTransition(**vars(b), mc_return=torch.randn(64)) for b in batches]
        info = batched.update(_stacked(batches))
        for k, a in enumerate(alone):
            ref = a.update(batches[k])
            assert info.keys() == ref.keys()
            assert all(torch.equal(v if v.dim() == 0 else v[k], ref[n]) for n, v in info.items()), step
    for m, a in zip(members, alone):  # networks, optimizer states, multiplier, generator; the step counter
        assert _same_state(m.state_dict(), a.state_dict()) == []
        assert m.sac.critic_updates == a.sac.critic_updates == 3
    assert not torch.equal(members[0].log_alpha, members[1].log_alpha)  # the seeds went their own ways


# ----- the critic step vs a brute-force loop on the same random draws -----

@pytest.mark.parametrize("calql,importance", [(False, True), (True, True), (False, False)])
def test_critic_losses_match_brute_force_loop(calql, importance):
    E, M, K, B, A = 3, 2, 2, 3, 2
    cfg = cql_config(**TINY, num_critics=E, target_subset=M, num_cql_samples=K, calql=calql,
                    importance_sampling=importance, gamma=0.9)
    torch.manual_seed(0)
    cql = CQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(3))
    b = _batch(B)
    if calql:  # bounds that bind for some samples, not for others
        b = MCTransition(**vars(b), mc_return=torch.tensor([-50.0, 0.0, 50.0]))
    state = cql.gen.get_state()
    loss, info, _ = cql.critic_losses(b)

    g = torch.Generator().set_state(state)
    subset = torch.randperm(E, generator=g)[:M]
    eps = torch.randn((B, 3 * K, A), generator=g)  # [pi(s) K | pi(s') K | target K]
    uni = torch.rand((B, K, A), generator=g) * 2 - 1
    act = b.action.clamp(-0.99999, 0.99999)
    with torch.no_grad():
        td, diffs = 0.0, []
        for i in range(B):
            ms, ls = cql.actor(b.obs[i:i + 1])
            mn, ln = cql.actor(b.next_obs[i:i + 1])
            us = [ms[0] + eps[i, j] * ls[0].exp() for j in range(K)]
            un = [mn[0] + eps[i, j] * ln[0].exp() for j in range(K, 3 * K)]
            pol = [(torch.tanh(u), _tanh_normal_logp(ms[0], ls[0].exp(), u)) for u in us] + \
                  [(torch.tanh(u), _tanh_normal_logp(mn[0], ln[0].exp(), u)) for u in un[:K]]
            samples = [(uni[i, j], A * math.log(0.5)) for j in range(K)] + pol
            q_tgt = [min(float(cql.critic_target(torch.cat([b.next_obs[i], torch.tanh(u)])[None])[e, 0, 0])
                         for e in subset)
                     for u in un[K:]]
            y = float(b.reward[i]) + 0.9 * (not bool(b.terminated[i])) * max(q_tgt)
            q_all = cql.critic(torch.cat([b.obs[i], act[i]])[None])[:, 0, 0]  # [E]
            td += float(((q_all - y) ** 2).sum())
            for e in subset:
                qd = float(q_all[e])
                vals = []
                for n, (a, logq) in enumerate(samples):
                    q = float(cql.critic(torch.cat([b.obs[i], a])[None])[e, 0, 0])
                    if calql and n >= K:
                        q = max(q, float(b.mc_return[i]))
                    vals.append(q - logq if importance else q)
                if not importance:
                    vals = [v - math.log(3 * K + 1) for v in vals + [qd]]
                diffs.append(math.log(sum(math.exp(v) for v in vals)) - qd)
    assert abs(info["loss/td"] - td / (E * B)) < 1e-4
    assert abs(info["stats/cql_diff"] - sum(diffs) / len(diffs)) < 1e-4
    assert abs(loss - (td / (E * B) + 5.0 * sum(diffs) / len(diffs))) < 1e-3


# ----- the update -----

def test_update_moves_parameters_and_targets_by_tau():
    cfg = cql_config(**TINY, tau=0.1)
    cql = CQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
    actor0 = [p.detach().clone() for p in cql.actor.parameters()]
    critic0 = [p.detach().clone() for p in cql.critic.parameters()]
    tgt0 = [p.detach().clone() for p in cql.critic_target.parameters()]
    alpha0 = float(cql.alpha)
    info = cql.update(_batch())
    assert all(math.isfinite(v) for v in info.values()) and cql.parameters_finite()
    assert {"loss/critic", "loss/td", "loss/cql", "loss/actor", "loss/alpha", "stats/cql_diff"} <= info.keys()
    assert any(not torch.equal(a, p) for a, p in zip(actor0, cql.actor.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(critic0, cql.critic.parameters()))
    for t0, t1, src in zip(tgt0, cql.critic_target.parameters(), cql.critic.parameters()):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * src.detach(), atol=1e-6, rtol=0)
    assert float(cql.alpha) != alpha0
    assert not cql.update(_batch())["loss/critic"].requires_grad


def test_seeded_updates_are_bit_identical_and_state_round_trips():
    cfg = cql_config(**TINY, lagrange=True)

    def make(seed_global):
        torch.manual_seed(seed_global)
        return CQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(1))

    a, b = make(0), make(0)
    for k in range(3):
        a.update(_batch(seed=k))
        b.update(_batch(seed=k))
    assert all(torch.equal(x, y) for x, y in zip(a.critic.parameters(), b.critic.parameters()))
    assert torch.equal(a.lagrange_raw, b.lagrange_raw)
    c = make(5)
    c.load_state_dict(a.state_dict())
    ia, ic = a.update(_batch(seed=9)), c.update(_batch(seed=9))
    assert ia == ic
    assert all(torch.equal(x, y) for x, y in zip(a.actor.parameters(), c.actor.parameters()))


def test_checkpoint_loads_into_sac_and_acts_identically():
    cfg = cql_config(**TINY, num_critics=4)
    cql = CQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
    for k in range(2):
        cql.update(_batch(seed=k))
    sac_cfg = cfg.sac_config()
    sac = SAC(sac_cfg, SPEC, "cpu", torch.Generator().manual_seed(7))  # a plain SAC, as WSRL builds it
    sac.load_state_dict(cql.state_dict())
    obs = torch.randn(6, 5)
    assert torch.equal(sac.act(obs, deterministic=True), cql.act(obs, deterministic=True))
    assert torch.equal(sac.act(obs), cql.act(obs))  # the generator state travels with the checkpoint
    assert torch.equal(sac.q(sac.critic, obs, torch.zeros(6, 2)), cql.q(cql.critic, obs, torch.zeros(6, 2)))
    assert torch.equal(sac.log_alpha, cql.log_alpha)


@pytest.mark.parametrize("gap,direction", [(-100.0, 1), (100.0, -1)])
def test_lagrange_multiplier_grows_while_the_gap_is_exceeded(gap, direction):
    cql = CQL(cql_config(**TINY, lagrange=True, target_gap=gap), SPEC, "cpu", torch.Generator().manual_seed(0))
    w0 = float(cql.cql_weight)
    assert abs(w0 - 1.0) < 1e-6
    for k in range(3):
        info = cql.update(_batch(seed=k))
    assert (float(cql.cql_weight) - w0) * direction > 0
    assert abs(info["stats/cql_weight"] - 1.0) > 0


def test_cql_pushes_out_of_distribution_q_below_data_q():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    B = 64
    obs = torch.randn(B, 5, generator=g)
    act = (0.5 + 0.05 * torch.randn(B, 2, generator=g)).clamp(-1, 1)  # data actions near +0.5
    data = Transition(obs, act, torch.zeros(B), torch.randn(B, 5, generator=g), torch.ones(B, dtype=torch.bool),
                      torch.zeros(B, dtype=torch.bool))
    cql = CQL(cql_config(**TINY, num_critics=2, critic_lr=1e-3), SPEC, "cpu", torch.Generator().manual_seed(0))
    for _ in range(150):
        cql.update(data)
    with torch.no_grad():
        q_data = cql.q(cql.critic, obs, act).mean()
        q_ood = cql.q(cql.critic, obs, torch.full((B, 2), -0.8)).mean()
    assert q_ood < q_data - 0.5


def test_calql_needs_mc_returns_and_bad_configs_are_rejected():
    cql = CQL(cql_config(**TINY, calql=True), SPEC, "cpu")
    assert cql.name == "calql"
    with pytest.raises(ValueError, match="mc_return"):
        cql.update(_batch())
    with pytest.raises(ValueError, match="crossq"):
        cql_config(crossq=True)
    with pytest.raises(ValueError, match="target_subset"):
        cql_config(num_critics=2, target_subset=3)


def test_wsrl_locomotion_defaults():
    c = cql_config()
    assert ((c.num_critics, c.target_subset, c.layer_norm, c.actor_layer_norm, c.backup_entropy)
            == (10, 2, True, True, False))
    assert (c.actor_lr, c.critic_lr, c.alpha_lr, c.alpha_cql, c.final_hidden_scale) == (1e-4, 3e-4, 1e-4, 5.0, 1e-2)
    assert c.max_target_backup and c.importance_sampling and c.action_clip == 0.99999
    entry = registry.get("calql")
    assert entry.default_config().calql and entry.regime == "offline" and entry.loop_defaults["clip_actions"] == 0.99999


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_exportable_traces_to_torchscript_with_equal_outputs():
    cql = CQL(cql_config(**TINY), SPEC, "cpu")
    pol = cql.exportable()
    x = torch.randn(7, 5)
    traced = torch.jit.trace(pol, x)
    torch.testing.assert_close(traced(x), pol(x), atol=1e-5, rtol=0)
    assert pol(x).abs().max() <= 1
