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

Why per-slice identity holds (measured on CPU, torch 2.13, one thread, on an Intel AVX-512 and an AMD AVX2 CPU;
``tests/core/test_seeds.py`` checks it): ``baddbmm`` over a batch of S >= 2 gives each slice the bits of ``addmm`` on
that slice for every output width but 1, and the backward runs the products ``nn.Linear``'s does, in its
orientation (:class:`_SeedAffine`: autograd's own ``x^T @ g`` for the weight rounds unlike ``g^T @ x`` on AVX2);
at width 1 ``addmm`` (and a batch of 1) takes a matrix-vector path whose sums round differently, so a width-1 layer
of a plain network runs as S ``F.linear`` calls (an ensemble of E >= 2 members already takes the batched path alone
and stacks to S*E). The per-seed reductions give the same bits, and so do element-wise kernels where each seed's
slice is a whole number of the kernel's vector blocks: a vectorized function (softplus, sigmoid) rounds the scalar
tail of a tensor differently from its vectorized body, and the tail of ``[S,B,A]`` is the last seed's while alone
every seed has its own (up to 32 floats with AVX-512: a batch of 256, or any multiple of 32 rows, always is whole).
For the same reason a fused optimizer over one stacked tensor would not: its vectorized loop and its scalar tail
meet at other elements than in a member's own tensor, hence one optimizer per member. Other thread counts split the
work differently: bit-identity with the alone run holds at the same fixed ``--threads``.

Random draws inside an update (a random critic subset, a policy's samples): the batched instance's ``gen`` is a
:class:`SeedGenerators`, and the draw helpers :func:`randn`, :func:`rand` and :func:`randperm`, given it where a
``torch.Generator`` goes, make one draw per seed with that seed's generator, of the shape its update draws alone,
and stack them; so each generator sees exactly the calls, shapes and order of its run alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from ctrl_rl.core.nets import EnsembleLinear
from ctrl_rl.core.optim import adam_step

A = TypeVar("A")


class _SeedAffine(torch.autograd.Function):
    """``[S,B,in] @ [S,out,in]^T + [S,out]`` with each slice's gradients computed as ``nn.Linear``'s are alone.

    Autograd of ``baddbmm(b, x, w^T)`` would form the weight gradient as ``x^T @ g`` (``[in,out]``), while
    ``addmm``'s backward forms ``g^T @ x`` (``[out,in]``): the same sums, but a BLAS kernel may split them differently
    by orientation (equal bits on an AVX-512 CPU, not on an AVX2 one for 4- or 5-wide layers). So the backward
    here is the one ``nn.Linear`` runs, batched: ``g^T @ x`` for the weight, ``g @ w`` for the input, ``g``
    summed over the batch for the bias; the weight gradient comes out in the weight's own layout."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))  # [S,B,out]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (g,) = grads  # [S,B,out]
        x, w = ctx.saved_tensors
        gx = torch.bmm(g, w) if ctx.needs_input_grad[0] else None  # [S,B,in]
        gw = torch.bmm(g.transpose(1, 2), x) if ctx.needs_input_grad[1] else None  # [S,out,in]
        gb = g.sum(1) if ctx.needs_input_grad[2] else None  # [S,out]
        return gx, gw, gb


class SeedLinear(nn.Module):
    """S ``nn.Linear`` members as one layer: ``[S,B,in] -> [S,B,out]``; the members own the parameters."""

    def __init__(self, members: Sequence[nn.Linear]):
        super().__init__()
        self.members = list(members)  # a plain list: the members are not submodules of the stack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.members[0].out_features == 1:  # addmm's matrix-vector path: one call per seed, as alone
            return torch.stack([F.linear(x[k], m.weight, m.bias) for k, m in enumerate(self.members)])  # [S,B,1]
        w = torch.stack([m.weight for m in self.members])  # [S,out,in]
        b = torch.stack([m.bias for m in self.members])  # [S,out]
        return cast(torch.Tensor, _SeedAffine.apply(x, w, b))  # [S,B,out]  # pyright: ignore[reportUnknownMemberType]


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

    @property
    def weight(self) -> torch.Tensor:
        """The members' current weights ``[S,E,in,out]`` (code that reads an ensemble layer's ``weight`` directly,
        e.g. to run a subset of members, reads every seed's)."""
        return torch.stack([m.weight for m in self.members])

    @property
    def bias(self) -> torch.Tensor:
        """The members' current biases ``[S,E,1,out]``."""
        return torch.stack([m.bias for m in self.members])


class SeedLayerNorm(nn.Module):
    """S ``nn.LayerNorm`` members as one layer ``[S,...,h]``: one ``F.layer_norm`` per seed with its own affine
    parameters. (One call without affine and a separate scale and shift would round differently: the kernel applies
    the affine inside its vectorized loop.)"""

    def __init__(self, members: Sequence[nn.LayerNorm]):
        super().__init__()
        self.members = list(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([F.layer_norm(x[k], m.normalized_shape, m.weight, m.bias, m.eps)
                            for k, m in enumerate(self.members)])


class SeedParameterList(nn.Module):
    """S ``nn.ParameterList`` members: entry ``i`` is the members' current entries stacked ``[S,*shape]``.

    Every ParameterList in ctrl_rl holds an ensemble's per-member parameters ``[E,1,h]`` (EnsembleMLP's LayerNorm
    scales and shifts) that broadcast against ``[E,B,h]`` with their own batch dim, so the stack is ``[S,E,1,h]``
    against ``[S,E,B,h]``, with no batch dim inserted (unlike a module's own parameter, :func:`seed_stack`)."""

    def __init__(self, members: Sequence[nn.ParameterList]):
        super().__init__()
        self.members = list(members)

    def __len__(self) -> int:
        return len(self.members[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.stack([m[i] for m in self.members])


def _stack_parameter(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """A module's own parameter (e.g. a state-independent log-std ``[A]``) as ``[S,1,*shape]``: broadcast against
    batch-first activations ``[S,B,...]`` as the member's broadcasts against ``[B,...]``."""
    return torch.stack(list(params)).unsqueeze(1)


def seed_stack(members: Sequence[nn.Module]) -> nn.Module:
    """The S members (one architecture) as one module of inputs ``[S,...]`` (see the module docstring).

    ``nn.Linear``, ``EnsembleLinear``, ``nn.LayerNorm`` and ``nn.ParameterList`` become :class:`SeedLinear`,
    :class:`SeedEnsembleLinear`, :class:`SeedLayerNorm` and :class:`SeedParameterList`; any other module becomes an
    instance of its own class whose submodules are stacked in turn, whose plain attributes are member 0's, and whose
    own parameters are refreshed before every call as ``[S,1,*shape]``; its methods (a policy's ``log_prob``,
    ``mode``) run on it unchanged. Buffers (running statistics) are refused.
    """
    m0 = members[0]
    if any(type(m) is not type(m0) for m in members):
        raise TypeError(f"seed_stack needs members of one class, got {sorted({type(m).__name__ for m in members})}")
    if isinstance(m0, nn.Linear):
        return SeedLinear([m for m in members if isinstance(m, nn.Linear)])
    if isinstance(m0, EnsembleLinear):
        return SeedEnsembleLinear([m for m in members if isinstance(m, EnsembleLinear)])
    if isinstance(m0, nn.LayerNorm):
        return SeedLayerNorm([m for m in members if isinstance(m, nn.LayerNorm)])
    if isinstance(m0, nn.ParameterList):
        return SeedParameterList([m for m in members if isinstance(m, nn.ParameterList)])
    if any(True for _ in m0.buffers(recurse=False)) or isinstance(m0, nn.ParameterDict):
        raise TypeError(f"seed_stack cannot stack {type(m0).__name__}: it holds buffers (running statistics) or "
                        "a parameter dict, whose seed-batched layout it does not know")
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


class SeedCalls(nn.Module):
    """S members of a module run one call per seed on its slice (``[S,...]`` -> each member on ``x[k]`` -> stacked):
    exact by construction, not batched. For what a layout names in ``SeedLayout.calls``: a cheap module holding
    buffers (an observation normalizer's running statistics), whose seed-batched form :func:`seed_stack` refuses."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        self.members = list(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x[k]) for k, m in enumerate(self.members)])


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
        for m in self.members:  # an optimizer by adam_step (= m.step() bit for bit, without its Python: core.optim)
            if isinstance(m, torch.optim.Optimizer):
                adam_step(m)
            else:
                m.step()


@dataclass(frozen=True)
class SeedLayout:
    """What of an algorithm instance :func:`batch_seeds` batches (attribute names of the algorithm's class)."""

    modules: tuple[str, ...]
    """Networks stacked with :func:`seed_stack` (inputs gain a leading ``[S]``)."""
    each: tuple[str, ...] = ()
    """Optimizers and schedulers: every member's own steps (:class:`Each`); a member's None stays None."""
    calls: tuple[str, ...] = ()
    """Modules run one call per seed (:class:`SeedCalls`), e.g. an observation normalizer with running statistics;
    a member's None stays None."""
    lists: tuple[str, ...] = ()
    """Lists of tensors (target and source parameters of a Polyak update): the members' lists concatenated."""
    tensors: tuple[str, ...] = ()
    """Single tensors an optimizer steps (a temperature's log alpha, a Lagrange multiplier): read as the members'
    current values stacked ``[S,*shape]`` at every access, so gradients reach each member's own; None where the
    members hold None."""
    counters: tuple[str, ...] = ()
    """Plain values every member holds alike and the update advances (a step counter): read from member 0, written
    to every member, so each member's checkpoint holds its count."""
    parts: tuple[tuple[str, SeedLayout], ...] = ()
    """Objects the algorithm holds whose own attributes are batched by their own layout (CQL's ``sac``)."""
    refuse: Callable[[Any], str | None] | None = None
    """``refuse(config)``: a setting the seed-batched update cannot reproduce bit for bit, named in words (e.g.
    dropout, whose masks come from each member's generator), or None."""


def _seed_class(cls: type[A], tensors: Sequence[str], counters: Sequence[str]) -> type[A]:
    """``cls`` with the layout's ``tensors`` and ``counters`` as properties over the instance's ``_seed_members``."""
    def stacked(name: str) -> property:
        def get(self: Any) -> torch.Tensor | None:
            values = [getattr(m, name) for m in self._seed_members]
            return None if values[0] is None else torch.stack(values)  # [S,*shape]
        return property(get)

    def counter(name: str) -> property:
        def get(self: Any) -> Any:
            return getattr(self._seed_members[0], name)

        def put(self: Any, value: Any) -> None:
            for m in self._seed_members:
                setattr(m, name, value)
        return property(get, put)

    props = {**{n: stacked(n) for n in tensors}, **{n: counter(n) for n in counters}}
    return cast("type[A]", type(cls.__name__, (cls,), props))  # a subclass of cls


def batch_seeds(algos: Sequence[A], layout: SeedLayout) -> A:
    """One instance of the members' class whose ``update`` trains all of them at once (see the module docstring).

    Other attributes are member 0's (config, spec, device); ``gen`` is the members' generators as one
    :class:`SeedGenerators`, from which the draw helpers make each seed's draw with its own generator.
    """
    a0 = algos[0]
    out: A = object.__new__(_seed_class(type(a0), layout.tensors, layout.counters))
    # member 0's attributes (shallow); what the layout names is replaced, tensors and counters become properties
    out.__dict__.update({k: v for k, v in a0.__dict__.items() if k not in (*layout.tensors, *layout.counters)})
    out.__dict__["_seed_members"] = list(algos)
    for name in layout.modules:
        setattr(out, name, seed_stack([getattr(a, name) for a in algos]))
    for name in layout.each:
        members = [getattr(a, name) for a in algos]
        setattr(out, name, None if members[0] is None else Each(members))
    for name in layout.calls:
        members = [getattr(a, name) for a in algos]
        setattr(out, name, None if members[0] is None else SeedCalls(members))
    for name in layout.lists:
        setattr(out, name, [t for a in algos for t in getattr(a, name)])
    for name, part in layout.parts:
        setattr(out, name, batch_seeds([getattr(a, name) for a in algos], part))
    out.__dict__["gen"] = SeedGenerators([vars(a)["gen"] for a in algos])  # each seed's own generator
    return out


class SeedGenerators:
    """The seeds' ``torch.Generator`` s in seed order, passed where an update passes its generator; the draw helpers
    below stack one draw per generator."""

    def __init__(self, gens: Sequence[torch.Generator]):
        self.gens = list(gens)

    def __len__(self) -> int:
        return len(self.gens)

    def draw(self, fn: Callable[[torch.Generator], torch.Tensor]) -> torch.Tensor:
        """``fn(gen)`` of every seed's generator, in seed order, stacked ``[S,...]``."""
        return torch.stack([fn(g) for g in self.gens])


Gen: TypeAlias = "torch.Generator | SeedGenerators | None"
"""A generator argument of the draw helpers: one run's generator (or None: the global one), or a seeds-run's."""


def _per_seed(shape: Sequence[int], gen: SeedGenerators) -> tuple[int, ...]:
    assert len(shape) >= 1 and shape[0] == len(gen), \
        f"a seed-batched draw needs a leading seed dimension of {len(gen)}, got shape {tuple(shape)}"
    return tuple(shape[1:])


def randn(shape: Sequence[int], generator: Gen, device: torch.device | str | None = None,
          dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.randn(shape, generator=...)``; with :class:`SeedGenerators`, ``shape`` is ``[S,...]`` and seed k's
    slice is ``torch.randn(shape[1:])`` of its generator."""
    if isinstance(generator, SeedGenerators):
        one = _per_seed(shape, generator)
        return generator.draw(lambda g: torch.randn(one, generator=g, device=device, dtype=dtype))
    return torch.randn(tuple(shape), generator=generator, device=device, dtype=dtype)


def rand(shape: Sequence[int], generator: Gen, device: torch.device | str | None = None,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.rand`` as :func:`randn` draws ``torch.randn``."""
    if isinstance(generator, SeedGenerators):
        one = _per_seed(shape, generator)
        return generator.draw(lambda g: torch.rand(one, generator=g, device=device, dtype=dtype))
    return torch.rand(tuple(shape), generator=generator, device=device, dtype=dtype)


def randperm(n: int, generator: Gen, device: torch.device | str | None = None) -> torch.Tensor:
    """``torch.randperm(n)`` ``[n]``; with :class:`SeedGenerators`, one permutation per seed ``[S,n]``."""
    if isinstance(generator, SeedGenerators):
        return generator.draw(lambda g: torch.randperm(n, generator=g, device=device))
    return torch.randperm(n, generator=generator, device=device)


def select_members(t: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """``t [E,...]`` at ``members [M]`` -> ``[M,...]`` (``index_select``); seed-batched, ``t [S,E,...]`` at each seed's
    ``members [S,M]`` -> ``[S,M,...]`` (one ``index_select`` over the flattened ``[S*E,...]``: the same copies)."""
    if members.dim() == 1:
        return t.index_select(0, members)
    S, E = t.shape[:2]
    rows = (members + E * torch.arange(S, device=members.device).unsqueeze(-1)).flatten()  # [S*M]
    return t.flatten(0, 1).index_select(0, rows).view(*members.shape, *t.shape[2:])


def unstack(value: torch.Tensor, seeds: int) -> Iterator[torch.Tensor]:
    """Slices of a seed-batched info value: ``[S,...]`` by seed; a value without a seed dimension (0-d, the same
    for every seed, e.g. a learning rate) for each seed."""
    if value.dim() == 0:
        return (value for _ in range(seeds))
    assert value.shape[0] == seeds, f"expected a leading seed dimension of {seeds}, got {tuple(value.shape)}"
    return iter(value.unbind(0))
