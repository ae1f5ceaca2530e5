"""Options of the manipulation tasks (``manip:<Task>,key=value,...``) as one frozen, checked config.

``ManipConfig.from_options(task, **options)`` reads the id's options (strings, numbers and booleans as the
registry's ``,key=value`` parser gives them, or the same as Python values) and raises ``UserInputError`` with one
sentence naming the input and what was expected for anything it cannot use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from ctrl_rl.envs.manipulation.scene import CAMERAS
from ctrl_rl.envs.manipulation.tasks import TASK_INFO, TASKS
from ctrl_rl.errors import UserInputError, did_you_mean

CAMERA_ALIASES = {"exterior1": CAMERAS[0], "exterior2": CAMERAS[1], "wrist": CAMERAS[2], "ext1": CAMERAS[0],
                  "ext2": CAMERAS[1]}
DEFAULT_IMAGE_SIZE = (180, 320)  # DROID's frames (H, W)
MAX_IMAGE_SIZE = (720, 1280)  # the offscreen buffer in scene.py


@dataclass(frozen=True)
class ManipConfig:
    """Settings of a batch of manipulation envs (all envs of a batch share them)."""

    task: str
    """One of Reach, Lift, Push, PickPlace, OpenDrawer."""
    cameras: tuple[str, ...] = ()
    """Cameras rendered into the observation (DROID names, in this order when several); empty = state only.
    As an option: ``all``, ``none``, or names / aliases (exterior1, exterior2, wrist) joined by ``+``."""
    image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE
    """(H, W) of every camera image; DROID's 180x320 by default. As an option ``HxW`` (``90x160``) or one int S
    for S x S."""
    language: bool = False
    """Add the ``language`` part: the episode's instruction as int64 UTF-8 bytes + 1, padded with 0 to 64."""
    reward: Literal["dense", "sparse"] = "dense"
    """``dense``: the task's shaped reward in [0, 1] per step; ``sparse``: 1 on steps where the task succeeds."""
    randomize: bool = False
    """Domain randomisation per episode: colours, lights, camera poses, friction, object masses, a small jitter of
    the start pose (object placement is random either way)."""
    action: Literal["cartesian_velocity", "joint_velocity"] = "cartesian_velocity"
    """DROID's cartesian velocity (7 values) or joint velocity (8 values: 7 joints + gripper velocity)."""
    max_episode_steps: int = 100
    """Time limit in 15 Hz steps (episodes end truncated); each task's default is in ``tasks.TASK_INFO``."""
    terminate_on_success: bool = False
    """End the episode (terminated) on the first successful step. Off by default: with a dense reward, ending
    early would forfeit the reward of the remaining steps and teach the agent to avoid success."""
    workers: int = 0
    """Worker processes to spread the envs over; 0 steps them all in this process."""
    group_size: int = 1
    """Envs in consecutive blocks of this size draw from one random stream, so they replay the same episodes
    (placement, start pose, randomisation, instruction) as long as their episodes end together: the groups of
    group-relative RL advantages. 1: every env its own stream."""

    @property
    def obs_parts_requested(self) -> bool:
        """True when the observation is a dict of parts (cameras or language), False for the flat state."""
        return bool(self.cameras) or self.language

    @classmethod
    def from_options(cls, task: str, **options: Any) -> ManipConfig:
        if task not in TASK_INFO:
            ids = ["manip:" + t for t in TASKS]
            raise UserInputError(f"unknown manipulation task {task!r}: expected one of {', '.join(ids)}"
                                 f"{did_you_mean('manip:' + task, ids)}.")
        known = set(cls.__dataclass_fields__) - {"task"}
        unknown = sorted(set(options) - known)
        if unknown:
            hint = did_you_mean(unknown[0], known)
            raise UserInputError(f"manip:{task} has no option {unknown[0]!r}{hint}: expected one of {sorted(known)}.")
        out: dict[str, Any] = {"task": task, "max_episode_steps": TASK_INFO[task].max_episode_steps}
        for key, value in options.items():
            if value is None:
                continue
            out[key] = _PARSERS[key](value, task)
        return cls(**out)


def _bool(key: str):
    def parse(value, task):
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise UserInputError(f"manip:{task} option {key}={value!r}: expected true or false.")

    return parse


def _choice(key: str, choices: tuple[str, ...]):
    def parse(value, task):
        if value not in choices:
            raise UserInputError(f"manip:{task} option {key}={value!r}: expected one of {', '.join(choices)}.")
        return value

    return parse


def _cameras(value, task) -> tuple[str, ...]:
    if isinstance(value, str):
        low = value.strip().lower()
        if low == "all":
            return CAMERAS
        if low in ("none", ""):
            return ()
        names = [v.strip() for v in value.split("+")]
    else:
        names = [str(v) for v in value]
    out = []
    for name in names:
        full = CAMERA_ALIASES.get(name, name)
        if full not in CAMERAS:
            raise UserInputError(f"manip:{task} option cameras={value!r} names the unknown camera {name!r}: expected "
                                 f"all, none, or names from {', '.join(CAMERAS)} (or exterior1, exterior2, wrist) "
                                 "joined by '+'.")
        if full not in out:
            out.append(full)
    return tuple(c for c in CAMERAS if c in out)  # a fixed order, whatever the order asked


def _image_size(value, task) -> tuple[int, int]:
    hw = None
    if isinstance(value, int) and not isinstance(value, bool):
        hw = (value, value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*[xX]\s*\d+\s*", value):
        h, w = re.split(r"[xX]", value)
        hw = (int(h), int(w))
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        hw = (int(value[0]), int(value[1]))
    if hw is None or not (8 <= hw[0] <= MAX_IMAGE_SIZE[0] and 8 <= hw[1] <= MAX_IMAGE_SIZE[1]):
        raise UserInputError(f"manip:{task} option image_size={value!r}: expected HxW (such as 180x320) or one size, "
                             f"with 8 <= H <= {MAX_IMAGE_SIZE[0]} and 8 <= W <= {MAX_IMAGE_SIZE[1]}.")
    return hw


def _positive_int(key: str, minimum: int):
    def parse(value, task):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UserInputError(f"manip:{task} option {key}={value!r}: expected an integer >= {minimum}.")
        return int(value)

    return parse


_PARSERS = {
    "cameras": _cameras,
    "image_size": _image_size,
    "language": _bool("language"),
    "reward": _choice("reward", ("dense", "sparse")),
    "randomize": _bool("randomize"),
    "action": _choice("action", ("cartesian_velocity", "joint_velocity")),
    "max_episode_steps": _positive_int("max_episode_steps", 1),
    "terminate_on_success": _bool("terminate_on_success"),
    "workers": _positive_int("workers", 0),
    "group_size": _positive_int("group_size", 1),
}
