"""Robot specs: what a policy may command and what the hardware allows.

A ``RobotSpec`` names the joints and gives their position, velocity and effort limits, the control rate, the home
pose, the gripper range, a cartesian workspace box and the action spaces a policy can speak (each with bounds,
units and how a command becomes a target). Tasks build on it (``envs/manipulation``), exports carry it in their
metadata, and the deployment runtime's safety filter reads its limits. It is plain data: no simulator, no torch.

``franka_droid()`` is the Franka Panda as DROID drives it (droid-policy-learning / the DROID paper, 2024):
7 joints plus a gripper, 15 Hz; the default action is a cartesian velocity in [-1, 1] scaled per control step to
0.075 m and 0.15 rad, with the gripper position in [0, 1] (0 open, 1 closed); joint velocity actions are scaled to
0.2 rad per step. Joint limits are Franka's published Panda limits (Franka Control Interface documentation,
"Robot and interface specifications"): positions, velocities 2.175/2.61 rad/s and torques 87/12 N m.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from ctrl_rl.errors import UserInputError


def _floats(values, what: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise UserInputError(f"{what} is {values!r}: expected a list of numbers") from None
    if any(math.isnan(v) for v in out):
        raise UserInputError(f"{what} is {list(out)}: expected numbers, not NaN (a missing limit)")
    return out


def _check_range(low: tuple[float, ...], high: tuple[float, ...], what: str, n: int | None = None) -> None:
    """Refuse a missing (empty, wrong length) or inverted ``[low, high]`` range in one sentence."""
    if not low or len(low) != len(high) or (n is not None and len(low) != n):
        want = f"{n} values" if n is not None else "as many values as the upper limits"
        raise UserInputError(f"{what} has {len(low)} lower and {len(high)} upper limits: expected {want} on each side")
    bad = [i for i, (lo, hi) in enumerate(zip(low, high)) if not lo < hi]
    if bad:
        i = bad[0]
        raise UserInputError(f"{what} is inverted or empty at index {i} (low {low[i]}, high {high[i]}): "
                             "expected low < high")


@dataclass(frozen=True)
class ActionSpace:
    """One way of commanding the robot: a vector of ``dim`` values in ``[low, high]`` (the policy's units).

    ``kind`` says how a command becomes a target: ``"delta"`` adds ``command * step_scale`` per control step to the
    current value (velocity actions in DROID's normalised form), ``"absolute"`` is the target itself (positions), or
    with ``step_scale`` and ``offset`` set, ``offset + step_scale * command`` (a legged robot's joint targets:
    ``default pose + 0.3 * command``, as MuJoCo Playground's and Isaac Lab's joint position actions).
    ``units`` names each component's unit after scaling (``m``, ``rad``, ``1`` for the normalised gripper).
    An export carries ``action_scale`` / ``action_offset`` from them (``scale``, ``offset``).
    """

    name: str
    low: tuple[float, ...]
    high: tuple[float, ...]
    units: tuple[str, ...]
    kind: Literal["delta", "absolute"] = "absolute"
    step_scale: tuple[float, ...] = ()
    """Per-component size of one control step at command 1 (``delta`` spaces): 0.075 m, 0.15 rad, ...; for an
    ``absolute`` space, the scale of ``offset + step_scale * command`` (empty: the command is the target)."""
    description: str = ""
    offset: tuple[float, ...] = ()
    """``absolute`` spaces with a ``step_scale``: the target at command 0 (a legged robot's default joint pose);
    empty means zeros."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", _floats(self.low, f"action space {self.name!r} low"))
        object.__setattr__(self, "high", _floats(self.high, f"action space {self.name!r} high"))
        object.__setattr__(self, "units", tuple(str(u) for u in self.units))
        object.__setattr__(self, "step_scale", _floats(self.step_scale, f"action space {self.name!r} step_scale"))
        object.__setattr__(self, "offset", _floats(self.offset, f"action space {self.name!r} offset"))
        _check_range(self.low, self.high, f"action space {self.name!r}")
        if len(self.units) != self.dim:
            raise UserInputError(f"action space {self.name!r} has {len(self.units)} units for {self.dim} components: "
                                 "expected one unit per component")
        if self.kind not in ("delta", "absolute"):
            raise UserInputError(f"action space {self.name!r} has kind {self.kind!r}: expected 'delta' or 'absolute'")
        if self.kind == "delta" and (len(self.step_scale) != self.dim or min(self.step_scale) <= 0):
            raise UserInputError(f"delta action space {self.name!r} has step_scale {list(self.step_scale)}: expected "
                                 f"{self.dim} positive sizes of one control step")
        for what, v in (("step_scale", self.step_scale), ("offset", self.offset)):
            if v and len(v) != self.dim:
                raise UserInputError(f"action space {self.name!r} has {len(v)} {what} values for {self.dim} "
                                     "components: expected none or one per component")
        if self.offset and self.kind != "absolute":
            raise UserInputError(f"action space {self.name!r} has an offset but kind {self.kind!r}: expected an "
                                 "offset only on an 'absolute' space")

    @property
    def dim(self) -> int:
        return len(self.low)

    @property
    def scale(self) -> tuple[float, ...]:
        """Per component: what command 1 adds (``delta``) or ``step_scale`` (``absolute``; 1 where none is given)."""
        return self.step_scale or (1.0,) * self.dim

    @property
    def target_offset(self) -> tuple[float, ...]:
        """Per component: the target at command 0 of an ``absolute`` space (0 where none is given; 0 for ``delta``)."""
        return self.offset or (0.0,) * self.dim


@dataclass(frozen=True)
class RobotSpec:
    """Limits, rate and action spaces of one robot (see the module docstring)."""

    name: str
    joint_names: tuple[str, ...]
    joint_pos_low: tuple[float, ...]
    joint_pos_high: tuple[float, ...]
    joint_vel_limit: tuple[float, ...]
    """Largest joint speed (rad/s), symmetric."""
    joint_effort_limit: tuple[float, ...]
    """Largest joint torque (N m), symmetric."""
    control_hz: float
    home: tuple[float, ...]
    """Home joint positions (rad), inside the position limits."""
    gripper_low: float = 0.0
    gripper_high: float = 1.0
    gripper_units: str = "1"
    workspace_low: tuple[float, float, float] = (-1.0, -1.0, 0.0)
    """Lower corner of the box the end effector may be sent to (m, robot base frame)."""
    workspace_high: tuple[float, float, float] = (1.0, 1.0, 1.0)
    action_spaces: tuple[ActionSpace, ...] = field(default_factory=tuple)
    default_action: str = ""
    joint_stiffness: tuple[float, ...] = ()
    """PD position gains (N m / rad) per joint where the robot's task defines them (a legged robot's joint
    position servo); empty when the policy does not command joint targets through a PD loop."""
    joint_damping: tuple[float, ...] = ()
    """PD velocity gains (N m s / rad) per joint, with ``joint_stiffness``."""

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        if n == 0:
            raise UserInputError(f"robot {self.name!r} has no joints: expected joint_names")
        for name in ("joint_pos_low", "joint_pos_high", "joint_vel_limit", "joint_effort_limit", "home",
                     "workspace_low", "workspace_high", "joint_stiffness", "joint_damping"):
            object.__setattr__(self, name, _floats(getattr(self, name), f"robot {self.name!r} {name}"))
        for name in ("joint_stiffness", "joint_damping"):
            v = getattr(self, name)
            if v and (len(v) != n or min(v) < 0):
                raise UserInputError(f"robot {self.name!r} {name} is {list(v)}: expected none or {n} gains >= 0")
        if bool(self.joint_stiffness) != bool(self.joint_damping):
            raise UserInputError(f"robot {self.name!r} gives only one of joint_stiffness and joint_damping: expected "
                                 "both PD gains or neither")
        object.__setattr__(self, "joint_names", tuple(self.joint_names))
        _check_range(self.joint_pos_low, self.joint_pos_high, f"robot {self.name!r} joint position limits", n)
        for name in ("joint_vel_limit", "joint_effort_limit"):
            v = getattr(self, name)
            _check_range(tuple(-x for x in v), v, f"robot {self.name!r} {name}", n)
        _check_range(self.workspace_low, self.workspace_high, f"robot {self.name!r} workspace", 3)
        _check_range((float(self.gripper_low),), (float(self.gripper_high),), f"robot {self.name!r} gripper range")
        if not (isinstance(self.control_hz, (int, float)) and self.control_hz > 0 and math.isfinite(self.control_hz)):
            raise UserInputError(f"robot {self.name!r} control_hz is {self.control_hz!r}: "
                                 "expected a positive rate in Hz")
        if len(self.home) != n or any(not lo <= h <= hi for h, lo, hi in zip(self.home, self.joint_pos_low,
                                                                              self.joint_pos_high)):
            raise UserInputError(f"robot {self.name!r} home pose {list(self.home)} is not {n} joint positions inside "
                                 "the position limits")
        spaces = tuple(a if isinstance(a, ActionSpace) else ActionSpace(**a) for a in self.action_spaces)
        object.__setattr__(self, "action_spaces", spaces)
        names = [a.name for a in spaces]
        if len(set(names)) != len(names):
            raise UserInputError(f"robot {self.name!r} names an action space twice ({names}): expected unique names")
        if spaces and self.default_action not in names:
            raise UserInputError(f"robot {self.name!r} default action {self.default_action!r} is not one of its action "
                                 f"spaces {names}")

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    @property
    def dt(self) -> float:
        """Seconds per control step."""
        return 1.0 / self.control_hz

    def action_space(self, name: str | None = None) -> ActionSpace:
        """The action space ``name`` (default: the robot's default); an unknown name is one sentence."""
        name = name or self.default_action
        for a in self.action_spaces:
            if a.name == name:
                return a
        raise UserInputError(f"robot {self.name!r} has no action space {name!r}: expected one of "
                             f"{[a.name for a in self.action_spaces]}")

    def to_dict(self) -> dict:
        """JSON-ready form (the export sidecar carries it); ``from_dict`` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RobotSpec:
        if not isinstance(d, dict):
            raise UserInputError(f"robot spec is {type(d).__name__}: expected a JSON object")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - known)
        if extra:
            raise UserInputError(f"robot spec has unknown fields {extra}: expected only {sorted(known)}")
        try:
            return cls(**{**d, "action_spaces": tuple(ActionSpace(**a) for a in d.get("action_spaces", ()))})
        except TypeError as e:
            raise UserInputError(f"robot spec is incomplete ({e}): expected every RobotSpec field") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---------------------------------------------------------------------------------------------- Franka / DROID
PANDA_JOINTS = tuple(f"panda_joint{i}" for i in range(1, 8))
PANDA_POS_LOW = (-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973)
PANDA_POS_HIGH = (2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973)
PANDA_VEL = (2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61)
PANDA_EFFORT = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)
DROID_HOME = (0.0, -math.pi / 5, 0.0, -4 * math.pi / 5, 0.0, 3 * math.pi / 5, 0.0)
DROID_HZ = 15.0
DROID_CAMERA_NAMES = {"exterior_image_1_left": "exterior_1_left", "exterior_image_2_left": "exterior_2_left",
                      "wrist_image_left": "wrist_left"}
"""DROID's RLDS camera names (the manipulation envs') -> the names in LeRobot's port (``observation.images.<name>``)."""
DROID_LIN_STEP, DROID_ROT_STEP, DROID_GRIP_STEP, DROID_JOINT_STEP = 0.075, 0.15, 0.25, 0.2


def franka_droid(workspace_low: tuple[float, float, float] = (0.25, -0.45, 0.0),
                 workspace_high: tuple[float, float, float] = (0.85, 0.45, 0.7)) -> RobotSpec:
    """The Franka Panda as DROID commands it (module docstring). The workspace box (robot base frame, m) is this
    library's tabletop default, not a DROID figure: the table in front of the robot, up to 0.7 m above its base."""
    unit = (-1.0,) * 7, (1.0,) * 7
    spaces = (
        ActionSpace("cartesian_velocity", *unit, units=("m",) * 3 + ("rad",) * 3 + ("1",), kind="delta",
                    step_scale=(DROID_LIN_STEP,) * 3 + (DROID_ROT_STEP,) * 3 + (DROID_GRIP_STEP,),
                    description="end-effector linear (xyz) and angular (rpy) velocity and gripper velocity, each in "
                                "[-1, 1] of the per-step limit"),
        ActionSpace("joint_velocity", *unit, units=("rad",) * 7, kind="delta", step_scale=(DROID_JOINT_STEP,) * 7,
                    description="joint velocities in [-1, 1] of 0.2 rad per control step"),
        ActionSpace("joint_position", PANDA_POS_LOW, PANDA_POS_HIGH, units=("rad",) * 7,
                    description="absolute joint position targets"),
        ActionSpace("gripper_position", (0.0,), (1.0,), units=("1",), description="0 open, 1 closed"),
    )
    return RobotSpec(name="franka_panda_droid", joint_names=PANDA_JOINTS, joint_pos_low=PANDA_POS_LOW,
                     joint_pos_high=PANDA_POS_HIGH, joint_vel_limit=PANDA_VEL, joint_effort_limit=PANDA_EFFORT,
                     control_hz=DROID_HZ, home=DROID_HOME, workspace_low=workspace_low, workspace_high=workspace_high,
                     action_spaces=spaces, default_action="cartesian_velocity")


ROBOTS = {"franka_droid": franka_droid}


def get_robot(name: str) -> RobotSpec:
    if name not in ROBOTS:
        raise UserInputError(f"unknown robot {name!r}: expected one of {sorted(ROBOTS)}")
    return ROBOTS[name]()
