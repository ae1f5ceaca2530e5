"""Checks every algorithm config runs in its ``__post_init__``, so no config accepts NaN or a negative rate.

``check_fields(config)`` looks at the declared type of each field:

- every float field holds a finite number (NaN or inf would silently disable a clip or poison a loss);
- every field whose name ends in ``lr`` (learning rates) is positive;
- every tuple-of-int field (layer widths) holds positive integers.

It raises ``ValueError`` naming the field and what was expected; the config loaders turn that into the
CLI's one-sentence error.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def _is_float_type(tp: object) -> bool:
    if tp is float:
        return True
    return typing.get_origin(tp) in (typing.Union, __import__("types").UnionType) and float in typing.get_args(tp)


def check_fields(config: DataclassInstance) -> None:
    """Raise ValueError for a non-finite float, a non-positive learning rate or a non-positive layer width."""
    hints = typing.get_type_hints(type(config))
    name = type(config).__name__
    for f in dataclasses.fields(config):
        v: object = getattr(config, f.name)
        tp = hints.get(f.name)
        if v is None or isinstance(v, bool):
            continue
        if _is_float_type(tp) and isinstance(v, (int, float)):
            if not math.isfinite(v):
                raise ValueError(f"{name}.{f.name} is {v!r}: expected a finite number")
            if f.name.endswith("lr") and v <= 0:
                raise ValueError(f"{name}.{f.name} is {v!r}: expected a positive learning rate")
        if typing.get_origin(tp) is tuple and typing.get_args(tp)[:1] == (int,) and isinstance(v, tuple):
            if any(not isinstance(w, int) or w < 1 for w in cast("tuple[object, ...]", v)):  # items of any type
                raise ValueError(f"{name}.{f.name} is {v!r}: expected positive layer widths")
