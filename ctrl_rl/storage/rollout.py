"""Preallocated on-device rollout storage ``[T,N,...]`` for on-policy learning."""

from __future__ import annotations

import torch

from ctrl_rl.core.types import Rollout
from ctrl_rl.envs.protocol import EnvSpec, StepOut


class RolloutStorage:
    """Holds one rollout; ``add`` writes step t in place, ``rollout()`` returns views of the buffers."""

    def __init__(self, T: int, N: int, spec: EnvSpec, device: torch.device):
        self.T, self.N = T, N
        O = spec.obs_shape
        self.obs = torch.zeros((T, N, *O), device=device)  # [T,N,O]
        self.final_obs = torch.zeros((T, N, *O), device=device)  # [T,N,O]
        if spec.discrete:
            self.action = torch.zeros((T, N), dtype=torch.int64, device=device)  # [T,N]
        else:
            self.action = torch.zeros((T, N, spec.action_dim), device=device)  # [T,N,A]
        self.logp = torch.zeros((T, N), device=device)  # [T,N]
        self.reward = torch.zeros((T, N), device=device)  # [T,N]
        self.terminated = torch.zeros((T, N), dtype=torch.bool, device=device)  # [T,N]
        self.truncated = torch.zeros((T, N), dtype=torch.bool, device=device)  # [T,N]

    def add(self, t: int, obs: torch.Tensor, action: torch.Tensor, logp: torch.Tensor, out: StepOut) -> None:
        self.obs[t].copy_(obs)
        self.action[t].copy_(action)
        self.logp[t].copy_(logp)
        self.reward[t].copy_(out.reward)
        self.terminated[t].copy_(out.terminated)
        self.truncated[t].copy_(out.truncated)
        self.final_obs[t].copy_(out.final_obs)

    def rollout(self) -> Rollout:
        return Rollout(self.obs, self.action, self.logp, self.reward, self.terminated, self.truncated, self.final_obs)
