"""Proximal Policy Optimization built for massive parallelism.

Paper: Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; GAE from Schulman et al. 2016.
Co-scaling of the number of environments: Beukman et al. 2026, "Preventing Learning Stagnation in PPO by
Scaling to 1 Million Parallel Environments" (see ``scale_envs``).

Losses, for a minibatch with old log-probs ``logp_old``, advantages ``A`` and value targets ``R``:

    ratio    = exp(logp - logp_old)
    L_policy = -mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))
    L_value  = 0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))   (clipped)
             = 0.5 * mean((V - R)^2)                                                    (unclipped)
    L        = L_policy + vf_coef * L_value - ent_coef * entropy

Deliberate choices:
- Truncated steps bootstrap from ``V(final_obs)``; terminated steps do not (core.returns.gae).
- The whole rollout and update stay on the device; minibatches are slices of one index permutation.
- Observation statistics are frozen during an iteration (collection and update use the same
  normalizer) and updated from the iteration's observations after the gradient steps, so that the
  first-epoch ratio is exactly 1.
- The KL-adaptive learning rate (as in rsl_rl) adapts once per epoch from the epoch's mean approx-KL
  (one host sync per epoch, not per minibatch).

Observations (``ctrl_rl.core.obs``): a flat env's ``[N,O]`` tensor is normalized and fed to the MLPs as
it always was (no encoder; an update packs the normalized observations into one ``[S, O+A+4]``
minibatch table). An env with several parts (camera images, a proprio ``state``) passes
a dict; one encoder (``core.encoders.make_encoder``, ``config.encoder``) shared by actor and critic maps
it to features, and both losses train it (as in CleanRL's and SB3's Atari PPO, whose CNN is shared). Only
the float vector parts are normalized (``state``, and e.g. ``privileged_state`` with its own statistics).
Minibatches then index the rollout's dict of parts with the epoch's permutation and run the encoder inside the loss.

Asymmetric actor-critic (docs/algorithms/ppo.md#asymmetric-actor-critic): the policy reads the parts a robot has
(``actor_parts``; by default every part not in ``spec.privileged_parts``, and a privileged one is refused), the
value network those and ``critic_parts`` (MuJoCo Playground's ``privileged_state``: true velocities, contacts,
noise-free readings), as legged-robot trainers such as rsl_rl and Playground do. Privileged parts only sharpen the
value baseline; ``exportable()`` and ``spec`` (what the export takes in) cover the policy's parts only.

Shape letters: T rollout steps, N envs, B minibatch, S = T*N samples, O obs dim, F features, A action dim.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    normal_entropy,
    normal_log_prob,
)
from ctrl_rl.core.encoders import Encoder, EncoderFields, make_encoder
from ctrl_rl.core.nets import Activation, RunningNorm, mlp
from ctrl_rl.core.obs import Obs, obs_index, obs_map
from ctrl_rl.core.policies import DeterministicPolicy
from ctrl_rl.core.returns import gae
from ctrl_rl.core.types import Rollout
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec, observation_roles


@dataclass(frozen=True)
class ActorCriticFields(EncoderFields):
    """The network fields of ``ActorCritic`` (PPO's, and the actor-learner algorithms' that reuse it)."""

    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy network."""
    critic_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the value network."""
    activation: Activation = "tanh"
    """Hidden activation."""
    init_log_std: float = 0.0
    """Initial state-independent log standard deviation of the Gaussian head."""
    obs_norm: bool = True
    """Normalize observations with running mean/std (folded into exported policies)."""
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


@dataclass(frozen=True)
class PPOConfig(ActorCriticFields):
    """PPO hyperparameters (defaults: a fast, robust setting for many parallel torch-native envs)."""

    rollout_steps: int = 32
    """T: env steps collected per env between updates."""
    epochs: int = 5
    """Passes over the rollout per update."""
    minibatch_size: int = 8192
    """Samples per gradient step; the rollout of T*N samples is cut into ceil(T*N / minibatch_size) minibatches."""
    lr: float = 3e-4
    """Adam learning rate (initial value when kl_adaptive_lr or anneal_lr is on)."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio."""
    clip_value_loss: bool = True
    """Clip the value update around the old values with the same range (False: plain squared error)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (<= 0 disables)."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    kl_adaptive_lr: bool = False
    """Adapt the learning rate to keep approx-KL near desired_kl (x1.5 / /1.5 steps, within [1e-5, 1e-2])."""
    desired_kl: float = 0.01
    """Target approx-KL for kl_adaptive_lr."""
    target_kl: float | None = None
    """Stop the epochs of an update early once the epoch's approx-KL exceeds this (None: never)."""
    value_chunk: int = 262144
    """Samples per chunk when computing values of the whole rollout (bounds memory at 10^6 envs). With an
    observation encoder (multi-part observations) at most ``minibatch_size``: a CNN's activations are far
    larger than its input, and a minibatch is what the update already pushes through it with gradients."""
    actor_parts: tuple[str, ...] = ()
    """Observation parts the policy reads (empty: every part a robot has, i.e. all but the env's
    ``privileged_parts``). A privileged part is refused: the exported policy would need simulator-only inputs."""
    critic_parts: tuple[str, ...] = ()
    """Parts the value network reads besides the policy's: an asymmetric actor-critic, e.g. the MuJoCo Playground
    tasks' ``privileged_state`` (as legged-robot trainers do). Only the policy is exported."""

    def __post_init__(self) -> None:
        check_fields(self)
        checks = {
            "rollout_steps": self.rollout_steps >= 1,
            "epochs": self.epochs >= 1,
            "minibatch_size": self.minibatch_size >= 1,
            "lr": self.lr > 0,
            "gamma": 0 <= self.gamma <= 1,
            "gae_lambda": 0 <= self.gae_lambda <= 1,
            "clip_eps": self.clip_eps > 0,
            "desired_kl": self.desired_kl > 0,
            "value_chunk": self.value_chunk >= 1,
            "target_kl": self.target_kl is None or self.target_kl > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid PPO setting {name}={getattr(self, name)!r}")
        _ = self.encoder  # checks the encoder fields now (a ValueError naming the field), not at the first update


def scale_envs(num_envs: int, config: PPOConfig, k: int) -> tuple[int, PPOConfig]:
    """Multiply the environments by ``k`` and co-scale PPO's hyperparameters.

    Rule implemented (keep the inner loop fixed, let the outer batch grow): rollout length T, minibatch
    size, learning rate, epochs and clip range stay unchanged, so each update sees k times more samples
    and takes k times more gradient steps of the same size; this lowers the noise of the outer-loop
    update without changing its per-step size. See docs/algorithms/ppo.md#co-scaling-the-number-of-environments on what
    was verified against the paper.
    """
    if k < 1:
        raise ValueError(f"scale_envs factor must be >= 1, got {k}")
    return num_envs * k, replace(config)


def ppo_losses(
    cfg: PPOConfig,
    logp: torch.Tensor,  # [B]
    entropy: torch.Tensor,  # [B]
    value: torch.Tensor,  # [B]
    logp_old: torch.Tensor,  # [B]
    value_old: torch.Tensor,  # [B]
    adv: torch.Tensor,  # [B]
    ret: torch.Tensor,  # [B]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + (clipped) value loss + entropy bonus; returns the total and its parts."""
    if cfg.norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    log_ratio = logp - logp_old  # [B]
    ratio = log_ratio.exp()  # [B]
    surr = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
    policy_loss = -surr.mean()
    if cfg.clip_value_loss:
        v_clip = value_old + (value - value_old).clamp(-cfg.clip_eps, cfg.clip_eps)
        value_loss = 0.5 * torch.max((value - ret).square(), (v_clip - ret).square()).mean()
    else:
        value_loss = 0.5 * (value - ret).square().mean()
    ent = entropy.mean()
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * ent
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator, >= 0
        clip_frac = ((ratio - 1).abs() > cfg.clip_eps).float().mean()
    parts = {"policy": policy_loss, "value": value_loss, "entropy": ent, "approx_kl": approx_kl, "clip_frac": clip_frac}
    return loss, parts


def observation_features(norm: nn.Module, encoder: Encoder | None, obs: Obs,
                         part_norms: nn.ModuleDict | None = None, names: Sequence[str] | None = None) -> torch.Tensor:
    """``[B,O]`` normalized flat observations (``encoder`` None), or the encoder's features ``[B,F]`` of the parts
    ``names`` (None: every part it was built for) of a dict of parts, each float vector part normalized first: the
    ``state`` part by ``norm``, the others by their ``part_norms`` entry. A plain tensor given to an encoder is the
    ``state`` part alone (the export of an actor that reads only it)."""
    if encoder is None:
        assert isinstance(obs, torch.Tensor)  # no encoder: a flat spec, plain-tensor observations
        return norm(obs.flatten(1))  # [B,O]
    if isinstance(obs, torch.Tensor):
        obs = {"state": obs}
    return encoder(_normalized(norm, part_norms, obs, encoder.names if names is None else names), names)  # [B,F]


def _normalized(norm: nn.Module, part_norms: nn.ModuleDict | None, obs: dict[str, torch.Tensor],
                names: Sequence[str]) -> dict[str, torch.Tensor]:
    """A new dict of the parts ``names`` of ``obs`` with the float vector ones normalized (the caller's is left as
    it was)."""
    out = {}
    for k in names:
        if k == "state":
            out[k] = norm(obs[k].flatten(1))  # [B,O]
        elif part_norms is not None and k in part_norms:
            out[k] = part_norms[k](obs[k].flatten(1))  # [B,P]
        else:
            out[k] = obs[k]
    return out


class ActorCritic(nn.Module):
    """Gaussian (state-independent log-std) or categorical policy and a separate value network, on the features
    of one observation encoder (none for flat observations; see the module docstring).

    ``actor_parts`` / ``critic_parts`` (``envs.protocol.observation_roles``): the policy reads the parts a robot has
    (or those named), never a privileged one; the value network reads the policy's parts and ``critic_parts``
    (asymmetric). The encoder is built for the critic's parts (a superset) and each part is encoded once."""

    def __init__(self, cfg: ActorCriticFields, spec: EnvSpec, actor_parts: tuple[str, ...] = (),
                 critic_parts: tuple[str, ...] = ()):
        super().__init__()
        self.discrete = spec.discrete
        self.flat = spec.is_flat
        self.actor_parts, self.critic_parts = observation_roles(spec, actor_parts, critic_parts)
        self.asymmetric = self.critic_parts != self.actor_parts
        read = [p for p in spec.parts if p.name in self.critic_parts]  # the critic's parts include the actor's
        # no parameters, buffers or random draws for flat observations: their networks are what they were
        self.encoder = None if self.flat else make_encoder(read, cfg.encoder, keyed=True)
        state_dim = spec.obs_dim if "state" in self.critic_parts else 0  # the flat observation or the 'state' part
        self.norm = RunningNorm((state_dim,)) if cfg.obs_norm and state_dim > 0 else nn.Identity()
        # other float vector parts (privileged_state) get their own normalizer; none exist for flat or pixel envs
        self.part_norms = nn.ModuleDict({p.name: RunningNorm((p.numel,)) for p in read if cfg.obs_norm and
                                         p.name != "state" and p.kind == "vector" and p.dtype.is_floating_point})
        actor_dim = state_dim if self.encoder is None else self.encoder.out_dim_of(self.actor_parts)
        critic_dim = state_dim if self.encoder is None else self.encoder.out_dim_of(self.critic_parts)
        self.actor = mlp(actor_dim, cfg.actor_hidden, spec.action_dim, cfg.activation, out_gain=0.01)
        self.critic = mlp(critic_dim, cfg.critic_hidden, 1, cfg.activation, out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), float(cfg.init_log_std)))

    def features(self, obs: Obs) -> torch.Tensor:
        """The actor's features ``[B,O]`` or ``[B,F]`` (privileged parts never among them)."""
        return observation_features(self.norm, self.encoder, obs, self.part_norms, self.actor_parts)

    def critic_features(self, obs: Obs) -> torch.Tensor:
        """The value network's features: the actor's, and with ``critic_parts`` those parts' as well."""
        if not self.asymmetric:
            return self.features(obs)
        return observation_features(self.norm, self.encoder, obs, self.part_norms, self.critic_parts)

    def both_features(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actor features, critic features)`` with every part encoded once."""
        if not self.asymmetric:
            x = self.features(obs)
            return x, x
        assert self.encoder is not None and not isinstance(obs, torch.Tensor)  # asymmetric: parts in a dict
        feats = self.encoder.part_features(_normalized(self.norm, self.part_norms, obs, self.critic_parts),
                                           self.critic_parts)  # {name: [B,F_k]}
        return (torch.cat([feats[k] for k in self.actor_parts], -1),  # [B,F_actor]
                torch.cat([feats[k] for k in self.critic_parts], -1))  # [B,F_critic]

    def value(self, obs: Obs) -> torch.Tensor:
        return self.critic(self.critic_features(obs)).squeeze(-1)  # [B]

    def dist_params(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor(x)  # [B,A] mean or logits

    @torch.no_grad()
    def sample(self, obs: Obs, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Stochastic action and its log-prob for ``[N,...]`` observations (PPO's rollouts, IMPALA's actors)."""
        out = self.actor(self.features(obs))  # [N,A]
        if self.discrete:
            action = categorical_sample(out, gen)  # [N]
            return action, categorical_log_prob(out, action)
        log_std = self.log_std.expand_as(out)  # [N,A]
        noise = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)  # [N,A]
        action = out + noise * log_std.exp()  # [N,A]
        return action, normal_log_prob(action, out, log_std)

    def log_prob_entropy(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.actor(x)  # [B,A]
        if self.discrete:
            return categorical_log_prob(out, action), categorical_entropy(out)
        log_std = self.log_std.expand_as(out)
        return normal_log_prob(action, out, log_std), normal_entropy(log_std)

    def norms(self) -> dict[str, RunningNorm]:
        """The observation normalizers by part (``state`` and the other float vector parts); empty without."""
        out = {"state": self.norm} if isinstance(self.norm, RunningNorm) else {}
        out.update({k: m for k, m in self.part_norms.items() if isinstance(m, RunningNorm)})
        return out


class ObservationFeatures(nn.Module):
    """The actor's input of raw observations (``observation_features`` of the actor's parts): the exported policy's
    encoder. It reads only the actor's parts, so an export needs no privileged input."""

    def __init__(self, norm: nn.Module, encoder: Encoder | None, part_norms: nn.ModuleDict | None = None,
                 names: Sequence[str] | None = None):
        super().__init__()
        self.norm, self.encoder, self.part_norms = norm, encoder, part_norms
        self.names = None if names is None else tuple(names)

    def forward(self, obs: Obs) -> torch.Tensor:
        return observation_features(self.norm, self.encoder, obs, self.part_norms, self.names)  # [B,O] or [B,F]


class ActionMode(nn.Module):
    """The policy network's deterministic action: the argmax of its logits, or its Gaussian mean clipped to
    [-1, 1] (the agent's action space)."""

    def __init__(self, net: nn.Module, discrete: bool):
        super().__init__()
        self.net, self.discrete = net, discrete

    def mode(self, features: torch.Tensor) -> torch.Tensor:
        out = self.net(features)  # [B,A] mean or logits
        return out.argmax(-1) if self.discrete else out.clamp(-1.0, 1.0)


def deterministic_policy(ac: ActorCritic) -> DeterministicPolicy:
    """The exported policy of an actor-critic (``core.policies.DeterministicPolicy``): raw observation (a ``[B,O]``
    tensor, or the dict of parts with images uint8) -> deterministic action; normaliser and encoder inside. It
    shares ``ac``'s modules (copy ``ac`` first for a policy that must not move with training)."""
    return DeterministicPolicy(ActionMode(ac.actor, ac.discrete),
                               ObservationFeatures(ac.norm, ac.encoder, ac.part_norms, ac.actor_parts))


class PPO:
    """Owns the actor-critic and its optimizer; the on-policy loop owns envs, storage and logging."""

    name = "ppo"

    def __init__(
        self,
        config: PPOConfig,
        spec: EnvSpec,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        grad_reduce: Callable[[list[torch.Tensor]], None] | None = None,
        stats_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        broadcast: Callable[[nn.Module], None] | None = None,
    ):
        """``grad_reduce`` averages gradients in place across data-parallel ranks, ``stats_reduce`` sums a
        tensor across ranks and ``broadcast`` copies rank 0's parameters to every rank; all None for
        single-process training."""
        self.config, self.device = config, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        self.ac = ActorCritic(config, spec, config.actor_parts, config.critic_parts).to(self.device)
        self.env_spec = spec  # what the envs hand out (every part, the critic's included)
        # what the policy reads, and so what its export takes in: the env's spec without the parts the actor
        # leaves out (a privileged part read by the critic only); the env's spec itself when it reads them all
        whole = self.ac.actor_parts == tuple(p.name for p in spec.parts)
        self.spec = spec if whole else spec.with_parts(self.ac.actor_parts)
        if broadcast is not None:
            broadcast(self.ac)
        self.params = [p for p in self.ac.parameters() if p.requires_grad]
        # fused Adam: one kernel for all parameters (CPU and CUDA)
        self.opt = torch.optim.Adam(self.params, lr=config.lr, eps=1e-5, fused=True)
        self.lr = config.lr
        self.grad_reduce, self.stats_reduce = grad_reduce, stats_reduce

    # -- acting -------------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Stochastic action and its log-prob for a batch of observations ``[N,O]`` (or a dict of parts)."""
        return self.ac.sample(obs, self.gen)

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return deterministic_policy(self.ac)(obs)
        return self.sample(obs)[0]

    def exportable(self) -> nn.Module:
        """The deterministic policy (``deterministic_policy``: a tensor in for flat envs, else the dict of parts)."""
        return deterministic_policy(self.ac)

    # -- learning -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _values(self, obs: Obs, T: int, N: int) -> torch.Tensor:
        """Values of ``[T,N,O]`` observations (or a dict of ``[T,N,*part.shape]`` parts) in chunks -> ``[T,N]``."""
        flat = obs_map(lambda v: v.flatten(0, 1), obs)  # [T*N,O] or parts [T*N,*shape]
        chunk = self.config.value_chunk if self.ac.flat else min(self.config.value_chunk, self.config.minibatch_size)
        out = torch.cat([self.ac.value(obs_index(flat, slice(i, i + chunk))) for i in range(0, T * N, chunk)])  # [T*N]
        return out.view(T, N)

    @property
    def rollout_steps(self) -> int:
        """T: env steps collected per env between updates (the on-policy loop sizes its storage with it)."""
        return self.config.rollout_steps

    def schedule(self, progress: float) -> None:
        """Called by the on-policy loop before every rollout with the fraction of the run done: with
        ``anneal_lr`` the learning rate decays linearly to 0."""
        if self.config.anneal_lr:
            self.set_lr_fraction(1.0 - progress)

    def set_lr_fraction(self, frac: float) -> None:
        """Linear annealing: set lr = config.lr * frac."""
        self.lr = self.config.lr * frac
        for g in self.opt.param_groups:
            g["lr"] = self.lr

    def update(self, batch: Rollout) -> dict[str, torch.Tensor]:
        """One PPO update on a rollout. The statistics stay device tensors (the loop converts them once per log
        step); counts and the learning rate become 0-d tensors on the same device (no host sync)."""
        cfg = self.config
        T, N = batch.reward.shape
        value = self._values(batch.obs, T, N)  # [T,N]
        next_value = self._values(batch.final_obs, T, N)  # [T,N]
        adv, ret = gae(batch.reward, value, next_value, batch.terminated, batch.terminated | batch.truncated,
                       cfg.gamma, cfg.gae_lambda)  # [T,N], [T,N]
        S = T * N
        A = 1 if self.spec.discrete else self.spec.action_dim
        # One packed [S, O+A+4] table of everything a minibatch needs, gathered once per epoch by the
        # permutation so that minibatches are contiguous views. Flat observations are normalized once (the
        # normalizer is frozen during the update) and lead the table; observations with parts stay out of
        # it ([S, A+4]) and each minibatch gathers its rows of every part and encodes them in the loss.
        if self.ac.flat:
            assert isinstance(batch.obs, torch.Tensor)  # a flat spec: plain-tensor observations
            with torch.no_grad():
                lead = [self.ac.features(batch.obs.reshape(S, self.env_spec.obs_dim))]  # [S,O]
            obs_all = None
        else:
            lead, obs_all = [], obs_map(lambda v: v.flatten(0, 1), batch.obs)  # parts [S,*shape]
        O = lead[0].shape[1] if lead else 0
        packed = torch.cat([
            *lead, batch.action.reshape(S, A).to(value.dtype), batch.logp.reshape(S, 1), value.reshape(S, 1),
            adv.reshape(S, 1), ret.reshape(S, 1)], dim=1)  # [S,O+A+4]
        mb = min(cfg.minibatch_size, S)
        n_mb = math.ceil(S / mb)
        sums = torch.zeros(6, device=self.device)  # policy, value, entropy, kl, clipfrac, grad_norm
        steps = 0
        epochs_done = 0
        epoch_kls = []
        for _ in range(cfg.epochs):
            perm = torch.randperm(S, generator=self.gen, device=self.device)  # [S]
            shuffled = packed[perm]  # [S,O+A+4]
            epoch_kl = torch.zeros((), device=self.device)
            for i in range(n_mb):
                rows = shuffled[i * mb:(i + 1) * mb]  # [B,O+A+4] view
                if obs_all is None:
                    x = xc = rows[:, :O]  # [B,O]
                else:  # with gradients into the encoder; the critic's features may hold privileged parts
                    x, xc = self.ac.both_features(obs_index(obs_all, perm[i * mb:(i + 1) * mb]))  # [B,F], [B,F_c]
                act = rows[:, O:O + A]  # [B,A]
                if self.spec.discrete:
                    act = act.squeeze(1).long()  # [B]
                logp_old, v_old, adv_b, ret_b = rows[:, O + A:].unbind(1)  # 4 x [B]
                logp, ent = self.ac.log_prob_entropy(x, act)
                v = self.ac.critic(xc).squeeze(-1)  # [B]
                loss, parts = ppo_losses(cfg, logp, ent, v, logp_old, v_old, adv_b, ret_b)
                self.opt.zero_grad(set_to_none=False)
                loss.backward()
                if self.grad_reduce is not None:
                    grads = [p.grad for p in self.params if p.grad is not None]
                    assert len(grads) == len(self.params)  # every parameter is in the loss: each has a gradient
                    self.grad_reduce(grads)
                if cfg.max_grad_norm > 0:
                    gn = nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                else:
                    gn = torch.zeros((), device=self.device)
                self.opt.step()
                sums += torch.stack([parts["policy"].detach(), parts["value"].detach(), parts["entropy"].detach(),
                                     parts["approx_kl"], parts["clip_frac"], gn.detach()])
                epoch_kl += parts["approx_kl"]
                steps += 1
            epochs_done += 1
            if cfg.kl_adaptive_lr or cfg.target_kl is not None:
                kl = epoch_kl / n_mb
                if self.stats_reduce is not None:
                    kl = self.stats_reduce(kl) / self.world_size()
                kl = float(kl)  # one host sync per epoch
                epoch_kls.append(kl)
                if cfg.kl_adaptive_lr:
                    if kl > 2.0 * cfg.desired_kl:
                        self.lr = max(1e-5, self.lr / 1.5)
                    elif kl < cfg.desired_kl / 2.0:
                        self.lr = min(1e-2, self.lr * 1.5)
                    for g in self.opt.param_groups:
                        g["lr"] = self.lr
                if cfg.target_kl is not None and kl > cfg.target_kl:
                    break
        obs = batch.obs  # a tensor exactly when the spec is flat
        for name, norm in self.ac.norms().items():
            self._update_norm(norm, obs if isinstance(obs, torch.Tensor) else obs[name])
        m = (sums / steps).detach()  # [6]
        with torch.no_grad():
            explained = 1 - (ret - value).var() / (ret.var() + 1e-8)
        info = {
            "loss/policy": m[0], "loss/value": m[1], "stats/entropy": m[2], "stats/approx_kl": m[3],
            "stats/clip_frac": m[4], "stats/grad_norm": m[5],
            **{k: m.new_tensor(float(v)) for k, v in (("stats/grad_steps", steps), ("stats/epochs", epochs_done),
                                                       ("stats/lr", self.lr))}, "stats/value_mean": value.mean(),
            "stats/explained_var": explained, "stats/adv_std": adv.std(),
        }
        if not self.spec.discrete:
            info["stats/action_std"] = self.ac.log_std.detach().exp().mean()
        return info

    def world_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @torch.no_grad()
    def _update_norm(self, norm: RunningNorm, obs: torch.Tensor) -> None:
        """Merge the moments of ``[T,N,O]`` flat observations (or of one vector part) into its normalizer."""
        x = obs.reshape(-1, norm.mean.numel()).double()  # [S,O]
        cnt = torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)
        s1, s2 = x.sum(0), x.square().sum(0)  # [O]
        if self.stats_reduce is not None:
            packed = self.stats_reduce(torch.cat([s1, s2, cnt.view(1)]))
            s1, s2, cnt = packed[: len(s1)], packed[len(s1): 2 * len(s1)], packed[-1]
        mean = s1 / cnt
        var = (s2 / cnt - mean.square()).clamp_min(0)
        norm.merge(mean.to(norm.mean.dtype), var.to(norm.var.dtype), cnt)

    # -- state --------------------------------------------------------------------------------------
    def parameters_finite(self) -> bool:
        return bool(torch.stack([p.detach().isfinite().all() for p in self.params]).all())

    def state_dict(self) -> dict:
        return {"ac": self.ac.state_dict(), "opt": self.opt.state_dict(), "lr": self.lr,
                "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.ac.load_state_dict(state["ac"])
        self.opt.load_state_dict(copy.deepcopy(state["opt"]))  # Optimizer.load_state_dict keeps references
        self.lr = state["lr"]
        for g in self.opt.param_groups:
            g["lr"] = self.lr
        self.gen.set_state(state["gen"])


register(AlgoEntry(
    "ppo", PPOConfig, PPO, regime="on-policy",
    summary="Proximal Policy Optimization for many parallel envs (Gaussian or categorical head)",
    scale_envs=scale_envs, continuous_only=False, distributed=True))
