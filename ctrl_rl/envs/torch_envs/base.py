"""Shared plumbing for the torch-native batched simulators.

Every simulator here keeps its whole state as one tensor ``state [S,N]`` on ``device`` (S state
variables) and is described by three pure tensor functions supplied by the concrete class:

- ``_initial_state(n) -> [S,n]``: a fresh start state per env, drawn from ``self.generator`` only;
- ``_transition(state [S,N], action) -> (next_state [S,N], reward [N], terminated [N] bool)``;
- ``_observe(state [S,N]) -> O tensors [N]``, the observation's columns.

The state is component-major (``[S,N]``, not ``[N,S]``) on purpose: each state variable is then a
contiguous ``[N]`` row, so the physics runs as vectorised elementwise kernels and the masked reset is a
fast row-broadcast ``torch.where``. With ``[N,S]`` every op and the reset run over a short strided
inner dimension, which measured ~2x slower per step on CPU at N = 2^20. Observations are handed out as
``[N,O]`` (the protocol's layout) by stacking the columns once.

``TorchEnv`` owns everything else once: action validation, the per-env step counter and time limit,
same-step auto-reset (masked ``torch.where``, no host sync, no per-env loop), seeding and
``state_dict``; and the spec from the class attributes alone (``static_spec``, which the registry's
``spec_of`` calls without building the simulator). The brief allows a tiny base here; the three methods
above are the only hooks, and they are pure functions of their arguments, so a simulator still reads top
to bottom in one file.

Auto-reset draws a fresh start state for *every* env on *every* step and keeps it only where an
episode ended. That costs one ``torch.rand`` of ``[S,N]`` per step but needs no ``done.any()``
(a host sync on GPU), and it makes generator consumption independent of which envs finished, so
runs are reproducible from ``(seed, actions)`` alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from ctrl_rl.envs.protocol import EnvSpec, StepOut


class TorchEnv(ABC):
    """Base of the torch batched simulators (see the module docstring).

    Args:
        num_envs: N, the number of environments simulated in lock step.
        device: where the state, the generator and every returned tensor live.
        seed: seed of the env's ``torch.Generator``; ``reset(seed)`` re-seeds it.
        max_episode_steps: time limit (episodes are truncated after this many steps); ``None`` uses
            the env's default (the gymnasium registration's value).
        dtype: dtype of the simulator state and arithmetic. Observations and rewards are always
            returned as float32 (the protocol's dtype); ``torch.float64`` is useful to compare long
            trajectories against float64 reference implementations.
    """

    # Filled in by each simulator.
    name: ClassVar[str]
    obs_dim: ClassVar[int]
    state_dim: ClassVar[int]
    discrete: ClassVar[bool]
    action_dim: ClassVar[int]  # A for continuous envs, the number of actions for discrete ones
    action_low: ClassVar[tuple[float, ...]] = ()
    action_high: ClassVar[tuple[float, ...]] = ()
    obs_low: ClassVar[tuple[float, ...]]  # bounds of one observation, for gymnasium spaces
    obs_high: ClassVar[tuple[float, ...]]
    dt: ClassVar[float]
    default_max_episode_steps: ClassVar[int]

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}.")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}.")
        self.spec = type(self).static_spec(max_episode_steps)  # a simulator with spec options sets its own after this
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_episode_steps = int(max_episode_steps if max_episode_steps is not None
                                     else self.default_max_episode_steps)  # checked by static_spec
        self._action_shape = (self.num_envs,) if self.discrete else (self.num_envs, self.action_dim)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.state = self._initial_state(self.num_envs)  # [S,N]
        self.elapsed_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # [N]

    @classmethod
    def static_spec(cls, max_episode_steps: int | None = None) -> EnvSpec:
        """The spec of this simulator from its class attributes alone, no state built (the registry's
        ``spec_of``); a simulator with options that change the spec (``PointMassPixels``) extends it."""
        if max_episode_steps is None:
            max_episode_steps = cls.default_max_episode_steps
        if int(max_episode_steps) < 1:
            raise ValueError(f"max_episode_steps must be a positive integer or None, got {max_episode_steps!r}.")
        return EnvSpec(
            env_id=f"torch:{cls.name}",
            obs_shape=(cls.obs_dim,),
            discrete=cls.discrete,
            action_dim=cls.action_dim,
            action_low=cls.action_low,
            action_high=cls.action_high,
            dt=cls.dt,
            max_episode_steps=int(max_episode_steps),
            backend="torch",
        )

    # ---- hooks -------------------------------------------------------------------------------

    @abstractmethod
    def _initial_state(self, n: int) -> torch.Tensor:
        """A fresh start state ``[S,n]`` drawn from ``self.generator`` only."""

    @abstractmethod
    def _transition(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(next_state [S,N], reward [N], terminated [N] bool)``."""

    @abstractmethod
    def _observe(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The observation's O columns, each ``[N]``."""

    # ---- helpers for the hooks ---------------------------------------------------------------

    def _uniform(self, rows: int, n: int, low: float, high: float) -> torch.Tensor:
        """``[rows,n]`` uniform samples in ``[low, high)`` from the env's generator."""
        u = torch.rand(rows, n, generator=self.generator, device=self.device, dtype=self.dtype)  # [rows,n]
        return u.mul_(high - low).add_(low)

    def _obs_tensor(self, state: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._observe(state), dim=-1).to(torch.float32)  # [N,O]

    # ---- the BatchedEnv protocol ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every env; re-seed the generator first when ``seed`` is given."""
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.state = self._initial_state(self.num_envs)  # [S,N]
        self.elapsed_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # [N]
        return self._obs_tensor(self.state)  # [N,O]

    def step(self, action: torch.Tensor) -> StepOut:
        """Advance every env by one step and reset the envs whose episode ended (same step)."""
        action = self._check_action(action)
        next_state, reward, terminated = self._transition(self.state, action)  # [S,N], [N], [N]
        steps = self.elapsed_steps + 1  # [N]
        truncated = (steps >= self.max_episode_steps) & ~terminated  # [N]; terminated wins
        done = terminated | truncated  # [N]
        fresh = self._initial_state(self.num_envs)  # [S,N]
        self.state = torch.where(done, fresh, next_state)  # [S,N]; done broadcasts over the S rows
        self.elapsed_steps = steps.masked_fill_(done, 0)  # [N]
        final_obs = self._obs_tensor(next_state)  # [N,O]
        obs = self._obs_tensor(self.state)  # [N,O]; equals final_obs where not done
        return StepOut(
            obs=obs,
            reward=reward.to(torch.float32),
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            info={},
        )

    def close(self) -> None:  # noqa: B027  (a deliberate no-op default: tensors need no closing; not a hook)
        """Nothing to release (the state is plain tensors); a no-op default that subclasses may extend."""

    # ---- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-exactly: state, step counters, generator state."""
        return {
            "env_id": self.spec.env_id,
            "state": self.state.clone(),
            "elapsed_steps": self.elapsed_steps.clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if d.get("env_id") != self.spec.env_id:
            raise ValueError(f"state_dict is for env {d.get('env_id')!r}, not {self.spec.env_id!r}.")
        state, steps = d["state"], d["elapsed_steps"]
        want = (self.state_dim, self.num_envs)
        if tuple(state.shape) != want or tuple(steps.shape) != (self.num_envs,):
            raise ValueError(
                f"state_dict holds state of shape {tuple(state.shape)} and step counters of shape "
                f"{tuple(steps.shape)}, expected {want} and {(self.num_envs,)} (num_envs={self.num_envs})."
            )
        self.state = state.to(device=self.device, dtype=self.dtype, copy=True)  # [S,N]
        self.elapsed_steps = steps.to(device=self.device, dtype=torch.int64, copy=True)  # [N]
        self.generator.set_state(d["generator"])

    # ---- validation ------------------------------------------------------------------------

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        """Shape/dtype check at the public entry (metadata only, no host sync)."""
        action = torch.as_tensor(action, device=self.device)
        if tuple(action.shape) != self._action_shape:
            kind = "int64 action indices" if self.discrete else "float actions"
            raise ValueError(
                f"{self.spec.env_id} expects {kind} of shape {self._action_shape} "
                f"(num_envs={self.num_envs}), got shape {tuple(action.shape)}."
            )
        if self.discrete:
            if action.is_floating_point() or action.is_complex():
                raise ValueError(f"{self.spec.env_id} has discrete actions; "
                                 f"expected an integer tensor, got {action.dtype}.")
            return action
        return action.to(self.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={str(self.device)!r})"
