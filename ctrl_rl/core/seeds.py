"""Several seeds in one process: S independent agents' networks run as one, each slice bit-identical to its agent.

Shape letters: S seeds, E ensemble members, B batch.

The agents stay what they are alone: S instances of the algorithm, each with its own modules, optimizers,
schedulers and ``torch.Generator``, so a seed's checkpoint is exactly a single run's. :func:`batch_seeds` builds
one more instance of the algorithm's class whose networks are *stacked views* of the members' (:func:`seed_stack`):
every call stacks the members' current parameters (``torch.stack``, an exact copy whose backward hands each member
its own gradient) and runs one batched matmul for all seeds on ``[S,B,in]`` inputs. Its optimizers and schedulers
step every member's own (:class:`Each`), so Adam's arithmetic is the member's, tensor by tensor. The algorithm's
``update`` runs unchanged on that instance as long as it is written with dimensions counted from the end (a leading
``[S]`` on every batch tensor; losses reduced per seed with ``mean(-1)`` and summed before ``backward``).

Why per-slice identity holds (measured on CPU, torch 2.13, one thread; ``tests/core/test_seeds.py`` checks it):
``baddbmm`` over a batch of S >= 2 gives each slice the bits of ``addmm`` on that slice for every output width but 1;
at width 1 ``addmm`` (and a batch of 1) takes a matrix-vector path whose sums round differently, so a width-1 layer
of a plain network runs as S ``F.linear`` calls (an ensemble of E >= 2 members already takes the batched path alone
and stacks to S*E). Element-wise kernels and the per-seed reductions give the same bits. A fused optimizer over one
stacked tensor would not: its vectorized loop and its scalar tail meet at other elements than in a member's own
tensor, hence one optimizer per member. Other thread counts split the work differently: bit-identity with the
alone run holds at the same fixed ``--threads``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from ctrl_rl.core.nets import EnsembleLinear

A = TypeVar("A")


class SeedLinear(nn.Module):
    """S ``nn.Linear`` members as one layer: ``[S,B,in] -> [S,B,out]``; the members own the parameters."""

    def __init__(self, members: Sequence[nn.Linear]):
        super().__init__()
        self.members = list(members)  # a plain list: the members are not submodules of the stack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.members[0].out_features == 1:  # addmm's matrix-vector path: one call per seed, as alone
            return torch.stack([F.linear(x[k], m.weight, m.bias) for k, m in enumerate(self.members)])  # [S,B,1]
        w = torch.stack([m.weight for m in self.members])  # [S,out,in]
        b = torch.stack([m.bias for m in self.members]).unsqueeze(1)  # [S,1,out]
        return torch.baddbmm(b, x, w.transpose(1, 2))  # [S,B,out]


class SeedEnsembleLinear(nn.Module):
    """S ``EnsembleLinear`` members of E each as one layer: ``[S,B,in]`` (shared by the E members, as alone) or
    ``[S,E,B,in]`` -> ``[S,E,B,out]`` in one ``baddbmm`` over S*E."""

    def __init__(self, members: Sequence[EnsembleLinear]):
        super().__init__()
        self.members = list(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        S = len(self.members)
        E, _, out = self.members[0].weight.shape
        if x.dim() == 3:
            x = x.unsqueeze(1).expand(S, E, *x.shape[1:])  # [S,E,B,in]
        if E == 1 and out == 1:  # a batch of one: the matrix-vector path, one call per seed
            return torch.stack([m(x[k]) for k, m in enumerate(self.members)])  # [S,1,B,1]
        w = torch.cat([m.weight for m in self.members])  # [S*E,in,out]
        b = torch.cat([m.bias for m in self.members])  # [S*E,1,out]
        y = torch.baddbmm(b, x.reshape(S * E, *x.shape[2:]), w)  # [S*E,B,out]
        return y.view(S, E, *y.shape[1:])  # [S,E,B,out]


def _stack_parameter(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """A module's own parameter (e.g. a state-independent log-std ``[A]``) as ``[S,1,*shape]``: broadcast against
    batch-first activations ``[S,B,...]`` as the member's broadcasts against ``[B,...]``."""
    return torch.stack(list(params)).unsqueeze(1)


def seed_stack(members: Sequence[nn.Module]) -> nn.Module:
    """The S members (one architecture) as one module of inputs ``[S,...]`` (see the module docstring).

    ``nn.Linear`` and ``EnsembleLinear`` become :class:`SeedLinear` / :class:`SeedEnsembleLinear`; any other
    module becomes an instance of its own class whose submodules are stacked in turn, whose plain attributes are
    member 0's, and whose own parameters are refreshed before every call as ``[S,1,*shape]``; its methods (a
    policy's ``log_prob``, ``mode``) run on it unchanged. Buffers (running statistics) are refused.
    """
    m0 = members[0]
    if any(type(m) is not type(m0) for m in members):
        raise TypeError(f"seed_stack needs members of one class, got {sorted({type(m).__name__ for m in members})}")
    if isinstance(m0, nn.Linear):
        return SeedLinear([m for m in members if isinstance(m, nn.Linear)])
    if isinstance(m0, EnsembleLinear):
        return SeedEnsembleLinear([m for m in members if isinstance(m, EnsembleLinear)])
    if any(True for _ in m0.buffers(recurse=False)) or isinstance(m0, (nn.ParameterList, nn.ParameterDict)):
        raise TypeError(f"seed_stack cannot stack {type(m0).__name__}: it holds buffers (running statistics) or "
                        "per-member parameter lists, whose seed-batched layout it does not know")
    out = object.__new__(type(m0))
    nn.Module.__init__(out)
    fresh = set(out.__dict__)
    out.__dict__.update({k: v for k, v in m0.__dict__.items() if k not in fresh})  # settings (dropout, clips)
    out.training = m0.training
    children = [dict(m.named_children()) for m in members]
    for name in children[0]:
        out.add_module(name, seed_stack([c[name] for c in children]))
    own = [dict(m.named_parameters(recurse=False)) for m in members]
    if own[0]:
        def refresh(module: nn.Module, args: Any) -> None:
            for name in own[0]:  # a plain tensor attribute: the members' current values, with their gradients
                object.__setattr__(module, name, _stack_parameter([p[name] for p in own]))
        out.register_forward_pre_hook(refresh)
    return out


class Each:
    """S optimizers (or schedulers) driven as one: ``zero_grad`` / ``step`` call every member's own, in seed order;
    ``param_groups`` are member 0's (the seeds share their settings, so a learning rate read there is every
    seed's)."""

    def __init__(self, members: Sequence[Any]):
        self.members = list(members)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.members[0].param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for m in self.members:
            m.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for m in self.members:
            m.step()


@dataclass(frozen=True)
class SeedLayout:
    """What of an algorithm instance :func:`batch_seeds` batches (attribute names of the algorithm's class)."""

    modules: tuple[str, ...]
    """Networks stacked with :func:`seed_stack` (inputs gain a leading ``[S]``)."""
    each: tuple[str, ...] = ()
    """Optimizers and schedulers: every member's own steps (:class:`Each`)."""
    lists: tuple[str, ...] = ()
    """Lists of tensors (target and source parameters of a Polyak update): the members' lists concatenated."""
    refuse: Callable[[Any], str | None] | None = None
    """``refuse(config)``: a setting the seed-batched update cannot reproduce bit for bit, named in words (e.g.
    dropout, whose masks come from each member's generator), or None."""


def batch_seeds(algos: Sequence[A], layout: SeedLayout) -> A:
    """One instance of the members' class whose ``update`` trains all of them at once (see the module docstring).

    Other attributes are member 0's (config, spec, device); ``gen`` is None: random draws inside a seed-batched
    update would come from one generator instead of each member's, so a layout refuses settings that draw them.
    """
    out = copy.copy(algos[0])  # member 0's class and attributes (shallow); what the layout names is replaced
    for name in layout.modules:
        setattr(out, name, seed_stack([getattr(a, name) for a in algos]))
    for name in layout.each:
        setattr(out, name, Each([getattr(a, name) for a in algos]))
    for name in layout.lists:
        setattr(out, name, [t for a in algos for t in getattr(a, name)])
    setattr(out, "gen", None)  # noqa: B010  (not every algorithm class declares it)
    return out


def unstack(value: torch.Tensor, seeds: int) -> Iterator[torch.Tensor]:
    """Slices of a seed-batched info value: ``[S,...]`` by seed; a value without a seed dimension (0-d, the same
    for every seed, e.g. a learning rate) for each seed."""
    if value.dim() == 0:
        return (value for _ in range(seeds))
    assert value.shape[0] == seeds, f"expected a leading seed dimension of {seeds}, got {tuple(value.shape)}"
    return iter(value.unbind(0))
