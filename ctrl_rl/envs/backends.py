"""Simulator backends as registered objects: each says how to build an env, how to get its spec without one where
it can, which ids it shows, and which optional package it needs.

A ``Backend`` is a frozen record of functions; ``register`` adds one under its name, and the registry
(``envs/registry.py``: ``make_env``, ``spec_of``, ``list_envs``) reads ``BACKENDS`` only: it holds no backend name,
prefix or id table of its own. The eight built in, in the order ``ctrl-rl list envs`` shows them:

=========  =====================  =================================================================================
backend    prefixes               ``spec_of`` (the spec without ``make``)
=========  =====================  =================================================================================
torch      ``torch:``             static: the simulator class's attributes (``TorchEnv.static_spec``)
envpool    ``envpool:``           envpool's own metadata (``envpool.make_spec``: config and spaces), no simulator
gymnasium  ``gym:``/``gymnasium:``  one unvectorized ``gymnasium.make`` env, read and closed (gymnasium's registry
                                  entry has the time limit but not the spaces or ``dt``)
dmc        ``dmc:``               one ``suite.load`` task, read and closed (dm_control has no lighter metadata)
warp       ``warp:``              the task's MJCF compiled by MuJoCo and its config (``envs/warp.py``), no Warp device;
                                  Reach and Lift (``envs/warp_manip.py``): static, as ``manip:``
minatar    ``minatar:``           static: the game's channels and action set (``envs/minatar.py``), no package
manip      ``manip:``             static: the task's config and the robot spec (``envs/manipulation/env.py``)
robot      ``robot:``             static: a real robot's spec, no simulator (``envs/robot.py``; ``make`` refuses)
=========  =====================  =================================================================================

Adding an environment:

- a torch-native simulator: a ``TorchEnv`` subclass (``torch_envs/base.py``: its class attributes are its spec;
  a simulator with options that change the spec overrides ``static_spec``) added to ``torch_envs.TORCH_ENVS``;
  it is then ``torch:<Name>``, with nothing to change here;
- a manipulation task: ``manipulation/tasks.py`` (its spec follows from the task and the robot spec);
- another simulator: an adapter module next to ``envpool.py`` / ``gymnasium.py`` / ``dmc.py`` (a class
  satisfying ``BatchedEnv``, NumPy confined to its step and reset, and a function giving the ``EnvSpec`` of an id
  and its options, the very spec the class sets, read from the library's metadata where it has some) and one
  ``register(Backend(...))`` call below, whose functions import the simulator only when they run
  (``import ctrl_rl.envs.registry`` stays light; tested);
- then ``tests/envs``: ``check_env`` on it, and an id of it in ``test_registry.CASES`` (``spec_of(id)`` equals the
  built env's spec).

Every function raises ``UserInputError`` for an unknown name, in one sentence naming the id (``unknown_env``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch

from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec
from ctrl_rl.errors import UserInputError, did_you_mean


@dataclass(frozen=True)
class Backend:
    """One simulator backend (see the module docstring).

    Attributes:
        name: ``EnvSpec.backend`` of its envs and the ``backend=`` argument of ``make_env``.
        prefixes: id prefixes that choose it (``torch`` for ``torch:Pendulum``); the first is the one its
            ``EnvSpec.env_id`` and ``list_envs`` use.
        make: ``make(name, num_envs, device, seed, **options) -> BatchedEnv``; ``name`` is the id after the
            prefix, ``options`` the id's ``,key=value`` options and ``make_env``'s keyword arguments.
        spec_of: ``spec_of(name, **options) -> EnvSpec``, equal to ``make(name, ...).spec``.
        list_ids: the representative names ``ctrl-rl list envs`` shows (without the prefix).
        known: every name it takes, for routing a bare id (with ``bare_ids``) and for did-you-mean hints.
        requires: the module it needs (``None``: none beyond ctrl_rl's own); ``install`` says how to get it.
        static_spec: True when ``spec_of`` reads code and config only (no simulator, no ``requires`` package).
        bare_ids: whether an id without a prefix may resolve to it (envpool first, then gymnasium).
        simulator: False for a backend that gives specs only (``robot:``, a real robot's spec for training on
            its data): its ``make`` refuses, and the loops do not evaluate in it (``registry.has_simulator``).
        describe: ``describe(name) -> str``, a short label ``ctrl-rl list envs`` prints beside a listed id (the
            family, robot and observation parts of envpool's MuJoCo Playground tasks); None: no labels.
    """

    name: str
    prefixes: tuple[str, ...]
    make: Callable[..., BatchedEnv]
    spec_of: Callable[..., EnvSpec]
    list_ids: Callable[[], Collection[str]]
    known: Callable[[], Collection[str]]
    requires: str | None = None
    install: str | None = None
    static_spec: bool = False
    bare_ids: bool = False
    simulator: bool = True
    describe: Callable[[str], str] | None = None

    @property
    def prefix(self) -> str:
        return self.prefixes[0]

    def env_id(self, name: str) -> str:
        """The prefixed id of ``name`` (``torch:Pendulum``)."""
        return f"{self.prefix}:{name}"


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Add ``backend``; a name or prefix another backend has is refused."""
    taken = {p for b in BACKENDS.values() for p in b.prefixes}
    if backend.name in BACKENDS or taken & set(backend.prefixes):
        raise ValueError(f"backend {backend.name!r} (prefixes {backend.prefixes}) clashes with a registered one.")
    BACKENDS[backend.name] = backend
    return backend


def prefix_of(backend_name: str) -> str | None:
    """The id prefix of a registered backend (``gymnasium`` -> ``gym``), or None for another name."""
    backend = BACKENDS.get(backend_name)
    return backend.prefix if backend is not None else None


def unknown_env(env_id: str, candidates: Collection[str], expected: str | None = None) -> UserInputError:
    """The one-sentence error for an id no backend has, with the closest ``candidates`` as a hint."""
    expected = expected or "one of the ids from `ctrl-rl list envs` or any envpool task / gymnasium id"
    return UserInputError(f"unknown env id {env_id!r}: expected {expected}{did_you_mean(env_id, candidates, n=3)}.")


# ---- torch-native simulators (envs/torch_envs) ---------------------------------------------------------------------


def _torch_classes() -> dict[str, Any]:
    from ctrl_rl.envs.torch_envs import TORCH_ENVS, TORCH_PIXEL_ENVS

    return {**TORCH_ENVS, **TORCH_PIXEL_ENVS}


def _torch_class(name: str, options: dict[str, Any]) -> Any:
    """The simulator class of ``torch:<name>``, after checking that it takes every option."""
    classes = _torch_classes()
    if name not in classes:
        raise unknown_env(f"torch:{name}", [f"torch:{n}" for n in classes])
    accepted = [p for p in inspect.signature(classes[name]).parameters if p not in ("num_envs", "device", "seed")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        hint = did_you_mean(unknown[0], accepted)
        raise UserInputError(f"torch:{name} has no option {unknown[0]!r}{hint}: expected one of {accepted}.")
    return classes[name]


def _torch_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    return _torch_class(name, options)(num_envs, device=device, seed=seed, **options)


def _torch_spec(name: str, **options: Any) -> EnvSpec:
    cls = _torch_class(name, options)
    takes = inspect.signature(cls.static_spec).parameters  # options such as dtype leave the spec as it is
    return cls.static_spec(**{k: v for k, v in options.items() if k in takes})


def _torch_names() -> tuple[str, ...]:
    try:
        return tuple(_torch_classes())
    except ImportError:  # listing works without them; make_env("torch:...") still raises
        return ()


register(Backend("torch", ("torch",), _torch_make, _torch_spec, _torch_names, _torch_names, static_spec=True))


# ---- envpool (envs/envpool.py) -------------------------------------------------------------------------------------

# A representative selection for `ctrl-rl list envs` (every envpool task works; these are the control ones people
# start from); the MuJoCo Playground tasks follow it, each with a label (``_envpool_describe``).
_ENVPOOL_LISTED = (
    "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "HumanoidStandup-v5",
    "Swimmer-v5", "Reacher-v5", "Pusher-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5",
    "Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0", "Acrobot-v1",
    "CheetahRun-v1", "WalkerWalk-v1", "WalkerRun-v1", "HopperHop-v1", "HumanoidRun-v1", "QuadrupedRun-v1",
    "CartpoleSwingup-v1", "ReacherEasy-v1", "FingerSpin-v1", "BallInCupCatch-v1", "AcrobotSwingup-v1",
)  # fmt: skip


def _envpool_listed() -> tuple[str, ...]:
    """The representative selection, then every MuJoCo Playground task the installed envpool ships."""
    try:
        from ctrl_rl.envs.envpool import playground_tasks

        playground = playground_tasks()
    except ImportError:  # listing works without envpool
        playground = ()
    return _ENVPOOL_LISTED + playground


def _envpool_describe(name: str) -> str:
    """The label of a Playground task: family, robot and observation parts (privileged ones marked); else ``""``."""
    from ctrl_rl.envs.envpool import envpool_spec, playground_label, playground_tasks

    if name not in playground_tasks():
        return ""
    spec = envpool_spec(name)
    parts = ", ".join(f"{p.name}[{p.numel}]" + (" (privileged)" if p.name in spec.privileged_parts else "")
                      for p in spec.parts)
    return f"{playground_label(name)}; {parts}; {spec.action_dim} actions at {1 / spec.dt:g} Hz"


def _envpool_tasks() -> set[str]:
    try:
        import envpool
    except ImportError:
        return set()
    return set(envpool.list_all_envs())


def _envpool_check(name: str) -> None:
    tasks = _envpool_tasks()
    if name not in tasks:
        raise unknown_env(f"envpool:{name}", [f"envpool:{t}" for t in tasks])


def _envpool_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    _envpool_check(name)
    from ctrl_rl.envs.envpool import EnvpoolEnv

    return EnvpoolEnv(name, num_envs=num_envs, device=device, seed=seed, **options)


def _envpool_spec(name: str, **options: Any) -> EnvSpec:
    _envpool_check(name)
    from ctrl_rl.envs.envpool import envpool_spec

    return envpool_spec(name, **options)


register(Backend("envpool", ("envpool",), _envpool_make, _envpool_spec, _envpool_listed, _envpool_tasks,
                 requires="envpool", install="pip install envpool", bare_ids=True, describe=_envpool_describe))


# ---- gymnasium (envs/gymnasium.py) ---------------------------------------------------------------------------------

_GYM_LISTED = (
    "Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0", "Acrobot-v1",
    "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Swimmer-v5", "Reacher-v5",
    "Pusher-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5",
)  # fmt: skip


def _gym_ids() -> set[str]:
    try:
        import gymnasium
    except ImportError:
        return set()
    return set(gymnasium.registry)


def _gym_check(name: str) -> None:
    ids = _gym_ids()
    if ":" not in name and name not in ids:  # "module:Env-v0" ids register on import: let gymnasium try
        raise unknown_env(f"gym:{name}", [f"gym:{i}" for i in ids])


def _gym_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    _gym_check(name)
    from ctrl_rl.envs.gymnasium import GymnasiumEnv

    return GymnasiumEnv(name, num_envs=num_envs, device=device, seed=seed, **options)


def _gym_spec(name: str, **options: Any) -> EnvSpec:
    _gym_check(name)
    from ctrl_rl.envs.gymnasium import gym_spec

    return gym_spec(name, **options)


register(Backend("gymnasium", ("gym", "gymnasium"), _gym_make, _gym_spec, lambda: _GYM_LISTED, _gym_ids,
                 requires="gymnasium", install="pip install gymnasium", bare_ids=True))


# ---- dm_control (envs/dmc.py) --------------------------------------------------------------------------------------

_DMC_LISTED = (
    "cheetah-run", "walker-stand", "walker-walk", "walker-run", "hopper-stand", "hopper-hop",
    "humanoid-stand", "humanoid-walk", "humanoid-run", "quadruped-walk", "quadruped-run",
    "cartpole-balance", "cartpole-swingup", "reacher-easy", "reacher-hard", "finger-spin",
    "finger-turn_easy", "ball_in_cup-catch", "acrobot-swingup", "pendulum-swingup", "point_mass-easy",
    "fish-swim", "swimmer-swimmer6", "manipulator-bring_ball",
)  # fmt: skip


def _dmc_tasks() -> set[str]:
    try:
        with warnings.catch_warnings():
            # dm_control probes GLFW for rendering on import; without a display that only warns
            warnings.filterwarnings("ignore", message=".*DISPLAY environment variable.*")
            from dm_control import suite
    except ImportError:
        return set()
    return {f"{d}-{t}" for d, t in suite.ALL_TASKS}


def _dmc_split(name: str) -> tuple[str, str]:
    """``(domain, task)`` of ``cheetah-run``; a name that is no suite task raises."""
    tasks = _dmc_tasks()
    if name not in tasks:
        raise unknown_env(f"dmc:{name}", [f"dmc:{t}" for t in tasks],
                          expected="'dmc:<domain>-<task>' such as 'dmc:cheetah-run'")
    domain, _, task = name.partition("-")
    return domain, task


def _dmc_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    domain, task = _dmc_split(name)
    from ctrl_rl.envs.dmc import DMCEnv

    return DMCEnv(domain, task, num_envs=num_envs, device=device, seed=seed, **options)


def _dmc_spec(name: str, **options: Any) -> EnvSpec:
    domain, task = _dmc_split(name)
    from ctrl_rl.envs.dmc import dmc_spec

    return dmc_spec(domain, task, **options)


register(Backend("dmc", ("dmc",), _dmc_make, _dmc_spec, lambda: _DMC_LISTED, _dmc_tasks,
                 requires="dm_control", install="pip install dm_control"))


# ---- MuJoCo Warp (envs/warp.py; the manipulation tasks in envs/warp_manip.py) -------------------------------------


def _warp_tasks() -> tuple[str, ...]:
    from ctrl_rl.envs.warp_manip import TASKS as MANIP_TASKS
    from ctrl_rl.envs.warp_tasks import TASKS

    return tuple(TASKS) + MANIP_TASKS


def _warp_check(name: str) -> None:
    if name not in _warp_tasks():
        raise unknown_env(f"warp:{name}", [f"warp:{t}" for t in _warp_tasks()],
                          expected=f"one of {', '.join('warp:' + t for t in _warp_tasks())}")


def _warp_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    _warp_check(name)
    from ctrl_rl.envs.warp_manip import TASKS as MANIP_TASKS

    if name in MANIP_TASKS:
        from ctrl_rl.envs.warp_manip import WarpManipEnv

        return WarpManipEnv(name, num_envs=num_envs, device=device, seed=seed, **options)
    from ctrl_rl.envs.warp import WarpEnv

    return WarpEnv(name, num_envs=num_envs, device=device, seed=seed, **options)


def _warp_spec(name: str, **options: Any) -> EnvSpec:
    _warp_check(name)
    from ctrl_rl.envs.warp_manip import TASKS as MANIP_TASKS

    if name in MANIP_TASKS:
        from ctrl_rl.envs.warp_manip import warp_manip_spec

        return warp_manip_spec(name, **options)
    from ctrl_rl.envs.warp import warp_spec

    return warp_spec(name, **options)


register(Backend("warp", ("warp",), _warp_make, _warp_spec, _warp_tasks, _warp_tasks,
                 requires="mujoco_warp", install="pip install 'ctrl-rl[warp]'"))


# ---- MinAtar (envs/minatar.py) -------------------------------------------------------------------------------------


def _minatar_games() -> tuple[str, ...]:
    from ctrl_rl.envs.minatar import GAMES

    return tuple(GAMES)


def _minatar_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    from ctrl_rl.envs.minatar import MinAtarEnv

    return MinAtarEnv(name, num_envs=num_envs, device=device, seed=seed, **options)  # unknown games: there


def _minatar_spec(name: str, **options: Any) -> EnvSpec:
    from ctrl_rl.envs.minatar import minatar_spec

    return minatar_spec(name, **options)


register(Backend("minatar", ("minatar",), _minatar_make, _minatar_spec, _minatar_games, _minatar_games,
                 requires="minatar", install="pip install minatar", static_spec=True))


# ---- Franka tabletop manipulation (envs/manipulation) --------------------------------------------------------------


def _manip_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    from ctrl_rl.envs.manipulation import make_manip

    return make_manip(name, num_envs=num_envs, device=device, seed=seed, **options)  # unknown tasks, options: there


def _manip_spec(name: str, **options: Any) -> EnvSpec:
    from ctrl_rl.envs.manipulation import manip_spec

    return manip_spec(name, **options)


def _manip_tasks() -> tuple[str, ...]:
    from ctrl_rl.envs.manipulation import TASKS

    return TASKS


register(Backend("manip", ("manip",), _manip_make, _manip_spec, _manip_tasks, _manip_tasks,
                 requires="mujoco", install="pip install mujoco", static_spec=True))


# ---- a real robot's spec without a simulator (envs/robot.py) --------------------------------------------------------


def _robot_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    from ctrl_rl.envs.robot import robot_make

    return robot_make(name, num_envs, device, seed, **options)


def _robot_spec(name: str, **options: Any) -> EnvSpec:
    from ctrl_rl.envs.robot import robot_spec_env

    return robot_spec_env(name, **options)


def _robot_names() -> tuple[str, ...]:
    from ctrl_rl.envs.robot import robot_names

    return robot_names()


register(Backend("robot", ("robot",), _robot_make, _robot_spec, _robot_names, _robot_names, static_spec=True,
                 simulator=False))
