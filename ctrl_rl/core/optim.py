"""Optimizer steps without the Python around them, for updates of many small tensors (SAC at batch 256 on CPU).

``torch.optim.Adam(fused=True).step()`` runs one fused kernel over a network's parameters, but first ~100 us of
Python per call on this CPU (hooks, profiling scopes, per-group lists, the functional dispatch, grouping by device and
dtype): about twice the kernel's own time for SAC's 256x256 critics, three optimizers per update
(experiments/sac_default_speed/README.md). ``adam_step`` calls the same kernel on the same state and arguments, so
a step is bit-identical to ``opt.step()``; the optimizer object stays what saves, loads and owns the state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch


def adam_step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()`` for a fused Adam: ``torch._fused_adam_`` on every parameter with a gradient, per group (the
    step counts incremented first, as ``Adam.step`` does). Falls back to ``opt.step()`` where this path does not
    reproduce it: anything but a ``torch.optim.Adam`` (another optimizer, ``core.seeds.Each``'s S members), tracing
    by torch.compile, a parameter's first step (the state is created there), amsgrad, a non-fused or differentiable
    optimizer, tensor hyperparameters, gradient scaling, or parameters of several devices or dtypes in a group."""
    # under torch.compile (SAC's --compile) dynamo traces Adam.step itself; the raw in-place kernel cannot be traced
    calls = _fused_calls(opt) if type(opt) is torch.optim.Adam and not torch.compiler.is_compiling() else None
    if calls is None:
        opt.step()  # pyright: ignore[reportUnknownMemberType]  (torch stub gap: Optimizer.step's return)
        return
    with torch.no_grad():
        for args, hyper in calls:
            torch._foreach_add_(args[5], 1)  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]
            torch._fused_adam_(*args, amsgrad=False, **hyper)  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]


def set_grads(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """``p.grad = g`` for each pair (from ``torch.autograd.grad``), in the parameter's own memory layout.

    A fused Adam on CPU (torch 2.13, ``opt.step()`` and ``adam_step`` alike) reads a gradient in memory order: one
    whose strides differ from its parameter's (e.g. a weight gradient from a transposed batched product) silently
    updates the wrong elements (0.2 off after one step at lr 0.1 on a 4x3 weight). ``.backward()`` always lays
    ``.grad`` out like the parameter; a gradient assigned by hand is copied into that layout where it differs."""
    for p, g in zip(params, grads):
        p.grad = g if g is None or g.stride() == p.stride() else torch.empty_like(p).copy_(g)


_Lists = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
               list[torch.Tensor]]


def _fused_calls(opt: torch.optim.Optimizer) -> list[tuple[_Lists, dict[str, Any]]] | None:
    """Per group with gradients: ``_fused_adam_``'s lists (params, grads, exp_avgs, exp_avg_sqs, [], steps) and its
    hyperparameters; None where ``adam_step`` must fall back to ``opt.step()``."""
    if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        return None
    calls: list[tuple[_Lists, dict[str, Any]]] = []
    for group in opt.param_groups:
        lr, (beta1, beta2) = group["lr"], group["betas"]
        if (not group["fused"] or group["amsgrad"] or group["differentiable"] or group["decoupled_weight_decay"]
                or any(isinstance(h, torch.Tensor) for h in (lr, beta1, beta2))):
            return None
        params: list[torch.Tensor] = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        states: list[dict[str, torch.Tensor]] = [opt.state[p] for p in params]
        if any(not st for st in states) or len({(p.device, p.dtype) for p in params}) > 1:
            return None
        grads = [cast(torch.Tensor, p.grad) for p in params]
        no_max: list[torch.Tensor] = []  # amsgrad's max_exp_avg_sqs: none
        lists: _Lists = (params, grads, [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states], no_max,
                         [st["step"] for st in states])
        calls.append((lists, {"lr": lr, "beta1": beta1, "beta2": beta2, "weight_decay": group["weight_decay"],
                              "eps": group["eps"], "maximize": group["maximize"]}))
    return calls
