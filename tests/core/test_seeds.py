"""core.seeds: stacked views of S members give each slice the member's own output and gradient bit for bit (one
thread), for plain networks with wide and width-1 heads, ensembles, and modules with their own parameters."""

import copy

import pytest
import torch
from torch import nn

from ctrl_rl.core.nets import EnsembleMLP, mlp
from ctrl_rl.core.seeds import (
    Each,
    SeedCalls,
    SeedGenerators,
    SeedLayout,
    batch_seeds,
    rand,
    randn,
    randperm,
    seed_stack,
    unstack,
)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class WithOwnParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(5, (32,), 3, "relu")
        self.log_std = nn.Parameter(torch.randn(3))  # [A]

    def forward(self, x):
        return self.net(x) * self.log_std.exp().expand(*x.shape[:-1], 3)


def _members(make, S=3):
    out = []
    for s in range(S):
        torch.manual_seed(s)
        out.append(make())
    return out


def _layer_norm_ensemble():
    net = EnsembleMLP(3, 5, (32, 32), 1, layer_norm=True)
    assert net.norm_scale is not None and net.norm_shift is not None
    with torch.no_grad():  # scales and shifts away from their initial 1 and 0
        for p in [*net.norm_scale, *net.norm_shift]:
            p.uniform_(0.5, 1.5)
    return net


def _layer_norm_mlp():
    net = mlp(5, (32, 32), 4, "relu", layer_norm=True)
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return net


@pytest.mark.parametrize("make", [lambda: mlp(5, (32, 32), 1, "relu"), lambda: mlp(5, (32, 32), 4, "tanh"),
                                  lambda: EnsembleMLP(2, 5, (32, 32), 1), lambda: EnsembleMLP(1, 5, (32,), 1),
                                  WithOwnParameter, _layer_norm_ensemble, _layer_norm_mlp])
def test_each_slice_is_its_member_forward_and_backward(make):
    members = _members(make)
    alone = copy.deepcopy(members)
    x = torch.randn(3, 64, 5)  # [S,B,in]
    y = seed_stack(members)(x)
    y.square().flatten(1).mean(-1).sum().backward()
    for k, m in enumerate(alone):
        yk = m(x[k])
        assert torch.equal(y[k], yk)
        yk.square().mean().backward()
        for (name, p), q in zip(m.named_parameters(), members[k].parameters()):
            assert q.grad is not None and torch.equal(p.grad, q.grad), name


def test_members_stay_the_parameters():
    members = _members(lambda: mlp(5, (8,), 2))
    stacked = seed_stack(members)
    assert list(stacked.parameters()) == []  # nothing of its own to optimise or save
    x = torch.randn(3, 4, 5)
    before = stacked(x)
    with torch.no_grad():
        members[1][0].weight.add_(1.0)  # an optimizer step on a member shows in the next call
    after = stacked(x)
    assert torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])


def test_each_steps_every_member_and_unstack_splits_by_seed():
    ps = [nn.Parameter(torch.ones(2)) for _ in range(2)]
    opt = Each([torch.optim.SGD([p], lr=0.5) for p in ps])
    for p in ps:
        p.grad = torch.ones(2)
    opt.step()
    assert all(torch.equal(p, torch.full((2,), 0.5)) for p in ps) and opt.param_groups[0]["lr"] == 0.5
    opt.zero_grad()
    assert all(p.grad is None for p in ps)
    assert [float(v) for v in unstack(torch.tensor([1.0, 2.0]), 2)] == [1.0, 2.0]
    assert [float(v) for v in unstack(torch.tensor(3.0), 2)] == [3.0, 3.0]


def test_seed_calls_run_each_member_on_its_slice():
    """SeedCalls (a layout's ``calls``): member k on slice k, bit for bit its call alone, buffers its own."""
    norms = [nn.BatchNorm1d(3).eval() for _ in range(2)]
    for k, m in enumerate(norms):
        m.running_mean.fill_(float(k))
    x = torch.randn(2, 5, 3)
    y = SeedCalls(norms)(x)
    assert all(torch.equal(y[k], norms[k](x[k])) for k in range(2)) and not torch.equal(y[0], y[1])


def test_modules_it_cannot_stack_are_refused():
    with pytest.raises(TypeError, match="buffers"):
        seed_stack([nn.BatchNorm1d(3), nn.BatchNorm1d(3)])
    with pytest.raises(TypeError, match="parameter dict"):
        seed_stack([nn.ParameterDict({"a": nn.Parameter(torch.ones(1))}) for _ in range(2)])
    with pytest.raises(TypeError, match="one class"):
        seed_stack([nn.ReLU(), nn.Tanh()])


def test_draw_helpers_give_each_seed_its_draw_alone():
    gens = [torch.Generator().manual_seed(s) for s in (0, 5, 9)]
    alone = [torch.Generator().manual_seed(s) for s in (0, 5, 9)]
    seeds = SeedGenerators(gens)
    perm, z, u = randperm(7, seeds), randn((3, 4, 2), seeds), rand((3, 5), seeds)  # [S,7], [S,4,2], [S,5]
    for k, g in enumerate(alone):  # the same calls, shapes and order as the seed's update alone
        assert torch.equal(perm[k], torch.randperm(7, generator=g))
        assert torch.equal(z[k], torch.randn((4, 2), generator=g))
        assert torch.equal(u[k], torch.rand((5,), generator=g))
        assert torch.equal(gens[k].get_state(), g.get_state())
    g1 = torch.Generator().manual_seed(1)  # one generator: torch's own draw
    assert torch.equal(randn((2, 3), g1), torch.randn((2, 3), generator=torch.Generator().manual_seed(1)))
    with pytest.raises(AssertionError, match="leading seed dimension of 3"):
        randn((4, 2), seeds)


class Tempered:
    """A minimal algorithm: a network, a temperature tensor and a counter its update advances."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.net = mlp(5, (32,), 4)
        self.log_alpha = torch.tensor(float(seed), requires_grad=True)
        self.opt = torch.optim.Adam([*self.net.parameters(), self.log_alpha], lr=0.1)
        self.steps = 0
        self.gen = torch.Generator().manual_seed(seed)

    def update(self, x: torch.Tensor) -> torch.Tensor:
        loss = (self.net(x).square().mean((-2, -1)) * self.log_alpha.exp())  # [*S]
        self.opt.zero_grad()
        loss.sum().backward()
        self.opt.step()
        self.steps += 1
        return loss.detach()


def test_batch_seeds_restacks_tensors_and_writes_counters_to_every_member():
    members = [Tempered(s) for s in (1, 2)]
    alone = copy.deepcopy(members)
    batched = batch_seeds(members, SeedLayout(("net",), each=("opt",), tensors=("log_alpha",), counters=("steps",)))
    assert isinstance(batched, Tempered) and isinstance(batched.gen, SeedGenerators)
    x = torch.randn(2, 64, 5)  # [S,B,in]
    for _ in range(2):
        info = batched.update(x)
        for k, m in enumerate(alone):
            assert torch.equal(info[k], m.update(x[k]))
    for m, a in zip(members, alone):
        assert m.steps == a.steps == 2 and torch.equal(m.log_alpha, a.log_alpha)
        assert all(torch.equal(p, q) for p, q in zip(m.net.parameters(), a.net.parameters()))
    assert torch.equal(batched.log_alpha, torch.stack([m.log_alpha for m in members]))  # the current values


def test_gradients_taken_directly_have_the_members_layout():
    """``torch.autograd.grad`` (SAC's actor step) hands each member a gradient laid out as its parameter, as
    ``addmm`` does alone: a fused Adam reads a strided gradient in memory order, i.e. wrongly."""
    members = _members(lambda: mlp(5, (32, 32), 4, "relu"), S=2)
    params = [p for m in members for p in m.parameters()]
    grads = torch.autograd.grad(seed_stack(members)(torch.randn(2, 64, 5)).sum(), params)
    assert all(g.is_contiguous() and g.stride() == p.stride() for g, p in zip(grads, params))
