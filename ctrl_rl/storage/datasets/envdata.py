"""Offline data opened for an env: loaded, checked against the env's observation and action sizes, its actions
mapped from the env's units to the agent's [-1, 1], clipped.

Datasets store actions in the env's own units (what the env's ``step`` took: Pendulum's torque in [-2, 2], a
robot's joint velocities in rad/s), while agents act in [-1, 1] and the training env's ``ActionRescale`` maps that
interval onto the env's bounds (``envs.wrappers``). ``to_agent_units`` is that map's inverse and the one place a
dataset's actions change units; every loop that trains on a dataset reads it through ``open_dataset``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.registry import spec_of
from ctrl_rl.envs.wrappers import action_affine
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.loader import is_lerobot, load_dataset
from ctrl_rl.storage.datasets.offline import OfflineDataset

BOUNDS_TOLERANCE = 1e-6
"""How far past [-1, 1] (in agent units) a mapped action may lie and still count as inside the bounds: float32
rounding of data recorded at the bounds."""

CLIP_FLAG = "--clip-dataset-actions"


def _fmt(values: tuple[float, ...]) -> str:
    return f"{values[0]:g}" if len(set(values)) == 1 else "[" + ", ".join(f"{v:g}" for v in values) + "]"


def unit_bounds(spec: EnvSpec) -> bool:
    """Whether ``spec``'s continuous actions are bounded by exactly -1 and 1 in every dimension (the MuJoCo
    locomotion tasks): there the env's units are the agent's."""
    A = spec.action_dim
    return not spec.discrete and spec.action_low == (-1.0,) * A and spec.action_high == (1.0,) * A


def to_agent_units(action: torch.Tensor, spec: EnvSpec, dataset: str, clip: bool) -> tuple[torch.Tensor, int]:
    """Dataset actions ``[S,A]`` in ``spec``'s units (the env's own spec, ``spec_of``: not the training env's
    rescaled one) mapped to the agent's [-1, 1]: ``a = 2 (a_env - low) / (high - low) - 1`` per dimension with
    finite bounds (``ActionRescale``'s inverse, written ``(a_env - bias) / scale``); dimensions with an infinite
    bound pass through. Returns ``(actions, rows clipped)``.

    Bounds of exactly +-1 everywhere (MuJoCo locomotion) give ``action`` itself, so those runs stay bit-identical;
    a discrete action space is left alone. A row with a dimension past the bounds (by more than
    ``BOUNDS_TOLERANCE`` in agent units) is refused in one sentence naming ``dataset``, the rows and the largest
    excess in env units, or, with ``clip``, clipped to the bounds and counted.
    """
    if spec.discrete or not action.is_floating_point():
        return action, 0
    assert action.ndim == 2 and action.shape[1] == spec.action_dim, \
        f"expected dataset actions [S,{spec.action_dim}], got {tuple(action.shape)}"
    finite, half, mid = action_affine(spec, torch.float64)  # [A] each: ActionRescale's map, inverted below
    agent = action if unit_bounds(spec) else ((action.double() - mid) / half).to(action.dtype)  # [S,A]
    bad = (agent.abs() > 1 + BOUNDS_TOLERANCE) & finite  # [S,A]
    rows = int(bad.any(1).sum())
    if rows == 0:
        return agent, 0
    excess = float(((agent.double().abs() - 1) * half)[bad].max())  # env units
    where = f"the bounds of env {spec.env_id!r} (low {_fmt(spec.action_low)}, high {_fmt(spec.action_high)})"
    if not clip:
        raise UserInputError(f"dataset {dataset} has {rows} of {action.shape[0]} actions outside {where}, by up to "
                             f"{excess:.6g} in env units: expected actions in the env's units inside its bounds, or "
                             f"pass {CLIP_FLAG} to clip them to the bounds")
    if agent is action:
        agent = action.clone()
    agent = torch.where(finite, agent.clamp(-1.0, 1.0), agent)  # [S,A]
    print(f"clipped {rows} of {action.shape[0]} dataset actions to the env's bounds ({CLIP_FLAG}; by up to "
          f"{excess:.6g} in env units): dataset {dataset}, {where}", flush=True)
    return agent, rows


def open_dataset(dataset: str, env_id: str, action_clip: float | None, clip_to_bounds: bool = False,
                 view: Literal["qlearning", "trajectory"] = "qlearning") -> OfflineDataset:
    """``--dataset`` for training in ``env_id``: checked against the env's sizes, its actions in the agent's units
    (``to_agent_units`` with the env's own bounds; ``clip_to_bounds``: ``--clip-dataset-actions``), then clipped to
    +-``action_clip`` (the loop's ``--clip-actions``, inside tanh's open range). ``view="qlearning"``: a file
    through the ``qlearning`` view (exactly ``d4rl.qlearning_dataset``), a Minari or LeRobot dataset through its
    episodes; ``"trajectory"``: whole episodes of any source. A LeRobot dataset's action feature is the one that
    holds the env's robot action space (``lerobot_action_key``)."""
    spec = spec_of(env_id)
    source_view = None if view == "qlearning" and not Path(dataset).is_file() else view  # Minari/LeRobot: episodes
    key = lerobot_action_key(dataset, spec) if is_lerobot(dataset) else None
    ds = load_dataset(dataset, view=source_view, obs_dim=spec.obs_dim, action_dim=spec.action_dim, action_key=key)
    ds.action, clipped = to_agent_units(ds.action, spec, dataset, clip_to_bounds)
    ds.metadata["action_units"] = "agent"
    ds.metadata["actions_clipped"] = clipped
    if action_clip is not None:
        ds.action.clamp_(-action_clip, action_clip)
    return ds


def lerobot_action_key(dataset: str, spec: EnvSpec) -> str:
    """The action feature(s) of the LeRobot dataset ``dataset`` that hold ``spec``'s actions, joined by +
    (``storage.datasets.lerobot.robot.action_keys``: ``action.cartesian_velocity+action.gripper_velocity`` for
    DROID's cartesian velocity, ``action`` outside DROID's vocabulary)."""
    from ctrl_rl.storage.datasets.lerobot import read_lerobot
    from ctrl_rl.storage.datasets.lerobot.robot import action_keys

    data = read_lerobot(dataset)
    return "+".join(action_keys(data.features, spec.action_space_name or "", spec.action_dim,
                                f"LeRobot dataset {data.root}")[0])


def robot_env_id(env_id: str, dataset: str, state_key: str = "observation.state", cameras: str | None = None,
                 image_size: str | None = None, language: bool = False) -> str:
    """A ``robot:<name>`` id (a real robot without a simulator, ``envs/robot.py``) completed from the LeRobot
    dataset it trains on: ``state=`` the width of ``state_key`` (keys joined by +), and for a VLA the ``cameras``
    (names or the manipulation tasks' aliases joined by +, each a video of the dataset, ``all``: every video; a
    DROID port name is written as the env's camera name, ``exterior_1_left`` -> ``exterior_image_1_left``), the
    ``image_size`` and ``language=true``. Any other id, or one that already has ``state=``, is returned as it is."""
    from ctrl_rl.envs.registry import has_simulator, split_env_options

    base, options = split_env_options(env_id)
    if has_simulator(env_id) or "state" in options:
        return env_id
    from ctrl_rl.envs.manipulation.config import CAMERA_ALIASES
    from ctrl_rl.robots.spec import DROID_CAMERA_NAMES
    from ctrl_rl.storage.datasets.lerobot import read_lerobot
    from ctrl_rl.storage.datasets.lerobot.robot import numeric_widths

    data = read_lerobot(dataset)
    source = f"LeRobot dataset {data.root}"
    widths = numeric_widths(data.features)
    keys = state_key.split("+")
    missing = [k for k in keys if k not in widths]
    if missing:
        raise UserInputError(f"{source} has no numeric feature {missing[0]!r} for the robot's state: expected "
                             "observation.state or --state-key naming the dataset's keys joined by +")
    extra: dict[str, str] = {"state": str(sum(widths[k] for k in keys))}
    if cameras is not None:
        videos = [k.removeprefix("observation.images.") for k in data.video_keys]
        port_to_env = {v: k for k, v in DROID_CAMERA_NAMES.items()}
        names = videos if cameras == "all" else [CAMERA_ALIASES.get(c, c) for c in cameras.split("+") if c]
        chosen = []
        for name in names:
            port = DROID_CAMERA_NAMES.get(name, name)
            if port not in videos:
                raise UserInputError(f"{source} has no camera {name!r} for --cameras: expected names or aliases of "
                                     f"its videos {videos or '(it has none)'}, or all")
            chosen.append(port_to_env.get(port, port))
        if not chosen:
            raise UserInputError(f"{source}: --cameras {cameras!r} chooses no camera: expected at least one of "
                                 f"{videos}")
        extra["cameras"] = "+".join(chosen)
        if image_size:
            extra["image_size"] = image_size
    if language:
        extra["language"] = "true"
    given = [f"{k}={v}" for k, v in options.items()]
    return ",".join([base, *given, *(f"{k}={v}" for k, v in extra.items() if k not in options)])


def robot_of_dataset(dataset: str, robot: str | None = None) -> str:
    """The env id of a run on the LeRobot dataset ``dataset`` without ``--env``: ``robot:<name>`` of ``robot``
    (``--robot``), else of the robot its ``robot_type`` names (``"Franka"`` -> ``franka_droid``,
    ``storage.datasets.lerobot.robot.robot_of``); one sentence when neither names a known robot."""
    from ctrl_rl.envs.robot import PREFIX
    from ctrl_rl.robots.spec import ROBOTS, get_robot
    from ctrl_rl.storage.datasets.lerobot import read_lerobot
    from ctrl_rl.storage.datasets.lerobot.robot import robot_of

    if robot is not None:
        get_robot(robot)  # an unknown name: one sentence listing the known ones
        return f"{PREFIX}:{robot}"
    data = read_lerobot(dataset)
    name = robot_of(data.robot_type)
    if name is None:
        raise UserInputError(f"LeRobot dataset {data.root} records robot_type {data.robot_type!r}, which names no "
                             f"robot known here, and neither --robot nor --env is given: expected --robot NAME (one "
                             f"of {sorted(ROBOTS)}) to train without a simulator, or --env ID to train and evaluate "
                             "in one")
    return f"{PREFIX}:{name}"
