"""Targets and losses of the actor-critic family as pure tensor functions (no modules, no optimizers).

- ``td_target``: SAC's soft TD target over a random subset of target critics (REDQ), bootstrapped only where
  the transition did not terminate (docs/algorithms/sac.md#losses).
- ``edac_diversity``: EDAC's gradient-diversity term of a critic ensemble (docs/algorithms/ravl.md#losses).

Shape letters: E critic members, M target subset, B batch, A action dim.
"""

from __future__ import annotations

from typing import cast

import torch

from ctrl_rl.core.seeds import select_members


def td_target(q_next: torch.Tensor, subset: torch.Tensor | None, reward: torch.Tensor, terminated: torch.Tensor,
              next_logp: torch.Tensor, alpha: torch.Tensor, gamma: float | torch.Tensor,
              backup_entropy: bool) -> torch.Tensor:
    """``y = r + gamma * (1 - terminated) * (min_{i in subset} Qbar_i(s', a') - [backup_entropy] alpha log pi(a'|s'))``.

    ``q_next [E,B]`` of the target critics at (s', a'), ``subset [M]`` member indices (None: every member, no
    gather), ``reward [B]``, ``terminated [B]`` bool, ``next_logp [B]``, ``alpha []`` -> ``y [B]``. A truncated
    transition bootstraps like any other. ``gamma`` may be a ``[B]`` tensor: an n-step batch's per-transition
    bootstrap discount (``Transition.discount``). Seed-batched (``core.seeds``): a leading ``[S]`` on every argument
    (``subset [S,M]``, ``alpha [S]``).
    """
    q_t = q_next.amin(-2) if subset is None else select_members(q_next, subset).min(-2).values  # [*S,B]
    if backup_entropy:
        q_t = q_t - alpha.unsqueeze(-1) * next_logp
    return reward + gamma * (~terminated).to(reward.dtype) * q_t


def edac_diversity(grad_a: torch.Tensor) -> torch.Tensor:
    """EDAC's diversity term ``1/(E-1) * mean_batch sum_{i != j} <g_i, g_j>`` of the members' action-gradients
    ``grad_a [E,B,A]`` (``grad_a[i] = grad_a Q_i(s, a)``), each normalised to ``g_i = grad_a[i] / ||grad_a[i]||``
    (1e-10 added to the norm). 0-d; needs E >= 2. Take ``grad_a`` with ``create_graph=True`` to train on it."""
    E = grad_a.shape[0]
    # torch stub gap: Tensor.norm leaves dim/keepdim/dtype and its return unannotated (kept over vector_norm:
    # the same call as ever, so the same numerics on every device)
    norm = cast(torch.Tensor, grad_a.norm(dim=-1, keepdim=True))  # [E,B,1]  # pyright: ignore[reportUnknownMemberType]
    g = grad_a / (norm + 1e-10)  # [E,B,A]  # [E,B,A]
    gram = torch.einsum("iba,jba->bij", g, g)  # [B,E,E]
    return (gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)).mean() / (E - 1)
