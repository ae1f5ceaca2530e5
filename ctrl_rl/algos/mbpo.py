"""Model-based offline SAC: SAC trained on k-step rollouts of a learned dynamics model started from dataset
states, mixed with real transitions (MBPO's data flow, run offline as in MOPO and RAVL; docs/algorithms/mbpo.md).

``mbpo`` is the plain baseline: SAC (``algos/sac.py``) with no penalty and no value pessimism beyond its clipped
double Q. It is the method of the RAVL paper's edge-of-reach experiment whose Q-values blow up even with the true
dynamics (docs/algorithms/mbpo.md#the-edge-of-reach-problem); SAC logs the ``stats/q_max`` and
``stats/q_member_std`` that experiment plots. MOPO (``algos/mopo.py``) is the same entry with a reward penalty
in the loop's settings; RAVL (``algos/ravl.py``) is SAC with an EDAC critic ensemble. How the model's rollouts
feed the agent (``rollout_length``, ``real_ratio``, ``penalty``, ``penalty_kind``, ``member_mode``, the rollout
starts and interval) are settings of the model-based loop (``learn.config.FlatRolloutsLoopConfig``,
``learn/model_based.py``), given on the command line beside SAC's.
"""

from __future__ import annotations

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SACConfig

MODEL_BASED_RUN = {"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 20_000,
                   "eval_every": 10_000, "eval_episodes": 10}

register(AlgoEntry(
    "mbpo", SACConfig, SAC, regime="model-based",
    summary="model-based offline SAC on k-step model rollouts, no penalty (the edge-of-reach baseline)",
    run_defaults=MODEL_BASED_RUN, continuous_only=True, requires_dataset=True))
