"""Env ids -> BatchedEnv or EnvSpec: ``make_env``, ``spec_of`` and ``list_envs``.

An id is ``<prefix>:<name>`` or a bare name:

==================  =====================================================  ==========================
id                  backend                                                example
==================  =====================================================  ==========================
``torch:<Name>``    torch-native simulators (``ctrl_rl.envs.torch_envs``)  ``torch:Pendulum``
``envpool:<task>``  envpool (C++ thread pool), incl. its dm_control tasks  ``envpool:HalfCheetah-v5``
``gym:<id>``        gymnasium vector env (also ``gymnasium:<id>``)         ``gym:Pendulum-v1``
``dmc:<dom>-<t>``   dm_control suite, run directly                         ``dmc:cheetah-run``
``manip:<Task>``    Franka tabletop tasks (MuJoCo, envs/manipulation)      ``manip:Lift,cameras=all``
``<id>``            envpool if it has the task, else gymnasium             ``HalfCheetah-v5``
==================  =====================================================  ==========================

An id may end in constructor options, ``,key=value`` each (``torch:PointMassPixels,image_size=32,proprio=false``):
values are read as int, float, ``true``/``false``, ``none`` or else a string, and passed to the backend's
constructor like ``make_env``'s keyword arguments. This lets a run (``--env``, a preset, a saved config)
carry env settings in its one ``env`` string; the characters need no quoting in a shell.

The backends are registered objects (``envs/backends.py``, which also says how to add an environment); this module
parses ids and dispatches to them. ``spec_of(id)`` gives the ``EnvSpec`` an env of that id would have without
building it where the backend can (torch-native and manipulation envs: from code and config; envpool: from its
metadata; gymnasium and dm_control: from one plain env, read and closed), cached per id: code that only needs
shapes, bounds or robot metadata (a run's setup, dataset checks, the export) calls it, not ``make_env``.

The simulators are imported only when an env of theirs is made (or an id of theirs is checked), so
``import ctrl_rl`` stays fast. Every wrong id, prefix, option or ``num_envs`` raises ``UserInputError`` with
one sentence naming the input and what was expected.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import numbers
from collections.abc import Iterator
from typing import Any

import torch

from ctrl_rl.envs.backends import BACKENDS, Backend, unknown_env
from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec
from ctrl_rl.errors import UserInputError, did_you_mean


def list_envs(backend: str | None = None) -> list[str]:
    """Representative env ids, grouped by backend (torch, envpool, gymnasium, dmc, manip), all prefixed.

    Args:
        backend: only this backend's ids ("torch", "envpool", "gymnasium", "dmc", "manip"); None for all.
    """
    if backend is not None and backend not in BACKENDS:
        raise UserInputError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}.")
    return [b.env_id(name) for b in BACKENDS.values() if backend in (None, b.name) for name in b.list_ids()]


def describe_env(env_id: str) -> str:
    """The label ``ctrl-rl list envs`` prints beside an id (``envpool:Go1JoystickFlatTerrain-v1``: its family, robot,
    observation parts and control rate), or ``""`` for an id whose backend gives none."""
    base, _ = split_env_options(env_id)
    chosen, name = _backend_of(base, "auto")
    return chosen.describe(name) if chosen.describe is not None else ""


def make_env(
    env_id: str,
    num_envs: int = 1,
    device: str | torch.device = "cpu",
    seed: int = 0,
    backend: str = "auto",
    **kwargs: Any,
) -> BatchedEnv:
    """Build a BatchedEnv of ``num_envs`` envs from an id (see the module docstring for the id forms).

    Args:
        env_id: ``torch:Pendulum``, ``envpool:HalfCheetah-v5``, ``gym:Pendulum-v1``, ``dmc:cheetah-run``
            or a bare id such as ``HalfCheetah-v5``.
        num_envs: N >= 1.
        device: where the env's tensors live.
        seed: base seed of the envs.
        backend: "auto" (from the prefix, or envpool-then-gymnasium for a bare id) or one of
            "torch", "envpool", "gymnasium", "dmc", "manip" to choose the backend of a bare id.
        **kwargs: passed to the backend's constructor (e.g. ``max_episode_steps``, envpool's
            ``num_threads``, gymnasium's ``vector_mode``), next to the id's own ``,key=value`` options.
    """
    full_id, env_id, options = _parse(env_id, kwargs)
    if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
        raise UserInputError(f"num_envs={num_envs!r} for env {env_id!r}: expected an integer >= 1.")
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise UserInputError(f"device {device!r} for env {env_id!r}: expected a torch device such as 'cpu' or "
                             "'cuda'.") from e
    chosen, name = _backend_of(env_id, backend)
    _require(chosen, env_id)
    with _option_errors(full_id, options):
        return chosen.make(name, int(num_envs), device, seed, **kwargs, **options)


def spec_of(env_id: str, backend: str = "auto", **kwargs: Any) -> EnvSpec:
    """The ``EnvSpec`` of an id, equal to ``make_env(env_id, ..., **kwargs).spec``, without building the env where
    the backend knows it statically (module docstring); specs of ids without ``kwargs`` are cached.

    Args:
        env_id: as for ``make_env``, options included (``manip:Lift,cameras=all``).
        backend: as for ``make_env``.
        **kwargs: the constructor options ``make_env`` would get (``max_episode_steps``, ...).
    """
    if kwargs:
        return _spec_of(env_id, backend, **kwargs)
    return _cached_spec(env_id, backend)


@functools.lru_cache(maxsize=256)
def _cached_spec(env_id: str, backend: str) -> EnvSpec:
    return _spec_of(env_id, backend)


def _spec_of(env_id: str, backend: str, **kwargs: Any) -> EnvSpec:
    full_id, env_id, options = _parse(env_id, kwargs)
    chosen, name = _backend_of(env_id, backend)
    if not chosen.static_spec:
        _require(chosen, env_id)
    with _option_errors(full_id, options):
        return chosen.spec_of(name, **kwargs, **options)


def has_simulator(env_id: str) -> bool:
    """Whether ``env_id`` can be built and stepped (False for a spec-only backend: ``robot:``, a real robot)."""
    return _backend_of(split_env_options(env_id)[0], "auto")[0].simulator


def resolve_backend(env_id: str) -> str:
    """The backend ("torch", "envpool", "gymnasium", "dmc", "manip") an id would be built with, without building it."""
    return _backend_of(split_env_options(env_id)[0], "auto")[0].name


def split_env_options(env_id: str) -> tuple[str, dict[str, Any]]:
    """``(id, options)`` of an id with ``,key=value`` options (module docstring); ``(env_id, {})`` without any.

    ``"torch:PointMassPixels,image_size=32,proprio=false"`` -> ``("torch:PointMassPixels", {"image_size": 32,
    "proprio": False})``.
    """
    base, *items = env_id.split(",")
    options: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier() or key in options:
            raise UserInputError(f"env id {env_id!r} has the option {item!r}: expected distinct ',key=value' options "
                                 "after the id, e.g. 'torch:PointMassPixels,image_size=32'.")
        options[key] = _option_value(text.strip())
    return base, options


def _option_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ---- id lookup (lazy imports) ----------------------------------------------------------------------


def _parse(env_id: Any, kwargs: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(full id, id without options, options)``; an option also given as a keyword argument is refused."""
    if not isinstance(env_id, str) or not env_id:
        raise UserInputError(f"env id {env_id!r}: expected a non-empty string such as 'torch:Pendulum'.")
    base, options = split_env_options(env_id)
    clash = sorted(set(options) & set(kwargs))
    if clash:
        raise UserInputError(f"env id {env_id!r} sets {clash[0]!r}, which is also passed as a keyword argument: "
                             "expected it in one place.")
    return env_id, base, options


def _backend_of(env_id: str, backend: str = "auto") -> tuple[Backend, str]:
    """``(backend, name after the prefix)`` of an id without options; ``backend`` chooses it for a bare id."""
    if backend != "auto" and backend not in BACKENDS:
        raise UserInputError(f"backend={backend!r} for env {env_id!r}: expected 'auto' or one of "
                             f"{', '.join(BACKENDS)}.")
    prefix, sep, name = env_id.partition(":")
    if not sep:
        return (BACKENDS[backend] if backend != "auto" else _auto_backend(env_id)), env_id
    by_prefix = {p: b for b in BACKENDS.values() for p in b.prefixes}
    if prefix not in by_prefix:
        hint = did_you_mean(prefix + ":", [p + ":" for p in by_prefix], n=3)
        raise UserInputError(f"unknown backend prefix {prefix!r} in env id {env_id!r}: expected one of "
                             f"{', '.join(repr(b.prefix + ':') for b in BACKENDS.values())}{hint}.")
    chosen = by_prefix[prefix]
    if backend not in ("auto", chosen.name):
        raise UserInputError(f"env id {env_id!r} names the {chosen.name} backend but backend={backend!r} was "
                             "asked for.")
    return chosen, name


def _auto_backend(env_id: str) -> Backend:
    """Backend of a bare id: the first backend taking bare ids that knows it (envpool, then gymnasium)."""
    bare = [b for b in BACKENDS.values() if b.bare_ids]
    for b in bare:
        if env_id in b.known():
            return b
    raise unknown_env(env_id, [n for b in bare for n in b.known()] + list_envs())


def _require(backend: Backend, env_id: str) -> None:
    """A missing simulator package is a setup problem the user can fix: say which one."""
    module = backend.requires
    if module is not None and importlib.util.find_spec(module) is None:
        raise UserInputError(f"env id {env_id!r} needs the {module} package: expected it installed "
                             f"({backend.install or 'pip install ' + module}).")


@contextlib.contextmanager
def _option_errors(full_id: str, options: dict[str, Any]) -> Iterator[None]:
    """Turns a constructor's ``TypeError`` / ``ValueError`` into one sentence naming the id when the id carried
    ``,key=value`` options (the user's input); without them it is the caller's bug and passes unchanged."""
    try:
        yield
    except UserInputError:
        raise
    except (TypeError, ValueError) as e:
        if not options:
            raise
        raise UserInputError(f"env id {full_id!r}: {e}") from None
