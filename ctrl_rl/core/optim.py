"""Optimizer steps without the Python around them, for updates of many small tensors (SAC at batch 256 on CPU).

``torch.optim.Adam(fused=True).step()`` runs one fused kernel over a network's parameters, but first ~100 us of
Python per call on this CPU (hooks, profiling scopes, per-group lists, the functional dispatch, grouping by device and
dtype): about twice the kernel's own time for SAC's 256x256 critics, three optimizers per update
(experiments/sac_default_speed/README.md). ``adam_step`` calls the same kernel on the same state and arguments, so
a step is bit-identical to ``opt.step()``; the optimizer object stays what saves, loads and owns the state.
"""

from __future__ import annotations

import torch


def adam_step(opt: torch.optim.Adam) -> None:
    """``opt.step()`` for a fused Adam: ``torch._fused_adam_`` on every parameter with a gradient, per group (the
    step counts incremented first, as ``Adam.step`` does). Falls back to ``opt.step()`` where this path does not
    reproduce it: a parameter's first step (the state is created there), amsgrad, a non-fused or differentiable
    optimizer, tensor hyperparameters, gradient scaling, or parameters of several devices or dtypes in a group."""
    calls = _fused_calls(opt)
    if calls is None:
        opt.step()
        return
    with torch.no_grad():
        for group, params, states in calls:
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)  # pyright: ignore[reportPrivateImportUsage]
            beta1, beta2 = group["betas"]
            torch._fused_adam_(  # pyright: ignore[reportPrivateImportUsage]
                params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                [], steps, amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"])


def _fused_calls(opt: torch.optim.Adam) -> list[tuple[dict, list[torch.Tensor], list[dict]]] | None:
    """Per group with gradients: (group, parameters with a gradient, their states); None where ``adam_step`` must
    fall back to ``opt.step()``."""
    if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None:
        return None
    calls = []
    for group in opt.param_groups:
        hyper = (group["lr"], *group["betas"])
        if (not group["fused"] or group["amsgrad"] or group["differentiable"] or group["decoupled_weight_decay"]
                or any(isinstance(h, torch.Tensor) for h in hyper)):
            return None
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        states = [opt.state[p] for p in params]
        if any(not s for s in states) or len({(p.device, p.dtype) for p in params}) > 1:
            return None
        calls.append((group, params, states))
    return calls
