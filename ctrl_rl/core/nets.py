"""Small network building blocks shared by the algorithms."""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
from torch import nn

Activation = Literal["tanh", "relu", "elu", "silu"]
_ACT = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}


def mlp(
    in_dim: int,
    hidden: tuple[int, ...],
    out_dim: int,
    activation: Activation = "tanh",
    layer_norm: bool = False,
    out_gain: float = 1.0,
    batch_renorm: bool = False,
    renorm_warmup: int = 100_000,
) -> nn.Sequential:
    """Linear layers with orthogonal init (gain sqrt 2 hidden, ``out_gain`` last) and zero biases.

    ``batch_renorm`` puts a BatchRenorm before every linear layer (input included), CrossQ's layout.
    """
    layers: list[nn.Module] = []
    dims = (in_dim, *hidden)
    for a, b in zip(dims[:-1], dims[1:]):
        if batch_renorm:
            layers.append(BatchRenorm(a, warmup_steps=renorm_warmup))
        lin = nn.Linear(a, b)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if layer_norm:
            layers.append(nn.LayerNorm(b))
        layers.append(_ACT[activation]())
    if batch_renorm:
        layers.append(BatchRenorm(dims[-1], warmup_steps=renorm_warmup))
    last = nn.Linear(dims[-1], out_dim)
    nn.init.orthogonal_(last.weight, out_gain)
    nn.init.zeros_(last.bias)
    layers.append(last)
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Running mean/variance normalizer (parallel Welford / Chan et al. merge) kept as buffers.

    Buffers travel with ``state_dict`` and are folded into exported policies. ``update`` takes a batch
    ``[B,O]``; ``forward`` returns ``clip((x - mean) / sqrt(var + eps))``.
    """

    mean: torch.Tensor  # buffers (register_buffer): declared so the checker sees Tensors, not Tensor | Module
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))
        self.clip = clip
        self.eps = eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape)  # [B,O]
        b_mean = x.mean(0)  # [O]
        b_var = x.var(0, unbiased=False)  # [O]
        self.merge(b_mean, b_var, torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device))

    @torch.no_grad()
    def merge(self, b_mean: torch.Tensor, b_var: torch.Tensor, b_count: torch.Tensor) -> None:
        """Merge the moments of another batch (used directly by data-parallel training)."""
        tot = self.count + b_count
        w = (b_count / tot).to(self.mean.dtype)
        delta = b_mean - self.mean  # [O]
        new_mean = self.mean + delta * w
        m2 = self.var * (1 - w) + b_var * w + delta.square() * w * (1 - w)
        self.mean.copy_(new_mean)
        self.var.copy_(m2)
        self.count.copy_(tot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) * torch.rsqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


class EnsembleLinear(nn.Module):
    """E independent linear layers as one ``[E,in,out]`` weight: ``[E,B,in] -> [E,B,out]`` in one batched matmul.

    A ``[B,in]`` input is shared by all members. Each member is initialised like ``nn.Linear``.
    """

    def __init__(self, members: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)
        self.weight = nn.Parameter(torch.empty(members, in_dim, out_dim).uniform_(-bound, bound))  # [E,in,out]
        self.bias = nn.Parameter(torch.empty(members, 1, out_dim).uniform_(-bound, bound))  # [E,1,out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.weight.shape[0], *x.shape)  # [E,B,in] (a view)
        return torch.baddbmm(self.bias, x, self.weight)  # [E,B,out]


class EnsembleMLP(nn.Module):
    """An ensemble of E MLPs with stacked parameters (one batched matmul per layer for all members).

    ``layer_norm`` adds a per-member LayerNorm after every hidden layer (before the activation);
    ``batch_renorm`` a per-member BatchRenorm before every linear layer (CrossQ's critic).
    Input ``[B,in]`` (shared) or ``[E,B,in]``; output ``[E,B,out]``.
    """

    def __init__(self, members: int, in_dim: int, hidden: tuple[int, ...], out_dim: int,
                 activation: Activation = "relu", layer_norm: bool = False, batch_renorm: bool = False,
                 renorm_warmup: int = 100_000):
        super().__init__()
        dims = (in_dim, *hidden, out_dim)
        self.layers = nn.ModuleList(EnsembleLinear(members, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.renorms = nn.ModuleList(BatchRenorm(a, members, warmup_steps=renorm_warmup) for a in dims[:-1]) \
            if batch_renorm else None
        self.norm_scale = (nn.ParameterList(nn.Parameter(torch.ones(members, 1, h)) for h in hidden)
                           if layer_norm else None)
        self.norm_shift = (nn.ParameterList(nn.Parameter(torch.zeros(members, 1, h)) for h in hidden)
                           if layer_norm else None)
        self.act = _ACT[activation]()
        self.members = members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.renorms is not None and x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, *x.shape)  # [E,B,in]: per-member statistics
        for i, layer in enumerate(self.layers):
            if self.renorms is not None:
                x = self.renorms[i](x)
            x = layer(x)  # [E,B,h]
            if i < len(self.layers) - 1:
                if self.norm_scale is not None and self.norm_shift is not None:  # both set together (layer_norm)
                    x = nn.functional.layer_norm(x, x.shape[-1:]) * self.norm_scale[i] + self.norm_shift[i]
                x = self.act(x)
        return x

    def forward_input_grad(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y [E,B], dy/dx[..., start:] [E,B,k])`` of a width-1 ReLU ensemble without norms, for a shared input
        ``x [B,in]``: each member's value and its gradient by its own input columns ``start:`` (EDAC's
        action-gradients), the gradient as a function of the weights that a loss can train.

        It is the backward pass written out, ``W_1[start:]^T D_1 W_2^T ... D_L w_out`` per member, with the ReLU
        masks ``D_l`` as constants. ``torch.autograd.grad(..., create_graph=True)`` gives the same values and the
        same weight gradients of a loss on them (a mask's derivative is 0 almost everywhere), but records each ReLU's
        backward as an op of the activations too, whose gradient (zeros) it materialises and adds to the forward's
        on every update (3 tensors of [E,B,H] for RAVL's critics)."""
        if self.renorms is not None or self.norm_scale is not None or not isinstance(self.act, nn.ReLU):
            raise ValueError("forward_input_grad needs a ReLU ensemble without LayerNorm or BatchRenorm")
        layers = [cast(EnsembleLinear, m) for m in self.layers]  # ModuleList items are typed Module
        if layers[-1].weight.shape[-1] != 1:
            raise ValueError("forward_input_grad needs a width-1 output")
        masks: list[torch.Tensor] = []
        for layer in layers[:-1]:
            x = torch.relu(layer(x))  # [E,B,H]
            # [E,B,H]: 1 where the ReLU passed, else 0 (x >= 0); no gradient flows through it. Float, not a bool
            # x > 0: a bool mask is converted to float by every product with it, forward and backward
            masks.append(x.detach().sign())
        y = layers[-1](x).squeeze(-1)  # [E,B]
        g = layers[-1].weight.transpose(1, 2) * masks[-1]  # [E,B,H]: dy/dz of the last hidden layer
        for layer, mask in zip(layers[-2:0:-1], masks[-2::-1]):
            g = torch.bmm(g, layer.weight.transpose(1, 2)) * mask  # [E,B,H]
        return y, torch.bmm(g, layers[0].weight[:, start:].transpose(1, 2))  # [E,B], [E,B,k]


class BatchRenorm(nn.Module):
    """Batch Renormalization (Ioffe 2017) over every dim but the last, as CrossQ uses it (Bhatt et al. 2024).

    Training mode normalises with the batch moments, corrected towards the running ones by
    ``r = clip(sigma_B / sigma, 1/r_max, r_max)`` and ``d = clip((mu_B - mu) / sigma, -d_max, d_max)``
    (both without gradient); for the first ``warmup_steps`` training calls r = 1, d = 0 (plain batch norm).
    Evaluation mode uses the running moments. ``members`` > 0 keeps separate statistics and affine
    parameters per ensemble member for ``[E,B,F]`` inputs. Running moments move with ``1 - momentum``.
    """

    running_mean: torch.Tensor  # buffers (register_buffer): declared so the checker sees Tensors, not Tensor | Module
    running_var: torch.Tensor
    steps: torch.Tensor

    def __init__(self, features: int, members: int = 0, momentum: float = 0.99, r_max: float = 3.0, d_max: float = 5.0,
                 warmup_steps: int = 100_000, eps: float = 1e-3):
        super().__init__()
        shape = (members, 1, features) if members else (features,)
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.momentum, self.r_max, self.d_max, self.warmup_steps, self.eps = momentum, r_max, d_max, warmup_steps, eps
        self.members = members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            x_hat = (x - self.running_mean) * torch.rsqrt(self.running_var + self.eps)
            return x_hat * self.weight + self.bias
        dims = (-2,) if self.members else tuple(range(x.dim() - 1))
        mean = x.mean(dims, keepdim=bool(self.members))  # [E,1,F] or [F]
        xc = x - mean  # centred input
        # the biased variance as the mean of squares of xc: torch.var's reduction over the batch dim was ~6x slower
        # on CPU at [256,96] (experiments/sac_flow_speed), the same value to float rounding
        var = xc.square().mean(dims, keepdim=bool(self.members))
        std = (var + self.eps).sqrt()
        with torch.no_grad():
            run_std = (self.running_var + self.eps).sqrt()
            active = (self.steps >= self.warmup_steps).to(x.dtype)  # 0 during warm-up: r = 1, d = 0
            r = 1 + active * ((std / run_std).clamp(1 / self.r_max, self.r_max) - 1)
            d = active * ((mean - self.running_mean) / run_std).clamp(-self.d_max, self.d_max)
            self.running_mean.lerp_(mean, 1 - self.momentum)
            self.running_var.lerp_(var, 1 - self.momentum)
            self.steps += 1
        # ((x - mean) / std * r + d) * weight + bias, with the per-feature factors folded first: one op on [B,F]
        return torch.addcmul(d * self.weight + self.bias, xc, r / std * self.weight)


def norm_block(in_dim: int, out_dim: int) -> nn.Sequential:
    """``Linear + LayerNorm + LeakyReLU`` (slope 0.01), PyTorch's default Linear initialisation: NeuBay's MLP block
    (the LRU encoder's input block, its actor head)."""
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim), nn.LeakyReLU())
