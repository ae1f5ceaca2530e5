"""The contract between a dynamics model and the code that rolls it out (ModelEnv, the model-based loops).

Shape letters: B states in a batch, O obs dim, A action dim, E ensemble members.

A ``DynamicsModel`` predicts, for states and actions in the env's own (unnormalised) units, the next state
and the reward of one chosen member per row, sampled from that member's Gaussian (``sample=True``) or its
mean, together with per-row uncertainty figures computed over the model's elite members:

- ``aleatoric``: the largest over elites of the norm of the predicted standard deviation (MOPO's penalty),
- ``epistemic``: sqrt of the mean over output dims of the variance over elites of the predicted means, on
  the standardised outputs (NeuBay's "epi_mean", the figure its adaptive truncation thresholds),
- ``total_var``: the mean over output dims of the variance of the elite mixture (aleatoric + epistemic), on
  the standardised outputs.

``terminated`` is the model's own termination prediction when it learned one (probability > 0.5), else
None (the caller then applies a termination function of the task, ``world_models.termination``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

UNCERTAINTIES = ("aleatoric", "epistemic", "total_var")


@dataclass
class ModelStep:
    next_obs: torch.Tensor  # [B,O] float32
    reward: torch.Tensor  # [B] float32
    terminated: torch.Tensor | None  # [B] bool, or None when the model has no termination head
    uncertainty: dict[str, torch.Tensor] = field(default_factory=dict)  # each [B] float32, keys UNCERTAINTIES


@runtime_checkable
class DynamicsModel(Protocol):
    obs_dim: int
    act_dim: int

    @property
    def elites(self) -> torch.Tensor:  # [K] int64 member ids, K <= E
        ...

    @property
    def num_members(self) -> int:  # E
        ...

    def predict(self, obs: torch.Tensor, act: torch.Tensor, members: torch.Tensor | None = None,
                sample: bool = True, generator: torch.Generator | None = None) -> ModelStep:
        """``obs`` [B,O], ``act`` [B,A]; ``members`` [B] int64 member ids (None: a random elite per row)."""
        ...
