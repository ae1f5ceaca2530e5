"""The BatchedEnv contract every simulator backend satisfies.

Shape letters: N envs, O obs dim, A action dim.

- Observations are ``Obs`` (``ctrl_rl.core.obs``): an env whose observation is the single float32
  ``state`` part (every vector env) passes a plain tensor ``[N,O]``; an env with other parts (camera
  images, language) passes a ``dict[str, Tensor]`` keyed by part name, each ``[N,*part.shape]`` with the
  part's dtype (images uint8 ``[N,C,H,W]``). ``spec.parts`` lists the parts either way.
- ``reset(seed) -> obs`` (on ``env.device``).
- ``step(action) -> StepOut``. ``action`` is ``[N,A]`` float32 for continuous envs and ``[N]`` int64
  for discrete envs. Reset is automatic *in the same step*: for an env whose episode just ended
  (``terminated | truncated``), ``obs`` already holds the first observation of the next episode and
  ``final_obs`` holds the last observation of the episode that ended, so that truncation can bootstrap
  from it. For envs that did not end, ``final_obs`` equals ``obs`` (every part).
- ``terminated`` is a true environment termination (no bootstrap); ``truncated`` is a time limit or
  other cut (bootstrap from ``final_obs``). Both are ``[N]`` bool; an env never has both set (a
  terminal state reached on the last allowed step counts as terminated).
- Tensors only, all on one device; NumPy simulators come in through adapters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ctrl_rl.core.obs import Obs, ObsPart, is_flat, parts_from_shape, state_shape
from ctrl_rl.errors import UserInputError, did_you_mean
from ctrl_rl.robots.spec import RobotSpec


@dataclass(frozen=True)
class RobotStateLayout:
    """Where a robot's measured state sits in an env's float32 ``state`` observation part: ``[start, stop)``
    column ranges (the deployment runtime's safety filter reads the joints and the end effector from them)."""

    joint_position: tuple[int, int]
    ee_position: tuple[int, int]


@dataclass(frozen=True)
class EnvSpec:
    """Static description of a batched environment.

    Attributes:
        env_id: the id the env was made from, including the backend prefix (``torch:Pendulum``).
        obs_shape: shape of one observation (``(O,)`` for vector observations). For an env with
            several observation parts (``obs_parts`` set), the shape of its ``state`` part, or ``()``
            when it has none.
        discrete: True for a discrete action space.
        action_dim: A for continuous actions, the number of actions for discrete ones.
        action_low: per-dimension lower bound of continuous actions (empty for discrete).
        action_high: per-dimension upper bound of continuous actions (empty for discrete).
        dt: seconds of simulated time per step (0.0 when unknown).
        max_episode_steps: the time limit applied by the env itself, or None.
        backend: "torch", "envpool", "gymnasium", "dmc" or "manip" (the registered backend's name).
        obs_parts: the named parts of the observation (see ``ctrl_rl.core.obs``); empty (the default,
            every vector env) means the single float32 ``state`` part of shape ``obs_shape``. Use
            ``parts`` to read the effective tuple.
        robot: the robot an env built on ``ctrl_rl.robots.spec`` drives (the manipulation tasks'
            ``franka_droid()``); None for the other envs. A policy export carries it.
        action_units: one unit per action dimension after the robot's scaling (``m``, ``rad``, ``1``);
            empty when the env's actions have no physical units beyond its bounds.
        action_space_name: which of ``robot``'s action spaces the env's actions are
            (``cartesian_velocity``); None without a robot.
        robot_state_layout: where the robot's joint and end-effector positions sit in the ``state``
            part; None without a robot.
        privileged_parts: names of observation parts only a simulator can give (MuJoCo Playground's
            ``privileged_state``: true velocities, contact forces, noise-free readings); a policy never reads
            them unless asked, so an export needs only what a robot measures. Empty: none.

    Every field is static: a registered backend gives the spec of an id without building a simulator
    where it can (``ctrl_rl.envs.spec_of``), and a built env's ``spec`` equals it.
    """

    env_id: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    dt: float = 0.0
    max_episode_steps: int | None = None
    backend: str = "torch"
    obs_parts: tuple[ObsPart, ...] = ()
    robot: RobotSpec | None = None
    action_units: tuple[str, ...] = ()
    action_space_name: str | None = None
    robot_state_layout: RobotStateLayout | None = None
    privileged_parts: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "action_units", tuple(self.action_units))  # a list would make the spec unhashable
        object.__setattr__(self, "privileged_parts", tuple(self.privileged_parts))
        unknown = [n for n in self.privileged_parts if n not in {getattr(p, 'name', p) for p in self.obs_parts}]
        if unknown:
            raise ValueError(f"{self.env_id}: privileged_parts {unknown} must name parts of obs_parts "
                             f"{[getattr(p, 'name', p) for p in self.obs_parts]}.")
        if self.action_units and len(self.action_units) != self.action_dim:
            raise ValueError(f"{self.env_id}: action_units {list(self.action_units)} must name one unit per action "
                             f"dimension ({self.action_dim}).")
        if not self.obs_parts:
            return
        object.__setattr__(self, "obs_parts", tuple(self.obs_parts))  # a list would make the spec unhashable
        names = [getattr(p, "name", p) for p in self.obs_parts]
        if not all(isinstance(p, ObsPart) for p in self.obs_parts) or len(set(names)) != len(names):
            raise ValueError(f"{self.env_id}: obs_parts {names} must be ObsPart entries with distinct names.")
        if tuple(self.obs_shape) != state_shape(self.obs_parts):
            raise ValueError(f"{self.env_id}: obs_shape {tuple(self.obs_shape)} must be the shape of the 'state' "
                             f"observation part, {state_shape(self.obs_parts)}.")

    @property
    def parts(self) -> tuple[ObsPart, ...]:
        """The observation's parts: ``obs_parts``, or the single float32 ``state`` part of ``obs_shape``."""
        return self.obs_parts if self.obs_parts else parts_from_shape(self.obs_shape)

    @property
    def is_flat(self) -> bool:
        """True when observations are plain ``[N,*obs_shape]`` float32 tensors (the single ``state`` part)."""
        return not self.obs_parts or is_flat(self.obs_parts)

    @property
    def obs_dim(self) -> int:
        """O: elements of one observation; for a multi-part env those of its ``state`` part (0 without one)."""
        if not self.is_flat and not self.obs_shape:
            return 0
        n = 1
        for s in self.obs_shape:
            n *= s
        return n

    @property
    def robot_parts(self) -> tuple[str, ...]:
        """Names of the parts a robot has too (every part not in ``privileged_parts``), in ``parts`` order."""
        return tuple(p.name for p in self.parts if p.name not in self.privileged_parts)

    def with_parts(self, names: tuple[str, ...]) -> EnvSpec:
        """This spec seen by a network that reads only the parts ``names`` (the ones it has, in ``parts`` order):
        what an actor of an asymmetric actor-critic, and so its export, takes in. One float32 ``state`` part left
        is the flat form (a plain ``[N,O]`` tensor)."""
        kept = tuple(p for p in self.parts if p.name in names)
        return dataclasses.replace(self, obs_parts=kept, obs_shape=state_shape(kept),
                                   privileged_parts=tuple(n for n in self.privileged_parts if n in names))


def observation_roles(spec: EnvSpec, actor_parts: tuple[str, ...] = (), critic_parts: tuple[str, ...] = ()
                      ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(actor, critic)``: the observation parts an actor and a critic read, each in ``spec.parts`` order.

    The actor reads ``actor_parts`` (empty: every part a robot has, ``spec.robot_parts``); a privileged part there
    is refused, so no policy silently depends on simulator-only inputs. The critic reads the actor's parts and
    ``critic_parts`` (an asymmetric actor-critic: ``privileged_state``). Names the spec lacks are refused. Both
    refusals are ``UserInputError`` sentences naming the ``--actor-parts`` / ``--critic-parts`` flag.
    """
    names = [p.name for p in spec.parts]
    for flag, given in (("--actor-parts", actor_parts), ("--critic-parts", critic_parts)):
        for n in given:
            if n not in names:
                raise UserInputError(f"{flag} names the observation part {n!r}, which {spec.env_id} does not have: "
                                     f"expected some of {names}{did_you_mean(n, names)}.")
    privileged = [n for n in actor_parts if n in spec.privileged_parts]
    if privileged:
        raise UserInputError(f"--actor-parts names {privileged[0]!r}, which {spec.env_id} marks privileged (only a "
                             f"simulator has it, so an exported policy could not run on a robot): expected some of "
                             f"{list(spec.robot_parts)}, and --critic-parts {privileged[0]} to let the critic read it.")
    actor = tuple(n for n in names if n in actor_parts) if actor_parts else spec.robot_parts
    if not actor:
        raise UserInputError(f"{spec.env_id} has no observation part a robot has (all of {names} are privileged): "
                             "expected an env with at least one non-privileged part for the actor.")
    critic = tuple(n for n in names if n in actor or n in critic_parts)
    return actor, critic


@dataclass
class StepOut:
    """Result of one batched step; see the module docstring for the semantics."""

    obs: Obs  # [N,O] float32, or a dict of parts [N,*part.shape]
    reward: torch.Tensor  # [N] float32
    terminated: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool
    final_obs: Obs  # [N,O] float32, or a dict of parts [N,*part.shape]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


@runtime_checkable
class BatchedEnv(Protocol):
    num_envs: int
    spec: EnvSpec
    device: torch.device

    def reset(self, seed: int | None = None) -> Obs: ...

    def step(self, action: torch.Tensor) -> StepOut: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncEnv(Protocol):
    """The split step that pipelined collection uses, where a simulator has it (envpool, and every ``Wrapper``):
    ``step_async(action)`` starts a step, ``step_wait()`` returns its ``StepOut``."""

    def step_async(self, action: torch.Tensor) -> None: ...

    def step_wait(self) -> StepOut: ...


@runtime_checkable
class StatefulEnv(Protocol):
    """An env whose state travels with checkpoints (every backend: seeds and counters, or the full simulator state
    of the torch-native ones)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, d: dict[str, Any]) -> None: ...


def action_to_numpy(action: torch.Tensor, spec: EnvSpec, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``action`` as a NumPy array of ``dtype`` for a NumPy simulator, after checking it against the contract:
    shape ``shape`` (``[N,A]``, or ``[N]`` for discrete actions) and, for discrete envs, an integer dtype."""
    action = torch.as_tensor(action)
    if tuple(action.shape) != shape:
        kind = "int64 action indices" if spec.discrete else "float actions"
        raise ValueError(f"{spec.env_id} expects {kind} of shape {shape} (num_envs={shape[0]}), "
                         f"got shape {tuple(action.shape)}.")
    if spec.discrete and (action.is_floating_point() or action.is_complex()):
        raise ValueError(f"{spec.env_id} has discrete actions; expected an integer tensor, got {action.dtype}.")
    return action.detach().cpu().numpy().astype(dtype, copy=False)
