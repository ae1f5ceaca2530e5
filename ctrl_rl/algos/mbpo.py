"""Model-based offline SAC: SAC trained on k-step rollouts of a learned dynamics model started from dataset
states, mixed with real transitions (MBPO's data flow, run offline as in MOPO and RAVL).

``mbpo`` is the plain baseline: no penalty and no value pessimism beyond SAC's clipped double Q. It is the
method of the RAVL paper's edge-of-reach experiment whose Q-values blow up even with the true dynamics
(docs/algorithms/mbpo.md#the-edge-of-reach-problem). MOPO (``algos/mopo.py``) subtracts an uncertainty penalty from the
imagined rewards;
RAVL (``algos/ravl.py``) uses an EDAC critic ensemble instead. The loop (``learn/model_based.py``) reads the
fields of ``MBPOConfig`` below: every ``rollout_every`` gradient steps it rolls the current actor out for
``rollout_length`` steps in the model from ``rollout_starts`` dataset states into the model buffer, and every
batch takes ``real_ratio`` of its rows from the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SACConfig
from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class MBPOConfig(SACConfig):
    """SAC plus how the agent uses the model's rollouts (defaults: MOPO's and RAVL's shared settings)."""

    rollout_length: int = 5
    """k: steps of every imagined rollout (MOPO: 1 or 5 per dataset; RAVL: 5)."""
    real_ratio: float = 0.05
    """Fraction of every batch drawn from the dataset; the rest from the model buffer (MOPO, RAVL: 0.05)."""
    penalty: float = 0.0
    """lambda: imagined rewards are r - lambda * u(s, a) with u the ``penalty_kind`` uncertainty (MOPO: 1 or 5)."""
    penalty_kind: Literal["aleatoric", "epistemic", "total_var"] = "aleatoric"
    """u: the model's largest predicted std norm over elites (MOPO), the elites' disagreement, or their
    total variance (``world_models.protocol``)."""
    member_mode: Literal["step", "episode"] = "step"
    """Which elite predicts: a random one per transition (MBPO, MOPO, RAVL) or one per imagined episode."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.rollout_length, int) or self.rollout_length < 1:
            raise UserInputError(f"invalid --rollout-length {self.rollout_length!r}: expected a positive integer")
        if not 0.0 <= self.real_ratio <= 1.0:
            raise UserInputError(f"invalid --real-ratio {self.real_ratio!r}: expected a fraction in [0, 1]")
        if not self.penalty >= 0.0:
            raise UserInputError(f"invalid --penalty {self.penalty!r}: expected a finite number >= 0")
        if self.crossq:
            raise UserInputError("--crossq is not supported by the model-based agents: "
                                 "expected SAC with target critics")


class ModelBasedSAC(SAC):
    """SAC that also logs the critic ensemble's statistics the edge-of-reach plots need: the largest Q of
    the batch and the spread of the members."""

    name = "mbpo"

    def critic_loss(self, q: torch.Tensor, y: torch.Tensor, aux: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, extra = super().critic_loss(q, y, aux)
        qd = q.detach()  # [E,B]
        return loss, {**extra, "stats/q_max": qd.max(), "stats/q_member_std": qd.std(0).mean() if qd.shape[0] > 1
                      else qd.new_zeros(())}


MODEL_BASED_RUN = {"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 20_000,
                   "eval_every": 10_000, "eval_episodes": 10}

register(AlgoEntry(
    "mbpo", MBPOConfig, ModelBasedSAC, regime="model-based",
    summary="model-based offline SAC on k-step model rollouts, no penalty (the edge-of-reach baseline)",
    run_defaults=MODEL_BASED_RUN, continuous_only=True, requires_dataset=True))
