"""Batches passed between storage and algorithms: dataclasses of tensors.

Shape-letter glossary used across ctrl_rl: T time (rollout steps), N parallel envs, B batch / minibatch,
E ensemble members, H horizon or action chunk, O observation dim, A action dim, S = T*N flattened samples.

Observation fields are ``Obs`` (``ctrl_rl.core.obs``): a float32 tensor for flat observations, or a dict
of named parts (images uint8) with the same leading dims, e.g. ``{"image/top": [T,N,3,H,W], "state": [T,N,O]}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ctrl_rl.core.obs import Obs


@dataclass
class Rollout:
    """On-policy rollout of T steps from N envs."""

    obs: Obs  # [T,N,O] observation the action was taken in (or a dict of parts [T,N,*part.shape])
    action: torch.Tensor  # [T,N,A] float (raw, unclipped policy sample) or [T,N] int64
    logp: torch.Tensor  # [T,N] log-prob of the action under the collecting policy
    reward: torch.Tensor  # [T,N]
    terminated: torch.Tensor  # [T,N] bool
    truncated: torch.Tensor  # [T,N] bool
    final_obs: Obs  # [T,N,O] state reached after the step (pre-reset obs where the episode ended); dict like obs


@dataclass
class Transition:
    """Off-policy transitions (used by the replay buffer)."""

    obs: Obs  # [B,O] (or a dict of parts [B,*part.shape])
    action: torch.Tensor  # [B,A]
    reward: torch.Tensor  # [B]
    next_obs: Obs  # [B,O] (or a dict of parts [B,*part.shape])
    terminated: torch.Tensor  # [B] bool
    truncated: torch.Tensor  # [B] bool
    # [B] bootstrap discount gamma^k of an n-step transition (storage.replay.NStepSampler); None: a one-step
    # transition, discounted by the algorithm's own gamma. Keyword-only, so subclasses may add required fields.
    discount: torch.Tensor | None = field(default=None, kw_only=True)
