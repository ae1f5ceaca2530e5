"""Batches passed between storage and algorithms: dataclasses of tensors.

Shape-letter glossary used across ctrl_rl: T time (rollout steps), N parallel envs, B batch / minibatch,
E ensemble members, H horizon or action chunk, O observation dim, A action dim, S = T*N flattened samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """On-policy rollout of T steps from N envs."""

    obs: torch.Tensor  # [T,N,O] observation the action was taken in
    action: torch.Tensor  # [T,N,A] float (raw, unclipped policy sample) or [T,N] int64
    logp: torch.Tensor  # [T,N] log-prob of the action under the collecting policy
    reward: torch.Tensor  # [T,N]
    terminated: torch.Tensor  # [T,N] bool
    truncated: torch.Tensor  # [T,N] bool
    final_obs: torch.Tensor  # [T,N,O] state reached after the step (pre-reset obs where the episode ended)


@dataclass
class Transition:
    """Off-policy transitions (used by the replay buffer)."""

    obs: torch.Tensor  # [B,O]
    action: torch.Tensor  # [B,A]
    reward: torch.Tensor  # [B]
    next_obs: torch.Tensor  # [B,O]
    terminated: torch.Tensor  # [B] bool
    truncated: torch.Tensor  # [B] bool
