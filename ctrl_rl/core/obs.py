"""Observations made of named parts, and small pure helpers that work on both observation forms.

An env describes its observation as a tuple of ``ObsPart`` (name, shape, dtype), for example::

    ObsPart("state", (O,), torch.float32)          proprioception / a flat state vector
    ObsPart("image/top", (3, H, W), torch.uint8)   one camera, channels first, values 0..255
    ObsPart("language", (L,), torch.int64)         instruction token ids (or float32 [D], an embedding)

The form of an observation batch (``Obs``) follows one rule:

- an env whose observation is the single part ``state`` of dtype float32 passes a plain tensor
  ``[N,O]`` (``[N,*shape]``), exactly as before parts existed, so the flat path costs nothing extra;
- every other env passes a ``dict[str, Tensor]`` keyed by part name, each ``[N,*part.shape]`` with the
  part's dtype (images stay uint8 from the env through storage; encoders convert them).

The helpers below take either form and return the same form; for dicts they act per part and keep the
key order. They are metadata-light (no host syncs) except ``obs_equal``, which returns a Python bool.
Shape letters: N batch rows (envs, transitions), O flat obs dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch

Obs = torch.Tensor | dict[str, torch.Tensor]

PartKind = Literal["image", "language", "vector"]


@dataclass(frozen=True)
class ObsPart:
    """One named part of an observation.

    Attributes:
        name: ``"state"`` for the flat float state vector, ``"image/<camera>"`` for a camera image
            (uint8 ``[C,H,W]``), ``"language"`` (or ``"language/<what>"``) for an instruction as int64
            token ids ``[L]`` or a float32 embedding ``[D]``; any other name is a vector part.
        shape: shape of one row of this part (without the batch dimension).
        dtype: dtype of the part as the env hands it out.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self):
        # runtime checks of values that may come from untyped code (hence the casts to object)
        if not isinstance(cast(object, self.name), str) or not self.name:
            raise ValueError(f"an observation part needs a non-empty string name, got {self.name!r}.")
        if not isinstance(cast(object, self.dtype), torch.dtype):
            raise ValueError(f"observation part {self.name!r} has dtype {self.dtype!r}, expected a torch.dtype.")
        shape = tuple(int(s) for s in self.shape)
        if any(s < 1 for s in shape):
            raise ValueError(f"observation part {self.name!r} has shape {shape}, expected positive sizes.")
        object.__setattr__(self, "shape", shape)  # normalise lists and numpy ints to a tuple of ints

    @property
    def numel(self) -> int:
        """Number of elements in one row of this part."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def kind(self) -> PartKind:
        """``"image"`` for ``image/...`` names, ``"language"`` for ``language...`` names, else ``"vector"``."""
        if self.name.startswith("image/"):
            return "image"
        if self.name.startswith("language"):
            return "language"
        return "vector"


def parts_from_shape(obs_shape: Sequence[int]) -> tuple[ObsPart, ...]:
    """The parts of a flat observation of shape ``obs_shape``: one float32 ``state`` part."""
    return (ObsPart("state", tuple(obs_shape), torch.float32),)


def is_flat(parts: Sequence[ObsPart]) -> bool:
    """True when ``parts`` is the single float32 ``state`` part, i.e. observations are plain tensors."""
    return len(parts) == 1 and parts[0].name == "state" and parts[0].dtype == torch.float32


def state_shape(parts: Sequence[ObsPart]) -> tuple[int, ...]:
    """Shape of the ``state`` part, or ``()`` when there is none (``EnvSpec.obs_shape`` of a multi-part env)."""
    for p in parts:
        if p.name == "state":
            return p.shape
    return ()


def obs_nbytes(parts: Sequence[ObsPart]) -> int:
    """Bytes of one observation row made of ``parts`` (each part's elements times its dtype's size); for
    memory estimates of storage, e.g. ``4 * O`` for a flat float32 state, ``3 * H * W`` for a uint8 camera."""
    return sum(p.numel * p.dtype.itemsize for p in parts)


def obs_map(fn: Callable[[torch.Tensor], torch.Tensor], obs: Obs) -> Obs:
    """``fn`` applied to the tensor, or to every part of a dict (same keys, same order)."""
    if isinstance(obs, torch.Tensor):
        return fn(obs)
    return {k: fn(v) for k, v in obs.items()}


def obs_index(obs: Obs, idx: int | slice | torch.Tensor) -> Obs:
    """Rows ``idx`` (an int, slice, bool mask or index tensor over the first dim) of every part."""
    if isinstance(obs, torch.Tensor):
        return obs[idx]
    return {k: v[idx] for k, v in obs.items()}


def obs_cat(obs_list: Sequence[Obs], dim: int = 0) -> Obs:
    """Concatenation along the batch dim (``dim``); all items must have the same form and parts."""
    if not obs_list:
        raise ValueError("obs_cat needs at least one observation batch.")
    first = obs_list[0]
    if isinstance(first, torch.Tensor):
        tensors = [o for o in obs_list if isinstance(o, torch.Tensor)]
        if len(tensors) != len(obs_list):
            raise ValueError("obs_cat got a tensor and a dict of parts, expected observations of one form.")
        return torch.cat(tensors, dim)
    dicts: list[dict[str, torch.Tensor]] = [first]
    for o in obs_list[1:]:
        if isinstance(o, torch.Tensor) or o.keys() != first.keys():
            got = "a tensor" if isinstance(o, torch.Tensor) else f"parts {list(o)}"
            raise ValueError(f"obs_cat got observations with parts {list(first)} and {got}, expected the same parts.")
        dicts.append(o)
    return {k: torch.cat([o[k] for o in dicts], dim) for k in first}


def obs_to(obs: Obs, device: torch.device | str, non_blocking: bool = False) -> Obs:
    """Every part moved to ``device`` (dtypes unchanged)."""
    if isinstance(obs, torch.Tensor):
        return obs.to(device, non_blocking=non_blocking)
    return {k: v.to(device, non_blocking=non_blocking) for k, v in obs.items()}


def obs_batch_size(obs: Obs) -> int:
    """N, the size of the first dim (the same for every part)."""
    if isinstance(obs, torch.Tensor):
        return obs.shape[0]
    if not obs:
        raise ValueError("an observation dict needs at least one part.")
    return next(iter(obs.values())).shape[0]


def obs_clone(obs: Obs) -> Obs:
    """A copy that later in-place writes to ``obs`` do not reach."""
    if isinstance(obs, torch.Tensor):
        return obs.clone()
    return {k: v.clone() for k, v in obs.items()}


def obs_where(mask: torch.Tensor, a: Obs, b: Obs) -> Obs:
    """Row-wise select: row i from ``a`` where ``mask[i]`` else from ``b`` (``mask [N]`` bool); for auto-reset."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        raise ValueError("obs_where got a tensor and a dict of parts, expected observations of one form.")
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)  # same form, checked above
        return torch.where(mask.view(-1, *(1,) * (a.dim() - 1)), a, b)
    assert not isinstance(b, torch.Tensor)  # same form, checked above
    return {k: torch.where(mask.view(-1, *(1,) * (v.dim() - 1)), v, b[k]) for k, v in a.items()}


def obs_equal(a: Obs, b: Obs) -> bool:
    """Same form, same parts, and every part ``torch.equal`` (shapes, values; a host sync)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a.keys() == b.keys() and all(torch.equal(v, b[k]) for k, v in a.items())


def obs_isfinite(obs: Obs) -> torch.Tensor:
    """``[N]`` bool: True where every element of the row's floating-point parts is finite.

    Integer parts (images, token ids) cannot hold NaN or inf and are not looked at.
    """
    n = obs_batch_size(obs)
    parts = [obs] if isinstance(obs, torch.Tensor) else list(obs.values())
    ok = None
    for v in parts:
        if not v.is_floating_point():
            continue
        row_ok = torch.isfinite(v.reshape(n, -1)).all(1)  # [N]
        ok = row_ok if ok is None else ok & row_ok
    if ok is None:
        device = parts[0].device if parts else "cpu"
        return torch.ones(n, dtype=torch.bool, device=device)  # [N]
    return ok
