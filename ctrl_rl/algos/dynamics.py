"""``dynamics``: a batched Gaussian ensemble of the environment's dynamics and reward, fitted on a dataset
(``ctrl-rl train dynamics --env Hopper-v5 --dataset hopper-medium-v5``); the run's ``model.pt`` is what the
model-based agents (mbpo, mopo, ravl) take with ``--model RUN``. The model and its fit live in
``ctrl_rl.world_models.ensemble``; the loop in ``ctrl_rl.learn.model_based``. Defaults are RAVL's (7 members of
4x200 SiLU, 5 elites, per-layer weight decay, 20% holdout, early stopping after 5 epochs without a 1% gain);
NeuBay's model (docs/algorithms/dynamics.md#neubays-model) is the ``neubay`` entry's ``model_defaults``: 128 members,
100 elites,
LayerNorm blocks with LeakyReLU, log sigma soft-clamped (``--logvar-bounds fixed``).
"""

from __future__ import annotations

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.world_models.ensemble import DynamicsConfig, EnsembleDynamics


def make_dynamics(config: DynamicsConfig, spec, device="cpu", generator=None) -> EnsembleDynamics:
    """An unfitted ensemble for ``spec``'s observation and action sizes (weights from torch's seeded RNG)."""
    return EnsembleDynamics(spec.obs_dim, spec.action_dim, config).to(device)


register(AlgoEntry(
    "dynamics", DynamicsConfig, make_dynamics, regime="world-model",
    summary="dynamics ensemble fitted on --dataset (Gaussian members, elites, early stopping) for --model RUN",
    run_defaults={"num_envs": 1, "total_steps": 2000, "log_every": 1, "checkpoint_every": 1, "eval_every": 0},
    continuous_only=True, requires_dataset=True))
