"""HABC: VLA behaviour cloning (``algos/vla_bc.py``) with each demonstration frame weighted by HABC's weighting
(``vla.habc.HABCWeighting``: a viability and an efficiency critic, a gate between their advantages, exp(A / beta)
clipped), so that failed episodes contribute too. docs/algorithms/vla.md#habc has the equations, the defaults and
why the implementable form is marked unverified.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.vla_bc import VLA_INIT_FROM, VLA_RUN_DEFAULTS, VLABC
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.vla.habc import HABCConfig, HABCWeighting
from ctrl_rl.vla.model import SHAPE_FIELDS, VLAModelConfig


@dataclass(frozen=True)
class VLAHABCConfig(HABCConfig, VLAModelConfig):
    """The VLA model's fields (``VLAModelConfig``), then HABC's weighting fields (``HABCConfig``); the bases are in
    this order so that the flags list the model first."""

    def __post_init__(self) -> None:
        VLAModelConfig.__post_init__(self)
        HABCConfig.__post_init__(self)


def make(config: VLAHABCConfig, spec: EnvSpec, device: torch.device, generator: torch.Generator) -> VLABC:
    return VLABC(config, spec, device, generator, weighting=HABCWeighting(config, device))


register(AlgoEntry(
    "vla_habc", VLAHABCConfig, make, regime="demonstrations",
    summary="VLA behaviour cloning weighted by HABC's viability and efficiency critics (successes and failures)",
    requires_dataset=True, init_from=VLA_INIT_FROM, init_fields=SHAPE_FIELDS, run_defaults=VLA_RUN_DEFAULTS))
