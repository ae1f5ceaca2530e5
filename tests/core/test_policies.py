"""The exported deterministic policy (core/policies.py): the actor's mode of the encoder's features."""

import torch
from torch import nn

from ctrl_rl.core.policies import DeterministicPolicy


class _Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def mode(self, x):
        return torch.tanh(self.lin(x))


class _Encoder(nn.Module):
    def forward(self, obs):
        return obs["state"] * 2.0


def test_flat_observations_go_to_the_actor_as_they_are_and_parts_through_the_encoder():
    actor = _Actor()
    x = torch.randn(4, 3)
    assert torch.equal(DeterministicPolicy(actor)(x), actor.mode(x))
    pol = DeterministicPolicy(actor, _Encoder())
    assert torch.equal(pol({"state": x}), actor.mode(2.0 * x))
    traced = torch.jit.trace(DeterministicPolicy(actor), (x,))
    assert torch.allclose(traced(torch.ones(2, 3)), actor.mode(torch.ones(2, 3)))
