"""MOPO (Yu et al., "MOPO: Model-based Offline Policy Optimization", NeurIPS 2020): SAC on model rollouts
whose rewards are penalised by the model's uncertainty, r~ = r - lambda * max_i ||Sigma_i(s, a)||_F (the
largest predicted standard-deviation norm over the elites).

Defaults are the official code's (tianheyu927/mopo, examples/config/d4rl/base*.py): 7 members, 5 elites,
rollouts of 50,000 starts every 1000 gradient steps kept for 5 rounds, real ratio 0.05, gamma 0.99, tau
5e-3, 2x256 SAC networks, and per dataset (D4RL v0 there) rollout length h and penalty lambda:

    halfcheetah-medium h=1 lambda=1   halfcheetah-medium-replay h=5 lambda=1
    hopper-medium      h=5 lambda=5   hopper-medium-replay      h=5 lambda=1
    walker2d-medium    h=5 lambda=5   walker2d-medium-replay    h=1 lambda=1

The presets ``mopo-<dataset>`` under experiments/presets carry these pairs. MOPO is SAC (``algos/sac.py``) on the
model-based loop with the penalty on: ``penalty`` and ``penalty_kind`` are the loop's settings
(``learn.config.FlatRolloutsLoopConfig``), which this entry's ``loop_defaults`` set.
"""

from __future__ import annotations

from ctrl_rl.algos.mbpo import MODEL_BASED_RUN
from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SACConfig

register(AlgoEntry(
    "mopo", SACConfig, SAC, regime="model-based",
    summary="MOPO: SAC on model rollouts with rewards penalised by the model's predicted uncertainty",
    loop_defaults={"penalty": 1.0, "penalty_kind": "aleatoric"},
    run_defaults=MODEL_BASED_RUN, continuous_only=True, requires_dataset=True))
