"""Env ids -> BatchedEnv: ``make_env`` and ``list_envs``.

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

The simulators are imported only when an env of theirs is made (or an id of theirs is checked), so
``import ctrl_rl`` stays fast. Every wrong id, prefix or ``num_envs`` raises ``UserInputError`` with
one sentence naming the input and what was expected.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
from collections.abc import Iterable
from typing import Any

import torch

from ctrl_rl.envs.protocol import BatchedEnv
from ctrl_rl.errors import UserInputError

# prefix -> backend name (EnvSpec.backend)
PREFIXES = {"torch": "torch", "envpool": "envpool", "gym": "gymnasium", "gymnasium": "gymnasium", "dmc": "dmc",
            "manip": "manip"}
_BACKEND_PREFIX = {"torch": "torch", "envpool": "envpool", "gymnasium": "gym", "dmc": "dmc", "manip": "manip"}

# A representative selection per backend for `ctrl-rl list envs` (every envpool task, gymnasium id
# and dm_control suite task works; these are the control ones people start from).
_ENVPOOL_IDS = (
    "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "HumanoidStandup-v5",
    "Swimmer-v5", "Reacher-v5", "Pusher-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5",
    "Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0", "Acrobot-v1",
    "CheetahRun-v1", "WalkerWalk-v1", "WalkerRun-v1", "HopperHop-v1", "HumanoidRun-v1", "QuadrupedRun-v1",
    "CartpoleSwingup-v1", "ReacherEasy-v1", "FingerSpin-v1", "BallInCupCatch-v1", "AcrobotSwingup-v1",
)  # fmt: skip
_GYM_IDS = (
    "Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0", "Acrobot-v1",
    "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Swimmer-v5", "Reacher-v5",
    "Pusher-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5",
)  # fmt: skip
_DMC_IDS = (
    "cheetah-run", "walker-stand", "walker-walk", "walker-run", "hopper-stand", "hopper-hop",
    "humanoid-stand", "humanoid-walk", "humanoid-run", "quadruped-walk", "quadruped-run",
    "cartpole-balance", "cartpole-swingup", "reacher-easy", "reacher-hard", "finger-spin",
    "finger-turn_easy", "ball_in_cup-catch", "acrobot-swingup", "pendulum-swingup", "point_mass-easy",
    "fish-swim", "swimmer-swimmer6", "manipulator-bring_ball",
)  # fmt: skip
_MANIP_IDS = ("Reach", "Lift", "Push", "PickPlace", "OpenDrawer")  # envs/manipulation/tasks.py TASKS


def list_envs(backend: str | None = None) -> list[str]:
    """Representative env ids, grouped by backend (torch, envpool, gymnasium, dmc, manip), all prefixed.

    Args:
        backend: only this backend's ids ("torch", "envpool", "gymnasium", "dmc", "manip"); None for all.
    """
    if backend is not None and backend not in _BACKEND_PREFIX:
        raise UserInputError(f"unknown backend {backend!r}: expected one of {', '.join(_BACKEND_PREFIX)}.")
    try:
        torch_names = list(_torch_envs())
    except ImportError:  # the torch simulators are optional for listing; make_env("torch:...") still raises
        torch_names = []
    groups = {
        "torch": [f"torch:{name}" for name in torch_names],
        "envpool": [f"envpool:{t}" for t in _ENVPOOL_IDS],
        "gymnasium": [f"gym:{t}" for t in _GYM_IDS],
        "dmc": [f"dmc:{t}" for t in _DMC_IDS],
        "manip": [f"manip:{t}" for t in _MANIP_IDS],
    }
    return [i for b, ids in groups.items() if backend in (None, b) for i in ids]


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
            "torch", "envpool", "gymnasium", "dmc" to choose the backend of a bare id.
        **kwargs: passed to the backend's constructor (e.g. ``max_episode_steps``, envpool's
            ``num_threads``, gymnasium's ``vector_mode``), next to the id's own ``,key=value`` options.
    """
    if not isinstance(env_id, str) or not env_id:
        raise UserInputError(f"env id {env_id!r}: expected a non-empty string such as 'torch:Pendulum'.")
    full_id = env_id
    env_id, options = split_env_options(env_id)
    clash = sorted(set(options) & set(kwargs))
    if clash:
        raise UserInputError(f"env id {full_id!r} sets {clash[0]!r}, which is also passed as a keyword argument: "
                             "expected it in one place.")
    if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
        raise UserInputError(f"num_envs={num_envs!r} for env {env_id!r}: expected an integer >= 1.")
    num_envs = int(num_envs)
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise UserInputError(f"device {device!r} for env {env_id!r}: expected a torch device such as 'cpu' or 'cuda'.") from e
    if backend != "auto" and backend not in _BACKEND_PREFIX:
        raise UserInputError(f"backend={backend!r} for env {env_id!r}: expected 'auto' or one of {', '.join(_BACKEND_PREFIX)}.")

    prefix, sep, name = env_id.partition(":")
    if sep:
        if prefix not in PREFIXES:
            hint = _did_you_mean(prefix + ":", [p + ":" for p in PREFIXES])
            raise UserInputError(
                f"unknown backend prefix {prefix!r} in env id {env_id!r}: expected one of "
                f"{', '.join(repr(p + ':') for p in _BACKEND_PREFIX.values())}{hint}."
            )
        chosen = PREFIXES[prefix]
        if backend not in ("auto", chosen):
            raise UserInputError(f"env id {env_id!r} names the {chosen} backend but backend={backend!r} was asked for.")
    else:
        name = env_id
        chosen = backend if backend != "auto" else _auto_backend(env_id)

    kwargs = dict(kwargs, **options, device=device, seed=seed)
    _require({"envpool": "envpool", "gymnasium": "gymnasium", "dmc": "dm_control", "manip": "mujoco"}.get(chosen),
             env_id)
    if chosen == "torch":
        registry = _torch_envs()
        if name not in registry:
            raise _unknown(env_id, [f"torch:{n}" for n in registry])
        accepted = [p for p in inspect.signature(registry[name]).parameters if p not in ("num_envs", "device", "seed")]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise UserInputError(f"env id {full_id!r} has the option {unknown[0]!r}, which {env_id} does not take: "
                                 f"expected one of {accepted}.")
        try:
            return registry[name](num_envs, **kwargs)
        except (TypeError, ValueError) as e:
            if not options:
                raise
            raise UserInputError(f"env id {full_id!r}: {e}") from None
    if chosen == "manip":
        from ctrl_rl.envs.manipulation import make_manip

        return make_manip(name, num_envs=num_envs, **kwargs)  # unknown tasks and options: UserInputError there
    if chosen == "envpool":
        tasks = _envpool_tasks()
        if name not in tasks:
            raise _unknown(env_id, [f"envpool:{t}" for t in tasks])
        from ctrl_rl.envs.envpool import EnvpoolEnv

        return EnvpoolEnv(name, num_envs=num_envs, **kwargs)
    if chosen == "gymnasium":
        ids = _gymnasium_ids()
        if ":" not in name and name not in ids:  # "module:Env-v0" ids register on import: let gymnasium try
            raise _unknown(env_id, [f"gym:{i}" for i in ids])
        from ctrl_rl.envs.gymnasium import GymnasiumEnv

        return GymnasiumEnv(name, num_envs=num_envs, **kwargs)
    # dmc
    domain, dash, task = name.partition("-")
    tasks = _dmc_tasks()
    if not dash or (domain, task) not in tasks:
        raise _unknown(env_id, [f"dmc:{d}-{t}" for d, t in tasks], expected="'dmc:<domain>-<task>' such as 'dmc:cheetah-run'")
    from ctrl_rl.envs.dmc import DMCEnv

    return DMCEnv(domain, task, num_envs=num_envs, **kwargs)


def resolve_backend(env_id: str) -> str:
    """The backend ("torch", "envpool", "gymnasium", "dmc") an id would be built with, without building it."""
    env_id = split_env_options(env_id)[0]
    prefix, sep, _ = env_id.partition(":")
    if sep and prefix in PREFIXES:
        return PREFIXES[prefix]
    if sep:
        raise UserInputError(f"unknown backend prefix {prefix!r} in env id {env_id!r}: expected one of "
                             f"{', '.join(repr(p + ':') for p in _BACKEND_PREFIX.values())}.")
    return _auto_backend(env_id)


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


def _auto_backend(env_id: str) -> str:
    """Backend of a bare id: envpool when it has the task, else gymnasium; unknown ids raise."""
    if env_id in _envpool_tasks():
        return "envpool"
    if env_id in _gymnasium_ids():
        return "gymnasium"
    candidates = [*_envpool_tasks(), *_gymnasium_ids(), *list_envs()]
    raise _unknown(env_id, candidates)


def _require(module: str | None, env_id: str) -> None:
    """A missing simulator package is a setup problem the user can fix: say which one."""
    if module is None:
        return
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UserInputError(f"env id {env_id!r} needs the {module} package: expected it installed (pip install {module}).")


def _torch_envs() -> dict[str, Any]:
    from ctrl_rl.envs.torch_envs import TORCH_ENVS, TORCH_PIXEL_ENVS

    return {**TORCH_ENVS, **TORCH_PIXEL_ENVS}


def _envpool_tasks() -> set[str]:
    try:
        import envpool
    except ImportError:
        return set()
    return set(envpool.list_all_envs())


def _gymnasium_ids() -> set[str]:
    import gymnasium

    return set(gymnasium.registry)


def _dmc_tasks() -> set[tuple[str, str]]:
    import warnings

    try:
        with warnings.catch_warnings():
            # dm_control probes GLFW for rendering on import; without a display that only warns
            warnings.filterwarnings("ignore", message=".*DISPLAY environment variable.*")
            from dm_control import suite
    except ImportError:
        return set()
    return set(suite.ALL_TASKS)


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _unknown(env_id: str, candidates: Iterable[str], expected: str | None = None) -> UserInputError:
    expected = expected or "one of the ids from `ctrl-rl list envs` or any envpool task / gymnasium id"
    return UserInputError(f"unknown env id {env_id!r}: expected {expected}{_did_you_mean(env_id, candidates)}.")
