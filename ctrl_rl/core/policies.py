"""The exported deterministic policy of the feed-forward agents (SAC and its variants, CQL, IQL, PPO, IMPALA).

``DeterministicPolicy(actor, encoder)`` maps what the env hands out to the actor's deterministic action in the
agent's action space: ``actor.mode(encoder(obs))``, or ``actor.mode(obs)`` without an encoder. The observation is
a ``[B,O]`` tensor for flat observations, else the dict of parts ``{name: [B,*part.shape]}`` (images uint8), which
the encoder reads; trace the dict form with ``torch.jit.trace(policy, (obs,), strict=False)``. The deployment
export wraps it (``deploy.export.ExportModule``: the env's action bounds, the robot metadata).
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
from torch import nn

from ctrl_rl.core.obs import Obs


class ModeActor(Protocol):
    def mode(self, features: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``[B,A]`` (``[B]`` discrete) of features ``[B,F]``."""
        ...


class DeterministicPolicy(nn.Module):
    """Observation -> ``actor.mode(encoder(obs))`` (module docstring); ``actor`` is a module with ``mode``
    (``ModeActor``). The modules are used as given (an agent's ``exportable`` passes copies)."""

    def __init__(self, actor: nn.Module, encoder: nn.Module | None = None):
        super().__init__()
        self.actor, self.encoder = actor, encoder

    def forward(self, obs: Obs) -> torch.Tensor:
        actor = cast(ModeActor, self.actor)
        if self.encoder is None:
            return actor.mode(cast(torch.Tensor, obs))  # flat: the [B,O] observation
        return actor.mode(self.encoder(obs))  # [B,F] features
