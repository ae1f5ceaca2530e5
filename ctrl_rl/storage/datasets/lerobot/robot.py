"""Which robot a LeRobot dataset was recorded on, and which of its action features feed each of the robot's action
spaces: what lets a run on real-robot data build its policy without a simulator (``ctrl-rl train vla_bc --dataset
DIR`` with no ``--env``), and what ``ctrl-rl data info`` prints.

Robot: ``meta/info.json``'s ``robot_type`` names it. LeRobot's DROID port (``port_droid.py``, and ctrl_rl's scripted
data) writes ``"Franka"``; ``ROBOT_TYPES`` maps that and the other spellings of a Franka Panda to the robot spec
``franka_droid`` (``robots.spec.ROBOTS``); a name of ``ROBOTS`` itself is taken as it is. Anything else names no
robot known here (``--robot NAME`` then says which).

Actions: the DROID port stores one command in several forms: ``action`` (8) = joint positions (7) + gripper
position, ``action.original`` (7) = RLDS's action, cartesian velocity (6) + gripper *position*, and the parts
``action.{cartesian_velocity, joint_velocity, joint_position, cartesian_position, gripper_velocity,
gripper_position}``. ``ACTION_KEYS`` lists, per action space of the robot spec, the keys whose concatenation is
that space's vector, in the order tried; the first the dataset has with the env's width is used:

================== ========================================================= ======================================
action space       keys (joined)                                             why
================== ========================================================= ======================================
cartesian_velocity action.cartesian_velocity + action.gripper_velocity       the space's 6 velocities and its
                                                                             gripper *velocity* (``delta``, 0.25
                                                                             per step), component for component
joint_velocity     action.joint_velocity + action.gripper_velocity (8)       the manip tasks' joint-velocity
                   or action.joint_velocity (7)                              action (+ gripper velocity), or the
                                                                             7 joints alone
joint_position     action (8: the port's joint positions + gripper) or       absolute joint targets
                   action.joint_position (7)
gripper_position   action.gripper_position
================== ========================================================= ======================================

``action.original`` is never picked for ``cartesian_velocity``: its gripper component is a position in [0, 1] (what
DROID's own controller takes), while the robot spec's (and the simulator's) is a velocity that integrates, so a
policy trained on it would close the gripper and never open it again. A dataset that has it but no
``action.gripper_velocity`` is refused in one sentence that names ``--action-key action.original`` (accepting that
difference). A dataset in none of DROID's vocabulary (no ``action.<part>`` key) falls back to its ``action``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import ROBOTS

ROBOT_TYPES = {"franka": "franka_droid", "panda": "franka_droid", "franka_panda": "franka_droid",
               "franka_emika_panda": "franka_droid", "franka_panda_droid": "franka_droid", "droid": "franka_droid"}
"""``robot_type`` (lower case) -> the robot spec (``robots.spec.ROBOTS``) it is recorded on."""

ENV_ACTION_KEY = "action.env"
"""ctrl_rl's scripted data: the simulator's own action vector (used first, whatever the space)."""

ACTION_KEYS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "cartesian_velocity": (
        (("action.cartesian_velocity", "action.gripper_velocity"),
         "cartesian velocity (6) + gripper velocity (1): the space's components, the gripper a velocity as the "
         "robot spec's"),),
    "joint_velocity": (
        (("action.joint_velocity", "action.gripper_velocity"), "joint velocities (7) + gripper velocity (1)"),
        (("action.joint_velocity",), "joint velocities (7)")),
    "joint_position": (
        (("action",), "the DROID port's action: joint positions (7) + gripper position (1)"),
        (("action.joint_position",), "joint positions (7)")),
    "gripper_position": ((("action.gripper_position",), "gripper position (1), 0 open .. 1 closed"),),
}
ORIGINAL_KEY = "action.original"
ORIGINAL_NOTE = ("action.original is RLDS's action, cartesian velocity (6) + gripper *position*: not the "
                 "cartesian_velocity space, whose gripper component is a velocity")


def robot_of(robot_type: str | None) -> str | None:
    """The robot spec name a dataset's ``robot_type`` names (``"Franka"`` -> ``franka_droid``), else None."""
    if not robot_type:
        return None
    if robot_type in ROBOTS:
        return robot_type
    return ROBOT_TYPES.get(robot_type.strip().lower().replace("-", "_").replace(" ", "_"))


def numeric_widths(features: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """``{feature: width}`` of the numeric features (a feature of shape ``(D,)`` has width D)."""
    out = {}
    for k, ft in features.items():
        if ft["dtype"] in ("video", "string"):
            continue
        n = 1
        for s in ft["shape"]:
            n *= int(s)
        out[k] = n
    return out


def droid_vocabulary(features: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the dataset stores actions in DROID's vocabulary (any ``action.<part>`` key besides ``action.env``)."""
    parts = {k for keys in ACTION_KEYS.values() for ks, _ in keys for k in ks if k != "action"} | {ORIGINAL_KEY}
    return any(k in features for k in parts)


def action_keys(features: Mapping[str, Mapping[str, Any]], space: str, width: int | None,
                source: str = "the dataset") -> tuple[list[str], str]:
    """``(keys, why)``: the dataset's action features for actions of the robot action space ``space`` (``""``: the
    env has no robot) of ``width`` values (None: any), without ``--action-key`` (module docstring for the order)."""
    widths = numeric_widths(features)
    if ENV_ACTION_KEY in widths:
        return [ENV_ACTION_KEY], "the simulator's own action vector (ctrl_rl's scripted data)"
    for keys, why in ACTION_KEYS.get(space, ()):
        if all(k in widths for k in keys) and (width is None or sum(widths[k] for k in keys) == width):
            return list(keys), why
    if droid_vocabulary(features):
        have = sorted(k for k in widths if k.startswith("action"))
        hint = (f" ({ORIGINAL_NOTE}; pass --action-key {ORIGINAL_KEY} to train on it anyway)"
                if space == "cartesian_velocity" and ORIGINAL_KEY in widths else "")
        want = " or ".join("+".join(ks) for ks, _ in ACTION_KEYS.get(space, ())) or "keys of the env's action"
        raise UserInputError(f"{source} stores DROID's actions {have} but none of them is the {width or ''}-value "
                             f"{space or 'env'} action{hint}: expected {want}, or --action-key naming the keys")
    if "action" in widths:
        return ["action"], "the dataset's action (no robot-specific keys to choose from)"
    raise UserInputError(f"{source} has no action feature: expected 'action' or --action-key naming one")


def given_keys(features: Mapping[str, Mapping[str, Any]], given: str, source: str = "the dataset") -> list[str]:
    """``--action-key`` (keys joined by +), each a numeric feature of the dataset."""
    widths = numeric_widths(features)
    keys = given.split("+")
    missing = [k for k in keys if k not in widths]
    if missing:
        raise UserInputError(f"{source} has no numeric feature {missing[0]!r} for --action-key: expected one of "
                             f"{sorted(k for k in widths if k.startswith('action'))}")
    return keys


def action_mapping(features: Mapping[str, Mapping[str, Any]], robot_name: str | None,
                   action_spaces: Sequence[tuple[str, int]]) -> dict[str, dict[str, Any]]:
    """For ``ctrl-rl data info``: per action space ``(name, dim)`` of ``robot_name``'s spec, the keys that feed it and
    why, or why none does (``action.env``, ctrl_rl's simulator vector, is listed apart as ``env``)."""
    out: dict[str, dict[str, Any]] = {}
    if ENV_ACTION_KEY in features:
        out["env"] = {"keys": ENV_ACTION_KEY, "width": numeric_widths(features)[ENV_ACTION_KEY],
                      "why": "the simulator's own action vector (ctrl_rl's scripted data), used first by a run in "
                             "that simulator"}
        features = {k: v for k, v in features.items() if k != ENV_ACTION_KEY}
    if robot_name is None:
        return out
    widths = numeric_widths(features)
    for name, dim in action_spaces:
        for width in (dim, dim + 1):  # the manip tasks append a gripper velocity to a joint space
            try:
                keys, why = action_keys(features, name, width)
            except UserInputError:
                continue
            if sum(widths[k] for k in keys) == width:
                out[name] = {"keys": "+".join(keys), "width": width, "why": why}
                break
        else:
            why = ORIGINAL_NOTE if name == "cartesian_velocity" and ORIGINAL_KEY in widths else \
                "the dataset has none of its keys"
            out[name] = {"keys": None, "width": dim, "why": why}
        if name == "cartesian_velocity" and ORIGINAL_KEY in widths and out[name]["keys"] is not None:
            out[name]["not"] = {ORIGINAL_KEY: ORIGINAL_NOTE}
    return out


def robot_report(features: Mapping[str, Mapping[str, Any]], robot_type: str | None) -> dict[str, Any]:
    """What ``ctrl-rl data info`` says about the robot: the spec ``robot_type`` names (None: none known here, and
    why), and per action space of that spec the keys that feed it and why (``action_mapping``)."""
    from ctrl_rl.robots.spec import get_robot

    name = robot_of(robot_type)
    spaces = [(a.name, a.dim) for a in get_robot(name).action_spaces] if name is not None else []
    why = (f"robot_type {robot_type!r}" if name is not None else
           f"robot_type {robot_type!r} names no robot known here ({sorted(ROBOTS)}): train with --robot NAME or --env")
    return {"robot": name, "robot_from": why, "actions": action_mapping(features, name, spaces)}
