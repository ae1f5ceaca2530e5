"""RAVL (Sims et al., "The Edge-of-Reach Problem in Offline Model-Based RL", NeurIPS 2024; docs/algorithms/ravl.md).

Short model rollouts (k = 5) from dataset states and no dynamics penalty; the value pessimism that handles
the edge-of-reach states comes from an EDAC critic ensemble instead: N = 10 critics, the TD target takes the
minimum over all of them, and a diversity term pushes apart the members' action-gradients at the batch's
actions,

    L_Q   = sum_i mean_batch (Q_i - y)^2 + eta * L_div
    L_div = 1/(N-1) * mean_batch sum_{i != j} <g_i, g_j>,   g_i = grad_a Q_i(s, a) / ||grad_a Q_i(s, a)||

Defaults are the code defaults of the paper's repository (anyasims/edge-of-reach): 3x256 actor and critics
with EDAC's initialisation, lr 3e-4, gamma 0.99, tau 5e-3, real-data ratio 0.05, batch 256, 1000 gradient
steps between rollout rounds of 50,000 starts. The per-dataset (N, eta, k, r) of the paper's appendix were
not checked (docs/algorithms/ravl.md#per-dataset-settings), so no per-dataset presets claim them.

RAVL is SAC (``algos/sac.py``) with these settings (``RAVL_SAC``): SAC-N's summed critic loss
(``critic_reduction="sum"``), EDAC's diversity term (``edac_eta``, ``core.losses.edac_diversity``) and EDAC's
initialisation (``edac_init``), EDAC's update order (``update_order="actor_first"``: temperature, actor, then
critic), on the model-based loop without a penalty (``learn.config.FlatRolloutsLoopConfig``'s
defaults).
"""

from __future__ import annotations

from ctrl_rl.algos.mbpo import MODEL_BASED_RUN
from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SACConfig

# RAVL's code defaults: 3x256 actor and critics, N = 10 critics with the minimum over all of them in the target,
# each member's batch mean summed (SAC-N, EDAC), eta = 1, EDAC's initialisation
# and its update order: temperature, actor, then critic (``update_order="actor_first"``; the official agent's
# ``update``, CORL's EDAC)
RAVL_SAC = {"actor_hidden": (256, 256, 256), "critic_hidden": (256, 256, 256), "num_critics": 10, "target_subset": 10,
            "critic_reduction": "sum", "edac_eta": 1.0, "edac_init": True, "update_order": "actor_first"}

register(AlgoEntry(
    "ravl", SACConfig, SAC, regime="model-based",
    summary="RAVL: model rollouts without a dynamics penalty, EDAC critic ensemble for value pessimism",
    config_defaults=RAVL_SAC, run_defaults={**MODEL_BASED_RUN, "total_steps": 3_000_000}, continuous_only=True,
    requires_dataset=True))
