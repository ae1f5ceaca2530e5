"""SAC Flow: SAC with a flow policy trained end to end through its noisy K-step rollout.

Paper: Zhang et al. 2025, "Sample-Efficient RL of Flow-Based Policies via Velocity-Reparameterized Sequential
Modeling" (arXiv 2509.25756); official JAX code Elessar123/SAC-FLOW. docs/algorithms/sac_flow.md.

Policy (noise-augmented rollout; dt = 1/K, t_i = i/K, i = 0..K-1):

    A_0 ~ N(0, I)
    m_i = A_i + dt * v(s, A_i, t_i),   A_{i+1} = m_i + s_i * eps_i,   eps_i ~ N(0, I) fresh per step and call
    a   = tanh(A_K)
    log pi(a|s) := log N(A_0; 0, I) + sum_i log N(A_{i+1}; m_i, s_i^2) - sum_j log(1 - tanh(A_Kj)^2)

``log pi`` is the log-density of the whole noisy path; it replaces the marginal action density in every SAC
term (critic target, actor loss, temperature loss). Gradients of the actor loss flow through all K steps
(reparameterised). ``mode`` is the noise-free path from A_0 = 0. Velocity fields (``velocity``):

    gated   (Flow-G, docs/algorithms/sac_flow.md): x = [BRN(s, A_i), emb(t_i)],  v = sigmoid(Gate(x)) * (Cand(x) - A_i);
            s_i = sigma(s) from a state-only MLP. Gate's last layer starts at W = 0, b = 5, so every step begins
            as a plain residual move towards the candidate (g = sigmoid(5) = 0.993).
    decoded (Flow-T, docs/algorithms/sac_flow.md): the step token Dense(BRN(A_i)) + TimeMLP(t_i) runs through decoder
    blocks shared
            over the steps (self-attention on itself, cross-attention to the obs token, FFN); two heads give the
            velocity mean mu_i and log sigma_i. The noise is on the velocity, A_{i+1} = A_i + dt (mu_i + sigma_i eps_i),
            so s_i = dt sigma_i, and the density includes its Jacobian -log(dt sigma_i).
    naive   (the unstable baseline, docs/algorithms/sac_flow.md): v, log sigma = MLP(BRN(s, A_i, t_i)).

    log sigma = log_min + (log_max - log_min) (tanh(h) + 1) / 2       (h: raw network output)

With one step token and one obs token, every softmax in the decoder is over a single key and equals 1, so
attention is exactly out_proj(value_proj(.)): the query/key projections are left out (they could not change the
output), and the cross-attention term, a function of the observation only, is computed once per call.

SAC losses, critics, CrossQ option, targets and export are ctrl_rl.algos.sac's, with the paper's target entropy 0
and initial temperature 0.2 (docs/algorithms/sac_flow.md).

Offline-to-online (docs/algorithms/sac_flow.md), as functions of the agent and a buffer:

    flow matching:  L_FM = mean || v(s, x_t, t) - (x_1 - x_0) ||^2,  x_t = (1 - t) x_0 + t x_1,
                    x_0 ~ N(0, I), t ~ U[0, 1], x_1 = atanh(clip(a_data))   (pre-tanh data actions)
    online actor:   L_pi = alpha_reg * mean (a_pi(s) - a_data)^2 - mean_i Q_i(s, a_pi) + alpha * log pi(a_pi|s)

Deliberate deviations from the official code: (1) fresh noise at every step of every call (the offline-to-online
agents draw it from a fixed PRNGKey(42)); (2) Flow-T's transition density includes -log(dt sigma) (the from-scratch
file scores only log N(eps; 0, 1)); (3) the exact stable tanh log-det instead of log(1 - tanh^2 + 1e-6);
(4) Flow-T uses one BatchRenorm on A_i shared by all steps (the code creates one per step, which has no meaning
for the continuous t of flow matching); (5) flow matching regresses onto atanh of the clipped data action, since
the policy emits tanh(A_K) (the code regresses onto the raw action); squared errors are averaged over batch and
action dims as in the code; (6) offline-to-online keeps the learned noise std (the code fixes 0.1 / 0.05) and
has no action chunks. MLP initialisation is ctrl_rl's (orthogonal), the decoder's PyTorch's default.

Shape letters: K flow steps, B batch, O obs dim, A action dim, D model width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import torch
from torch import nn
from torch.nn import functional as F

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SACActor, SACConfig
from ctrl_rl.core.distributions import tanh_log_det
from ctrl_rl.core.nets import BatchRenorm, mlp
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError

FlowVelocity = Literal["gated", "decoded", "naive"]
StepFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
"""``step(x [B,A], i)`` -> velocity mean ``[B,A]`` and log sigma ``[B,A]`` at ``A_i = x`` and time ``t_i``."""
_LOG_2PI = math.log(2 * math.pi)
PRE_TANH_CLIP = 0.999
"""Data actions are clipped to [-0.999, 0.999] before atanh (|atanh| <= 3.8)."""


@dataclass(frozen=True)
class SACFlowConfig(SACConfig):
    """SAC Flow hyperparameters: SAC's (``actor_hidden`` unused) plus the flow policy's, defaults from the
    paper's from-scratch code. The paper's from-scratch runs also use the CrossQ backbone (``crossq=True``,
    ``adam_beta1=0.5``, ``policy_delay=3``, ``critic_lr=1e-3``, ``critic_hidden=(1024, 1024)``, ``batch_size=512``,
    ``learning_starts=50_000``); those stay SAC's defaults here and belong in a preset."""

    init_alpha: float = 0.2
    """Initial temperature (paper: 0.2)."""
    target_entropy: float | None = 0.0
    """Target entropy of the path log-likelihood (paper: 0; -|A| behaves differently, docs/algorithms/sac_flow.md)."""
    velocity: FlowVelocity = "gated"
    """Velocity field: "gated" (Flow-G), "decoded" (Flow-T transformer decoder) or "naive" (plain MLP)."""
    flow_steps: int = 4
    """K: Euler steps of the rollout (dt = 1/K)."""
    flow_hidden: int = 512
    """Flow-G: hidden width of the gate and candidate MLPs; naive: width of both hidden layers."""
    time_embed_dim: int = 32
    """Flow-G: sinusoidal time features, then Dense(2x) -> swish -> Dense(this)."""
    noise_hidden: tuple[int, ...] = (512, 512)
    """Flow-G: hidden widths of the state-only ReLU MLP giving the per-step noise std."""
    d_model: int = 96
    """Flow-T: token width (obs encoder d/2 -> d, time MLP d/4 -> d/2 -> d, FFN 4d). The paper's 4 attention
    heads are not a setting: with one key per softmax the head count cannot change the output."""
    n_layers: int = 2
    """Flow-T: decoder blocks, shared by all K steps."""
    noise_log_std_min: float = -5.0
    """Lower end of the tanh-rescaled log noise std."""
    noise_log_std_max: float = 2.0
    """Upper end of the tanh-rescaled log noise std."""
    gate_bias: float = 5.0
    """Flow-G: initial bias of the gate's last layer (its weights start at zero)."""
    alpha_reg: float = 100.0
    """Offline-to-online (``sac_flow_o2o``): weight of the action regulariser ``mean (a_pi - a_data)^2`` in the
    online actor loss (paper: 100)."""
    flow_batch_renorm: bool = True
    """BatchRenorm on the velocity inputs (Flow-G: (s, A_i); Flow-T: s, A_i and the decoder norms instead of
    LayerNorm; naive: (s, A_i, t)), as in the paper's CrossQ-based code."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.velocity not in ("gated", "decoded", "naive"):
            raise ValueError(f"invalid SAC Flow velocity {self.velocity!r}: expected 'gated', 'decoded' or 'naive'")
        if self.flow_steps < 1 or self.flow_hidden < 1 or any(h < 1 for h in self.noise_hidden):
            raise ValueError("invalid SAC Flow setting: expected flow_steps >= 1 and positive hidden widths")
        if self.time_embed_dim < 4 or self.time_embed_dim % 2:
            raise ValueError(f"invalid SAC Flow time_embed_dim={self.time_embed_dim}: expected an even number >= 4")
        if self.n_layers < 1 or self.d_model < 4 or self.d_model % 4:
            raise ValueError(f"invalid SAC Flow decoder d_model={self.d_model}, n_layers={self.n_layers}: "
                             "expected d_model divisible by 4 and n_layers >= 1")
        if not self.noise_log_std_min < self.noise_log_std_max:
            raise ValueError("invalid SAC Flow setting: expected noise_log_std_min < noise_log_std_max")
        if self.actor_batch_renorm:
            raise ValueError("actor_batch_renorm describes SAC's Gaussian actor; SAC Flow takes flow_batch_renorm")
        if self.alpha_reg < 0:
            raise ValueError(f"invalid SAC Flow alpha_reg={self.alpha_reg}: expected >= 0")


def offline_step(algo: SACFlow, buffer: TransitionSource, batch_size: int) -> dict[str, torch.Tensor]:
    """One offline step of the O2O recipe: a SAC critic step on a batch, then a flow-matching actor step on another."""
    info = algo.update_critic(buffer.sample(batch_size, algo.gen))
    return {**info, **pretrain_step(algo, buffer, batch_size)}


def squash_log_std(h: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``log sigma = lo + (hi - lo) (tanh(h) + 1) / 2``: smooth, bounded in (lo, hi)."""
    return lo + 0.5 * (hi - lo) * (torch.tanh(h) + 1.0)


def _input_norm(features: int, cfg: SACFlowConfig) -> nn.Module:
    return BatchRenorm(features, warmup_steps=cfg.renorm_warmup) if cfg.flow_batch_renorm else nn.Identity()


class VelocityField(Protocol):
    """What FlowActor needs from a velocity network."""

    noise_on_velocity: bool
    """True: the noise std is on the velocity (transition std dt * sigma); False: on A_{i+1} directly."""

    def context(self, obs: torch.Tensor, noise: bool = True) -> torch.Tensor:
        """Per-call work on the observation, shared by the K steps (``noise=False``: the std is not needed)."""
        ...

    def __call__(self, obs: torch.Tensor, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs [B,O]``, ``x [B,A]``, ``t [B,1]`` -> velocity mean ``[B,A]`` and log sigma ``[B,A]``."""
        ...

    def steps(self, obs: torch.Tensor, times: torch.Tensor, noise: bool = True) -> StepFn:
        """The rollout's K velocity calls at the times ``times [K,1]`` (the same for every row), with the work
        that does not depend on ``A_i`` done once: ``step(x, i)`` equals ``self(obs, ctx, x, t_i)`` to float
        rounding (tests/algos/test_sac_flow_equivalence.py)."""
        ...


class SinusoidalTime(nn.Module):
    """``t [B,1]`` -> sin/cos features (``dim``) -> Dense(2 dim) -> swish -> Dense(dim): Flow-G's time embedding."""

    freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, dim: int):
        super().__init__()
        half = dim // 2
        self.register_buffer("freq", torch.exp(-math.log(10000.0) * torch.arange(half) / (half - 1)))  # [dim/2]
        self.mlp = mlp(dim, (2 * dim,), dim, "silu")

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        z = t * self.freq  # [B,dim/2]
        return self.mlp(torch.cat([z.sin(), z.cos()], -1))  # [B,dim]


class GatedVelocity(nn.Module):
    """Flow-G: ``v = sigmoid(Gate(x)) * (Cand(x) - A)``, ``x = [BRN(s, A), emb(t)]``; noise std from the state."""

    noise_on_velocity = False

    def __init__(self, cfg: SACFlowConfig, obs_dim: int, action_dim: int):
        super().__init__()
        in_dim = obs_dim + action_dim + cfg.time_embed_dim
        self.norm = _input_norm(obs_dim + action_dim, cfg)
        self.time = SinusoidalTime(cfg.time_embed_dim)
        self.gate = mlp(in_dim, (cfg.flow_hidden,), action_dim, "silu")
        gate_out = self.gate[-1]
        assert isinstance(gate_out, nn.Linear)  # mlp ends in its output Linear
        nn.init.zeros_(gate_out.weight)
        nn.init.constant_(gate_out.bias, cfg.gate_bias)
        self.cand = mlp(in_dim, (cfg.flow_hidden,), action_dim, "silu")
        self.noise = mlp(obs_dim, cfg.noise_hidden, action_dim, "relu")
        self.log_std_range = (cfg.noise_log_std_min, cfg.noise_log_std_max)

    def context(self, obs: torch.Tensor, noise: bool = True) -> torch.Tensor:
        if not noise:
            return obs[:, :0]  # [B,0]: the std network is skipped when only the velocity is needed
        return squash_log_std(self.noise(obs), *self.log_std_range)  # [B,A], the same at every step

    def forward(self, obs: torch.Tensor, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.cat([self.norm(torch.cat([obs, x], -1)), self.time(t)], -1)  # [B,O+A+T]
        return torch.sigmoid(self.gate(h)) * (self.cand(h) - x), ctx  # [B,A], [B,A]

    def steps(self, obs: torch.Tensor, times: torch.Tensor, noise: bool = True) -> StepFn:
        """Gate and candidate share their input, so their first layers run as one matmul of the normalised
        ``(s, A_i)`` columns; the time columns are the same for every row, so their product with the weights
        (and the biases) is one ``[K,2H]`` row per step, computed once."""
        ctx = self.context(obs, noise)  # [B,A] log sigma, or [B,0]
        g0, g_out, c0, c_out = self.gate[0], self.gate[2], self.cand[0], self.cand[2]  # mlp: Linear, SiLU, Linear
        assert isinstance(g0, nn.Linear) and isinstance(c0, nn.Linear)
        assert isinstance(g_out, nn.Linear) and isinstance(c_out, nn.Linear)
        H, n_in = g0.out_features, obs.shape[1] + g_out.out_features  # hidden width, O + A
        w = torch.cat([g0.weight, c0.weight])  # [2H,O+A+T]
        w_in = w[:, :n_in].t()  # [O+A,2H]
        bias = torch.addmm(torch.cat([g0.bias, c0.bias]), self.time(times), w[:, n_in:].t())  # [K,2H]

        def step(x: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            hid = F.silu(torch.addmm(bias[i], self.norm(torch.cat([obs, x], -1)), w_in))  # [B,2H]
            return torch.sigmoid(g_out(hid[:, :H])) * (c_out(hid[:, H:]) - x), ctx  # [B,A], [B,A]

        return step


_GELU_A = 2.0 * math.sqrt(2.0 / math.pi)
_GELU_B = _GELU_A * 0.044715


class _SigmoidGELU(torch.autograd.Function):
    """``x sigmoid(u)``, ``u = 2 sqrt(2/pi) (x + 0.044715 x^3)``: the tanh-approximate GELU written with
    ``0.5 (1 + tanh(z)) = sigmoid(2 z)``, the same function, with a hand-written backward
    ``s + x s (1 - s) u'``. On this CPU build ``F.gelu(approximate="tanh")`` forward and backward took ~0.95 ms
    at [256,384], this ~0.2 ms (experiments/sac_flow_speed)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        s = (x * x).mul_(_GELU_B).add_(_GELU_A).mul_(x).sigmoid_()  # [B,F] sigmoid(u)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        du = (x * x).mul_(3.0 * _GELU_B).add_(_GELU_A)  # [B,F] u'
        return (s - s * s).mul_(x).mul_(du).add_(s).mul_(grads[0])


class TanhGELU(nn.Module):
    """``nn.GELU(approximate="tanh")``, faster when a gradient is taken (``_SigmoidGELU``); without gradient, and
    while tracing or exporting, PyTorch's own kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch.jit.is_tracing is public API that the stubs do not re-export
        if x.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing():  # pyright: ignore[reportPrivateImportUsage]
            return cast(torch.Tensor, _SigmoidGELU.apply(x))
        return F.gelu(x, approximate="tanh")


class OneKeyAttention(nn.Module):
    """Multi-head attention over a single key/value token: ``out(value(memory))``.

    With one key every softmax weight is exactly 1, so the query and key projections cannot change the
    output (and would get zero gradients); they are left out and the value passes straight through. This is
    the exact function of the paper's attention layers for one step token and one obs token.
    """

    def __init__(self, d: int):
        super().__init__()
        self.value, self.out = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, memory: torch.Tensor) -> torch.Tensor:
        return self.out(self.value(memory))  # [B,D]


class DecoderBlock(nn.Module):
    """Post-norm decoder block: self-attention, cross-attention to the obs token, FFN(4d, GELU), each + residual.

    The step token attends only to itself (the paper's diagonal mask) and cross-attends to the single obs token,
    so the cross-attention term depends on the observation alone: ``cross(obs_token)`` is computed once per
    call and reused by all K steps.
    """

    def __init__(self, cfg: SACFlowConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn, self.cross_attn = OneKeyAttention(d), OneKeyAttention(d)
        self.ffn = nn.Sequential(nn.Linear(d, 4 * d), TanhGELU(), nn.Linear(4 * d, d))
        self.norms = nn.ModuleList(BatchRenorm(d, warmup_steps=cfg.renorm_warmup) if cfg.flow_batch_renorm
                                   else nn.LayerNorm(d) for _ in range(3))

    def forward(self, tok: torch.Tensor, cross: torch.Tensor) -> torch.Tensor:
        tok = self.norms[0](tok + self.self_attn(tok))  # [B,D]
        tok = self.norms[1](tok + cross)  # [B,D]
        return self.norms[2](tok + self.ffn(tok))  # [B,D]


class DecodedVelocity(nn.Module):
    """Flow-T: the step token ``Dense(BRN(A)) + TimeMLP(t)`` decoded against the obs token; heads give the
    velocity mean and the log std of the velocity noise."""

    noise_on_velocity = True

    def __init__(self, cfg: SACFlowConfig, obs_dim: int, action_dim: int):
        super().__init__()
        d = cfg.d_model
        self.obs_norm, self.act_norm = _input_norm(obs_dim, cfg), _input_norm(action_dim, cfg)
        self.obs_enc = mlp(obs_dim, (d // 2,), d, "silu")
        self.act_proj = nn.Linear(action_dim, d)
        self.time = mlp(1, (d // 4, d // 2), d, "silu")
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.head = nn.Linear(d, 2 * action_dim)  # velocity mean and raw log std
        self.log_std_range = (cfg.noise_log_std_min, cfg.noise_log_std_max)

    def context(self, obs: torch.Tensor, noise: bool = True) -> torch.Tensor:
        """Each block's cross-attention output for the obs token, ``[n_layers,B,D]`` (the same at every step)."""
        tok = self.obs_enc(self.obs_norm(obs))  # [B,D] obs token
        # self.blocks holds DecoderBlocks (ModuleList items are typed Module)
        return torch.stack([cast(DecoderBlock, block).cross_attn(tok) for block in self.blocks])  # [n_layers,B,D]

    def forward(self, obs: torch.Tensor, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.act_proj(self.act_norm(x)) + self.time(t)  # [B,D]
        for i, block in enumerate(self.blocks):
            tok = block(tok, ctx[i])  # [B,D]
        mean, h = self.head(tok).chunk(2, -1)  # [B,A] each
        return mean, squash_log_std(h, *self.log_std_range)

    def steps(self, obs: torch.Tensor, times: torch.Tensor, noise: bool = True) -> StepFn:
        """Per call, once: the cross-attention terms, the time tokens of the K steps (plus the step projection's
        bias) ``[K,D]``, and each block's self-attention with its residual as one affine map,
        ``tok + out(value(tok)) = tok (I + W_out W_value)^T + (W_out b_value + b_out)``: one matmul per block and
        step instead of two and an add."""
        crosses = self.context(obs, noise).unbind(0)  # n_layers x [B,D]
        time_tok = self.time(times) + self.act_proj.bias  # [K,D]
        w_proj = self.act_proj.weight.t()  # [A,D]
        blocks = [cast(DecoderBlock, b) for b in self.blocks]  # ModuleList items are typed Module
        eye = torch.eye(time_tok.shape[1], dtype=obs.dtype, device=obs.device)  # [D,D]
        attn = [(torch.addmm(eye, b.self_attn.out.weight, b.self_attn.value.weight).t(),  # [D,D]
                 torch.addmv(b.self_attn.out.bias, b.self_attn.out.weight, b.self_attn.value.bias))  # [D]
                for b in blocks]

        def step(x: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            tok = torch.addmm(time_tok[i], self.act_norm(x), w_proj)  # [B,D]
            for block, (w, b), cross in zip(blocks, attn, crosses, strict=True):
                tok = block.norms[0](torch.addmm(b, tok, w))  # [B,D]
                tok = block.norms[1](tok + cross)
                tok = block.norms[2](tok + block.ffn(tok))
            mean, h = self.head(tok).chunk(2, -1)  # [B,A] each
            return mean, squash_log_std(h, *self.log_std_range)

        return step


class NaiveVelocity(nn.Module):
    """Naive flow SAC: one ReLU MLP of ``BRN(s, A, t)`` gives the velocity and the log std of the next state."""

    noise_on_velocity = False

    def __init__(self, cfg: SACFlowConfig, obs_dim: int, action_dim: int):
        super().__init__()
        in_dim = obs_dim + action_dim + 1
        self.norm = _input_norm(in_dim, cfg)
        self.net = mlp(in_dim, (cfg.flow_hidden, cfg.flow_hidden), 2 * action_dim, "relu")
        self.log_std_range = (cfg.noise_log_std_min, cfg.noise_log_std_max)

    def context(self, obs: torch.Tensor, noise: bool = True) -> torch.Tensor:
        return obs[:, :0]  # [B,0]: nothing to precompute

    def forward(self, obs: torch.Tensor, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        mean, h = self.net(self.norm(torch.cat([obs, x, t], -1))).chunk(2, -1)  # [B,A] each
        return mean, squash_log_std(h, *self.log_std_range)

    def steps(self, obs: torch.Tensor, times: torch.Tensor, noise: bool = True) -> StepFn:
        """The plain per-step call (the time column goes through the batch renorm with the rest of the input)."""
        ctx = self.context(obs, noise)  # [B,0]
        return lambda x, i: self(obs, ctx, x, times[i].expand(x.shape[0], 1))


class FlowActor(SACActor):
    """K-step noise-augmented flow policy around a velocity field (a ``VelocityField`` module); SAC's actor
    interface (``sample``, ``mode``).

    ``sample`` draws all its noise in one call, ``[K+1,B,A]``: row 0 is A_0, row i+1 is eps_i.
    """

    def __init__(self, field: VelocityField, action_dim: int, steps: int):
        super().__init__()
        self.field, self.action_dim, self.steps = field, action_dim, steps

    def velocity(self, obs: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Mean velocity ``[B,A]`` at ``x [B,A]`` and any times ``t [B,1]`` in [0, 1] (flow matching)."""
        return self.field(obs, self.field.context(obs, noise=False), x, t)[0]

    def times(self, like: torch.Tensor) -> torch.Tensor:
        """The step times ``t_i = i / K`` as ``[K,1]`` (dtype and device of ``like``)."""
        dt = 1.0 / self.steps
        return like.new_tensor([[i * dt] for i in range(self.steps)])  # [K,1]

    def transition(self, step: StepFn, x: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``m_i [B,A]`` and log std ``log s_i [B,A]`` of ``A_{i+1}`` given ``A_i = x`` (``step``: the field's
        ``steps(obs, times)``)."""
        dt = 1.0 / self.steps
        v, log_sigma = step(x, i)  # [B,A] each
        # velocity noise: A_{i+1} = A_i + dt (v + sigma eps), so the transition std is s = dt sigma
        log_s = log_sigma + math.log(dt) if self.field.noise_on_velocity else log_sigma
        return x + dt * v, log_s

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised action ``[B,A]`` in (-1, 1) and the path log-likelihood with tanh correction ``[B]``."""
        assert obs.dim() == 2, f"FlowActor.sample expects obs [B,O], got {tuple(obs.shape)}"
        K, A = self.steps, self.action_dim
        noise = torch.randn((K + 1, obs.shape[0], A), generator=generator, device=obs.device,
                            dtype=obs.dtype)  # [K+1,B,A]
        step = self.field.steps(obs, self.times(obs))
        x = noise[0]  # [B,A] A_0
        sq = noise.square().sum((0, 2))  # [B] sum of all squared standard normal draws (A_0 and every eps_i)
        log_s_sum = torch.zeros_like(sq)  # [B]
        for i in range(K):
            m, log_s = self.transition(step, x, i)  # [B,A] each
            x = torch.addcmul(m, log_s.exp(), noise[i + 1])  # [B,A]
            log_s_sum = log_s_sum + log_s.sum(-1)
        # log N(A_0; 0, I) + sum_i log N(A_{i+1}; m_i, s_i^2), with (A_{i+1} - m_i) / s_i = eps_i
        log_p = -0.5 * sq - log_s_sum - 0.5 * (K + 1) * A * _LOG_2PI  # [B]
        return torch.tanh(x), log_p - tanh_log_det(x)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic action ``[B,A]``: the noise-free path from A_0 = 0, then tanh."""
        step = self.field.steps(obs, self.times(obs), noise=False)
        x = obs.new_zeros(obs.shape[0], self.action_dim)  # [B,A]
        for i in range(self.steps):
            x = self.transition(step, x, i)[0]
        return torch.tanh(x)


_FIELDS = {"gated": GatedVelocity, "decoded": DecodedVelocity, "naive": NaiveVelocity}


def make_flow_actor(cfg: SACFlowConfig, spec: EnvSpec) -> FlowActor:
    field = _FIELDS[cfg.velocity](cfg, spec.obs_dim, spec.action_dim)
    return FlowActor(field, spec.action_dim, cfg.flow_steps)


class SACFlow(SAC):
    """SAC with a flow actor (``config.velocity``); critics, CrossQ option, updates and export are SAC's."""

    name = "sac_flow"

    def __init__(self, config: SACFlowConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None):
        if not isinstance(config, SACFlowConfig):
            raise TypeError(f"SACFlow needs a SACFlowConfig, got {type(config).__name__}")
        if not spec.is_flat:
            raise UserInputError(f"SAC Flow takes flat state observations: env {spec.env_id!r} has the parts "
                                 f"{[q.name for q in spec.parts]} "
                                 "(expected a state-vector env; PPO and SAC learn from images)")
        if spec.discrete:
            raise ValueError(f"SAC Flow needs continuous actions; {spec.env_id} has discrete actions")
        super().__init__(config, spec, device, generator, actor=make_flow_actor(config, spec))


# ----- offline-to-online (docs/algorithms/sac_flow.md): pure losses and single steps on a buffer (ReplayBuffer or
# MixedSampler) -----


class TransitionSource(Protocol):
    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Transition: ...


def pre_tanh_action(action: torch.Tensor, clip: float = PRE_TANH_CLIP) -> torch.Tensor:
    """Data actions in [-1, 1] -> the flow's pre-tanh space, ``atanh(clamp(a, -clip, clip))``.

    The policy emits ``tanh(A_K)``, so behaviour cloning must move A_K (not the action) to the data: the target of
    the flow is atanh(a). The clip keeps targets finite for saturated actions (|a| = 1 is common in datasets).
    """
    return torch.atanh(action.clamp(-clip, clip))


def flow_matching_loss(actor: FlowActor, obs: torch.Tensor, action: torch.Tensor, generator: torch.Generator | None,
                       clip: float = PRE_TANH_CLIP) -> torch.Tensor:
    """Conditional flow matching on the straight path from ``x_0 ~ N(0, I)`` to ``x_1 = atanh(clip(a))``."""
    assert obs.dim() == 2 and action.shape == (obs.shape[0], actor.action_dim), "expected obs [B,O], action [B,A]"
    x1 = pre_tanh_action(action, clip)  # [B,A]
    x0 = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)  # [B,A]
    t = torch.rand((x1.shape[0], 1), generator=generator, device=x1.device, dtype=x1.dtype)  # [B,1]
    v = actor.velocity(obs, (1 - t) * x0 + t * x1, t)  # [B,A]
    return (v - (x1 - x0)).square().mean()


def pretrain_step(algo: SACFlow, buffer: TransitionSource, batch_size: int) -> dict[str, torch.Tensor]:
    """One flow-matching gradient step of the actor (its optimizer) on a batch from ``buffer``."""
    batch = buffer.sample(batch_size, algo.gen)
    assert isinstance(algo.actor, FlowActor)  # SACFlow's actor
    assert isinstance(batch.obs, torch.Tensor)  # SACFlow takes flat (plain-tensor) observations
    loss = flow_matching_loss(algo.actor, batch.obs, batch.action, algo.gen)
    algo.actor_opt.zero_grad(set_to_none=True)
    loss.backward()
    algo.actor_opt.step()
    return {"loss/flow_matching": loss.detach()}


def o2o_actor_loss(algo: SACFlow, batch: Transition, alpha_reg: float = 100.0
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """``alpha_reg * mean (a_pi - a_data)^2 + mean (alpha log pi - mean_i Q_i(s, a_pi))`` -> loss, info, log pi ``[B]``.

    The squared error is averaged over batch and action dims (as in the paper's code); the critic ensemble is
    averaged (docs/algorithms/sac_flow.md). CrossQ critics are evaluated on running statistics, as in SAC's actor step.
    """
    assert isinstance(batch.obs, torch.Tensor)  # SACFlow takes flat (plain-tensor) observations
    a, logp = algo.actor.sample(batch.obs, algo.gen)  # [B,A], [B]
    if algo.config.crossq:
        algo.critic.eval()
    try:
        q = algo.q(algo.critic, batch.obs, a).mean(0)  # [B]
    finally:
        algo.critic.train()
    reg = (a - batch.action).square().mean()
    loss = alpha_reg * reg + (algo.alpha * logp - q).mean()
    info = {"loss/actor": loss.detach(), "loss/action_reg": reg.detach(), "stats/entropy": -logp.detach().mean(),
            "stats/alpha": algo.alpha}
    return loss, info, logp.detach()


def o2o_update(algo: SACFlow, buffer: TransitionSource, batch_size: int, alpha_reg: float = 100.0
               ) -> dict[str, torch.Tensor]:
    """One offline-to-online update from ``buffer``: SAC's critic step, then every ``policy_delay`` critic steps
    an actor step on ``o2o_actor_loss`` and a temperature step. Returns device tensors (no host sync)."""
    batch = buffer.sample(batch_size, algo.gen)
    info = algo.update_critic(batch)
    if algo.critic_updates % algo.config.policy_delay:
        return info
    loss, actor_info, logp = o2o_actor_loss(algo, batch, alpha_reg)
    algo.actor_step(loss)
    return {**info, **actor_info, **algo.alpha_step(logp)}


register(AlgoEntry(
    "sac_flow", SACFlowConfig, SACFlow, regime="off-policy",
    summary="SAC Flow: flow policy (Flow-G gated, Flow-T decoded or naive velocity) trained with SAC",
    run_defaults={"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 50_000}))

# docs/algorithms/sac_flow.md, the QC-FQL-based recipe without action chunks: ``--offline-steps`` gradient steps on
# --dataset (a critic
# step and a flow-matching actor step each), then online SAC Flow with the offline data kept in half of every
# batch and the actor loss ``o2o_actor_loss``. 4x512 critics with LayerNorm, 2 critics averaged, no BatchRenorm
# (plain MLPs), lr 3e-4, batch 256, updates after 5k env steps, stored actions clipped to +-0.99999.
register(AlgoEntry(
    "sac_flow_o2o", SACFlowConfig, SACFlow, regime="offline-to-online",
    summary="SAC Flow offline-to-online: flow-matching pre-training on --dataset, then online SAC Flow",
    config_defaults={"critic_hidden": (512, 512, 512, 512), "layer_norm": True, "actor_q": "mean",
                     "flow_batch_renorm": False},
    run_defaults={"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 25_000,
                  "eval_every": 20_000},
    loop_defaults={"offline_steps": 1_000_000, "offline_ratio": 0.5, "warmup_actions": "policy",
                   "learning_starts": 5_000, "clip_actions": 0.99999},
    update_step=lambda algo, sampler, batch_size, cfg: o2o_update(algo, sampler, batch_size, cfg.alpha_reg),
    pretrain_step=lambda algo, sampler, batch_size, cfg: offline_step(algo, sampler, batch_size),
    init_from=("sac_flow_o2o",), requires_dataset=True))
