"""DoMo-AC: doubly multi-step off-policy actor-critic (Tang et al., ICML 2023, arXiv 2305.18501).

The paper combines a multi-step policy **improvement** (kappa) with a multi-step off-policy **evaluation**
(lambda) on the IMPALA architecture. Its equations could not be read here (no full text and no public code
were reachable); the update below is derived from the abstract and the theory it names, and is not checked
against the paper. What was derived, and how:

1. Improvement. The kappa-greedy policy w.r.t. a value ``v`` (Efroni et al. 2018, "Beyond the One-Step Greedy
   Approach in RL") is the optimal policy of a surrogate MDP with reward ``r + (1 - kappa) gamma v(x')`` and
   discount ``kappa gamma``. kappa = 0 gives the one-step greedy policy; kappa = 1 gives the optimal policy of
   the true MDP. A practical actor-critic takes a policy-gradient step on the surrogate objective rather than
   solving it.
2. Its advantage, estimated off-policy from the behaviour policy's segments. Take the critic ``V`` as
   baseline and V-trace's evaluation target ``vs`` as the value ``v`` in the surrogate reward. Expand the
   surrogate return over the segment with kappa-gamma discounting. Weight the first step by
   ``min(pg_rho_bar, pi/mu)`` and each later step by a truncated trace ``min(c_bar, pi/mu)``; the truncation
   is the bias/variance knob the abstract names. The result is ``core.returns.domo_advantage``:
   ``A_t = rho_t * sum_j (kappa gamma)^j (prod c) d_{t+j}``, with
   ``d = r + gamma ((1 - kappa) vs' + kappa V') - V``.
3. Evaluation. The critic regresses on V-trace targets with trace ``lambda``
   (``c = lambda * min(c_bar, pi/mu)``).

Limits (tests/core/test_returns.py):
- kappa = 0 gives IMPALA's V-trace policy gradient exactly.
- On-policy data with full traces (lambda = 1) gives the Monte Carlo advantage for every kappa, and the
  critic learns the lambda-returns.
- lambda = 0 gives one-step TD targets.

Everything else (networks, optimizer, losses, loop) is ``algos/impala.py``. The defaults are choices made here,
not the paper's (its Atari hyperparameters were not available): kappa 0.5, halfway between the one-step and the
full lookahead, and lambda 0.95 where IMPALA keeps V-trace's 1. With lambda = 1 and data from the current policy
(in-process actors with weights sent every update) the advantage is the Monte Carlo one for every kappa, so
DoMo-AC would be IMPALA at its defaults; below 1 the evaluation bootstraps and kappa acts on every batch, lagged or
not. 0.95 is the trace most actor-critic defaults use (GAE's lambda in PPO), close enough to 1 to keep the
evaluation's bias small (tests/algos/test_domo_defaults.py).
"""

from __future__ import annotations

from ctrl_rl.algos.impala import IMPALA, IMPALAConfig
from ctrl_rl.algos.registry import AlgoEntry, register

DEFAULT_KAPPA = 0.5
DEFAULT_LAMBDA = 0.95

register(AlgoEntry(
    "domo_ac", IMPALAConfig, IMPALA, regime="actor-learner",
    summary="DoMo-AC: V-trace evaluation (lambda) + kappa-greedy multi-step improvement on the actor-learner loop",
    config_defaults={"kappa": DEFAULT_KAPPA, "trace_lambda": DEFAULT_LAMBDA}, continuous_only=False,
    run_defaults={"total_steps": 200_000, "num_envs": 8, "log_every": 10, "checkpoint_every": 100}))
