"""Device-resident circular replay buffer and a mixed sampler (off-policy and offline-to-online learning).

Shape letters: C capacity, N envs, B batch, O obs dim, A action dim.

Observations are ``Obs`` (``ctrl_rl.core.obs``). A flat env (the single float32 ``state`` part) is
stored as one float32 tensor ``[C,O]`` per observation field, exactly as before parts existed. An env
with several parts (``obs_parts``, e.g. ``spec.parts`` of a pixel env) gets one tensor per part with
the part's dtype, ``[C,*part.shape]``, so images stay uint8 (84x84 RGB: 21 KB a frame, not 85 KB);
``add`` takes and ``sample`` returns dicts of parts. Those per-part tensors are allocated with
``torch.empty``: on Linux a large buffer takes memory page by page as rows are written, and rows past
``size`` are never read. obs and next_obs are stored apart (2 frames per transition), which keeps
``add``/``sample`` one indexed copy per part.

The buffer is preallocated on the training device, so memory stays flat however long a run is. Each
``add`` writes one step of N parallel envs at once (one indexed copy per field, no per-env loop).
``next_obs`` must be the state the step reached: the protocol's ``final_obs`` (the pre-reset observation
where an episode ended), so truncated transitions bootstrap correctly; ``terminated`` and ``truncated``
are stored apart. Sampling takes an explicit ``torch.Generator``.

``NStepSampler`` draws n-step transitions from a buffer that every ``add`` fills with one step of the same N envs:
env i's next step then lies N rows further on (modulo the capacity), so a chain is a strided gather.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ctrl_rl.core.obs import (
    Obs,
    ObsPart,
    is_flat,
    obs_batch_size,
    obs_cat,
    obs_index,
    obs_map,
    parts_from_shape,
    state_shape,
)
from ctrl_rl.core.returns import nstep_return
from ctrl_rl.core.types import Transition

_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class ReplayBuffer:
    """Circular buffer of transitions; the oldest rows are overwritten once ``capacity`` is reached.

    Args:
        capacity: C, rows kept.
        obs_shape: shape of a flat observation; with ``obs_parts``, the shape of the ``state`` part
            (``()`` without one), i.e. ``spec.obs_shape``.
        action_dim: A (the number of actions for discrete envs).
        device: where every row lives.
        discrete: store ``[C]`` int64 actions instead of ``[C,A]`` float32.
        obs_parts: the observation's parts (``spec.parts``); empty means the flat ``state`` part of
            ``obs_shape``.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_dim: int, device: torch.device | str = "cpu",
                 discrete: bool = False, obs_parts: Sequence[ObsPart] = ()):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity, self.device = int(capacity), torch.device(device)
        self.obs_shape, self.action_dim, self.discrete = tuple(obs_shape), int(action_dim), discrete
        if obs_parts and state_shape(obs_parts) != self.obs_shape:
            raise ValueError(f"replay obs_shape {self.obs_shape} is not the shape of the 'state' part of obs_parts, "
                             f"{state_shape(obs_parts)}: pass spec.obs_shape with spec.parts")
        self.obs_parts = tuple(obs_parts) or parts_from_shape(self.obs_shape)
        self.flat = is_flat(self.obs_parts)
        C = self.capacity
        if self.flat:
            self.obs: Obs = torch.zeros((C, *self.obs_shape), device=self.device)  # [C,O]
            self.next_obs: Obs = torch.zeros((C, *self.obs_shape), device=self.device)  # [C,O]
        else:
            self.obs = {p.name: torch.empty((C, *p.shape), dtype=p.dtype, device=self.device) for p in self.obs_parts}
            self.next_obs = {p.name: torch.empty((C, *p.shape), dtype=p.dtype, device=self.device)
                             for p in self.obs_parts}
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

    def add(self, obs: Obs, action: torch.Tensor, reward: torch.Tensor, next_obs: Obs,
            terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """Append one step of N envs: ``obs [N,O]``, ``action [N,A]`` (``[N]`` discrete), ``reward [N]``,
        ``next_obs [N,O]`` (use ``final_obs``), ``terminated [N]``, ``truncated [N]``.

        With several observation parts ``obs`` and ``next_obs`` are dicts of ``[N,*part.shape]``;
        integer parts (images, token ids) must come in the part's dtype, float parts are cast.
        """
        n = self._check_flat(obs, next_obs) if self.flat else self._check_parts(obs, next_obs)
        if reward.shape != (n,) or terminated.shape != (n,) or truncated.shape != (n,):
            raise ValueError(f"replay expects reward/terminated/truncated of shape [{n}]")
        if n > self.capacity:
            raise ValueError(f"a step of {n} envs does not fit a replay buffer of capacity {self.capacity}")
        idx = (self.ptr + torch.arange(n, device=self.device)) % self.capacity  # [N]
        _index_copy(self.obs, idx, obs)
        _index_copy(self.next_obs, idx, next_obs)
        self.action.index_copy_(0, idx, action.to(self.action.dtype).reshape(n, *self.action.shape[1:]))
        self.reward.index_copy_(0, idx, reward.to(self.reward.dtype))
        self.terminated.index_copy_(0, idx, terminated.bool())
        self.truncated.index_copy_(0, idx, truncated.bool())
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.added += n

    def _check_flat(self, obs: Obs, next_obs: Obs) -> int:
        """Both observations are ``[N,O]`` tensors of one shape; returns N."""
        if not isinstance(obs, torch.Tensor) or not isinstance(next_obs, torch.Tensor):
            raise ValueError(f"replay expects obs and next_obs as tensors of shape [N,{self.obs_shape}], got a "
                             f"{type(obs).__name__} and a {type(next_obs).__name__}")
        if tuple(obs.shape[1:]) != self.obs_shape or tuple(next_obs.shape) != tuple(obs.shape):
            raise ValueError(f"replay expects obs and next_obs of shape [N,{self.obs_shape}], got "
                             f"{tuple(obs.shape)} "
                             f"and {tuple(next_obs.shape)}")
        return obs.shape[0]

    def _as_parts(self, what: str, o: Obs) -> dict[str, torch.Tensor]:
        names = [p.name for p in self.obs_parts]
        if not isinstance(o, dict) or sorted(o) != sorted(names):
            got = f"parts {list(o)}" if isinstance(o, dict) else f"a {type(o).__name__}"
            raise ValueError(f"replay expects {what} as a dict of the parts {names}, got {got}")
        return o

    def _check_parts(self, obs: Obs, next_obs: Obs) -> int:
        """Both observations hold every part with its shape (and dtype, for integer parts); returns N."""
        obs, next_obs = self._as_parts("obs", obs), self._as_parts("next_obs", next_obs)
        n = obs_batch_size(obs)
        for p in self.obs_parts:
            for what, v in (("obs", obs[p.name]), ("next_obs", next_obs[p.name])):
                if tuple(v.shape) != (n, *p.shape) or (v.dtype != p.dtype and not v.is_floating_point()):
                    raise ValueError(f"replay expects {what} part {p.name!r} as {p.dtype} of shape {(n, *p.shape)}, "
                                     f"got {v.dtype} of shape {tuple(v.shape)}")
        return n

    def sample_indices(self, batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return torch.randint(0, self.size, (batch_size,), generator=generator, device=self.device)  # [B]

    def gather(self, idx: torch.Tensor) -> Transition:
        return Transition(obs_index(self.obs, idx), self.action[idx], self.reward[idx], obs_index(self.next_obs, idx),
                          self.terminated[idx], self.truncated[idx])

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transition:
        """``batch_size`` transitions drawn uniformly with replacement from the filled rows."""
        return self.gather(self.sample_indices(batch_size, generator))

    def state_dict(self) -> dict:
        """The filled rows and the write position (saved with checkpoints when ``--save-replay`` is on).

        Observation fields are tensors for flat observations and dicts of per-part tensors otherwise.
        """
        return {"capacity": self.capacity, "ptr": self.ptr, "size": self.size, "added": self.added,
                **{f: obs_map(lambda v: v[: self.size].cpu().clone(), getattr(self, f)) for f in _FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"replay state has capacity {state['capacity']}, this buffer {self.capacity}")
        size = int(state["size"])
        for f in ("obs", "next_obs"):
            src, dst = state[f], getattr(self, f)
            if isinstance(src, dict) != isinstance(dst, dict) or (isinstance(src, dict) and sorted(src) != sorted(dst)):
                has = f"the parts {sorted(src)}" if isinstance(src, dict) else "flat observations"
                want = f"the parts {sorted(dst)}" if isinstance(dst, dict) else "flat observations"
                raise ValueError(f"replay state holds {has}, this buffer expects {want}")
        for f in _FIELDS:
            src, dst = state[f], getattr(self, f)
            if isinstance(dst, dict):
                for k, v in dst.items():
                    v[:size].copy_(src[k].to(self.device))
            else:
                dst[:size].copy_(src.to(self.device))
        self.ptr, self.size, self.added = int(state["ptr"]), size, int(state["added"])


def _index_copy(dst: Obs, idx: torch.Tensor, src: Obs) -> None:
    """Rows ``idx`` of ``dst`` (``[C,...]``, or a dict of per-part buffers) set to ``src`` cast to their dtype: one
    indexed copy per part. ``src`` has the form of ``dst`` (``add`` has checked it)."""
    if isinstance(dst, torch.Tensor):
        assert isinstance(src, torch.Tensor)
        dst.index_copy_(0, idx, src.to(dst.dtype))
        return
    assert isinstance(src, dict)
    for k, buf in dst.items():  # [C,*part.shape]
        buf.index_copy_(0, idx, src[k].to(buf.dtype))


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
        return Transition(obs_cat([p.obs for p in parts]), torch.cat([p.action for p in parts]),
                          torch.cat([p.reward for p in parts]), obs_cat([p.next_obs for p in parts]),
                          torch.cat([p.terminated for p in parts]), torch.cat([p.truncated for p in parts]))


class NStepSampler:
    """n-step transitions from a ``ReplayBuffer`` whose every ``add`` held one step of the same ``stride`` envs (the
    off-policy loop's N), so env i's step after row r is row ``(r + stride) % C``.

    ``sample`` draws the first transitions exactly as ``buffer.sample`` does (same indices for the same generator
    state), follows each one n - 1 steps along its env and returns ``Transition(obs, action, R, next_obs_L,
    terminated_L, truncated_L, discount)`` of ``core.returns.nstep_return``: the chain stops at an episode end
    (terminated: no bootstrap; truncated: bootstrapped from its ``final_obs``) or at the env's newest stored step.
    ``discount [B]`` (``gamma^(L+1)``) replaces the algorithm's gamma in its TD target. With n = 1 the batch is
    ``buffer.sample``'s plus ``discount = gamma``.
    """

    def __init__(self, buffer: ReplayBuffer, n: int, gamma: float, stride: int):
        if n < 1 or stride < 1:
            raise ValueError(f"n-step sampling needs n >= 1 and stride >= 1, got n={n}, stride={stride}")
        if stride > buffer.capacity:
            raise ValueError(f"n-step stride {stride} is larger than the replay capacity {buffer.capacity}")
        self.buffer, self.n, self.gamma, self.stride = buffer, int(n), float(gamma), int(stride)
        self._ahead = torch.arange(self.n, device=buffer.device) * self.stride  # [n] row offsets along an env

    def __len__(self) -> int:
        return len(self.buffer)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transition:
        b = self.buffer
        if b.added % self.stride:
            raise ValueError(f"n-step sampling with stride {self.stride} needs a buffer filled {self.stride} rows at a "
                             f"time, but {b.added} rows were added")
        C = b.capacity
        idx = b.sample_indices(batch_size, generator)  # [B]
        newer = (b.ptr - 1 - idx) % C  # [B] rows written after row idx (the newest row is ptr - 1)
        rows = (idx.unsqueeze(1) + self._ahead) % C  # [B,n] the env's next n - 1 steps
        valid = self._ahead <= newer.unsqueeze(1)  # [B,n]
        ret, last, discount = nstep_return(b.reward[rows], b.terminated[rows], b.truncated[rows], valid, self.gamma)
        end = rows.gather(1, last.unsqueeze(1)).squeeze(1)  # [B] the row of the chain's last step
        return Transition(obs_index(b.obs, idx), b.action[idx], ret, obs_index(b.next_obs, end), b.terminated[end],
                          b.truncated[end], discount=discount)
