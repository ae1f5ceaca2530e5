"""Legged robots as MuJoCo Playground drives them: joint position targets around a default pose, held by a PD loop.

A Playground joystick task (Go1, as envpool 1.2 runs it: ``envpool/mujoco/playground/go1.h``) sends each actuator
the target ``default_pose + action_scale * action`` (action in [-1, 1], actuator order) at ``ctrl_dt``; a MuJoCo
position actuator with gain ``kp`` tracks it and a joint damping ``kd`` brakes it, i.e. the torque
``kp * (target - q) - kd * qdot`` of a robot's joint PD servo, and the actuator's ``ctrlrange`` (the joint range,
``inheritrange="1"``) clips the target. ``joint_target_robot`` puts that into a ``RobotSpec``: the joints in actuator
order, their ranges and torque limits, the default pose (the task's keyframe) as ``home``, the gains, and one
``absolute`` action space whose ``offset`` is the default pose and whose ``step_scale`` is ``action_scale``, so an
export carries the mapping (``deploy.export.deploy_metadata``).

Plain data: the task's model file is read on the envs floor (``envs/playground.py``); what a model file does not
hold is here, each figure with its source:

- ``JOINT_VELOCITY_LIMITS``: MJCF has no joint speed limit. Unitree Go1: 30.1 rad/s on every joint, the
  ``<limit velocity>`` of Unitree's own description (unitreerobotics/unitree_ros,
  ``robots/go1_description/urdf/go1.urdf``).
"""

from __future__ import annotations

from ctrl_rl.robots.spec import ActionSpace, RobotSpec

JOINT_TARGETS = "joint_position_offset"
"""The action space name of a joint-target robot: ``target = offset + step_scale * action``."""

JOINT_VELOCITY_LIMITS = {"unitree_go1": 30.1}
"""Largest joint speed (rad/s) per robot name, for every joint (module docstring)."""


def joint_target_robot(name: str, joint_names: tuple[str, ...], pos_low: tuple[float, ...],
                       pos_high: tuple[float, ...], effort_limit: tuple[float, ...], home: tuple[float, ...],
                       kp: float, kd: float, action_scale: float, control_hz: float) -> RobotSpec:
    """A robot commanded by joint targets ``home + action_scale * action`` (action in [-1, 1]) through a PD loop
    with gains ``kp`` / ``kd`` on every joint, at ``control_hz``; the joint speed limit is ``JOINT_VELOCITY_LIMITS``'s.
    ``joint_names`` and every per-joint tuple are in actuator order (the order of the action's components)."""
    n = len(joint_names)
    space = ActionSpace(JOINT_TARGETS, (-1.0,) * n, (1.0,) * n, ("rad",) * n, "absolute",
                        step_scale=(float(action_scale),) * n, offset=home,
                        description=f"joint position targets: default pose + {action_scale:g} * action (action in "
                                    "[-1, 1], actuator order), clipped to the joint ranges, tracked by a PD loop "
                                    "(joint_stiffness, joint_damping)")
    return RobotSpec(name=name, joint_names=joint_names, joint_pos_low=pos_low, joint_pos_high=pos_high,
                     joint_vel_limit=(JOINT_VELOCITY_LIMITS[name],) * n, joint_effort_limit=effort_limit,
                     control_hz=control_hz, home=home, action_spaces=(space,), default_action=JOINT_TARGETS,
                     joint_stiffness=(float(kp),) * n, joint_damping=(float(kd),) * n)
