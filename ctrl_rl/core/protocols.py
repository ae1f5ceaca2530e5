"""The algorithm contract as types: what every loop, the evaluation and the export may rely on.

An algorithm owns its networks, optimizers and ``torch.Generator``; never an env, a buffer, a logger or CLI code.
Every registered algorithm satisfies ``Algorithm``; the capabilities below are what some loops need on top, each a
``runtime_checkable`` protocol that a loop tests with ``isinstance`` (never ``hasattr``) and pyright checks where
the type is known. ``tests/algos/test_contract.py`` builds every registered algorithm and checks the contract.

- ``Algorithm``: ``act``, ``update(batch) -> dict[str, Tensor]`` (always device tensors: the loop converts them
  once per log step), ``state_dict`` / ``load_state_dict``, ``parameters_finite``, ``exportable`` and ``gen``.
- ``OnPolicySampling``: stochastic actions with their log-probabilities for a rollout (PPO, IMPALA, DoMo-AC).
- ``Scheduled``: settings that follow training progress (learning-rate annealing, NeuBay's schedules).
- ``ActorWeights``: the part of the state an actor process needs (actor-learner regimes).
- ``ObservationStatistics``: running statistics of the observations (SAC's ``obs_norm``), fed by the loop.
- ``Recurrent``: an acting state carried across steps (NeuBay's history encoder, a VLA's chunk queue):
  ``reset_state(n)`` for n fresh episodes, ``observe(reward, done)`` after each step.
- ``RecurrentPolicy``: an exported module with a hidden state input (``initial_hidden``).
- ``ChunkPolicy``: an exported module that emits action chunks of ``chunk`` steps and keeps its own queue.
- ``LanguagePolicy``: an exported module that reads the instruction as token ids (``language_input``).

A capability is structural: a class has it by having the members, no registration needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ctrl_rl.core.obs import Obs

Info = dict[str, torch.Tensor]
"""What ``update`` returns: namespaced keys (``loss/critic``, ``stats/q_mean``) to 0-d device tensors."""


@runtime_checkable
class Algorithm(Protocol):
    """The contract of every registered algorithm."""

    gen: torch.Generator
    """The algorithm's own generator: every random draw of acting and updating comes from it."""

    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[N,A]`` (float, in [-1, 1]) or ``[N]`` (int64) for observations ``[N,...]``."""
        ...

    def update(self, batch: Any) -> Info:
        """One update on a batch of the regime's data flow; returns 0-d device tensors, no host sync."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything that continues training bit-exactly: weights, optimizers, counters."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def parameters_finite(self) -> bool:
        """False when any parameter holds NaN or inf (the loop stops the run)."""
        ...

    def exportable(self) -> nn.Module:
        """The deterministic policy as a module of observations (the export graph's core)."""
        ...


@runtime_checkable
class OnPolicySampling(Protocol):
    def sample(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log_prob)`` of a stochastic action per env: ``[N,A]`` (or ``[N]``) and ``[N]``."""
        ...


@runtime_checkable
class Scheduled(Protocol):
    def schedule(self, progress: float) -> None:
        """Set what follows training progress, ``progress`` in [0, 1]."""
        ...


@runtime_checkable
class ActorWeights(Protocol):
    def policy_state(self) -> dict[str, torch.Tensor]:
        """The weights an actor needs to act (sent to actors every ``broadcast_every`` updates)."""
        ...

    def load_policy_state(self, state: dict[str, torch.Tensor]) -> None: ...


@runtime_checkable
class ObservationStatistics(Protocol):
    def update_obs_stats(self, obs: Obs) -> None:
        """Merge one env step's observations ``[N,...]`` into the statistics the agent normalizes with (the off-policy
        loop calls it every step, warm-up included; an agent without normalization does nothing)."""
        ...


@runtime_checkable
class Recurrent(Protocol):
    def reset_state(self, n: int) -> None:
        """Forget the acting state and start ``n`` fresh episodes."""
        ...

    def observe(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """After a step: the rewards ``[N]`` and the episode ends ``[N]`` (an ended episode's state restarts)."""
        ...


@runtime_checkable
class RecurrentPolicy(Protocol):
    def initial_hidden(self, batch: int) -> torch.Tensor:
        """The hidden state an exported recurrent module starts an episode with, for ``batch`` episodes."""
        ...


@runtime_checkable
class ChunkPolicy(Protocol):
    chunk: int
    """Actions per chunk: the module emits ``[B,H,A]`` and the runtime plays them open-loop."""
    execute_steps: int
    """How many actions of each chunk the runtime plays before it asks for the next chunk."""


@runtime_checkable
class LanguagePolicy(Protocol):
    def language_input(self) -> dict[str, Any] | None:
        """How the instruction enters the graph (``max_length`` token ids and the tokenizer), or None."""
        ...

    def save_tokenizer(self, directory: Path) -> None:
        """Write the tokenizer the runtime tokenises the instruction with into ``directory``."""
        ...
