"""Online fine-tuning configs: WSRL, the RLPD baseline and fine-tuning with the offline data retained.

Paper: Zhou, Peng, Li, Levine, Kumar 2025, "Efficient Online RL Fine-Tuning Need Not Retain Offline Data"
(code zhouzypaul/wsrl @ 891ee35, ``wsrl_config`` = ``sac_config`` + overrides; ALGORITHMS.md §1.4).

All three are SAC (``ctrl_rl.algos.sac``) driven by the off-policy loop with three switches:

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
more than any run here); the stored actions are clipped to ``+-action_clip`` as WSRL does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ctrl_rl.algos.sac import SACConfig

# Fields that fix the parameter shapes: with --init they come from the checkpoint's config.
NETWORK_FIELDS = ("actor_hidden", "critic_hidden", "activation", "num_critics", "layer_norm", "actor_layer_norm")


@dataclass(frozen=True)
class WSRLSACConfig(SACConfig):
    """SAC with the networks and optimizer settings WSRL pre-trains (CQL, Cal-QL) and fine-tunes with: 10
    critics with subset 2, LayerNorm in actor and critics (``--use_redq``), no entropy term in the target
    (ALGORITHMS.md §1.3-1.4). A checkpoint of one loads into the others."""

    num_critics: int = 10
    """E: critic ensemble size (WSRL ``add_redq_config``: 10)."""
    target_subset: int = 2
    """M: critics in the target min (and CQL's term) (WSRL ``critic_subsample_size`` 2)."""
    layer_norm: bool = True
    """LayerNorm after every hidden layer of the critics (WSRL ``--use_redq``)."""
    actor_layer_norm: bool = True
    """LayerNorm after every hidden layer of the actor (WSRL ``--use_redq``; SAC needs the same actor to load it)."""
    final_hidden_scale: float = 1e-2
    """Initial-weight scale of the last hidden layer of actor and critics (WSRL ``kernel_scale_final`` 1e-2)."""
    actor_lr: float = 1e-4
    """Actor Adam learning rate (WSRL sac_config 1e-4)."""
    critic_lr: float = 3e-4
    """Critic Adam learning rate (WSRL sac_config 3e-4)."""
    alpha_lr: float = 1e-4
    """Temperature Adam learning rate (WSRL sac_config 1e-4)."""
    backup_entropy: bool = False
    """Entropy term in the TD target (WSRL: False)."""
    action_clip: float = 0.99999
    """Dataset and stored actions are clipped to +-this (WSRL ``--clip_action``), inside tanh's open range."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.action_clip <= 1 or self.final_hidden_scale <= 0:
            raise ValueError("invalid setting: expected 0 < action_clip <= 1 and final_hidden_scale > 0")


@dataclass(frozen=True)
class WSRLConfig(WSRLSACConfig):
    """WSRL fine-tuning: SAC with WSRL's locomotion settings (10 critics, subset 2, LayerNorm, batch 1024 in
    4 critic minibatches, 5k-step warm-up with the frozen pre-trained policy, no offline data)."""

    init: str | None = None
    """Pre-trained run directory or checkpoint (cql, calql or sac) to start from (WSRL: required)."""
    offline_ratio: float = 0.0
    """Fraction of every batch drawn from --dataset (WSRL 0: no offline data; RLPD and retained 0.5)."""
    warmup_actions: Literal["policy", "random"] = "policy"
    """Who acts during the first learning_starts env steps (no updates then): the policy or uniform random."""
    critic_splits: int = 4
    """Critic minibatches per batch: batch_size / critic_splits transitions each, one critic step each."""
    batch_size: int = 1024
    """Transitions per batch update (WSRL 1024)."""
    learning_starts: int = 5_000
    """Warm-up env steps without updates (WSRL 5,000)."""
    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.offline_ratio <= 1.0:
            raise ValueError(f"invalid offline_ratio {self.offline_ratio}: expected a fraction in [0, 1]")
        if self.critic_splits < 1 or self.batch_size % self.critic_splits:
            raise ValueError(f"invalid critic_splits {self.critic_splits}: expected a positive divisor of "
                             f"batch_size {self.batch_size}")
        if self.warmup_actions not in ("policy", "random"):
            raise ValueError(f"invalid warmup_actions {self.warmup_actions!r}: expected 'policy' or 'random'")


@dataclass(frozen=True)
class RLPDConfig(WSRLConfig):
    """The RLPD-style baseline of WSRL's code: the same SAC, no pre-training, 50/50 offline/online batches,
    uniform random actions during the first learning_starts env steps."""

    offline_ratio: float = 0.5
    """Fraction of every batch drawn from --dataset (RLPD: 0.5)."""
    warmup_actions: Literal["policy", "random"] = "random"
    """Who acts during the first learning_starts env steps (no updates then): the policy or uniform random."""
