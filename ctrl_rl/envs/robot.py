"""``robot:<name>``: the spec of a real robot without a simulator, for training on data recorded on it.

A run on real-robot data (``ctrl-rl train vla_bc --dataset DIR`` without ``--env``) still builds its policy for an
``EnvSpec``: observation parts, action bounds and units, the control rate and the robot. This backend gives that
spec from the robot spec (``robots.spec.ROBOTS``) and a few options, and nothing else: ``make`` refuses in one
sentence, and the loops evaluate only in an env that has a simulator (``registry.has_simulator``). The resolved
id is saved with the run, so evaluation, export and ``--init`` rebuild the same spec without the dataset.

Options (``robot:franka_droid,state=8,cameras=exterior_image_1_left,image_size=48x64,language=true``):

- ``action``: which of the robot's action spaces the actions are (default: the robot's ``default_action``); the
  action bounds, units and dimension are that space's;
- ``state``: the width of the float32 ``state`` part (default: one value per joint), the dataset's proprioception
  (DROID: 7 joint positions + gripper = 8); its first ``num_joints`` columns are the joint positions when
  ``joint_state=true`` (the default, as DROID's ``observation.state``);
- ``cameras``: camera names joined by ``+`` (default none): one uint8 ``image/<camera>`` part ``[3,H,W]`` each;
- ``image_size``: ``HxW`` of the camera parts (default 48x64);
- ``language``: a ``language`` part of 64 token ids (the instruction's UTF-8 bytes + 1, as the manipulation tasks).

``dt`` is ``1 / control_hz``; there is no time limit.
"""

from __future__ import annotations

from typing import Any

import torch

from ctrl_rl.core.obs import ObsPart
from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec, RobotStateLayout
from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import ROBOTS, get_robot

PREFIX = "robot"
LANGUAGE_LEN = 64
"""Token ids of the ``language`` part: the manipulation tasks' length (``envs/manipulation/sim.LANGUAGE_LEN``)."""


def _image_size(text: Any, env_id: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise UserInputError(f"env id {env_id!r} has image_size={text!r}: expected HxW such as 48x64") from None
    if h < 1 or w < 1:
        raise UserInputError(f"env id {env_id!r} has image_size={text!r}: expected positive sizes such as 48x64")
    return h, w


def robot_spec_env(name: str, action: str | None = None, state: int | None = None, cameras: str | None = None,
                   image_size: Any = None, language: bool = False, joint_state: bool = True) -> EnvSpec:
    """The spec of ``robot:<name>`` with its options (module docstring)."""
    robot = get_robot(name)
    opts = [f"action={action}"] if action else []
    opts += [f"state={state}"] if state is not None else []
    opts += [f"cameras={cameras}"] if cameras else []
    opts += [f"image_size={image_size}"] if cameras and image_size is not None else []
    opts += ["language=true"] if language else []
    opts += ["joint_state=false"] if not joint_state else []
    env_id = ",".join([f"{PREFIX}:{name}", *opts])
    space = robot.action_space(action)
    width = robot.num_joints if state is None else state
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise UserInputError(f"env id {env_id!r} has state={state!r}: expected the positive width of the robot's "
                             "state vector")
    parts: list[ObsPart] = [ObsPart("state", (width,), torch.float32)]
    names = [c for c in str(cameras).split("+") if c] if cameras else []
    if len(set(names)) != len(names):
        raise UserInputError(f"env id {env_id!r} names a camera twice ({names}): expected distinct cameras")
    if names:
        h, w = _image_size(image_size or "48x64", env_id)
        parts += [ObsPart(f"image/{c}", (3, h, w), torch.uint8) for c in names]
    if language:
        parts.append(ObsPart("language", (LANGUAGE_LEN,), torch.int64))
    layout = None
    if joint_state and width >= robot.num_joints:
        n = robot.num_joints
        layout = RobotStateLayout(joint_position=(0, n), ee_position=(0, 0))
    return EnvSpec(env_id=env_id, obs_shape=(width,), discrete=False, action_dim=space.dim, action_low=space.low,
                   action_high=space.high, dt=robot.dt, max_episode_steps=None, backend=PREFIX,
                   obs_parts=tuple(parts) if len(parts) > 1 else (), robot=robot, action_units=space.units,
                   action_space_name=space.name, robot_state_layout=layout)


def robot_make(name: str, num_envs: int, device: torch.device, seed: int, **options: Any) -> BatchedEnv:
    raise UserInputError(f"env {PREFIX}:{name} is a robot without a simulator (its spec only, for training on data "
                         "recorded on it): expected --env naming a simulator to evaluate or deploy in")


def robot_names() -> tuple[str, ...]:
    return tuple(ROBOTS)
