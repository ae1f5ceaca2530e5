"""Action heads of a VLA policy: what turns the language model's outputs into an action chunk ``[B,H,A]``.

Every head works in a normalised action space, [-1, 1] per dimension (``ActionNormalizer``, OpenVLA's quantile
normalisation). Shape letters: B batch, H chunk length, A action dim, D the language model's width, V vocabulary,
M = H*A action tokens, K Euler steps, F the flow network's width.

- Tokens (OpenVLA, Kim et al. 2024): each normalised action value is one of 256 uniform bins on [-1, 1], emitted
  as one of the last 256 ids of the vocabulary; row-major order (step h, then dim a). ``token_loss`` is the
  cross-entropy of teacher forcing, ``token_log_prob`` the chunk's log-likelihood for PPO. Deviation: OpenVLA
  maps bin b to id ``V - 1 - b`` with 255 digitize bins; here bin b is id ``V - 256 + b`` with 256 bins.
- ``RegressionHead`` (OpenVLA-OFT, Kim et al. 2025): an MLP on the hidden states at H learned query positions,
  L1 loss; for RL a diagonal Gaussian with a state-independent learned log-std around its output.
- ``FlowHead`` (pi0, Black et al. 2024): flow matching with pi0's convention (t = 1 noise, t = 0 data),
  Euler integration from noise; for RL (ReinFlow / Flow-GRPO style) a noisy Euler chain with Gaussian
  transitions whose log-density is the chunk's likelihood.

Weighted losses (advantage-weighted BC) are self-normalised: ``L = sum_b w_b l_b / sum_b w_b`` with ``l_b`` the
sample's mean loss over its chunk, so all-equal weights give the plain mean and a zero weight removes a sample.
Randomness always comes from a passed ``torch.Generator`` (None: torch's default generator).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LOG_2PI = math.log(2 * math.pi)


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def _weighted_mean(per_sample: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``sum_b w_b l_b / sum_b w_b`` (plain mean when ``weights`` is None); ``per_sample [B]``, ``weights [B]``.
    All-zero weights give 0 (the denominator is clamped at 1e-12)."""
    if weights is None:
        return per_sample.mean()
    _check(weights.shape == per_sample.shape, f"weights must have shape {tuple(per_sample.shape)} (one per sample), "
                                              f"got {tuple(weights.shape)}")
    w = weights.to(per_sample.dtype)  # [B]
    return (w * per_sample).sum() / w.sum().clamp_min(1e-12)


def _quantiles(x: torch.Tensor, q: float) -> torch.Tensor:
    """Per-column quantile of ``x [S,A]`` with linear interpolation (numpy's default; no size limit) -> ``[A]``."""
    s = x.sort(0).values  # [S,A]
    pos = q * (x.shape[0] - 1)
    lo, frac = int(math.floor(pos)), pos - math.floor(pos)
    hi = min(lo + 1, x.shape[0] - 1)
    return s[lo] + frac * (s[hi] - s[lo])


class ActionNormalizer(nn.Module):
    """Per-dimension quantile normalisation (OpenVLA): ``x = clip(2 (a - q01) / (q99 - q01) - 1, -1, 1)``.

    Buffers ``q01``, ``q99`` ``[A]`` (the 1% and 99% quantiles of the dataset's actions; unfitted: -1 and 1, the
    identity on [-1, 1]). A dimension whose range ``q99 - q01`` is below 1e-6 (a constant, e.g. an unused
    gripper) normalises to 0 and unnormalises to ``q01``. ``unnormalize`` does not clip: a chunk outside
    [-1, 1] maps outside [q01, q99] and clipping to the env's bounds is the caller's job.
    """

    MIN_RANGE = 1e-6
    q01: torch.Tensor  # [A] buffer
    q99: torch.Tensor  # [A] buffer

    def __init__(self, action_dim: int):
        super().__init__()
        self.action_dim = action_dim
        self.register_buffer("q01", -torch.ones(action_dim))
        self.register_buffer("q99", torch.ones(action_dim))

    @classmethod
    def from_actions(cls, actions: torch.Tensor) -> ActionNormalizer:
        """A normaliser fitted to ``actions [S,A]``."""
        _check(actions.dim() == 2, f"actions must be [S,A], got shape {tuple(actions.shape)}")
        norm = cls(actions.shape[1]).to(actions.device)
        norm.fit(actions)
        return norm

    @torch.no_grad()
    def fit(self, actions: torch.Tensor) -> None:
        """Set ``q01``, ``q99`` in place from ``actions [S,A]`` (S >= 1, finite)."""
        _check(actions.dim() == 2 and actions.shape[1] == self.action_dim and actions.shape[0] > 0,
               f"actions must be [S,{self.action_dim}] with S >= 1, got shape {tuple(actions.shape)}")
        a = actions.to(self.q01.device, torch.float64)  # [S,A]
        _check(bool(torch.isfinite(a).all()), "actions contain NaN or infinite values; expected finite numbers")
        self.q01.copy_(_quantiles(a, 0.01))
        self.q99.copy_(_quantiles(a, 0.99))

    def _range(self) -> tuple[torch.Tensor, torch.Tensor]:
        rng = self.q99 - self.q01  # [A]
        ok = rng >= self.MIN_RANGE  # [A]
        return ok, torch.where(ok, rng, torch.ones_like(rng))

    def normalize(self, a: torch.Tensor) -> torch.Tensor:
        """Env actions ``[...,A]`` -> normalised ``[...,A]`` in [-1, 1]."""
        _check(a.shape[-1] == self.action_dim, f"actions must end in {self.action_dim} dims, got {tuple(a.shape)}")
        ok, rng = self._range()
        x = (2 * (a - self.q01) / rng - 1).clamp(-1, 1)  # [...,A]
        return torch.where(ok, x, torch.zeros_like(x))

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``[...,A]`` -> env actions ``[...,A]``: ``a = (x + 1) / 2 (q99 - q01) + q01`` (no clipping)."""
        _check(x.shape[-1] == self.action_dim, f"actions must end in {self.action_dim} dims, got {tuple(x.shape)}")
        ok, rng = self._range()
        a = (x + 1) / 2 * rng + self.q01  # [...,A]
        return torch.where(ok, a, self.q01.expand_as(a))


class TokenBins:
    """OpenVLA-style action tokens: ``n_bins`` uniform bins on [-1, 1], bin ``b`` = token id ``V - n_bins + b``.

    ``encode`` gives bin indices (the cross-entropy targets of ``token_loss``); ``to_ids`` / ``to_bins`` move between
    bins and vocabulary ids; ``decode`` maps bins to bin centres ``-1 + (b + 1/2) 2 / n_bins`` (round-trip error at
    most half a bin, ``1 / n_bins``). Holds no tensors, so it works on any device.
    """

    def __init__(self, vocab_size: int, n_bins: int = 256):
        _check(0 < n_bins <= vocab_size, f"n_bins must be in [1, vocab_size={vocab_size}], got {n_bins}")
        self.vocab_size, self.n_bins = vocab_size, n_bins
        self.offset = vocab_size - n_bins

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised chunk ``[B,H,A]`` -> bin indices ``[B,H*A]`` (int64, row-major: step h, then dim a)."""
        _check(x.dim() == 3, f"encode expects a normalised chunk [B,H,A], got shape {tuple(x.shape)}")
        b = torch.floor((x.clamp(-1, 1) + 1) / 2 * self.n_bins).long()  # [B,H,A]; x = 1 falls in the last bin
        return b.clamp(0, self.n_bins - 1).flatten(1)  # [B,M]

    def decode(self, bins: torch.Tensor, chunk: int, action_dim: int) -> torch.Tensor:
        """Bin indices ``[B,H*A]`` -> normalised chunk ``[B,H,A]`` at the bin centres."""
        _check(bins.dim() == 2 and bins.shape[1] == chunk * action_dim,
               f"decode expects bins [B,{chunk * action_dim}] for H={chunk}, A={action_dim}, got {tuple(bins.shape)}")
        x = (bins.float() + 0.5) * (2.0 / self.n_bins) - 1  # [B,M]
        return x.view(bins.shape[0], chunk, action_dim)  # [B,H,A]

    def to_ids(self, bins: torch.Tensor) -> torch.Tensor:
        """Bin indices -> vocabulary ids (any shape)."""
        return bins + self.offset

    def to_bins(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids (of action tokens: not checked, to avoid a host sync) -> bin indices (any shape)."""
        return ids - self.offset

    def bin_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """LM logits ``[...,V]`` -> the action tokens' logits ``[...,n_bins]`` (the last ``n_bins`` ids)."""
        _check(logits.shape[-1] == self.vocab_size, f"logits must end in the vocabulary size {self.vocab_size}, "
                                                    f"got shape {tuple(logits.shape)}")
        return logits[..., self.offset:]


def token_loss(bin_logits: torch.Tensor, target_bins: torch.Tensor, weights: torch.Tensor | None = None
               ) -> torch.Tensor:
    """Cross-entropy of teacher forcing: ``l_b = -1/M sum_m log softmax(z_bm)[y_bm]``, then ``sum w_b l_b / sum w_b``.

    ``bin_logits [B,M,n_bins]``, ``target_bins [B,M]`` (indices), ``weights [B]`` or None (plain mean).
    """
    _check(bin_logits.dim() == 3 and target_bins.shape == bin_logits.shape[:2],
           f"token_loss expects bin_logits [B,M,n] and target_bins [B,M], got {tuple(bin_logits.shape)} and "
           f"{tuple(target_bins.shape)}")
    ce = F.cross_entropy(bin_logits.transpose(1, 2), target_bins, reduction="none")  # [B,M]
    return _weighted_mean(ce.mean(1), weights)


def token_log_prob(bin_logits: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """The chunk's log-likelihood ``sum_m log softmax(z_bm)[bins_bm]`` -> ``[B]`` (PPO's ratio of token chunks)."""
    _check(bin_logits.dim() == 3 and bins.shape == bin_logits.shape[:2],
           f"token_log_prob expects bin_logits [B,M,n] and bins [B,M], got {tuple(bin_logits.shape)} and "
           f"{tuple(bins.shape)}")
    logp = bin_logits.log_softmax(-1).gather(-1, bins.unsqueeze(-1)).squeeze(-1)  # [B,M]
    return logp.sum(1)


def sample_bins(bin_logits: torch.Tensor, gen: torch.Generator | None, temperature: float = 1.0) -> torch.Tensor:
    """One bin per row of ``bin_logits [B,n_bins]`` -> ``[B]``: argmax at temperature 0, else a draw from
    ``softmax(z / temperature)`` with ``gen``."""
    _check(bin_logits.dim() == 2, f"sample_bins expects bin_logits [B,n_bins], got shape {tuple(bin_logits.shape)}")
    _check(temperature >= 0, f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return bin_logits.argmax(-1)
    probs = (bin_logits.float() / temperature).softmax(-1)  # [B,n]
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _check_cond(name: str, cond: torch.Tensor, chunk: int, hidden_size: int) -> None:
    _check(cond.dim() == 3 and cond.shape[1:] == (chunk, hidden_size),
           f"{name} expects cond [B,{chunk},{hidden_size}], got shape {tuple(cond.shape)}")


def _check_chunk(name: str, x: torch.Tensor, cond: torch.Tensor, chunk: int, action_dim: int) -> None:
    _check(x.shape == (cond.shape[0], chunk, action_dim),
           f"{name} expects a chunk [{cond.shape[0]},{chunk},{action_dim}], got shape {tuple(x.shape)}")


class RegressionHead(nn.Module):
    """OpenVLA-OFT's head: ``mean_h = MLP(cond_h)`` per query position (LayerNorm -> Linear -> GELU -> Linear ->
    GELU -> Linear), L1 loss ``l_b = mean_{h,a} |mean - target|`` in normalised units.

    For RL, ``pi(x | cond) = N(x; mean, diag(exp(2 log_std)))`` with a state-independent ``log_std [A]`` shared by
    the H steps, initialised to ``init_log_std`` (default log 0.1: a tenth of the normalised range; ctrl_rl's VLA
    config sets its own). ``sample`` and ``log_prob`` work on the unclipped Gaussian sample; clipping to [-1, 1]
    at execution is the caller's job (the stored, unclipped sample is what ``log_prob`` scores).
    """

    def __init__(self, hidden_size: int, action_dim: int, chunk: int, mlp_hidden: int = 256,
                 init_log_std: float = math.log(0.1)):
        super().__init__()
        self.D, self.A, self.H = hidden_size, action_dim, chunk
        self.net = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, mlp_hidden), nn.GELU(),
                                 nn.Linear(mlp_hidden, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, action_dim))
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, cond: torch.Tensor) -> torch.Tensor:
        """The predicted chunk (the Gaussian's mean) ``[B,H,A]`` from ``cond [B,H,D]``."""
        _check_cond("RegressionHead", cond, self.H, self.D)
        return self.net(cond)  # [B,H,A]

    def loss(self, cond: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """L1 to ``target [B,H,A]``: per-sample mean over H and A, weighted mean over B."""
        mean = self(cond)  # [B,H,A]
        _check_chunk("RegressionHead.loss", target, cond, self.H, self.A)
        return _weighted_mean((mean - target).abs().mean((1, 2)), weights)

    def log_prob(self, cond: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``sum_{h,a} log N(x_ha; mean_ha, std_a^2)`` -> ``[B]``."""
        mean = self(cond)  # [B,H,A]
        _check_chunk("RegressionHead.log_prob", x, cond, self.H, self.A)
        z = (x - mean) * torch.exp(-self.log_std)  # [B,H,A]
        return (-0.5 * z.square() - self.log_std - 0.5 * _LOG_2PI).sum((1, 2))

    def entropy(self) -> torch.Tensor:
        """Entropy of the chunk's Gaussian, a scalar (the same for every state):
        ``H sum_a (log(2 pi e) / 2 + log_std_a)``."""
        return self.H * (0.5 * (1 + _LOG_2PI) + self.log_std).sum()

    def sample(self, cond: torch.Tensor, gen: torch.Generator | None, deterministic: bool = False) -> torch.Tensor:
        """``mean + std * z`` with ``z ~ N(0, I)`` drawn with ``gen`` (the mean when deterministic) -> ``[B,H,A]``."""
        mean = self(cond)  # [B,H,A]
        if deterministic:
            return mean
        z = torch.randn(mean.shape, generator=gen, device=mean.device, dtype=mean.dtype)  # [B,H,A]
        return mean + self.log_std.exp() * z


def time_embedding(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """pi0's sinusoidal embedding of ``t [...]`` -> ``[...,dim]``: ``[sin(2 pi t / p_i), cos(2 pi t / p_i)]`` for
    ``dim / 2`` periods ``p_i`` spaced geometrically from ``min_period`` to ``max_period``."""
    frac = torch.linspace(0, 1, dim // 2, device=t.device, dtype=t.dtype)  # [dim/2]
    period = min_period * (max_period / min_period) ** frac  # [dim/2]
    ang = 2 * math.pi * t.unsqueeze(-1) / period  # [...,dim/2]
    return torch.cat([ang.sin(), ang.cos()], -1)


class FlowHead(nn.Module):
    """pi0's flow-matching action expert (a small MLP here), conditioned on the query states ``cond [B,H,D]``.

    Convention (pi0): ``x_t = t eps + (1 - t) a``, ``eps ~ N(0, I)``, target velocity ``u = eps - a``;
    ``t = 0.001 + 0.999 s``, ``s ~ Beta(1.5, 1)``, drawn by inverse CDF (``F(s) = s^1.5``, so ``s = U^(2/3)`` with
    ``U ~ U(0, 1)`` from the generator). ``loss``: ``l_b = mean_{h,a} (v(x_t, t) - u)^2``, weighted mean over B.

    Velocity network, per chunk position h, one hidden layer of width F on the concatenation
    ``[x_t,h ; flatten(x_t) ; emb(t) ; LN(cond_h) ; mean_h LN(cond_h)]`` plus a learned position embedding,
    then GELU -> Linear(F, F) -> GELU -> Linear(F, A). The flattened noisy chunk lets every position see the
    others (pi0's expert attends over the chunk; this is the cheap version), so a multimodal chunk is denoised
    coherently. The first layer is split by input so the cond part is computed once per call and shared by all
    Euler steps.

    ``sample``: Euler from t = 1 to 0 in K steps, ``x_{t - dt} = x_t - dt v(x_t, t)``, from ``eps`` or the given
    ``noise`` (deterministic given the noise).

    ``sample_chain`` (for PPO; ReinFlow / Flow-GRPO style): with ``dt = 1/K``, ``t_k = 1 - k dt`` and ``x_0 = eps``,

        x_{k+1} = m_k + s z_k,   m_k = x_k - dt v(x_k, t_k),   s = sigma sqrt(dt),   z_k ~ N(0, I),   k = 0..K-1

    (every step adds noise, the last one too, so the executed chunk is x_K). Its log-likelihood is the sum of the K
    Gaussian transition densities ``log N(x_{k+1}; m_k, s^2 I)`` over all H*A dims; the density of ``x_0`` is left
    out (it does not depend on the parameters, so PPO's ratio is unchanged). No drift correction is applied:
    the chain's final distribution is the flow's, broadened by roughly ``sigma``.
    """

    def __init__(self, hidden_size: int, action_dim: int, chunk: int, width: int = 256, time_dim: int = 32,
                 steps: int = 10):
        super().__init__()
        _check(time_dim >= 2 and time_dim % 2 == 0, f"time_dim must be an even number >= 2, got {time_dim}")
        _check(steps >= 1, f"steps must be >= 1, got {steps}")
        self.D, self.A, self.H, self.time_dim, self.steps = hidden_size, action_dim, chunk, time_dim, steps
        self.cond_norm = nn.LayerNorm(hidden_size)
        self.in_cond = nn.Linear(hidden_size, width)
        self.in_mean = nn.Linear(hidden_size, width, bias=False)
        self.pos = nn.Parameter(torch.randn(chunk, width) * 0.02)  # [H,F]
        self.in_x = nn.Linear(action_dim, width, bias=False)
        self.in_chunk = nn.Linear(chunk * action_dim, width, bias=False)
        self.in_t = nn.Linear(time_dim, width, bias=False)
        self.out = nn.Sequential(nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, action_dim))

    def context(self, cond: torch.Tensor) -> torch.Tensor:
        """The cond part of the first layer, ``[B,H,F]`` (the same at every t)."""
        _check_cond("FlowHead", cond, self.H, self.D)
        c = self.cond_norm(cond)  # [B,H,D]
        return self.in_cond(c) + self.in_mean(c.mean(1, keepdim=True)) + self.pos  # [B,H,F]

    def velocity(self, ctx: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``v(x_t, t)`` for ``x [...,H,A]``, ``t`` broadcastable to ``[...]``, ``ctx`` to ``[...,H,F]``
        -> ``[...,H,A]``."""
        t = t.to(x.dtype).expand(x.shape[:-2])  # [...]
        g = self.in_chunk(x.flatten(-2)) + self.in_t(time_embedding(t, self.time_dim))  # [...,F]
        return self.out(ctx + self.in_x(x) + g.unsqueeze(-2))  # [...,H,A]

    def loss(self, cond: torch.Tensor, target: torch.Tensor, gen: torch.Generator | None,
             weights: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching MSE of ``v(x_t, t)`` vs ``u = eps - target``; ``target [B,H,A]`` normalised."""
        ctx = self.context(cond)  # [B,H,F]
        _check_chunk("FlowHead.loss", target, cond, self.H, self.A)
        B = target.shape[0]
        u01 = torch.rand(B, generator=gen, device=target.device, dtype=target.dtype)  # [B]
        t = 0.001 + 0.999 * u01.pow(2.0 / 3.0)  # [B] Beta(1.5, 1) by inverse CDF, scaled to [0.001, 1]
        eps = torch.randn(target.shape, generator=gen, device=target.device, dtype=target.dtype)  # [B,H,A]
        tt = t[:, None, None]  # [B,1,1]
        v = self.velocity(ctx, tt * eps + (1 - tt) * target, t)  # [B,H,A]
        return _weighted_mean((v - (eps - target)).square().mean((1, 2)), weights)

    def _steps(self, steps: int | None) -> int:
        K = self.steps if steps is None else steps
        _check(K >= 1, f"steps must be >= 1, got {K}")
        return K

    def _noise(self, cond: torch.Tensor, gen: torch.Generator | None, noise: torch.Tensor | None) -> torch.Tensor:
        if noise is None:
            return torch.randn((cond.shape[0], self.H, self.A), generator=gen, device=cond.device, dtype=cond.dtype)
        _check_chunk("FlowHead noise", noise, cond, self.H, self.A)
        return noise

    def sample(self, cond: torch.Tensor, gen: torch.Generator | None, steps: int | None = None,
               noise: torch.Tensor | None = None) -> torch.Tensor:
        """Euler integration from t = 1 (``noise`` or ``eps ~ N(0, I)`` with ``gen``) to t = 0 -> ``[B,H,A]``."""
        ctx = self.context(cond)  # [B,H,F]
        K = self._steps(steps)
        x = self._noise(cond, gen, noise)  # [B,H,A]
        for k in range(K):
            t = x.new_full((), 1.0 - k / K)
            x = x - self.velocity(ctx, x, t) / K  # [B,H,A]
        return x

    def sample_chain(self, cond: torch.Tensor, gen: torch.Generator | None, sigma: float,
                     steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The noisy chain (class docstring) -> ``(x_K [B,H,A], chain [B,K+1,H,A], log_prob [B])``, all without
        gradient: ``chain_log_prob`` gives the differentiable log-likelihood of a stored chain."""
        _check(sigma > 0, f"sigma must be > 0 for the chain's likelihood, got {sigma}")
        K = self._steps(steps)
        s = sigma * math.sqrt(1.0 / K)
        with torch.no_grad():
            ctx = self.context(cond)  # [B,H,F]
            x = self._noise(cond, gen, None)  # [B,H,A]
            z = torch.randn((K, *x.shape), generator=gen, device=x.device, dtype=x.dtype)  # [K,B,H,A]
            chain = [x]
            for k in range(K):
                x = x - self.velocity(ctx, x, x.new_full((), 1.0 - k / K)) / K + s * z[k]  # [B,H,A]
                chain.append(x)
            # (x_{k+1} - m_k) / s = z_k exactly
            log_prob = (-0.5 * z.square() - math.log(s) - 0.5 * _LOG_2PI).sum((0, 2, 3))  # [B]
        return x, torch.stack(chain, 1), log_prob

    def chain_log_prob(self, cond: torch.Tensor, chain: torch.Tensor, sigma: float) -> torch.Tensor:
        """``sum_k sum_{h,a} log N(x_{k+1}; m_k, s^2)`` of a stored ``chain [B,K+1,H,A]`` under the current
        parameters -> ``[B]`` (differentiable; K is read from the chain; all steps in one batched call)."""
        _check(sigma > 0, f"sigma must be > 0 for the chain's likelihood, got {sigma}")
        ctx = self.context(cond)  # [B,H,F]
        _check(chain.dim() == 4 and chain.shape[0] == cond.shape[0] and chain.shape[1] >= 2
               and chain.shape[2:] == (self.H, self.A),
               f"chain_log_prob expects chain [{cond.shape[0]},K+1,{self.H},{self.A}], got {tuple(chain.shape)}")
        K = chain.shape[1] - 1
        s = sigma * math.sqrt(1.0 / K)
        x = chain[:, :-1]  # [B,K,H,A]
        t = torch.tensor([1.0 - k / K for k in range(K)], device=x.device, dtype=x.dtype)  # [K] as in sample_chain
        m = x - self.velocity(ctx[:, None], x, t[None]) / K  # [B,K,H,A]
        z = (chain[:, 1:] - m) / s  # [B,K,H,A]
        return (-0.5 * z.square() - math.log(s) - 0.5 * _LOG_2PI).sum((1, 2, 3))
