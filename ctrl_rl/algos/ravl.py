"""RAVL (Sims et al., "The Edge-of-Reach Problem in Offline Model-Based RL", NeurIPS 2024; docs/algorithms/ravl.md).

Short model rollouts (k = 5) from dataset states and no dynamics penalty; the value pessimism that handles
the edge-of-reach states comes from an EDAC critic ensemble instead: N = 10 critics, the TD target takes the
minimum over all of them, and a diversity term pushes apart the members' action-gradients at the batch's
actions,

    L_Q   = sum_i mean_batch (Q_i - y)^2 + eta * L_div
    L_div = 1/(N-1) * mean_batch sum_{i != j} <g_i, g_j>,   g_i = grad_a Q_i(s, a) / ||grad_a Q_i(s, a)||

Defaults are the code defaults of the paper's repository (anyasims/edge-of-reach): 3x256 actor and critics
with EDAC's initialisation, lr 3e-4, gamma 0.99, tau 5e-3, real-data ratio 0.05, batch 256, 1000 gradient
steps between rollout rounds of 50,000 starts. The per-dataset (N, eta, k, r) of the paper's appendix were
not checked (docs/algorithms/ravl.md#per-dataset-settings), so no per-dataset presets claim them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ctrl_rl.algos.mbpo import MODEL_BASED_RUN, MBPOConfig, ModelBasedSAC
from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class RAVLConfig(MBPOConfig):
    """MBPOConfig with EDAC's critic ensemble; defaults: RAVL's code defaults."""

    actor_hidden: tuple[int, ...] = (256, 256, 256)
    critic_hidden: tuple[int, ...] = (256, 256, 256)
    num_critics: int = 10
    target_subset: int = 10
    edac_eta: float = 1.0
    """eta: weight of EDAC's gradient-diversity term in the critic loss (0: SAC-N)."""
    edac_init: bool = True
    """EDAC's initialisation: hidden biases 0.1, critic output layer U(-3e-3, 3e-3), actor output U(-1e-3, 1e-3)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.edac_eta >= 0.0:
            raise UserInputError(f"invalid --edac-eta {self.edac_eta!r}: expected a finite number >= 0")
        if self.edac_eta > 0 and self.num_critics < 2:
            raise UserInputError(f"invalid --num-critics {self.num_critics}: EDAC's diversity term needs at least 2 "
                                 "critics (or --edac-eta 0)")


def edac_init_(critic: nn.Module, actor: nn.Module) -> None:
    """EDAC's initialisation of an ``EnsembleMLP`` critic and a ``sac.Actor`` (in place)."""
    with torch.no_grad():
        *hidden, last = critic.layers
        for layer in hidden:
            layer.bias.fill_(0.1)
        last.weight.uniform_(-3e-3, 3e-3)
        last.bias.uniform_(-3e-3, 3e-3)
        linears = [m for m in actor.net if isinstance(m, nn.Linear)]
        for layer in linears[:-1]:
            layer.bias.fill_(0.1)
        linears[-1].weight.uniform_(-1e-3, 1e-3)
        linears[-1].bias.uniform_(-1e-3, 1e-3)


class RAVL(ModelBasedSAC):
    name = "ravl"

    def __init__(self, config: RAVLConfig, spec, device="cpu", generator=None, actor=None):
        super().__init__(config, spec, device, generator, actor)
        if config.edac_init:
            edac_init_(self.critic, self.actor)
            self.critic_target.load_state_dict(self.critic.state_dict())

    def critic_q(self, f: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.config.edac_eta == 0:
            return super().critic_q(f, action)
        E = self.config.num_critics
        a = action.unsqueeze(0).expand(E, *action.shape).clone().requires_grad_(True)  # [E,B,A]
        x = torch.cat([f.unsqueeze(0).expand(E, *f.shape), a], -1)  # [E,B,F+A]
        return self.critic(x).squeeze(-1), a  # [E,B]

    def critic_loss(self, q: torch.Tensor, y: torch.Tensor, aux: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        _, stats = super().critic_loss(q, y, aux)
        loss = (q - y).square().mean(1).sum()  # sum over members of each member's batch mean (EDAC, SAC-N)
        if aux is None:
            return loss, stats
        E = q.shape[0]
        g = torch.autograd.grad(q.sum(), aux, create_graph=True)[0]  # [E,B,A]: member i's Q depends on a[i] only
        g = g / (g.norm(dim=-1, keepdim=True) + 1e-10)
        gram = torch.einsum("iba,jba->bij", g, g)  # [B,E,E]
        div = (gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)).mean() / (E - 1)
        return loss + self.config.edac_eta * div, {**stats, "loss/edac_div": div.detach()}


register(AlgoEntry(
    "ravl", RAVLConfig, RAVL, regime="model-based",
    summary="RAVL: model rollouts without a dynamics penalty, EDAC critic ensemble for value pessimism",
    run_defaults={**MODEL_BASED_RUN, "total_steps": 3_000_000}, continuous_only=True, requires_dataset=True))
