"""Online fine-tuning: WSRL, the RLPD baseline and fine-tuning with the offline data retained.

Paper: Zhou, Peng, Li, Levine, Kumar 2025, "Efficient Online RL Fine-Tuning Need Not Retain Offline Data"
(code zhouzypaul/wsrl @ 891ee35, ``wsrl_config`` = ``sac_config`` + overrides;
docs/algorithms/wsrl.md#the-batch-update).

All three are SAC (``ctrl_rl.algos.sac``) with WSRL's network and optimizer settings (``WSRL_SAC``), trained by
the off-policy loop with three loop settings (``OffPolicyLoopConfig``):

* ``init``: a CQL / Cal-QL / SAC checkpoint whose actor, critic ensemble, target critics and temperature
  (and optimizer states) start the fine-tuning. The network shape fields are taken from that checkpoint.
* ``offline_ratio`` with ``--dataset``: the fraction of every batch drawn from the offline data (RLPD 0.5).
* ``warmup_actions``: what acts during the first ``learning_starts`` env steps, in which no parameter is
  updated: the (frozen) policy, sampling from it (WSRL's warm-up), or uniform random actions (RLPD).

Every env step makes ``utd_ratio`` "batch updates"; one batch update draws ``batch_size`` transitions as
``critic_splits`` minibatches, takes one critic step (and target update) per minibatch and then one actor
and one temperature step on the whole batch (WSRL: 1024 = 4 x 256, so UTD 4 for the critic, 1 for the actor).

    WSRL:      ctrl-rl train wsrl --init RUN_DIR --env Hopper-v5
    RLPD:      ctrl-rl train rlpd --dataset hopper-medium-replay-v5 --env Hopper-v5
    retained:  ctrl-rl train wsrl --init RUN_DIR --env Hopper-v5 --dataset hopper-medium-replay-v5 --offline-ratio 0.5

Deliberate deviations: the mixed batches are drawn per minibatch (each critic minibatch holds the same
offline fraction; the code draws one batch then cuts it); the replay capacity defaults to 1M (the code: 2M,
more than any run here); the stored actions are clipped to ``+-0.99999`` as WSRL does (``--clip-actions``).
"""

from __future__ import annotations

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SACConfig, _update_step

# SAC with the networks and optimizer settings WSRL pre-trains (CQL, Cal-QL) and fine-tunes with: 10 critics
# with subset 2, LayerNorm in actor and critics (``--use_redq``), the last hidden layer initialised at 1e-2
# scale (``kernel_scale_final``), actor lr 1e-4, critic lr 3e-4, temperature lr 1e-4 (sac_config), no entropy
# term in the target (docs/algorithms/wsrl.md#defaults). A checkpoint of one loads into the others.
WSRL_SAC = {"num_critics": 10, "target_subset": 2, "layer_norm": True, "actor_layer_norm": True,
            "final_hidden_scale": 1e-2, "actor_lr": 1e-4, "critic_lr": 3e-4, "alpha_lr": 1e-4, "backup_entropy": False}

# Config fields that fix the parameter shapes: with --init they come from the checkpoint's config.
NETWORK_FIELDS = ("actor_hidden", "critic_hidden", "activation", "num_critics", "layer_norm", "actor_layer_norm")

# Checkpoints whose state loads into SAC (their actor, critics and temperature).
SAC_CHECKPOINTS = ("cql", "calql", "sac", "wsrl", "rlpd")

_ONLINE_RUN = {"num_envs": 1, "total_steps": 500_000, "log_every": 1000, "checkpoint_every": 25_000,
               "eval_every": 20_000}
# WSRL: batch 1024 (4 critic minibatches of 256), 5k warm-up steps with the frozen policy, no offline data
_WSRL_LOOP = {"batch_size": 1024, "learning_starts": 5_000, "warmup_actions": "policy", "clip_actions": 0.99999}

register(AlgoEntry(
    "wsrl", SACConfig, SAC, regime="offline-to-online",
    summary="WSRL: online SAC fine-tuning of a cql/calql run (--init), warm-up with the frozen policy, no offline data",
    config_defaults={**WSRL_SAC, "critic_splits": 4}, run_defaults=_ONLINE_RUN, loop_defaults=_WSRL_LOOP,
    update_step=_update_step, init_from=SAC_CHECKPOINTS, init_fields=NETWORK_FIELDS, requires_init=True))

register(AlgoEntry(
    "rlpd", SACConfig, SAC, regime="offline-to-online",
    summary="RLPD baseline: online SAC from scratch with 50/50 offline (--dataset) and online batches",
    config_defaults={**WSRL_SAC, "critic_splits": 4}, run_defaults=_ONLINE_RUN,
    loop_defaults={**_WSRL_LOOP, "warmup_actions": "random", "offline_ratio": 0.5},
    update_step=_update_step, init_from=SAC_CHECKPOINTS, init_fields=NETWORK_FIELDS, requires_dataset=True))
