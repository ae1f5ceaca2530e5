"""Sample weighting for behaviour cloning: the contract (``SampleWeighting``) and HABC's weighting, which owns its
two critics (LeRobot's ``SampleWeighter`` is the model: a weighting object passed in, not a method switch).

A weighting gives one weight per demonstration frame of a batch; behaviour cloning then minimises the head's loss
weighted per sample (``algos/vla_bc.py``; ``heads`` self-normalise the weights).

HABC (Fang, Huang et al. 2026; docs/algorithms/vla.md#habc, where the implementable form built here is marked
unverified): two critics on the dataset's critic state (``vla.data``), a viability head ``V_via`` (sigmoid,
cross-entropy to the episode's success label, autonomous frames only) and an efficiency head ``V_eff`` (regressed on
successful episodes to the discounted cost-to-go ``-c (1 - gamma^(k+1)) / (1 - gamma)``, k frames left). With
``s'`` the next frame (on an episode's last frame ``V_via(s') =`` its success label and ``V_eff(s') = 0``):

    A_via = gamma V_via(s') - V_via(s)          A_eff = -c + gamma V_eff(s') - V_eff(s)
    g = sigmoid((V_via(s) - tau_g) / T_g)       A = (1 - g) A_via + g A_eff
    w = min(exp(A / beta), w_max)

Frames a human executed (an ``intervention`` flag) get w = 1 and never train the critics on their episode's
outcome (intervention-aware credit). The critics take one Adam step on every batch; w = 1 during the first
``habc_warmup`` batches. Shape letters: B batch, C critic-state dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from ctrl_rl.core.nets import mlp
from ctrl_rl.core.validate import check_fields
from ctrl_rl.errors import UserInputError


@runtime_checkable
class SampleWeighting(Protocol):
    """Per-frame weights of a demonstration batch, with whatever the weighting learns on the way."""

    def weights(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(w [B], info)`` for a batch of ``vla.data.Demos.batch``; info holds 0-d tensors to log."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class HABCConfig:
    """HABC's weighting (module docstring): critics, gate and temperature. Every field is read on every batch."""

    habc_gamma: float = 0.99
    """The critics' discount per frame."""
    habc_beta: float = 0.05
    """beta: the temperature of exp(A / beta)."""
    habc_max_weight: float = 20.0
    """w_max: the weight clip."""
    habc_gate_threshold: float = 0.5
    """tau_g: viability above which the gate shifts to efficiency."""
    habc_gate_temperature: float = 0.1
    """T_g: the gate's sigmoid temperature."""
    habc_step_cost: float = 0.01
    """c: the efficiency head's per-frame cost."""
    habc_warmup: int = 100
    """Batches with w = 1 while the critics start."""
    critic_lr: float = 1e-3
    """Adam learning rate of the two critics."""
    critic_hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of each critic."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.habc_beta <= 0 or self.habc_gate_temperature <= 0:
            raise UserInputError(f"invalid --habc-beta {self.habc_beta} or --habc-gate-temperature "
                                 f"{self.habc_gate_temperature}: expected positive temperatures")
        if not isinstance(self.habc_warmup, int) or self.habc_warmup < 0:
            raise UserInputError(f"invalid --habc-warmup {self.habc_warmup!r}: expected a non-negative integer")


class HABCWeighting:
    """HABC's weights (module docstring). The critics are built on the first batch, whose critic state fixes their
    input width (the dataset's, not the env's), or by ``load_state_dict``."""

    def __init__(self, config: HABCConfig, device: torch.device):
        self.config, self.device = config, torch.device(device)
        self.critic_via: torch.nn.Module | None = None
        self.critic_eff: torch.nn.Module | None = None
        self.critic_opt: torch.optim.Optimizer | None = None
        self.batches = 0

    def _build(self, C: int) -> None:
        c = self.config
        self.critic_via = mlp(C, c.critic_hidden, 1, "relu").to(self.device)
        self.critic_eff = mlp(C, c.critic_hidden, 1, "relu").to(self.device)
        self.critic_opt = torch.optim.Adam([*self.critic_via.parameters(), *self.critic_eff.parameters()],
                                           lr=c.critic_lr)

    def weights(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Fit the two critics on ``batch`` (one Adam step) and return the actor weights ``w [B]``."""
        c = self.config
        if "success" not in batch:
            raise UserInputError("HABC's weighting needs episode outcomes: expected an is_episode_successful feature "
                                 "(or another success key) in the dataset")
        if self.critic_via is None:
            self._build(batch["critic_state"].shape[1])
        assert self.critic_via is not None and self.critic_eff is not None and self.critic_opt is not None
        s, s2 = batch["critic_state"], batch["next_critic_state"]  # [B,C]
        ok, last, auto = batch["success"].float(), batch["last"], ~batch["intervention"]  # [B]
        logit = self.critic_via(s).squeeze(-1)  # [B]
        v_eff = self.critic_eff(s).squeeze(-1)  # [B]
        k = batch["steps_to_end"].float()  # [B]
        g = c.habc_gamma
        cost_to_go = -c.habc_step_cost * (1 - g ** (k + 1)) / (1 - g)  # [B]
        a = auto.float()
        loss_via = (F.binary_cross_entropy_with_logits(logit, ok, reduction="none") * a).sum() / a.sum().clamp_min(1)
        m = a * ok
        loss_eff = (((v_eff - cost_to_go) ** 2) * m).sum() / m.sum().clamp_min(1)
        self.critic_opt.zero_grad(set_to_none=True)
        (loss_via + loss_eff).backward()
        self.critic_opt.step()
        with torch.no_grad():
            v = torch.sigmoid(self.critic_via(s).squeeze(-1))  # [B]
            v2 = torch.where(last, ok, torch.sigmoid(self.critic_via(s2).squeeze(-1)))  # [B]
            e, e2 = self.critic_eff(s).squeeze(-1), torch.where(last, 0.0, self.critic_eff(s2).squeeze(-1))  # [B]
            a_via = g * v2 - v
            a_eff = -c.habc_step_cost + g * e2 - e
            gate = torch.sigmoid((v - c.habc_gate_threshold) / c.habc_gate_temperature)  # [B]
            adv = (1 - gate) * a_via + gate * a_eff  # [B]
            w = torch.exp(adv / c.habc_beta).clamp(max=c.habc_max_weight)
            w = torch.where(auto, w, torch.ones_like(w))
            if self.batches < c.habc_warmup:
                w = torch.ones_like(w)
        self.batches += 1
        return w, {"loss/viability": loss_via.detach(), "loss/efficiency": loss_eff.detach(),
                   "stats/gate": gate.mean(), "stats/weight_mean": w.mean(), "stats/weight_max": w.max()}

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batches": self.batches}
        if self.critic_via is not None and self.critic_eff is not None and self.critic_opt is not None:
            out.update(critic_via=self.critic_via.state_dict(), critic_eff=self.critic_eff.state_dict(),
                       critic_opt=self.critic_opt.state_dict())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = state["batches"]
        if "critic_via" in state:
            self._build(state["critic_via"]["0.weight"].shape[1])
            assert self.critic_via is not None and self.critic_eff is not None and self.critic_opt is not None
            self.critic_via.load_state_dict(state["critic_via"])
            self.critic_eff.load_state_dict(state["critic_eff"])
            self.critic_opt.load_state_dict(state["critic_opt"])
