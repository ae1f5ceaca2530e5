"""The linear recurrent unit (LRU) sequence model: a diagonal complex recurrence in residual layers, run over a
whole sequence by a parallel prefix scan and one step at a time while acting (NeuBay's encoders,
docs/algorithms/neubay.md).

Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences", as NeuBay's code
(twni2016/neubay ``memory/lru.py``, ``SequenceLayer``) writes it:

    LRU:       h_t = lambda * h_{t-1} + (gamma * B) x_t,   y_t = Re(C h_t) + D * x_t
    LRULayer:  x + out1(g) * sigmoid(out2(g)),   g = GELU(LRU(LayerNorm(x)))
    LRUEncoder: norm_block(I -> D), then L LRULayers

with ``lambda = exp(-exp(nu_log) + i exp(theta_log))`` (so ``|lambda| < 1``), ``|lambda|`` initialised in
``[r_min, r_max]``, phases in ``[0, max_phase]``, and ``gamma = sqrt(1 - |lambda|^2)`` normalising the input.
``start`` marks the rows where the recurrence restarts (hidden 0): the first row of each sequence in a batch of
concatenated sequences.

Implementation choice: the recurrence over a whole sequence runs as a parallel scan over time (``linear_scan``:
a Hillis-Steele prefix scan, the form of the paper's ``associative_scan``, for short sequences and on a GPU; for
long ones on the CPU blocks of about sqrt(S) rows scanned step by step all at once, then their carries; its
gradient is the same scan backwards in time); ``step`` is the one-step recurrence, and ``step_real`` the same in
real arithmetic (the real and imaginary parts in a last dim of 2: graphs without complex tensors, ONNX). All three
agree to float rounding (tests/core/test_sequence.py).

Shape letters: S sequence rows, N sequences, I input dim, D d_model, L layers, H hidden units (complex).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ctrl_rl.core.nets import norm_block


def _hillis_steele(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Hillis-Steele prefix scan of ``h_t = a_t h_{t-1} + b_t`` along dim 0 (``h_{-1} = 0``), without autograd:
    ceil(log2 T) steps, each one fused multiply-add over the whole tensor into a second buffer (ping-pong)."""
    T, d = a.shape[0], 1
    if T == 1:
        return b.clone()
    b, nb = b.clone(), torch.empty_like(b)
    a, na = a.clone(), torch.empty_like(a)
    while d < T:
        nb[:d] = b[:d]
        torch.addcmul(b[d:], a[d:], b[:-d], out=nb[d:])
        b, nb = nb, b
        if 2 * d < T:
            na[:d] = a[:d]
            torch.mul(a[d:], a[:-d], out=na[d:])
            a, na = na, a
        d *= 2
    return b


def _scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h_t = a_t h_{t-1} + b_t`` along dim 0 without autograd: ``_blocked`` for long sequences on the CPU, where
    the work sets the time, else ``_hillis_steele``, whose log2(T) steps are fewer operations: on a GPU a NeuBay
    update is bound by its operator launches (H200: 42 against 79 ms per update, experiments/model_based_speed)."""
    if a.shape[0] < 256 or a.device.type != "cpu":
        return _hillis_steele(a, b)
    return _blocked(a, b)


def _blocked(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``_scan`` in blocks: blocks of C rows (C the power of two nearest sqrt(T)) are scanned step by step all at
    once, the blocks' ends by ``_hillis_steele``, then every row adds its block's carry times its running product
    of ``a``: O(T) work in about C + log2(T / C) steps, against ``_hillis_steele``'s O(T log T) (3-4x faster on a
    CPU at NeuBay's 2,100 rows)."""
    T = a.shape[0]
    C = 1 << round(math.log2(math.sqrt(T)))
    n = -(-T // C)  # blocks
    if n * C != T:  # rows after the end: a = b = 0, which leave every real row as it is
        pad = (n * C - T, *a.shape[1:])
        a, b = torch.cat([a, a.new_zeros(pad)]), torch.cat([b, b.new_zeros(pad)])
    A, B = a.reshape(n, C, *a.shape[1:]), b.reshape(n, C, *b.shape[1:])  # [n,C,...]
    h, prod = torch.empty_like(B), torch.empty_like(A)  # h within the block; prod_{s in block, s <= t} a_s
    h[:, 0], prod[:, 0] = B[:, 0], A[:, 0]
    for j in range(1, C):
        torch.addcmul(B[:, j], A[:, j], h[:, j - 1], out=h[:, j])
        torch.mul(A[:, j], prod[:, j - 1], out=prod[:, j])
    ends = _hillis_steele(prod[:, -1], h[:, -1])  # [n,...] h at every block's last row
    h[1:] += prod[1:] * ends[:-1].unsqueeze(1)
    return h.reshape(n * C, *b.shape[1:])[:T]


class _LinearScan(torch.autograd.Function):
    """``linear_scan`` with its gradient as a second scan backwards in time. With ``g_t = dL/dh_t`` in total:
    ``g_t = dL/dh_t|direct + conj(a_{t+1}) g_{t+1}``, ``dL/db_t = g_t`` and ``dL/da_t = g_t conj(h_{t-1})``
    (PyTorch's convention for complex gradients: ``d(xy)/dx`` passes ``grad * conj(y)``). Neither pass keeps a
    graph: the backward pass costs one scan instead of the log-depth graph of slices and products."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = _scan(a, b)
        ctx.save_for_backward(a, h)
        return h

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        (gh,) = grads
        a, h = cast(tuple[torch.Tensor, torch.Tensor], ctx.saved_tensors)
        c = torch.cat([a[1:].conj(), torch.zeros_like(a[:1])])  # [T,...]: c_t links g_t to g_{t+1}
        g = _scan(c.flip(0), gh.flip(0)).flip(0)  # [T,...]
        grad_a = None
        if cast(tuple[bool, bool], ctx.needs_input_grad)[0]:
            grad_a = torch.zeros_like(g)
            grad_a[1:] = g[1:] * h[:-1].conj()  # h_{-1} = 0
        return grad_a, g


def linear_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h_t = a_t * h_{t-1} + b_t`` with ``h_{-1} = 0`` along dim 0 of ``a``, ``b [T,...]`` (same shape and dtype,
    real or complex), by ``_scan`` (Hillis-Steele below 256 rows and off the CPU, else blocked), whose gradient is
    one scan backwards in time (``_LinearScan``)."""
    # torch stub gap: Function.apply is typed (...) -> Any
    return cast(torch.Tensor, _LinearScan.apply(a, b))  # pyright: ignore[reportUnknownMemberType]


class LRU(nn.Module):
    """Linear recurrent unit with a diagonal complex recurrence (module docstring; initialisation as NeuBay's code,
    ``memory/lru.py``)."""

    def __init__(self, d_model: int, d_hidden: int, r_min: float, r_max: float, max_phase: float):
        super().__init__()
        u1, u2 = torch.rand(d_hidden), torch.rand(d_hidden)
        nu_log = torch.log(-0.5 * torch.log((u1 * (r_max**2 - r_min**2) + r_min**2).clamp(min=1e-30)))  # [H]
        self.nu_log = nn.Parameter(nu_log)
        self.theta_log = nn.Parameter(torch.log((max_phase * u2).clamp(min=1e-30)))  # [H]
        self.gamma_log = nn.Parameter(torch.log(torch.sqrt(1 - torch.exp(-torch.exp(nu_log)) ** 2)))  # [H]
        self.B_re = nn.Parameter(torch.randn(d_hidden, d_model) / math.sqrt(2 * d_model))  # [H,D]
        self.B_im = nn.Parameter(torch.randn(d_hidden, d_model) / math.sqrt(2 * d_model))  # [H,D]
        self.C_re = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(d_hidden))  # [D,H]
        self.C_im = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(d_hidden))  # [D,H]
        self.D = nn.Parameter(torch.randn(d_model))  # [D]

    def lam(self) -> torch.Tensor:
        return torch.exp(torch.complex(-self.nu_log.exp(), self.theta_log.exp()))  # [H] complex, |lambda| < 1

    def drive(self, x: torch.Tensor) -> torch.Tensor:
        """``(gamma * B) x`` as a complex ``[..., H]`` from real ``x [..., D]`` (two real matmuls)."""
        g = self.gamma_log.exp()  # [H]
        # float32 parts (under bfloat16 autocast the products are bfloat16; the recurrence stays complex64)
        return torch.complex((x @ self.B_re.T * g).float(), (x @ self.B_im.T * g).float())

    def read(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``Re(C h) + D * x`` -> ``[..., D]``."""
        return h.real @ self.C_re.T - h.imag @ self.C_im.T + x * self.D

    def forward(self, x: torch.Tensor, start: torch.Tensor, h0: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [S,N,D]``, ``start [S,N]`` (hidden reset to 0 before these rows), ``h0 [N,H]`` -> ``(y [S,N,D],
        h [S,N,H])`` (every hidden state)."""
        bx = self.drive(x)  # [S,N,H]
        a = self.lam() * (~start).unsqueeze(-1)  # [S,N,H]: 0 where the recurrence restarts
        if h0 is not None:
            bx = torch.cat([bx[:1] + a[:1] * h0, bx[1:]])
        h = linear_scan(a, bx)  # [S,N,H]
        return self.read(h, x), h

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``x [N,D]``, ``h [N,H]`` -> ``(y [N,D], h [N,H])``."""
        h = self.lam() * h + self.drive(x)
        return self.read(h, x), h

    def step_real(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``step`` in real arithmetic (graphs without complex tensors: ONNX): ``h [N,H,2]`` holds the real and
        imaginary parts; ``lambda = exp(-nu) (cos theta + i sin theta)``."""
        r = torch.exp(-self.nu_log.exp())  # [H]
        theta = self.theta_log.exp()  # [H]
        lam_re, lam_im = r * torch.cos(theta), r * torch.sin(theta)  # [H] each
        g = self.gamma_log.exp()  # [H]
        h_re, h_im = h[..., 0], h[..., 1]  # [N,H] each
        new_re = lam_re * h_re - lam_im * h_im + x @ self.B_re.T * g  # [N,H]
        new_im = lam_re * h_im + lam_im * h_re + x @ self.B_im.T * g  # [N,H]
        y = new_re @ self.C_re.T - new_im @ self.C_im.T + x * self.D  # [N,D]
        return y, torch.stack([new_re, new_im], -1)


class LRULayer(nn.Module):
    """``x + out1(g) * sigmoid(out2(g))``, ``g = GELU(LRU(LayerNorm(x)))`` (NeuBay's ``SequenceLayer``); GELU is the
    tanh approximation (JAX's default)."""

    def __init__(self, d_model: int, d_hidden: int, r_min: float, r_max: float, max_phase: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.lru = LRU(d_model, d_hidden, r_min, r_max, max_phase)
        self.out1, self.out2 = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def _glu(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        g = F.gelu(y, approximate="tanh")
        return x + self.out1(g) * torch.sigmoid(self.out2(g))

    def forward(self, x: torch.Tensor, start: torch.Tensor, h0: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [S,N,D]``, ``start [S,N]`` -> ``(y [S,N,D], h [S,N,H])`` (``LRU.forward``)."""
        y, h = self.lru(self.norm(x), start, h0)
        return self._glu(x, y), h

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h = self.lru.step(self.norm(x), h)
        return self._glu(x, y), h

    def step_real(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h = self.lru.step_real(self.norm(x), h)
        return self._glu(x, y), h


class LRUEncoder(nn.Module):
    """Inputs ``x_t [I]`` -> features ``z_t [D]`` of the sequence so far: an input block (``norm_block``), then
    ``layers`` residual ``LRULayer``; the hidden state is ``[L,H]`` complex (``hidden_shape``)."""

    def __init__(self, in_dim: int, d_model: int, d_hidden: int, layers: int, r_min: float, r_max: float,
                 max_phase: float):
        super().__init__()
        self.pre = norm_block(in_dim, d_model)
        self.layers = nn.ModuleList(LRULayer(d_model, d_hidden, r_min, r_max, max_phase) for _ in range(layers))
        self.hidden_shape = (layers, d_hidden)

    def forward(self, x: torch.Tensor, start: torch.Tensor, at: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x [S,N,I]``, ``start [S,N]`` -> ``(z [S,N,D], hidden [len(at),N,L,H] at the rows ``at``, or None)``."""
        z = self.pre(x)
        hs: list[torch.Tensor] = []
        for layer in self.layers:
            z, h = layer(z, start)  # [S,N,D], [S,N,H]
            if at is not None:
                hs.append(h[at])
        return z, (torch.stack(hs, -2) if at is not None else None)

    def step(self, x: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N,I]``, ``hidden [N,L,H]`` complex -> ``(z [N,D], hidden [N,L,H])``."""
        z = self.pre(x)
        hs: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            z, h = cast(LRULayer, layer).step(z, hidden[:, i])
            hs.append(h)
        return z, torch.stack(hs, 1)

    def step_real(self, x: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``step`` with ``hidden [N,L,H,2]`` as real and imaginary parts (no complex tensors in the graph)."""
        z = self.pre(x)
        hs: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            z, h = cast(LRULayer, layer).step_real(z, hidden[:, i])
            hs.append(h)
        return z, torch.stack(hs, 1)
