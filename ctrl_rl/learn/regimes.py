"""Regimes: one registered object per way data moves through training, each with its loop and its loop config.

An algorithm's registry entry names its regime (``AlgoEntry.regime``); the regime says which loop runs it, which
loop config holds that loop's settings (``RunConfig.loop``; on the command line beside the run's and the
algorithm's flags; where the loop has several collectors, the one the entry names: ``AlgoEntry.collector``) and
whether the run ends with a policy. Each loop module registers the regime(s) it runs at its
end, the way each algorithm file registers its entry; this module only holds the registry, so no other table of
regime names exists (``tests/learn/test_regimes.py``).

    register_regime(Regime("on-policy", OnPolicyLoopConfig, train_onpolicy, summary="envs -> rollouts -> update"))

Every ``train`` has one signature: ``train(run, algo_name, cfg, run_dir, resume, max_iterations, dist_info)``.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ctrl_rl.errors import UserInputError, did_you_mean

if TYPE_CHECKING:
    from ctrl_rl.learn.config import RunConfig
    from ctrl_rl.learn.distributed import DistInfo
    from ctrl_rl.learn.runtime import TrainResult



class TrainFn(Protocol):
    def __call__(self, run: RunConfig, algo_name: str, cfg: Any, run_dir: Path, resume: bool,
                 max_iterations: int | None, dist_info: DistInfo) -> TrainResult: ...


class SeedsTrainFn(Protocol):
    def __call__(self, runs: Sequence[RunConfig], algo_name: str, cfg: Any, run_dirs: Sequence[Path], resume: bool,
                 max_iterations: int | None) -> list[TrainResult]: ...


@dataclass(frozen=True)
class Regime:
    name: str
    """What ``AlgoEntry.regime`` says: the data flow, never an algorithm's name."""
    loop_config: type
    """The frozen dataclass of the loop's settings (``RunConfig.loop``)."""
    train: TrainFn
    """Runs one algorithm of this regime from ``run`` into ``run_dir`` (resumable)."""
    summary: str
    """The data flow in one line, for ``ctrl-rl list algos`` and the docs."""
    has_policy: bool = True
    """False where a run ends with no policy to evaluate or export (a fitted dynamics model)."""
    collectors: Mapping[str, type] = field(default_factory=dict)
    """A loop whose data goes through a collector the entry names (``AlgoEntry.collector``; the model-based loop):
    the loop config class of each collector besides the default one, whose class is ``loop_config``."""

    train_seeds: SeedsTrainFn | None = None
    """Runs several seeds of one algorithm in one process (``--seeds``, ``learn/seeds.py``), or None where the
    loop cannot."""

    def loop_config_for(self, collector: str | None) -> type:
        """The loop config class of an entry of this regime that names ``collector`` (None: the default)."""
        if collector is None:
            return self.loop_config
        if collector not in self.collectors:
            raise UserInputError(f"collector {collector!r}{did_you_mean(collector, self.collectors)} is not one the "
                                 f"{self.name} regime offers: expected None or one of {sorted(self.collectors)}")
        return self.collectors[collector]


_REGIMES: dict[str, Regime] = {}


def register_regime(regime: Regime) -> Regime:
    if regime.name in _REGIMES and _REGIMES[regime.name] is not regime:
        raise ValueError(f"regime {regime.name!r} is already registered")
    _REGIMES[regime.name] = regime
    return regime


def _load_builtin() -> None:
    """Import every module of ``ctrl_rl.learn`` once: the loop modules register their regimes when imported."""
    import ctrl_rl.learn as learn

    for mod in pkgutil.iter_modules(learn.__path__):
        importlib.import_module(f"ctrl_rl.learn.{mod.name}")


def regimes() -> list[Regime]:
    _load_builtin()
    return [_REGIMES[n] for n in sorted(_REGIMES)]


def get_regime(name: str) -> Regime:
    """The regime called ``name``, or one sentence naming it and the registered ones."""
    _load_builtin()
    if name not in _REGIMES:
        close = difflib.get_close_matches(str(name), _REGIMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserInputError(f"unknown regime {name!r}{hint}: expected one of {sorted(_REGIMES)}")
    return _REGIMES[name]
