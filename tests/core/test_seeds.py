"""core.seeds: stacked views of S members give each slice the member's own output and gradient bit for bit (one
thread), for plain networks with wide and width-1 heads, ensembles, and modules with their own parameters."""

import copy

import pytest
import torch
from torch import nn

from ctrl_rl.core.nets import EnsembleMLP, mlp
from ctrl_rl.core.seeds import Each, seed_stack, unstack


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


@pytest.mark.parametrize("make", [lambda: mlp(5, (32, 32), 1, "relu"), lambda: mlp(5, (32, 32), 4, "tanh"),
                                  lambda: EnsembleMLP(2, 5, (32, 32), 1), lambda: EnsembleMLP(1, 5, (32,), 1),
                                  WithOwnParameter])
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


def test_modules_it_cannot_stack_are_refused():
    with pytest.raises(TypeError, match="buffers"):
        seed_stack([nn.BatchNorm1d(3), nn.BatchNorm1d(3)])
    with pytest.raises(TypeError, match="one class"):
        seed_stack([nn.ReLU(), nn.Tanh()])
