"""Soft Actor-Critic with a batched critic ensemble (REDQ-style target subset).

Papers: Haarnoja et al. 2018 ("Soft Actor-Critic", automatic temperature in the 2018 applications paper);
Chen et al. 2021 (REDQ: N critics, a random subset of M for the target). docs/algorithms/sac.md#losses.

Losses for a batch (s, a, r, s', terminated):

    a' ~ pi(.|s'),  Q_t = min_{i in random subset of size M} Qbar_i(s', a')
    y  = r + gamma * (1 - terminated) * (Q_t - [backup_entropy] * alpha * log pi(a'|s'))
    L_Q     = mean_i mean_batch (Q_i(s, a) - y)^2          (every member regresses to the same y)
              [+ eta * L_div]                              (EDAC, ``edac_eta > 0``)
    L_pi    = mean_batch (alpha * log pi(a|s) - Qagg(s, a)),  a ~ pi(.|s),  Qagg = min or mean over members
    L_alpha = -mean_batch (log_alpha * (log pi(a|s) + H_target))

Only true terminations stop the bootstrap: a truncated transition's ``next_obs`` is the final
observation of its episode (the protocol's ``final_obs``) and is bootstrapped like any other.
Target critics move by Polyak averaging with a fused in-place lerp. N=2, M=2 is classic SAC.

SAC-N and EDAC (An et al. 2021, "Uncertainty-Based Offline RL with Diversified Q-Ensemble"; RAVL's critics,
docs/algorithms/ravl.md#losses) are settings, not subclasses: ``critic_reduction="sum"`` sums the members'
batch means (``L_Q = sum_i mean_batch (Q_i - y)^2``, SAC-N), ``edac_eta > 0`` adds EDAC's gradient-diversity
term ``core.losses.edac_diversity`` of the members' action-gradients at the batch's actions, and
``edac_init`` is EDAC's initialisation. Every critic step also logs the ensemble's largest Q of the batch and
the spread of the members (``stats/q_max``, ``stats/q_member_std``: the edge-of-reach plots read them).

CrossQ (Bhatt et al., ICLR 2024), ``crossq=True``: BatchRenorm in the critics (and optionally the actor),
no target network, and one joint critic forward of the ``(s, a)`` and ``(s', a')`` batches so both
halves share the batch statistics; the target is the detached second half. The actor is evaluated
with the critics in evaluation mode (running statistics). CrossQ also uses Adam beta1 = 0.5 and a
policy delay of 3 (``adam_beta1``, ``policy_delay``).

The actor is pluggable: any module with ``sample(obs, generator) -> (action [B,A], log_prob [B])`` in
``[-1, 1]`` and ``mode(obs) -> action`` works (SAC Flow's flow policies use this; flat observations only).

Observations (``ctrl_rl.core.obs``): flat ``[B,O]`` observations go to actor and critics as they are (no
encoder, no extra op), or through a running mean/std normalizer with ``obs_norm`` (FastTD3/FastSAC, Seo et al.
2025: statistics of every env step's observations; the replay keeps raw observations, each batch is normalized
with the current statistics; the export folds them in). An n-step batch (``Transition.discount``, the loop's
``--n-step``) bootstraps with its per-transition discount instead of ``gamma``. Observations with several
parts (camera images, a proprio ``state``) follow DrQ (Kostrikov, Yarats & Fergus 2021, "Image Augmentation Is
All You Need") as DrQ-v2 (Yarats et al. 2022) writes it: one encoder (``core.encoders.make_encoder``,
``config.encoder``) maps a batch to features ``[B,F]``; the critics share it and the critic loss trains it; the
actor reads the same batch's features detached (the actor loss never trains the encoder), computed once per
update before the critic step.
With ``drq_pad > 0`` the image parts of obs and next_obs are randomly shifted in every update (DrQ's
augmentation, one draw per sample: DrQ's K = M = 1, as DrQ-v2). Deliberate deviation from DrQ: DrQ keeps a
target encoder (Polyak-averaged with the target critics); here the target's features phi(s') come from
the online encoder under no_grad, as in DrQ-v2.

Shape letters: E critic members, B batch, O obs dim, F features, A action dim.
"""

from __future__ import annotations

import abc
import copy
import math
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.distributions import LOG_STD_MAX, LOG_STD_MIN, tanh_normal_sample
from ctrl_rl.core.encoders import Encoder, EncoderFields, make_encoder, random_shift_obs
from ctrl_rl.core.losses import edac_diversity, td_target
from ctrl_rl.core.nets import Activation, BatchRenorm, EnsembleLinear, EnsembleMLP, RunningNorm, mlp
from ctrl_rl.core.obs import Obs, obs_cat
from ctrl_rl.core.optim import adam_step, set_grads
from ctrl_rl.core.policies import DeterministicPolicy
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.seeds import SeedLayout, randperm
from ctrl_rl.core.types import Transition
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class SACConfig(EncoderFields):
    """SAC hyperparameters (defaults: the SAC paper's MuJoCo settings)."""

    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the policy network."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each critic."""
    activation: Activation = "relu"
    """Hidden activation of actor and critics."""
    num_critics: int = 2
    """N: critic ensemble size (computed in one batched call)."""
    target_subset: int = 2
    """M: critics drawn at random for the min in the target (M = N: clipped double-Q over all)."""
    layer_norm: bool = False
    """LayerNorm after every hidden layer of the critics."""
    actor_layer_norm: bool = False
    """LayerNorm after every hidden layer of the actor (WSRL's CQL pre-training and fine-tuning)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_alpha: float = 1.0
    """Initial temperature."""
    learn_alpha: bool = True
    """Tune the temperature towards target_entropy (False: keep init_alpha)."""
    target_entropy: float | None = None
    """Target policy entropy (None: -|A|)."""
    backup_entropy: bool = True
    """Subtract alpha * log pi(a'|s') inside the TD target."""
    actor_q: Literal["min", "mean"] = "min"
    """How the actor aggregates the critic ensemble."""
    policy_delay: int = 1
    """Update actor and temperature once every this many critic updates."""
    adam_beta1: float = 0.9
    """Adam beta1 of all optimizers (CrossQ uses 0.5)."""
    crossq: bool = False
    """CrossQ: BatchRenorm critics, no target network, joint forward of current and next batch."""
    actor_batch_renorm: bool = False
    """BatchRenorm in the actor too (CrossQ's actor)."""
    renorm_warmup: int = 100_000
    """BatchRenorm: training calls of plain batch norm before the renorm correction starts."""
    compile: bool = False
    """torch.compile the critic and actor steps. Off by default: on this 2-core CPU it took ~50 s to
    compile and measured no faster than eager (experiments/sac_updates/sac_updates.py --compile)."""
    critic_splits: int = 1
    """Critic minibatches per batch update: the loop draws ``critic_splits`` minibatches, each takes one critic
    step (and target update), then the actor and temperature take one step on their union (WSRL: 4)."""
    final_hidden_scale: float = 1.0
    """Initial-weight scale of the last hidden layer of actor and critics (WSRL ``kernel_scale_final`` 1e-2)."""
    cnn_channels: int = 32
    """Encoder of camera images (multi-part observations only; ``core.encoders``): channels of every conv
    layer (DrQ: 32)."""
    cnn_layers: int = 4
    """Encoder: conv layers per camera (DrQ: 4; 2 is much cheaper on CPU for small simple scenes such as
    ``torch:PointMassPixels`` at 32 px)."""
    cnn_stride: int = 2
    """Encoder: stride of the first conv layer (DrQ: 2; 1 with one layer of 16 channels is MinAtar's reference
    network for its 10x10 grids)."""
    image_features: int = 50
    """Encoder: features out of each camera's CNN (Linear + LayerNorm + tanh; DrQ: 50)."""
    drq_pad: int = 0
    """DrQ random shift of the image parts in every update: replicate-pad by this many pixels, crop back at a
    random offset (0: off; DrQ: 4 for 84x84 images). Unused by flat observations."""
    critic_reduction: Literal["mean", "sum"] = "mean"
    """How the critic loss combines the members' squared TD errors: their mean over members and batch (SAC,
    REDQ), or the sum over members of each member's batch mean (SAC-N, EDAC, RAVL)."""
    edac_eta: float = 0.0
    """eta: weight of EDAC's gradient-diversity term in the critic loss (0: off, SAC-N; RAVL 1.0)."""
    edac_init: bool = False
    """EDAC's initialisation as RAVL's official code runs it (``edac_init_``): critic hidden weights
    U(-1/sqrt(out), 1/sqrt(out)), hidden biases 0.1, critic output layer U(-3e-3, 3e-3), actor output U(-1e-3, 1e-3)
    (RAVL: on)."""
    update_order: Literal["critic_first", "actor_first"] = "critic_first"
    """Order of one update's steps: ``critic_first`` (the SAC papers' and SB3's: the critic step, then the actor and
    temperature steps on the updated critics) or ``actor_first`` (EDAC's and CORL's, which RAVL's official code keeps:
    the temperature and actor steps on the critics before this update, then the critic step, whose target draws
    a' from the updated actor and uses the updated temperature; RAVL's default). ``policy_delay`` 1 only."""
    obs_norm: bool = False
    """Normalize flat observations with running mean/std (``core.nets.RunningNorm``, PPO's) before actor and
    critics: the loop feeds it every env step's observations (``update_obs_stats``), the replay keeps raw ones, the
    statistics travel with the checkpoint and are folded into the export (FastTD3/FastSAC; off: the SAC paper)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if not 1 <= self.target_subset <= self.num_critics:
            raise ValueError(f"invalid SAC setting target_subset={self.target_subset}: "
                             f"expected 1..num_critics={self.num_critics}")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1 or self.init_alpha <= 0:
            raise ValueError("invalid SAC setting: expected 0 < tau <= 1, 0 <= gamma <= 1, init_alpha > 0")
        if self.policy_delay < 1 or not 0 <= self.adam_beta1 < 1:
            raise ValueError("invalid SAC setting: expected policy_delay >= 1 and 0 <= adam_beta1 < 1")
        if self.critic_splits < 1 or self.final_hidden_scale <= 0:
            raise ValueError("invalid SAC setting: expected critic_splits >= 1 and final_hidden_scale > 0")
        if not isinstance(self.drq_pad, int) or isinstance(self.drq_pad, bool) or self.drq_pad < 0:
            raise ValueError(f"invalid SAC setting drq_pad={self.drq_pad!r}: expected 0 (off) or a number of pixels")
        if self.update_order not in ("critic_first", "actor_first"):
            raise UserInputError(f"invalid --update-order {self.update_order!r}: expected 'critic_first' or "
                                 "'actor_first'")
        if self.update_order == "actor_first" and (self.policy_delay != 1 or self.crossq or self.critic_splits != 1):
            raise UserInputError("--update-order actor_first takes one actor step before every critic step: expected "
                                 "--policy-delay 1, --critic-splits 1 and no --crossq")
        if self.critic_reduction not in ("mean", "sum"):
            raise UserInputError(f"invalid --critic-reduction {self.critic_reduction!r}: expected 'mean' or 'sum'")
        if not self.edac_eta >= 0.0:
            raise UserInputError(f"invalid --edac-eta {self.edac_eta!r}: expected a finite number >= 0")
        if self.edac_eta > 0 and self.num_critics < 2:
            raise UserInputError(f"invalid --num-critics {self.num_critics}: EDAC's diversity term needs at least 2 "
                                 "critics (or --edac-eta 0)")
        if self.edac_eta > 0 and self.crossq:
            raise UserInputError("--edac-eta differentiates the critics of the critic step, which CrossQ runs jointly "
                                 "with the target: expected --edac-eta 0 with --crossq")
        _ = self.encoder  # checks the encoder fields now (a ValueError naming the field), not at the first update


class SACActor(nn.Module, abc.ABC):
    """The interface SAC needs of an actor module (no behaviour of its own): SAC's tanh-Gaussian ``Actor`` or one
    given to it (SAC-Flow's ``FlowActor``). Features ``obs [B,F]`` in, actions in [-1, 1] out. An abstract
    ``nn.Module`` rather than a Protocol because SAC also moves, copies and optimizes it as a module."""

    @abc.abstractmethod
    def sample(self, obs: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a [B,A], log pi(a|s) [B])`` with gradient."""

    @abc.abstractmethod
    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``[B,A]``."""


class Actor(SACActor):
    """Tanh-Gaussian policy: an MLP gives mean and clamped log-std of ``u``; ``a = tanh(u)``. Its input is
    ``in_dim`` features (default: the flat observation, ``spec.obs_dim``)."""

    def __init__(self, cfg: SACConfig, spec: EnvSpec, in_dim: int | None = None):
        super().__init__()
        self.net = mlp(spec.obs_dim if in_dim is None else in_dim, cfg.actor_hidden, 2 * spec.action_dim,
                       cfg.activation,
                       layer_norm=cfg.actor_layer_norm, batch_renorm=cfg.actor_batch_renorm,
                       renorm_warmup=cfg.renorm_warmup)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, -1)  # [B,A] each
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self(obs)  # [B,A] each
        return tanh_normal_sample(mean, log_std, generator)

    def sample_pair(self, obs_next: torch.Tensor, obs: torch.Tensor, generator: torch.Generator | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample(cat([obs_next, obs]))`` (the same noise draw) with gradient through the ``obs`` rows only: the
        network runs on ``obs_next [B,F]`` under no_grad, so the backward's products cover B rows, not 2B (the rows
        are independent: no BatchRenorm here). Returns ``(a [2B,A], log pi [2B])``, the ``obs_next`` rows first."""
        with torch.no_grad():
            out_next = self.net(obs_next)  # [B,2A]
        mean, log_std = torch.cat([out_next, self.net(obs)], -2).chunk(2, -1)  # [*S,2B,A] each
        return tanh_normal_sample(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), generator)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self(obs)[0])


def scale_last_hidden_(linears: list, scale: float) -> None:
    """Scale the initial weights and bias of the last hidden layer (``linears[-2]``) in place (WSRL's init)."""
    with torch.no_grad():
        linears[-2].weight.mul_(scale)
        linears[-2].bias.mul_(scale)


def edac_init_(critic: EnsembleMLP, actor_linears: list[nn.Linear]) -> None:
    """EDAC's initialisation of the critic ensemble and of the actor's linear layers as RAVL's official code (CORL's
    EDAC) runs it, in place: critic hidden weights U(-1/sqrt(out), 1/sqrt(out)), hidden biases 0.1, critic output
    layer U(-3e-3, 3e-3), actor output layer U(-1e-3, 1e-3) (draws from the global generator, as the layers' default
    initialisation does).

    The hidden weights' bound is CORL's ``VectorizedLinear`` init: ``kaiming_uniform_(a=sqrt(5))`` on each member's
    ``[in, out]`` weight, whose fan-in torch reads from the last dim, i.e. ``1/sqrt(out)``. Only the first layer
    differs from ``nn.Linear``'s ``1/sqrt(in)`` when the hidden sizes are equal: for HalfCheetah's 23 inputs and 256
    units its weights are 3.3x smaller, and the ensemble's Q spread at initialisation half as large (issue 28
    section 3, experiments/ravl_parity)."""
    with torch.no_grad():
        *hidden, last = [cast(EnsembleLinear, m) for m in critic.layers]  # ModuleList items are typed Module
        for layer in hidden:
            bound = 1.0 / math.sqrt(layer.weight.shape[-1])  # [E,in,out]: CORL's fan-in, the out dim
            layer.weight.uniform_(-bound, bound)
            layer.bias.fill_(0.1)
        last.weight.uniform_(-3e-3, 3e-3)
        last.bias.uniform_(-3e-3, 3e-3)
        for layer in actor_linears[:-1]:
            layer.bias.fill_(0.1)
        actor_linears[-1].weight.uniform_(-1e-3, 1e-3)
        actor_linears[-1].bias.uniform_(-1e-3, 1e-3)


def _has_batch_renorm(module: nn.Module) -> bool:
    return any(isinstance(m, BatchRenorm) for m in module.modules())


class SAC:
    """Owns actor, critic ensemble, target critics, temperature and their optimizers."""

    name = "sac"

    def __init__(self, config: SACConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None, actor: SACActor | None = None):
        if spec.discrete:
            raise ValueError(f"SAC needs continuous actions; {spec.env_id} has discrete actions")
        self.config, self.spec, self.device = config, spec, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        c = config
        if actor is not None and c.edac_init:
            raise UserInputError("--edac-init initialises SAC's Gaussian actor, and this agent brings its own actor: "
                                 "expected --no-edac-init")
        if actor is not None and not spec.is_flat:
            raise ValueError(f"{type(self).__name__}'s actor reads flat observations: {spec.env_id} has the "
                             f"observation "
                             f"parts {[p.name for p in spec.parts]} (expected a single float 'state')")
        # flat observations: no encoder at all (no parameters, no op, the networks they had before encoders). A
        # privileged part (EnvSpec.privileged_parts) is read by neither network, so the policy and its export need
        # only what a robot has; ``spec`` then says what the policy reads (the export's inputs).
        parts = [p for p in spec.parts if p.name in spec.robot_parts]
        self.encoder: Encoder | None = (None if spec.is_flat else
                                        make_encoder(parts, c.encoder, keyed=True).to(self.device))
        if spec.privileged_parts:
            self.spec = spec.with_parts(spec.robot_parts)
        if c.obs_norm and (not spec.is_flat or actor is not None):
            raise UserInputError(f"--obs-norm normalizes the flat observations SAC's own actor reads: env "
                                 f"{spec.env_id!r} with {type(self).__name__} does not have them (expected a "
                                 "state-vector env and SAC's Gaussian actor, or --no-obs-norm)")
        # running mean/std of the flat observations (obs_norm), applied wherever observations become features
        self.obs_norm = RunningNorm((spec.obs_dim,)).to(self.device) if c.obs_norm else None
        feat_dim = spec.obs_dim if self.encoder is None else self.encoder.out_dim
        actor_linears: list[nn.Linear] = []  # of SAC's own actor (a given actor keeps its initialisation)
        if actor is None:
            actor = Actor(c, spec, feat_dim)
            actor_linears = [m for m in actor.net if isinstance(m, nn.Linear)]
            if c.final_hidden_scale != 1.0:
                scale_last_hidden_(actor_linears, c.final_hidden_scale)
        self.actor = actor.to(self.device)
        self.critic = EnsembleMLP(c.num_critics, feat_dim + spec.action_dim, c.critic_hidden, 1, c.activation,
                                  c.layer_norm, batch_renorm=c.crossq, renorm_warmup=c.renorm_warmup).to(self.device)
        if c.final_hidden_scale != 1.0:
            scale_last_hidden_(list(self.critic.layers), c.final_hidden_scale)
        if c.edac_init:
            edac_init_(self.critic, actor_linears)
        # CrossQ has no target network: the joint forward's detached second half is the target
        self.critic_target = None if c.crossq else copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(c.init_alpha), device=self.device, requires_grad=c.learn_alpha)
        self.target_entropy = float(-spec.action_dim if c.target_entropy is None else c.target_entropy)
        betas = (c.adam_beta1, 0.999)
        # fused Adam: one kernel over all parameters of a network (CPU and CUDA)
        self.actor_params = list(self.actor.parameters())
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=c.actor_lr, betas=betas, fused=True)
        self.encoder_params = [] if self.encoder is None else list(self.encoder.parameters())
        # the encoder learns from the critic loss only (DrQ), so it shares the critic's optimizer
        self.critic_opt = torch.optim.Adam([*self.critic.parameters(), *self.encoder_params], lr=c.critic_lr,
                                           betas=betas, fused=True)
        self.alpha_opt = (torch.optim.Adam([self.log_alpha], lr=c.alpha_lr, betas=betas, fused=True)
                          if c.learn_alpha else None)
        self.actor_renorm = _has_batch_renorm(self.actor)
        # EDAC's action-gradients without autograd's double backward where the critics allow it (ReLU, no norms)
        self._edac_direct = c.activation == "relu" and not c.layer_norm and not c.crossq
        if c.compile:
            self.update_critic = torch.compile(self.update_critic)
            self.update_actor = torch.compile(self.update_actor)
        self.critic_updates = 0
        if self.critic_target is not None:
            self._tgt = list(self.critic_target.parameters())
            self._src = list(self.critic.parameters())

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def q(self, net: EnsembleMLP, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[E,B]`` values of features ``obs [B,F]`` (flat observations ``[B,O]``) and actions ``[B,A]``."""
        return net(torch.cat([obs, action], -1)).squeeze(-1)  # [E,B]

    def encode(self, obs: Obs) -> torch.Tensor:
        """Features ``[B,F]`` of observations for actor and critics; flat ``[B,O]`` observations as they are."""
        if self.encoder is None:
            assert isinstance(obs, torch.Tensor)  # no encoder: a flat spec, plain-tensor observations
            return obs if self.obs_norm is None else self.obs_norm(obs)
        return self.encoder(obs)

    @torch.no_grad()
    def update_obs_stats(self, obs: Obs) -> None:
        """Merge a step's observations ``[N,O]`` into the running statistics (``obs_norm``; else nothing)."""
        if self.obs_norm is not None:
            assert isinstance(obs, torch.Tensor)  # obs_norm: flat observations (checked when built)
            self.obs_norm.update(obs)

    def features(self, batch: Transition) -> tuple[torch.Tensor, torch.Tensor]:
        """``(phi(s) [B,F], phi(s') [B,F])`` for one update: image parts shifted (``drq_pad``), phi(s) with
        gradient into the encoder, phi(s') without (the target). Flat batches: ``(obs, next_obs)`` as they are."""
        if self.encoder is None:
            # no encoder: a flat spec, plain-tensor observations
            assert isinstance(batch.obs, torch.Tensor) and isinstance(batch.next_obs, torch.Tensor)
            if self.obs_norm is not None:
                return self.obs_norm(batch.obs), self.obs_norm(batch.next_obs)
            return batch.obs, batch.next_obs
        obs, next_obs = self._augment(batch.obs), self._augment(batch.next_obs)
        with torch.no_grad():
            f_next = self.encoder(next_obs)  # [B,F]
        return self.encoder(obs), f_next

    def _augment(self, obs: Obs) -> Obs:
        """DrQ's random shift of the image parts (``drq_pad``), or ``obs`` itself."""
        return random_shift_obs(obs, self.config.drq_pad, self.gen) if self.config.drq_pad else obs

    def _sample_eval(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor sample (of features ``obs``) with BatchRenorm (if any) on running statistics, left untouched."""
        if not self.actor_renorm:
            return self.actor.sample(obs, self.gen)
        self.actor.eval()
        try:
            return self.actor.sample(obs, self.gen)
        finally:
            self.actor.train()

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        if deterministic and self.actor_renorm:
            return self.exportable()(obs)
        x = self.encode(obs)  # [N,F]; flat: obs itself
        if deterministic:
            return self.actor.mode(x)
        if isinstance(self.actor, Actor) and not self.actor_renorm:  # no log-prob needed while acting
            mean, log_std = self.actor(x)  # [N,A] each
            eps = torch.randn(mean.shape, generator=self.gen, device=mean.device, dtype=mean.dtype)  # [N,A]
            return torch.tanh(mean + eps * log_std.exp())
        return self._sample_eval(x)[0]

    def exportable(self) -> nn.Module:
        """Deterministic policy on a copy of the actor (and encoder) in evaluation mode (the agent's action space
        [-1, 1]); it takes the dict of parts for multi-part observations (``DeterministicPolicy``)."""
        front = self.encoder if self.obs_norm is None else self.obs_norm  # obs_norm: flat, no encoder
        return DeterministicPolicy(copy.deepcopy(self.actor), copy.deepcopy(front)).eval()

    def update_critic(self, batch: Transition, next_sample: tuple[torch.Tensor, torch.Tensor] | None = None,
                      feats: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """One critic step (and encoder step); ``next_sample`` = (a' [B,A], log pi(a'|s') [B]) if already drawn (no
        gradient); ``feats`` = ``features(batch)`` if already computed."""
        c = self.config
        # dimensions count from the end: a seeds-run (core.seeds) gives every tensor a leading [S] ([*S,...])
        f, f_next = feats if feats is not None else self.features(batch)  # [*S,B,F] each
        B = f.shape[-2]
        if c.target_subset == c.num_critics:
            subset = None  # every member: no draw, no gather
        else:
            subset = randperm(c.num_critics, self.gen, self.device)[..., : c.target_subset]  # [*S,M]
        if next_sample is None:
            with torch.no_grad():
                next_sample = self._sample_eval(f_next)
        next_a, next_logp = next_sample  # [*S,B,A], [*S,B]
        if c.crossq:
            q_all = self.q(self.critic, torch.cat([f, f_next]), torch.cat([batch.action, next_a]))  # [E,2B]
            q, q_next = q_all[:, :B], q_all[:, B:].detach()  # [E,B] each
        else:
            assert self.critic_target is not None  # a target network unless CrossQ
            with torch.no_grad():
                q_next = self.q(self.critic_target, f_next, next_a)  # [*S,E,B]
            if c.edac_eta > 0 and self._edac_direct:
                # EDAC's action-gradients written out beside the forward (EnsembleMLP.forward_input_grad)
                q, grad_a = self.critic.forward_input_grad(torch.cat([f, batch.action], -1), f.shape[-1])  # [E,B]
            elif c.edac_eta > 0:
                # EDAC differentiates every member's Q by its own copy of the batch actions
                E = c.num_critics
                a_e = batch.action.unsqueeze(0).expand(E, *batch.action.shape).clone().requires_grad_(True)  # [E,B,A]
                q = self.critic(torch.cat([f.unsqueeze(0).expand(E, *f.shape), a_e], -1)).squeeze(-1)  # [E,B]
            else:
                q = self.q(self.critic, f, batch.action)  # [*S,E,B]
        gamma = c.gamma if batch.discount is None else batch.discount  # an n-step batch's gamma^k ([B])
        y = td_target(q_next, subset, batch.reward, batch.terminated, next_logp, self.alpha, gamma,
                      c.backup_entropy)  # [*S,B]
        sq = (q - y.unsqueeze(-2)).square()  # [*S,E,B]
        loss = sq.mean((-2, -1)) if c.critic_reduction == "mean" else sq.mean(-1).sum(-1)  # [*S]
        qd = q.detach()  # [*S,E,B]
        E = qd.shape[-2]
        info = {"stats/q_max": qd.amax((-2, -1)),
                # the members' standard deviation written out (torch.std over the 2 members was ~3 times slower)
                "stats/q_member_std": ((qd - qd.mean(-2, keepdim=True)).square().sum(-2) / (E - 1)).sqrt().mean(-1)
                if E > 1 else qd.new_zeros(qd.shape[:-2])}
        if c.edac_eta > 0:
            if not self._edac_direct:
                # member i's Q depends on a_e[i] only, so one gradient of the sum gives every member's [E,B,A]
                grad_a = torch.autograd.grad(q.sum(), a_e, create_graph=True)[0]  # [E,B,A]
            div = edac_diversity(grad_a)
            loss = loss + c.edac_eta * div
            info["loss/edac_div"] = div.detach()
        self.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # a seed-batched update's [S] losses: each seed's gradient is its own loss's
        adam_step(self.critic_opt)  # = critic_opt.step(), without its Python (core.optim)
        if self.critic_target is not None:
            polyak_(self._tgt, self._src, c.tau)
        self.critic_updates += 1
        return {"loss/critic": loss.detach(), "stats/q_mean": qd.mean((-2, -1)), "stats/target_mean": y.mean(-1),
                **info}

    def update_actor(self, batch: Transition, sample: tuple[torch.Tensor, torch.Tensor] | None = None,
                     feats: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """One actor and temperature step; ``sample`` = (a [B,A], log pi(a|s) [B]) with gradient, if drawn;
        ``feats`` = the batch's features phi(s) [B,F] without gradient, if already computed."""
        c = self.config
        if feats is None:
            if self.encoder is None:
                assert isinstance(batch.obs, torch.Tensor)  # no encoder: a flat spec, plain-tensor observations
                feats = self.encode(batch.obs)  # [B,O] (normalized with obs_norm)
            else:
                with torch.no_grad():
                    feats = self.encoder(self._augment(batch.obs))  # [B,F]
        assert feats is not None  # set above (the checker sees torch.no_grad as possibly swallowing an exception)
        # dimensions count from the end: CQL's seeds-runs (core.seeds) give every tensor a leading [S] ([*S,...])
        a, logp = sample if sample is not None else self.actor.sample(feats, self.gen)  # [*S,B,A], [*S,B]
        # EDAC's order takes the temperature step first; its actor loss then reads the updated temperature
        alpha_info = self.alpha_step(logp) if c.update_order == "actor_first" else None
        if c.crossq:
            self.critic.eval()  # CrossQ evaluates the actor's actions on the critics' running statistics
            try:
                q = self.q(self.critic, feats, a)  # [E,B]
            finally:
                self.critic.train()
        else:
            q = self.q(self.critic, feats, a)  # [*S,E,B]
        q_agg = q.min(-2).values if c.actor_q == "min" else q.mean(-2)  # [*S,B]
        loss = (self.alpha.unsqueeze(-1) * logp - q_agg).mean(-1)  # [*S]
        self.actor_step(loss)
        return {"loss/actor": loss.detach(), "stats/entropy": -logp.detach().mean(-1), "stats/alpha": self.alpha,
                **(alpha_info if alpha_info is not None else self.alpha_step(logp))}

    def actor_step(self, loss: torch.Tensor) -> None:
        """One optimizer step of the actor on ``loss``. Gradients are taken for the actor's parameters only:
        the critics' weight gradients of an actor loss are never computed."""
        grads = torch.autograd.grad(loss.sum(), self.actor_params, allow_unused=True)  # [S] losses: each its own
        set_grads(self.actor_params, grads)  # in each parameter's layout (core.optim)
        adam_step(self.actor_opt)

    def alpha_step(self, logp: torch.Tensor) -> dict[str, torch.Tensor]:
        """One temperature step towards the target entropy, ``L = -log_alpha * (log pi + H_target)``."""
        if self.alpha_opt is None:
            return {}
        alpha_loss = -(self.log_alpha.unsqueeze(-1) * (logp.detach() + self.target_entropy)).mean(-1)  # [*S]
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.sum().backward()
        adam_step(self.alpha_opt)
        return {"loss/alpha": alpha_loss.detach()}

    def update(self, batch: Transition) -> dict[str, torch.Tensor]:
        """One critic step (with the target update) and, every ``policy_delay`` critic steps, one
        actor/temperature step. Returns device tensors (no host sync)."""
        # the batch is encoded once (flat: no op); the actor reads the critic step's input features, detached
        f, f_next = self.features(batch)  # [*S,B,F] each
        f_actor = f.detach()  # [*S,B,F]
        if self.config.update_order == "actor_first":  # EDAC's order: temperature and actor, then the critic
            info = self.update_actor(batch, feats=f_actor)
            info.update(self.update_critic(batch, feats=(f, f_next)))
            return info
        if (self.critic_updates + 1) % self.config.policy_delay == 0 and not self.actor_renorm:
            # both actor samples from one noise draw: the actor does not change between the critic step and its
            # own step, so a' ~ pi(s') (for the target, detached) and a ~ pi(s) come from one call; SAC's own actor
            # runs the s' rows without gradient (half the backward's products of a joint forward)
            B = f.shape[-2]
            a, logp = (self.actor.sample_pair(f_next, f_actor, self.gen) if isinstance(self.actor, Actor) else
                       self.actor.sample(torch.cat([f_next, f_actor], -2), self.gen))  # [*S,2B,A], [*S,2B]
            info = self.update_critic(batch, (a[..., :B, :].detach(), logp[..., :B].detach()), (f, f_next))
            info.update(self.update_actor(batch, (a[..., B:, :], logp[..., B:]), f_actor))
        else:
            info = self.update_critic(batch, feats=(f, f_next))
            if self.critic_updates % self.config.policy_delay == 0:
                info.update(self.update_actor(batch, feats=f_actor))
        return info

    def update_split(self, batches: list[Transition]) -> dict[str, torch.Tensor]:
        """WSRL/RLPD's high-UTD step (docs/algorithms/wsrl.md#the-batch-update): one critic step (and target update)
        per minibatch in
        ``batches``, then one actor and one temperature step on all of them together."""
        for b in batches:
            info = self.update_critic(b)
        d = batches[0].action.dim() - 2  # the batch dim: 0, or 1 behind a seeds-run's leading [S] (core.seeds)
        full = batches[0] if len(batches) == 1 else Transition(
            obs_cat([b.obs for b in batches], d), torch.cat([b.action for b in batches], d),
            torch.cat([b.reward for b in batches], d), obs_cat([b.next_obs for b in batches], d),
            torch.cat([b.terminated for b in batches], d), torch.cat([b.truncated for b in batches], d))
        info.update(self.update_actor(full))
        return info

    def parameters_finite(self) -> bool:
        params = [*self.actor.parameters(), *self.critic.parameters(), *self.encoder_params, self.log_alpha]
        return bool(torch.stack([p.detach().isfinite().all() for p in params]).all())

    def state_dict(self) -> dict:
        """Networks, optimizers, temperature and generator; ``encoder`` only with multi-part observations,
        ``obs_norm`` (the running statistics) only with ``obs_norm``."""
        state = {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                 "critic_target": self.critic_target.state_dict() if self.critic_target is not None else None,
                 "log_alpha": self.log_alpha.detach().clone(), "critic_updates": self.critic_updates,
                 "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                 "alpha_opt": self.alpha_opt.state_dict() if self.alpha_opt else None, "gen": self.gen.get_state()}
        if self.encoder is not None:
            state["encoder"] = self.encoder.state_dict()
        if self.obs_norm is not None:
            state["obs_norm"] = self.obs_norm.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        if self.encoder is not None:
            self.encoder.load_state_dict(state["encoder"])
        if self.obs_norm is not None:
            if "obs_norm" not in state:
                raise KeyError("obs_norm: the checkpoint was trained without --obs-norm")
            self.obs_norm.load_state_dict(state["obs_norm"])
        if self.critic_target is not None:
            self.critic_target.load_state_dict(state["critic_target"])
        self.critic_updates = int(state.get("critic_updates", 0))
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        # deep copies: torch's Optimizer.load_state_dict keeps references to the given state tensors
        self.actor_opt.load_state_dict(copy.deepcopy(state["actor_opt"]))
        self.critic_opt.load_state_dict(copy.deepcopy(state["critic_opt"]))
        if self.alpha_opt is not None and state["alpha_opt"] is not None:
            self.alpha_opt.load_state_dict(copy.deepcopy(state["alpha_opt"]))
        self.gen.set_state(state["gen"])


def _update_step(algo: SAC, sampler, batch_size: int, config: SACConfig) -> dict:
    """One batch update: ``critic_splits`` critic minibatches (WSRL: 4 x 256 of a 1024 batch), or one batch."""
    k = config.critic_splits
    if k == 1:
        return algo.update(sampler.sample(batch_size, algo.gen))
    return algo.update_split([sampler.sample(batch_size // k, algo.gen) for _ in range(k)])


def _seeds_refuse(c: SACConfig) -> str | None:
    """A setting a seeds-run (``--seeds``, core.seeds) cannot reproduce bit for bit, in words, or None."""
    if c.crossq or c.actor_batch_renorm:
        return "--crossq or --actor-batch-renorm (BatchRenorm's running statistics are buffers no seed stack holds)"
    if c.edac_eta > 0:
        return "--edac-eta above 0 (EDAC's action-gradients run on one seed's critic ensemble)"
    if c.compile:
        return "--compile (each seed's compiled steps are its own)"
    return None


# What a seeds-run batches (core.seeds): SAC's update counts dimensions from the end (CQL's seeds-runs batch their
# SAC by this layout too, as a part)
SEED_LAYOUT = SeedLayout(("actor", "critic", "critic_target"), each=("actor_opt", "critic_opt", "alpha_opt"),
                         lists=("_tgt", "_src", "actor_params"), tensors=("log_alpha",), counters=("critic_updates",),
                         calls=("obs_norm",), refuse=_seeds_refuse)

register(AlgoEntry(
    "sac", SACConfig, SAC, regime="off-policy",
    summary="Soft Actor-Critic: batched critic ensemble (REDQ subset), UTD ratio, CrossQ option",
    run_defaults={"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 50_000},
    update_step=_update_step, seed_layout=SEED_LAYOUT))
