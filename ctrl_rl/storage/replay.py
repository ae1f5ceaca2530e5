"""Device-resident circular replay buffer and a mixed sampler (off-policy and offline-to-online learning).

Shape letters: C capacity, N envs, B batch, O obs dim, A action dim.

The buffer is preallocated on the training device, so memory stays flat however long a run is. Each
``add`` writes one step of N parallel envs at once (one indexed copy per field, no per-env loop).
``next_obs`` must be the state the step reached: the protocol's ``final_obs`` (the pre-reset observation
where an episode ended), so truncated transitions bootstrap correctly; ``terminated`` and ``truncated``
are stored apart. Sampling takes an explicit ``torch.Generator``.
"""

from __future__ import annotations

import torch

from ctrl_rl.core.types import Transition

_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class ReplayBuffer:
    """Circular buffer of transitions; the oldest rows are overwritten once ``capacity`` is reached."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_dim: int, device: torch.device | str = "cpu",
                 discrete: bool = False):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity, self.device = int(capacity), torch.device(device)
        self.obs_shape, self.action_dim, self.discrete = tuple(obs_shape), int(action_dim), discrete
        C = self.capacity
        self.obs = torch.zeros((C, *self.obs_shape), device=self.device)  # [C,O]
        self.next_obs = torch.zeros((C, *self.obs_shape), device=self.device)  # [C,O]
        if discrete:
            self.action = torch.zeros(C, dtype=torch.int64, device=self.device)  # [C]
        else:
            self.action = torch.zeros((C, self.action_dim), device=self.device)  # [C,A]
        self.reward = torch.zeros(C, device=self.device)  # [C]
        self.terminated = torch.zeros(C, dtype=torch.bool, device=self.device)  # [C]
        self.truncated = torch.zeros(C, dtype=torch.bool, device=self.device)  # [C]
        self.ptr = 0  # next row to write
        self.size = 0  # rows holding data
        self.added = 0  # transitions ever added

    def __len__(self) -> int:
        return self.size

    def add(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, next_obs: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """Append one step of N envs: ``obs [N,O]``, ``action [N,A]`` (``[N]`` discrete), ``reward [N]``,
        ``next_obs [N,O]`` (use ``final_obs``), ``terminated [N]``, ``truncated [N]``."""
        n = obs.shape[0]
        if tuple(obs.shape[1:]) != self.obs_shape or tuple(next_obs.shape) != tuple(obs.shape):
            raise ValueError(f"replay expects obs and next_obs of shape [N,{self.obs_shape}], got {tuple(obs.shape)} "
                             f"and {tuple(next_obs.shape)}")
        if reward.shape != (n,) or terminated.shape != (n,) or truncated.shape != (n,):
            raise ValueError(f"replay expects reward/terminated/truncated of shape [{n}]")
        if n > self.capacity:
            raise ValueError(f"a step of {n} envs does not fit a replay buffer of capacity {self.capacity}")
        idx = (self.ptr + torch.arange(n, device=self.device)) % self.capacity  # [N]
        self.obs.index_copy_(0, idx, obs.to(self.obs.dtype))
        self.next_obs.index_copy_(0, idx, next_obs.to(self.obs.dtype))
        self.action.index_copy_(0, idx, action.to(self.action.dtype).reshape(n, *self.action.shape[1:]))
        self.reward.index_copy_(0, idx, reward.to(self.reward.dtype))
        self.terminated.index_copy_(0, idx, terminated.bool())
        self.truncated.index_copy_(0, idx, truncated.bool())
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.added += n

    def sample_indices(self, batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return torch.randint(0, self.size, (batch_size,), generator=generator, device=self.device)  # [B]

    def gather(self, idx: torch.Tensor) -> Transition:
        return Transition(self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx],
                          self.terminated[idx], self.truncated[idx])

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transition:
        """``batch_size`` transitions drawn uniformly with replacement from the filled rows."""
        return self.gather(self.sample_indices(batch_size, generator))

    def state_dict(self) -> dict:
        """The filled rows and the write position (saved with checkpoints when ``--save-replay`` is on)."""
        return {"capacity": self.capacity, "ptr": self.ptr, "size": self.size, "added": self.added,
                **{f: getattr(self, f)[: self.size].cpu().clone() for f in _FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"replay state has capacity {state['capacity']}, this buffer {self.capacity}")
        size = int(state["size"])
        for f in _FIELDS:
            getattr(self, f)[:size].copy_(state[f].to(self.device))
        self.ptr, self.size, self.added = int(state["ptr"]), size, int(state["added"])


class MixedSampler:
    """Draws a fixed fraction of every batch from a second buffer (e.g. offline data next to online data).

    ``round(fraction * B)`` rows come from ``second`` and the rest from ``first``; the two parts are
    concatenated (first, then second) so a learner can also split them again.
    """

    def __init__(self, first: ReplayBuffer, second: ReplayBuffer, fraction: float):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"mixed-sampler fraction must be in [0, 1], got {fraction}")
        self.first, self.second, self.fraction = first, second, fraction

    def split(self, batch_size: int) -> tuple[int, int]:
        n2 = int(round(self.fraction * batch_size))
        return batch_size - n2, n2

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transition:
        n1, n2 = self.split(batch_size)
        parts = [b.sample(n, generator) for b, n in ((self.first, n1), (self.second, n2)) if n > 0]
        if len(parts) == 1:
            return parts[0]
        return Transition(*(torch.cat([getattr(p, f) for p in parts]) for f in
                            ("obs", "action", "reward", "next_obs", "terminated", "truncated")))
