"""NeuBay (Ni, Derman, Jain, Taboga, Ravanbakhsh, Bacon 2025, "Long-Horizon Model-Based Offline RL Without
Conservatism", arXiv 2512.04341; docs/algorithms/neubay.md; code twni2016/neubay @5604bad, read for the details below).

A history-dependent SAC trained on episode tapes (``storage.tapes``): real history prefixes and their long
imagined continuations under one posterior sample of the world model each (``world_models.history``). No
conservatism: the value is kept in check by long rollouts and uncertainty truncation, not by a penalty.

Agent input per step: ``x_t = concat(obs_t, a_{t-1}, r_{t-1})``, zeros at an episode's first step. Two encoders
of the same shape (actor; critic, with a target copy), each the LRU sequence model ``core.sequence.LRUEncoder``:
``Linear(I, d_model) + LayerNorm + LeakyReLU``, then ``lru_layers`` residual LRU layers (Orvieto et al. 2023,
"Resurrecting Recurrent Neural Networks", as the paper's code: ``x + GLU(GELU(LRU(LayerNorm(x))))``), where the
LRU is the diagonal complex recurrence ``h_t = lambda * h_{t-1} + (gamma * B) x_t``, ``y_t = Re(C h_t) + D * x_t``,
with ``|lambda|`` initialised in ``[r_min, r_max]`` and phases in ``[0, max_phase]``.

Losses of a batch of T rows (z = encoder features, h = the history up to and including x_t, h' = with x_{t+1}):

    a' ~ pi(.|h'),  y = r + gamma (1 - terminated) (min_{i in random M of N} Qbar_i(h', a') - alpha log pi(a'|h'))
    L_Q     = mix_t( mean_i Huber(Q_i(h_t, a_t) - y_t) )                 (every head regresses to the same y)
    L_pi    = mix_t( alpha log pi(a|h_t) - mean_i Q_i(h_t, a) ),  a ~ pi(.|h_t)   (MEAN over heads, not min)
    L_alpha = mix_t( alpha (H_t - H_target) ),  H_t = -log pi(a|h_t)      (the paper's form, gradient in log alpha)
    mix_t(l) = real_weight * mean_{real t} l_t + (1 - real_weight) * mean_{imagined t} l_t

The target critic has its own encoder copy; both move by Polyak averaging. The actor loss is taken after the
critic step, through the updated critic (its encoder run again, without gradient). Optimisers: AdamW, weight
decay 0, eps 1e-8; gradients NaN-zeroed, then clipped to global norm ``grad_clip`` separately for each
encoder and each head (the paper's per-label optax chains); lr cosine-decayed over the run to
``lr * ratio`` (critic ratio 1.0: constant; actor ratio 0.0), encoders at ``encoder_lr`` with their network's
ratio. The loop sets the schedule with ``schedule(progress)`` before every update (``core.protocols.Scheduled``).

Sequences. A batch (``TapeBatch``) is one flat sequence of concatenated tapes. The encoders read
``S = T + P`` inputs: every row's ``x_t``, and after the last row of each of the P tapes one extra input built
from that row's ``next_obs`` (so h' exists for every row; ``sequence``). The recurrence restarts (hidden 0)
at each tape's first row. The encoders run the recurrence over the sequence as a parallel prefix scan
(``core.sequence.linear_scan``); the actor's one-step recurrence (``LRUEncoder.step``) runs while acting. Both
agree to float rounding (tested).

Acting in the real env (``act``): the policy keeps a hidden state, the previous action and reward per env.
``reset_state(n)`` starts n fresh episodes; ``observe(reward, done)`` after every env step feeds the reward
to the next input and resets the envs whose episode ended (evaluation, ``learn.evaluate``, calls both). Without
``observe`` every previous reward is 0. ``exportable()`` is the deterministic recurrent policy
``(obs, prev_action, prev_reward, hidden) -> (action, hidden)`` (``RecurrentPolicy``).

Deliberate deviations: the paper's alpha loss uses alpha itself (kept); its encoders are JAX/Equinox
(initialisations reproduced from its code: LRU as ``memory/lru.py``, critic output layer uniform
``+-sqrt(0.01 / fan_in)`` with zero bias, other layers PyTorch's ``nn.Linear`` default = Equinox's); GELU is
the tanh approximation (JAX's default).

Shape letters: T batch rows, S sequence rows, P tapes, N envs, E critic heads, M target subset, O obs dim,
A action dim, I = O + A + 1 input dim, D d_model, L LRU layers, H LRU hidden (complex).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.distributions import LOG_STD_MAX, LOG_STD_MIN, tanh_normal_sample
from ctrl_rl.core.losses import td_target
from ctrl_rl.core.nets import EnsembleLinear, norm_block
from ctrl_rl.core.obs import Obs
from ctrl_rl.core.optim import set_grads
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.sequence import LRUEncoder
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.tapes import TapeBatch
from ctrl_rl.world_models.history import agent_inputs, prefix_inputs


@dataclass(frozen=True)
class NeuBayConfig:
    """NeuBay's agent (defaults: the paper's ``configs/d4rl_loco/base.yaml``; docs/algorithms/neubay.md#defaults)."""

    d_model: int = 256
    """Width of the encoders' input block and LRU layers (paper 256)."""
    lru_hidden: int = 128
    """Complex hidden units of every LRU (paper ``d_hidden`` 128)."""
    lru_layers: int = 2
    """LRU layers per encoder (paper 2)."""
    r_min: float = 0.0
    """Smallest initial |lambda| of the recurrence (paper 0)."""
    r_max: float = 0.9
    """Largest initial |lambda| (paper 0.9; 'affects stability')."""
    max_phase: float = 6.28
    """Largest initial phase of lambda (the paper's LRU code: 6.28)."""
    head_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the actor head and of every critic head, each Linear + LayerNorm + LeakyReLU (paper 2 x 256)."""
    num_critics: int = 10
    """N: critic heads on the shared critic encoder (paper 10, REDQ-style)."""
    target_subset: int = 2
    """M: target heads drawn at random for the min in the TD target (paper 2)."""
    critic_out_scale: float = 0.01
    """Critic output layers initialised uniform in +-sqrt(scale / fan_in), zero bias (paper 0.01)."""
    gamma: float = 0.99
    tau: float = 0.005
    """Polyak rate of the target critic and its encoder."""
    actor_lr: float = 1e-4
    """Learning rate of the actor head (paper 1e-4)."""
    critic_lr: float = 1e-4
    """Learning rate of the critic heads (paper 1e-4)."""
    encoder_lr: float = 1e-5
    """Learning rate of both encoders (paper base 1e-5; tuned per dataset from 3e-7 to 3e-5,
    docs/algorithms/neubay.md)."""
    alpha_lr: float = 1e-4
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    """Cosine decay of actor and critic learning rates over the run (paper), or constant."""
    actor_lr_ratio: float = 0.0
    """Final actor (and actor encoder) lr as a fraction of its initial value (paper 0.0)."""
    critic_lr_ratio: float = 1.0
    """Final critic (and critic encoder) lr as a fraction of its initial value (paper 1.0: no decay)."""
    adam_eps: float = 1e-8
    grad_clip: float = 1000.0
    """Global-norm clip of every encoder's and head's gradients (paper 1000)."""
    init_alpha: float = 0.2
    learn_alpha: bool = True
    """Tune the temperature towards the target entropy (paper: yes for most datasets; hopper: fixed 0.2)."""
    target_entropy: float | None = None
    """Target policy entropy (None: -|A|, the paper's ratio 1.0)."""
    backup_entropy: bool = True
    """Subtract alpha log pi(a'|h') in the TD target (paper: on)."""
    real_weight: float = 0.05
    """w_real: weight of the real rows' mean loss against the imagined rows' (paper base 0.05; 0.05-0.8 per dataset)."""
    bf16: bool = False
    """Mixed precision of the update: its network passes under bfloat16 autocast (matrix products with bfloat16
    inputs; hidden activations, LayerNorms and their gradients in bfloat16), parameters, optimizer states, the LRU
    recurrence, the output layers (critic values, the actor's mean and log-std) and the losses in float32. 1.44x
    the float32 update's gradient steps/s on a 2-core CPU with AMX, none on an H200, where the update is host-bound
    (experiments/model_based_speed); it changes what the update computes by bfloat16's rounding (relative 2^-8).
    Acting and rollouts stay float32."""

    def __post_init__(self) -> None:
        try:
            check_fields(self)
        except ValueError as e:
            raise UserInputError(str(e)) from None
        ints = ("d_model", "lru_hidden", "lru_layers", "num_critics", "target_subset")
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {v!r}: expected a positive integer")
        if not 1 <= self.target_subset <= self.num_critics:
            raise UserInputError(f"invalid --target-subset {self.target_subset}: expected 1 to --num-critics "
                                 f"{self.num_critics}")
        if not 0.0 <= self.r_min < self.r_max < 1.0:
            raise UserInputError(f"invalid --r-min {self.r_min} / --r-max {self.r_max}: "
                                 "expected 0 <= r_min < r_max < 1")
        for name in ("real_weight", "actor_lr_ratio", "critic_lr_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: expected a fraction "
                                     "in [0, 1]")
        if not 0.0 < self.tau <= 1.0 or not 0.0 <= self.gamma <= 1.0:
            raise UserInputError(f"invalid --tau {self.tau} / --gamma {self.gamma}: expected 0 < tau <= 1 and "
                                 "0 <= gamma <= 1")
        for name in ("init_alpha", "grad_clip", "adam_eps", "critic_out_scale", "max_phase"):
            if not getattr(self, name) > 0:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: "
                                     "expected a positive number")
        if self.lr_schedule not in ("cosine", "constant"):
            raise UserInputError(f"invalid --lr-schedule {self.lr_schedule!r}: expected 'cosine' or 'constant'")




def encoder(in_dim: int, c: NeuBayConfig) -> LRUEncoder:
    """A history encoder: inputs ``x_t [I]`` -> features ``z_t [D]`` of the history so far."""
    return LRUEncoder(in_dim, c.d_model, c.lru_hidden, c.lru_layers, c.r_min, c.r_max, c.max_phase)


class ActorHead(nn.Module):
    """Tanh-Gaussian policy head on history features: blocks -> (mean, log std clamped to [-5, 2])."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], action_dim: int):
        super().__init__()
        dims = (in_dim, *hidden)
        self.net = nn.Sequential(*(norm_block(a, b) for a, b in zip(dims[:-1], dims[1:])),
                                 nn.Linear(dims[-1], 2 * action_dim))

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.net[:-1](z)  # [B,h]
        with torch.autocast(h.device.type, enabled=False):  # the output layer in float32 (NeuBayConfig.bf16)
            mean, log_std = self.net[-1](h.float()).chunk(2, -1)  # [B,A] each
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)


class CriticHeads(nn.Module):
    """E critic heads in one batched call: per head blocks (per-head LayerNorm) -> Linear(1), on ``(z, a)``."""

    def __init__(self, members: int, in_dim: int, hidden: tuple[int, ...], out_scale: float):
        super().__init__()
        dims = (in_dim, *hidden, 1)
        self.layers = nn.ModuleList(EnsembleLinear(members, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.ln_scale = nn.ParameterList(nn.Parameter(torch.ones(members, 1, h)) for h in hidden)
        self.ln_shift = nn.ParameterList(nn.Parameter(torch.zeros(members, 1, h)) for h in hidden)
        with torch.no_grad():
            bound = math.sqrt(out_scale / dims[-2])
            out = cast(EnsembleLinear, self.layers[-1])  # built above (ModuleList items are typed Module)
            out.weight.uniform_(-bound, bound)
            out.bias.zero_()

    def forward(self, z: torch.Tensor, action: torch.Tensor, heads: torch.Tensor | None = None) -> torch.Tensor:
        """``[E,B]`` values of features ``z [B,D]`` and actions ``[B,A]``; ``heads [M]``: only those heads, ``[M,B]``
        (the TD target's random subset, without computing the other heads)."""
        x = torch.cat([z, action], -1)  # [B,D+A]
        if torch.is_autocast_enabled(x.device.type):  # cast once before the expand, not once per head
            x = x.to(torch.get_autocast_dtype(x.device.type))
        last = len(self.layers) - 1
        for i, layer in enumerate(self.linears()):
            w, b = (layer.weight, layer.bias) if heads is None else (layer.weight[heads], layer.bias[heads])
            if x.dim() == 2:
                x = x.expand(w.shape[0], *x.shape)  # [E,B,in] (a view)
            if i == last:
                with torch.autocast(x.device.type, enabled=False):  # the values in float32 (NeuBayConfig.bf16)
                    x = torch.baddbmm(b, x.float(), w)  # [E,B,1]
                break
            x = torch.baddbmm(b, x, w)  # [E,B,h]
            scale, shift = self.ln_scale[i], self.ln_shift[i]  # [E,1,h]
            if heads is not None:
                scale, shift = scale[heads], shift[heads]
            # the affine in the activations' dtype (bfloat16 under autocast: no float32 copy of [E,B,h])
            x = F.leaky_relu(torch.addcmul(shift.to(x.dtype), F.layer_norm(x, x.shape[-1:]), scale.to(x.dtype)),
                             inplace=True)
        return x.squeeze(-1)  # [E,B]

    def linears(self) -> list[EnsembleLinear]:
        """``self.layers`` typed: every entry is an ``EnsembleLinear`` (built so in ``__init__``)."""
        return [cast(EnsembleLinear, layer) for layer in self.layers]  # ModuleList yields nn.Module


class RecurrentPolicy(nn.Module):
    """Exported deterministic policy: ``forward(obs [N,O], prev_action [N,A], prev_reward [N], hidden [N,L,H,2])
    -> (action [N,A] in [-1, 1], hidden [N,L,H,2])``; ``hidden`` holds the real and imaginary parts of the actor's
    LRU states (zeros at an episode's start, with zero previous action and reward). Real arithmetic only
    (``LRUEncoder.step_real``), so it exports to ONNX; traceable with
    ``torch.jit.trace(policy, (obs, prev_action, prev_reward, hidden))``."""

    def __init__(self, encoder: LRUEncoder, head: ActorHead):
        super().__init__()
        self.encoder, self.head = encoder, head

    def initial_hidden(self, n: int) -> torch.Tensor:
        first = cast(nn.Linear, self.encoder.pre[0])  # norm_block starts with its Linear
        return torch.zeros(n, *self.encoder.hidden_shape, 2, device=first.weight.device)

    def forward(self, obs, prev_action, prev_reward, hidden):
        z, h = self.encoder.step_real(agent_inputs(obs, prev_action, prev_reward), hidden)
        return torch.tanh(self.head(z)[0]), h


def mixed_mean(values: torch.Tensor, real: torch.Tensor, real_weight: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w * mean_real + (1 - w) * mean_imagined, mean_real, mean_imagined)`` of ``values [T]``; a side without rows
    contributes 0 (the paper's clip of the counts at 1)."""
    r = real.to(values.dtype)  # [T]
    i = 1.0 - r
    m_real = (values * r).sum() / r.sum().clamp(min=1.0)
    m_imag = (values * i).sum() / i.sum().clamp(min=1.0)
    return real_weight * m_real + (1.0 - real_weight) * m_imag, m_real, m_imag


class NeuBay:
    """Owns the two encoders, actor and critic heads, the target critic, temperature, optimizers and the acting
    state."""

    name = "neubay"

    def __init__(self, config: NeuBayConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None):
        if spec.discrete or not spec.is_flat:
            raise UserInputError(f"neubay needs flat observations and continuous actions: {spec.env_id} has "
                                 f"{'discrete actions' if spec.discrete else 'observation parts'}")
        self.config, self.spec, self.device = config, spec, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        c, A = config, spec.action_dim
        in_dim = spec.obs_dim + A + 1
        self.actor_encoder = encoder(in_dim, c).to(self.device)
        self.actor = ActorHead(c.d_model, c.head_hidden, A).to(self.device)
        self.critic_encoder = encoder(in_dim, c).to(self.device)
        self.critic = CriticHeads(c.num_critics, c.d_model + A, c.head_hidden, c.critic_out_scale).to(self.device)
        self.target_encoder = copy.deepcopy(self.critic_encoder).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(c.init_alpha), device=self.device, requires_grad=c.learn_alpha)
        self.target_entropy = float(-A if c.target_entropy is None else c.target_entropy)
        # one group per encoder and per head: its own lr and its own gradient clip (the paper's labels)
        self.critic_groups = [list(self.critic_encoder.parameters()), list(self.critic.parameters())]
        self.actor_groups = [list(self.actor_encoder.parameters()), list(self.actor.parameters())]
        self.actor_params = [p for g in self.actor_groups for p in g]
        self.base_lrs = {"critic": (c.encoder_lr, c.critic_lr), "actor": (c.encoder_lr, c.actor_lr)}
        self.critic_opt = torch.optim.AdamW([{"params": g, "lr": lr} for g, lr in zip(self.critic_groups,
                                                                                       self.base_lrs["critic"])],
                                            weight_decay=0.0, eps=c.adam_eps, fused=True)
        self.actor_opt = torch.optim.AdamW([{"params": g, "lr": lr} for g, lr in zip(self.actor_groups,
                                                                                      self.base_lrs["actor"])],
                                           weight_decay=0.0, eps=c.adam_eps, fused=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=c.alpha_lr) if c.learn_alpha else None
        self._tgt = [*self.target_encoder.parameters(), *self.target_critic.parameters()]
        self._src = [*self.critic_encoder.parameters(), *self.critic.parameters()]
        self.updates = 0
        self._hidden: torch.Tensor | None = None  # acting state: [N,L,H] complex, prev action [N,A], prev reward [N]
        self._prev_a: torch.Tensor | None = None
        self._prev_r: torch.Tensor | None = None

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    # ---- schedule, sequences ------------------------------------------------------------------------

    def schedule(self, progress: float) -> None:
        """Cosine decay: lr = base * (ratio + (1 - ratio) * (1 + cos(pi * progress)) / 2), progress in [0, 1]."""
        if self.config.lr_schedule == "constant":
            return
        cos = 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
        c = self.config
        for opt, bases, ratio in ((self.critic_opt, self.base_lrs["critic"], c.critic_lr_ratio),
                                  (self.actor_opt, self.base_lrs["actor"], c.actor_lr_ratio)):
            for group, base in zip(opt.param_groups, bases):
                group["lr"] = base * (ratio + (1.0 - ratio) * cos)

    @staticmethod
    def sequence(batch: TapeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoders' input sequence of a batch (module docstring): ``(x [S,I], start [S], pos [T])``; row t's
        history ends at ``pos[t]`` and its next history at ``pos[t] + 1``. Needs ``batch.first[0]``."""
        T, P = len(batch), batch.tapes()
        first = batch.first
        end = torch.cat([first[1:], first.new_ones(1)]).long()  # [T] last row of its tape
        pos = torch.arange(T, device=first.device) + end.cumsum(0) - end  # [T]
        S = T + P
        x_row = prefix_inputs(batch.obs, batch.action, batch.reward, first)  # [T,I]
        x_next = agent_inputs(batch.next_obs, batch.action, batch.reward)  # [T,I]
        seq = x_row.new_zeros(S + 1, x_row.shape[1])  # [S+1,I]; row S takes the writes of rows that are no end
        seq[torch.where(end.bool(), pos + 1, S)] = x_next
        seq[pos] = x_row
        start = torch.zeros(S, dtype=torch.bool, device=first.device)  # [S]
        start[pos] = first
        return seq[:S], start, pos

    def _encode(self, encoder: LRUEncoder, seq: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return encoder(seq.unsqueeze(1), start.unsqueeze(1))[0].squeeze(1)  # [S,D]

    # ---- losses and steps ---------------------------------------------------------------------------

    def critic_loss(self, batch: TapeBatch, seq: torch.Tensor | None = None, start: torch.Tensor | None = None,
                    pos: torch.Tensor | None = None, policy: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The mixed Huber TD loss (module docstring) with gradient into the critic encoder and heads. ``policy`` =
        the actor's ``(mean, log_std)`` over the sequence, if already computed (used without gradient)."""
        c = self.config
        if seq is None or start is None or pos is None:  # given together (update) or not at all
            seq, start, pos = self.sequence(batch)
        nxt = pos + 1  # [T]
        with torch.no_grad():
            mean, log_std = policy if policy is not None else self.actor(self._encode(self.actor_encoder, seq, start))
            a_next, logp_next = tanh_normal_sample(mean[nxt], log_std[nxt], self.gen)  # [T,A], [T]
            subset = torch.randperm(c.num_critics, generator=self.gen, device=self.device)[: c.target_subset]  # [M]
            # only the subset's target heads are computed: the TD target reads no other
            q_next = self.target_critic(self._encode(self.target_encoder, seq, start)[nxt], a_next, subset)  # [M,T]
            y = td_target(q_next, torch.arange(c.target_subset, device=self.device), batch.reward, batch.terminated,
                          logp_next, self.alpha, c.gamma, c.backup_entropy)  # [T]
        q = self.critic(self._encode(self.critic_encoder, seq, start)[pos], batch.action)  # [E,T]
        per_row = F.huber_loss(q, y.expand_as(q), reduction="none").mean(0)  # [T]
        loss, l_real, l_imag = mixed_mean(per_row, batch.real, c.real_weight)
        qd = q.detach().mean(0)  # [T]
        _, q_real, q_imag = mixed_mean(qd, batch.real, c.real_weight)
        return loss, {"loss/critic": loss.detach(), "loss/critic_real": l_real.detach(),
                      "loss/critic_imag": l_imag.detach(), "stats/q_mean": qd.mean(), "stats/q_real": q_real,
                      "stats/q_imag": q_imag, "stats/q_max": q.detach().max(), "stats/target_mean": y.mean()}

    def _apply(self, opt: torch.optim.Optimizer, groups: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """NaN-zero and clip each group's gradients (``grad_clip``), then step; returns the groups' norms."""
        norms = []
        for g in groups:
            grads = [p.grad for p in g if p.grad is not None]
            for gr in grads:
                gr.masked_fill_(gr.isnan(), 0.0)
            norms.append(torch.nn.utils.clip_grad_norm_(g, self.config.grad_clip, foreach=True))
        opt.step()
        return norms

    def update(self, batch: TapeBatch) -> dict[str, torch.Tensor]:
        """One critic step (and target update), then one actor and one temperature step, on one tape batch
        (under bfloat16 autocast with ``bf16``). Returns device tensors (no host sync)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            return self._update(batch)

    def _update(self, batch: TapeBatch) -> dict[str, torch.Tensor]:
        c = self.config
        seq, start, pos = self.sequence(batch)
        mean, log_std = self.actor(self._encode(self.actor_encoder, seq, start))  # [S,A] each, with gradient
        loss_q, info = self.critic_loss(batch, seq, start, pos, (mean.detach(), log_std.detach()))
        self.critic_opt.zero_grad(set_to_none=True)
        loss_q.backward()
        enc_norm, head_norm = self._apply(self.critic_opt, self.critic_groups)
        polyak_(self._tgt, self._src, c.tau)
        # actor: a ~ pi(.|h_t) with gradient; the updated critic (encoder without gradient) scores it
        a, logp = tanh_normal_sample(mean[pos], log_std[pos], self.gen)  # [T,A], [T]
        with torch.no_grad():
            zc = self._encode(self.critic_encoder, seq, start)[pos]  # [T,D]
        q_pi = self.critic(zc, a).mean(0)  # [T] mean over heads
        loss_pi, pi_real, pi_imag = mixed_mean(self.alpha * logp - q_pi, batch.real, c.real_weight)
        grads = torch.autograd.grad(loss_pi, self.actor_params, allow_unused=True)
        set_grads(self.actor_params, grads)  # in each parameter's layout (core.optim)
        self._apply(self.actor_opt, self.actor_groups)
        entropy = -logp.detach()  # [T]
        _, h_real, h_imag = mixed_mean(entropy, batch.real, c.real_weight)
        info.update({"loss/actor": loss_pi.detach(), "loss/actor_real": pi_real.detach(),
                     "loss/actor_imag": pi_imag.detach(), "stats/entropy_real": h_real, "stats/entropy_imag": h_imag,
                     "stats/alpha": self.alpha, "stats/real_fraction": batch.real.float().mean(),
                     "stats/critic_encoder_grad_norm": enc_norm, "stats/critic_head_grad_norm": head_norm})
        if self.alpha_opt is not None:
            loss_a, _, _ = mixed_mean(self.log_alpha.exp() * (entropy - self.target_entropy), batch.real, c.real_weight)
            self.alpha_opt.zero_grad(set_to_none=True)
            loss_a.backward()
            self.alpha_opt.step()
            info["loss/alpha"] = loss_a.detach()
        self.updates += 1
        return info

    # ---- the collector's interface (world_models.history.HistoryAgent) -----------------------------

    @torch.no_grad()
    def warm_up(self, inputs: torch.Tensor, start: torch.Tensor,
                last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z, hidden = self.actor_encoder(inputs.unsqueeze(1), start.unsqueeze(1), at=last)  # [W,1,D], [P,1,L,H]
        return hidden.squeeze(1), z[last, 0]

    @torch.no_grad()
    def advance(self, inputs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z, hidden = self.actor_encoder.step(inputs, hidden)
        return hidden, z

    @torch.no_grad()
    def sample_action(self, features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        mean, log_std = self.actor(features)  # [N,A] each
        return tanh_normal_sample(mean, log_std, generator)[0]

    # ---- acting in the real env ---------------------------------------------------------------------

    def reset_state(self, n: int) -> None:
        """Start n fresh episodes: zero hidden state, previous action and reward."""
        L, H = self.actor_encoder.hidden_shape
        self._hidden = torch.zeros(n, L, H, dtype=torch.complex64, device=self.device)  # [N,L,H]
        self._prev_a = torch.zeros(n, self.spec.action_dim, device=self.device)  # [N,A]
        self._prev_r = torch.zeros(n, device=self.device)  # [N]

    @torch.no_grad()
    def observe(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """After an env step: the reward becomes the next input's previous reward; ended episodes restart."""
        if self._hidden is None or self._prev_a is None:  # set together by reset_state
            return
        keep = (~done.to(self.device, torch.bool)).float()  # [N]
        self._prev_r = reward.to(self.device, torch.float32) * keep
        self._prev_a = self._prev_a * keep.unsqueeze(1)
        self._hidden = self._hidden * keep[:, None, None]

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        """The next action of N envs given their observation; the history so far is the acting state
        (``reset_state`` when N changes)."""
        assert isinstance(obs, torch.Tensor)  # NeuBay takes flat observations
        if self._hidden is None or self._hidden.shape[0] != obs.shape[0]:
            self.reset_state(obs.shape[0])
        assert self._hidden is not None and self._prev_a is not None and self._prev_r is not None  # reset_state
        z, self._hidden = self.actor_encoder.step(agent_inputs(obs.float(), self._prev_a, self._prev_r), self._hidden)
        mean, log_std = self.actor(z)  # [N,A] each
        a = torch.tanh(mean) if deterministic else tanh_normal_sample(mean, log_std, self.gen)[0]
        self._prev_a = a
        return a

    def exportable(self) -> nn.Module:
        """``RecurrentPolicy`` on copies of the actor encoder and head, in evaluation mode."""
        return RecurrentPolicy(copy.deepcopy(self.actor_encoder), copy.deepcopy(self.actor)).eval()

    # ---- checkpoints --------------------------------------------------------------------------------

    def parameters_finite(self) -> bool:
        params = [*self.actor_params, *self._src, self.log_alpha]
        return bool(torch.stack([p.detach().isfinite().all() for p in params]).all())

    def state_dict(self) -> dict:
        return {"actor_encoder": self.actor_encoder.state_dict(), "actor": self.actor.state_dict(),
                "critic_encoder": self.critic_encoder.state_dict(), "critic": self.critic.state_dict(),
                "target_encoder": self.target_encoder.state_dict(), "target_critic": self.target_critic.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(), "updates": self.updates,
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "alpha_opt": self.alpha_opt.state_dict() if self.alpha_opt is not None else None,
                "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        for k in ("actor_encoder", "actor", "critic_encoder", "critic", "target_encoder", "target_critic"):
            getattr(self, k).load_state_dict(state[k])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.updates = int(state["updates"])
        # deep copies: torch's Optimizer.load_state_dict keeps references to the given state tensors
        self.actor_opt.load_state_dict(copy.deepcopy(state["actor_opt"]))
        self.critic_opt.load_state_dict(copy.deepcopy(state["critic_opt"]))
        if self.alpha_opt is not None and state["alpha_opt"] is not None:
            self.alpha_opt.load_state_dict(copy.deepcopy(state["alpha_opt"]))
        self.gen.set_state(state["gen"])


register(AlgoEntry(
    "neubay", NeuBayConfig, NeuBay, regime="model-based", collector="tapes",
    summary="NeuBay: history-conditioned (LRU) SAC on long model rollouts, one ensemble member per rollout, "
            "uncertainty truncation, no conservatism",
    run_defaults={"num_envs": 1, "total_steps": 2_000_000, "log_every": 1000, "checkpoint_every": 20_000,
                  "eval_every": 20_000, "eval_episodes": 20},
    continuous_only=True, requires_dataset=True,
    # docs/algorithms/dynamics.md#neubays-model: 128 members of 4 blocks Linear(200) -> LayerNorm -> LeakyReLU (no skip
    # connection in the
    # paper's code), log sigma soft-clamped to
    # [-5, 0.25], weight decay 5e-5, each member on its own permutation (no bootstrap), holdout min(20%, 1000),
    # early stop after 5 epochs without a 1% gain, the 100 lowest-holdout members kept
    model_defaults={"members": 128, "elites": 100, "hidden": (200, 200, 200, 200), "layer_norm": True,
                    "residual": False, "activation": "leaky_relu", "logvar_bounds": "fixed",
                    "weight_decay": (5e-5,) * 5, "bootstrap": False, "max_holdout": 1000, "min_epochs": 0}))
