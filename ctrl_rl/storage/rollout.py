"""Preallocated on-device rollout storage ``[T,N,...]`` for on-policy learning.

Observations follow ``spec.parts`` (``ctrl_rl.core.obs``): one float32 ``[T,N,O]`` tensor per observation
field for flat envs, and for envs with several parts a dict of ``[T,N,*part.shape]`` tensors in each
part's dtype (images stay uint8).
"""

from __future__ import annotations

import torch

from ctrl_rl.core.obs import Obs
from ctrl_rl.core.types import Rollout
from ctrl_rl.envs.protocol import EnvSpec, StepOut


class RolloutStorage:
    """Holds one rollout; ``add`` writes step t in place, ``rollout()`` returns views of the buffers."""

    def __init__(self, T: int, N: int, spec: EnvSpec, device: torch.device):
        self.T, self.N = T, N
        self.flat = spec.is_flat
        if self.flat:
            O = spec.obs_shape
            self.obs: Obs = torch.zeros((T, N, *O), device=device)  # [T,N,O]
            self.final_obs: Obs = torch.zeros((T, N, *O), device=device)  # [T,N,O]
        else:
            self.obs = {p.name: torch.zeros((T, N, *p.shape), dtype=p.dtype, device=device) for p in spec.parts}
            self.final_obs = {p.name: torch.zeros((T, N, *p.shape), dtype=p.dtype, device=device) for p in spec.parts}
        if spec.discrete:
            self.action = torch.zeros((T, N), dtype=torch.int64, device=device)  # [T,N]
        else:
            self.action = torch.zeros((T, N, spec.action_dim), device=device)  # [T,N,A]
        self.logp = torch.zeros((T, N), device=device)  # [T,N]
        self.reward = torch.zeros((T, N), device=device)  # [T,N]
        self.terminated = torch.zeros((T, N), dtype=torch.bool, device=device)  # [T,N]
        self.truncated = torch.zeros((T, N), dtype=torch.bool, device=device)  # [T,N]

    def add(self, t: int, obs: Obs, action: torch.Tensor, logp: torch.Tensor, out: StepOut,
            envs: slice = slice(None)) -> None:
        """Write step ``t`` of the envs in ``envs`` (all by default; a slice for one group of a pipelined collector)."""
        _copy_step(self.obs, t, envs, obs)
        _copy_step(self.final_obs, t, envs, out.final_obs)
        self.action[t, envs].copy_(action)
        self.logp[t, envs].copy_(logp)
        self.reward[t, envs].copy_(out.reward)
        self.terminated[t, envs].copy_(out.terminated)
        self.truncated[t, envs].copy_(out.truncated)

    def rollout(self) -> Rollout:
        return Rollout(self.obs, self.action, self.logp, self.reward, self.terminated, self.truncated, self.final_obs)


def _copy_step(dst: Obs, t: int, envs: slice, src: Obs) -> None:
    """``dst[t, envs] = src`` for a ``[T,N,...]`` buffer, or part by part for a dict of them. ``src`` has the form
    of ``dst``: both follow ``spec.parts`` (a plain tensor for a flat env, a dict of parts otherwise)."""
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"rollout storage of flat observations got a {type(src).__name__}: expected a tensor")
        dst[t, envs].copy_(src)
        return
    if not isinstance(src, dict):
        raise TypeError(f"rollout storage of the parts {list(dst)} got a {type(src).__name__}: expected a dict")
    for k, buf in dst.items():  # [T,N,*part.shape] each
        buf[t, envs].copy_(src[k])
