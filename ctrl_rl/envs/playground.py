"""The robot spec of a MuJoCo Playground legged task in envpool, from its model file and envpool's config.

envpool 1.2's joystick tasks (``envpool/mujoco/playground/go1.h``, ``PlaygroundGo1EnvBase``) load the task's scene
file under the config's ``base_path``, set every actuator's gain to the config's ``kp`` and every joint's damping to
its ``kd``, take the default pose from the ``home`` keyframe (``qpos[7:19]``, after the free joint) and send
``ctrl[i] = default_pose[i] + action_scale * action[i]`` for ``n = ctrl_dt / sim_dt`` physics steps. So the robot
spec is: the joints the actuators drive, in actuator order (the action's order; the task reads ``qpos[7 + i]`` for
actuator ``i``, so the actuator order must be the joint order, checked here), their ranges, the actuators' force
ranges as torque limits, the keyframe's joint positions as ``home``, ``kp`` / ``kd`` and ``action_scale`` from the
config (so ``envpool.make`` options that change them are followed) and the rate ``1 / (ctrl_dt * action_repeat)``.
The model file is read as XML (``envs/mjcf.py``), no simulator is built; the result is cached per file and settings.

Covered: ``ROBOT_FILES`` (Go1 joystick, flat and rough terrain). Not covered: Go1Getup (target = current
joint positions + scale * action) and Go1Handstand / Go1Footstand (target = last target + scale * action), whose
actions are not offsets from a fixed pose; Spot and Op3 (same form as Go1, no sourced joint speed limit yet); the
humanoids and Barkour, whose gains envpool's config does not expose.
"""

from __future__ import annotations

import functools
import os

from ctrl_rl.envs.mjcf import read_mjcf
from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.legged import joint_target_robot
from ctrl_rl.robots.spec import RobotSpec

_XMLS = "mujoco/playground/assets/mujoco_playground/_src/locomotion"

ROBOT_FILES = {
    "Go1JoystickFlatTerrain-v1": ("unitree_go1", f"{_XMLS}/go1/xmls/scene_mjx_feetonly_flat_terrain.xml", "home"),
    "Go1JoystickRoughTerrain-v1": ("unitree_go1", f"{_XMLS}/go1/xmls/scene_mjx_feetonly_rough_terrain.xml", "home"),
}
"""envpool task -> (robot name, model file under the config's ``base_path``, keyframe of the default pose), as
``envpool/mujoco/playground/go1.h`` loads them."""


def playground_robot(task: str, config: dict) -> RobotSpec | None:
    """The robot spec of a Playground task (module docstring) from envpool's config of it, or None for a task
    ``ROBOT_FILES`` does not list."""
    if task not in ROBOT_FILES:
        return None
    name, xml, key = ROBOT_FILES[task]
    hz = 1.0 / (float(config["ctrl_dt"]) * int(config.get("action_repeat", 1)))
    return _robot(name, os.path.join(config["base_path"], xml), key, float(config["kp"]), float(config["kd"]),
                  float(config["action_scale"]), hz)


@functools.cache
def _robot(name: str, path: str, key: str, kp: float, kd: float, action_scale: float, hz: float) -> RobotSpec:
    model = read_mjcf(path)
    if key not in model.keyframes:
        raise UserInputError(f"{path} has no keyframe {key!r}: expected the task's default pose there")
    qpos = model.keyframes[key]
    joints = [model.joint(a.joint) for a in model.actuators]
    adrs = [j.qpos_adr for j in joints]
    if adrs != list(range(7, 7 + len(joints))):
        raise UserInputError(f"{path}: the actuators drive qpos {adrs}, expected the joints after the free joint in "
                             "actuator order (envpool reads qpos[7 + i] for actuator i)")
    missing = [a.name for a, j in zip(model.actuators, joints) if j.range is None or a.forcerange is None]
    if missing:
        raise UserInputError(f"{path}: actuators {missing} have no joint range or force range: expected both")
    low = tuple(j.range[0] for j in joints if j.range is not None)
    high = tuple(j.range[1] for j in joints if j.range is not None)
    effort = tuple(max(abs(a.forcerange[0]), abs(a.forcerange[1])) for a in model.actuators if a.forcerange)
    home = tuple(qpos[a] for a in adrs)
    return joint_target_robot(name, tuple(j.name for j in joints), low, high, effort, home, kp, kd, action_scale, hz)

