"""The algorithm registry: one entry per algorithm, written by the algorithm's own file.

An entry says everything the rest of ctrl_rl needs to know about an algorithm: its name, its frozen config
class (and the defaults a variant sets on it), how to build it from ``(config, spec, device, generator)``,
which training regime runs it, the run and loop settings it defaults to, a one-line summary, and a few
optional hooks for the steps that differ between algorithms of one regime. The CLI, config loading,
evaluation, export and ``ctrl-rl list algos`` read the registry; no other table of algorithm names exists.

    from ctrl_rl.algos.registry import AlgoEntry, register
    register(AlgoEntry("my_algo", MyConfig, MyAlgo, regime="off-policy", summary="..."))

Regimes (registered by the loops of ``ctrl_rl.learn``, ``learn/regimes.py``) and their data flows:

- ``on-policy``: envs -> rollout storage -> ``update(rollout)`` (PPO).
- ``off-policy``: envs -> replay buffer -> ``update(batch)`` x UTD (SAC, SAC Flow).
- ``offline``: dataset -> buffer -> ``update(batch)``, evaluated in the env (CQL, Cal-QL, IQL).
- ``offline-to-online``: the off-policy loop started from a pre-trained checkpoint (``--init``) and/or with
  offline data mixed into the batches (WSRL, RLPD, SAC Flow O2O).
- ``world-model``: dataset -> a dynamics ensemble fitted epoch by epoch with early stopping (``dynamics``).
- ``model-based``: dataset -> a fitted model (``--model RUN`` or fitted first) -> imagined rollouts of the
  current actor through the collector the entry names (``collector``): by default k-step rollouts from dataset
  states into a flat model buffer -> ``update(batch)`` on real and imagined rows (MBPO, MOPO, RAVL);
  ``collector="tapes"``: real history prefixes continued by a recurrent actor (one member per rollout,
  uncertainty truncation) -> episode tapes -> ``update(tapes)`` (NeuBay). An algorithm of the tapes collector
  also has the collector's ``warm_up`` / ``advance`` / ``sample_action`` (``world_models.history.HistoryAgent``)
  and ``reset_state(n)`` / ``observe(reward, done)`` for its acting state; a ``schedule(progress)`` runs before
  every update.
- ``actor-learner``: actors (in-process, worker processes or Ray) collect ``[T, N]`` segments with the weights they
  last received -> the learner's ``update(segments)`` with off-policy correction (IMPALA's V-trace, DoMo-AC). Such
  an algorithm also has ``sample(obs) -> (action, log_prob)`` and ``policy_state()`` / ``load_policy_state()`` (the
  weights an actor needs).
- ``demonstrations``: demonstrations in the LeRobot layout -> ``update(batch)`` of a vision-language-action model
  (``ctrl_rl.vla``; VLA BC, HABC); evaluated in the env by success rate. Such an algorithm also has a
  ``model`` (``vla.model.VLAModel``) and ``start_from(policy_state)`` (``vla.model.DemonstrationLearner``).
- ``chunk-rollouts``: envs stepped one action chunk at a time, beside demonstrations -> ``update({rollout, demos,
  own})`` (VLA RL). Such an algorithm is also a ``vla.rollouts.ChunkLearner`` (chunk sampling, its value, what each
  update reads).

The algorithm contract is ``ctrl_rl.core.protocols.Algorithm`` (``act``, ``update(batch) -> dict[str, Tensor]``,
``state_dict`` / ``load_state_dict``, ``parameters_finite``, ``exportable``, ``gen``) with the capability protocols
beside it (on-policy sampling, schedules, actor weights, recurrent acting state); the ``world-model`` regime's entry
builds a ``ctrl_rl.world_models.protocol.DynamicsModel`` instead. ``tests/algos/test_contract.py`` checks every
registered entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctrl_rl.core.protocols import Algorithm, Info
from ctrl_rl.core.seeds import SeedLayout
from ctrl_rl.errors import UserInputError, did_you_mean
from ctrl_rl.world_models.protocol import DynamicsModel

# update_step(algo, sampler, batch_size, config) -> info: one update drawing its batch(es) from ``sampler``
UpdateStep = Callable[[Any, Any, int, Any], Info]


def default_update_step(algo: Algorithm, sampler: Any, batch_size: int, config: Any) -> Info:
    """One update on one batch of ``batch_size`` drawn with the algorithm's generator."""
    return algo.update(sampler.sample(batch_size, algo.gen))


@dataclass(frozen=True)
class AlgoEntry:
    """One registered algorithm. Only ``name``, ``config``, ``make``, ``regime`` and ``summary`` are required."""

    name: str
    """The name users type: ``ctrl-rl train NAME``."""
    config: type
    """Frozen dataclass of the algorithm's hyperparameters (every field becomes a flag)."""
    make: Callable[..., Algorithm | DynamicsModel]
    """``make(config, spec, device, generator, **loop_kwargs) -> algorithm`` (a dynamics model for the
    ``world-model`` regime)."""
    regime: str
    """The data flow that trains it: a regime registered by a loop of ``ctrl_rl.learn`` (``learn/regimes.py``)."""
    summary: str
    """One line for ``ctrl-rl list algos``."""
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Config fields this entry sets on ``config`` (a variant, e.g. Cal-QL = CQL with ``calql=True``)."""
    run_defaults: Mapping[str, Any] = field(default_factory=dict)
    """RunConfig fields this algorithm starts from when no preset gives them (budget, log intervals, ...)."""
    loop_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Loop config fields this algorithm starts from (batch size, warm-up, offline ratio, ...)."""
    update_step: UpdateStep = default_update_step
    """How one update draws its batch(es) (WSRL: several critic minibatches; SAC Flow O2O: its own loss)."""
    pretrain_step: UpdateStep | None = None
    """Offline-to-online only: the update of an offline pre-training phase of ``--offline-steps`` gradient
    steps on ``--dataset``, run as an offline run whose checkpoint the online run starts from."""
    prepare_offline: Callable[[Any, Any, Any], tuple[Any, dict]] | None = None
    """Offline only: ``prepare_offline(dataset, buffer, config) -> (sampler, record)`` (IQL's reward scale,
    Cal-QL's Monte-Carlo returns); ``record`` goes into the checkpoint."""
    init_from: tuple[str, ...] = ()
    """Algorithms whose checkpoints can start this one (``--init``); empty: ``--init`` is refused."""
    init_fields: tuple[str, ...] = ()
    """Config fields that fix parameter shapes: with ``--init`` they are taken from the checkpoint's config."""
    requires_init: bool = False
    """``--init`` is required (WSRL fine-tunes a pre-trained run)."""
    requires_dataset: bool = False
    """``--dataset`` is required (offline learners, RLPD, SAC Flow O2O)."""
    continuous_only: bool = True
    """The algorithm needs continuous actions."""
    scale_envs: Callable[[int, Any, int], tuple[int, Any]] | None = None
    """``scale_envs(num_envs, config, k) -> (num_envs, config)``: the co-scaling rule behind ``--scale-envs``."""
    distributed: bool = False
    """Runs data-parallel under torchrun."""
    collector: str | None = None
    """Model-based only: how the model's rollouts reach the agent, one of the collectors the regime offers
    (``learn/model_based.py``): None, k-step rollouts into a flat replay buffer; ``"tapes"``, history rollouts of a
    recurrent agent into a tape buffer. It picks the loop config (and so the flags) the entry trains with."""
    seed_layout: SeedLayout | None = None
    """What of an instance ``core.seeds.batch_seeds`` batches so that ``--seeds`` trains several seeds in one
    process (the algorithm's ``update`` then counts dimensions from the end); None: ``--seeds`` is refused."""
    model_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Model-based only: the world model's config fields this agent fits with when no ``--model`` is given
    (NeuBay: a LayerNorm residual ensemble); empty: the world-model entry's defaults."""

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.config):
            raise TypeError(f"algorithm {self.name!r}: config must be a dataclass, got {self.config!r}")
        names = {f.name for f in dataclasses.fields(self.config)}
        unknown = set(self.config_defaults) - names
        if unknown:
            raise ValueError(f"algorithm {self.name!r}: config_defaults name unknown fields {sorted(unknown)}")

    def default_config(self, **overrides: Any) -> Any:
        """The config this entry trains with by default, with ``overrides`` applied."""
        return self.config(**{**self.config_defaults, **overrides})


_REGISTRY: dict[str, AlgoEntry] = {}


def register(entry: AlgoEntry, replace: bool = False) -> AlgoEntry:
    """Add ``entry``; a second entry of the same name is refused unless ``replace``."""
    if entry.name in _REGISTRY and not replace:
        raise ValueError(f"algorithm {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_builtin() -> None:
    import ctrl_rl.algos  # noqa: F401  (its __init__ imports every algorithm file, which registers itself)


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def entries() -> list[AlgoEntry]:
    _load_builtin()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def get(name: str) -> AlgoEntry:
    """The entry called ``name``, or one sentence naming the unknown name and the known ones."""
    _load_builtin()
    if name not in _REGISTRY:
        family = sorted(n for n in _REGISTRY if n.startswith(f"{name}_"))  # a family's prefix: its members
        hint = f" (the algorithms of that name are {family})" if family else did_you_mean(name, _REGISTRY)
        raise UserInputError(f"unknown algorithm {name!r}{hint}: expected one of {sorted(_REGISTRY)}")
    return _REGISTRY[name]
