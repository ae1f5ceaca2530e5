"""The five tabletop tasks: initial placement, privileged state, dense reward, success, instructions, time limit.

Frames and units as in ``scene.py`` (world = robot base frame, table top at z = 0, m, rad). ``ee`` is the
end-effector site (the TCP between the fingers), ``d(a, b)`` a Euclidean distance, ``g`` the measured gripper
position (0 open, 1 closed). Every dense reward lies in [0, 1] per step; the sparse reward (``reward=sparse``) is
``1.0`` on steps where the task succeeds, else 0. Success is tested after every step (``info["success"]``).

============  ===================================  ===============================================  =======
task          privileged state (after proprio)     dense reward                                      limit
============  ===================================  ===============================================  =======
Reach         target (3), target - ee (3)          1 - tanh(10 d(ee, target))                        50
Lift          cube (3), cube quat wxyz (4),        0.25 reach(cube) + 0.25 grasped                   100
              cube - ee (3)                        + 0.5 clip(lift / 0.10, 0, 1)
Push          cube (3), quat (4), goal (3),        0.25 reach(cube) + 0.75 (1 - tanh(5 d_xy(cube,    120
              cube - ee (3), goal - cube (3)       goal)))
PickPlace     as Push                              0.25 reach(cube) + 0.25 grasped                   120
                                                   + 0.5 (1 - tanh(5 d(cube, goal)))
OpenDrawer    handle (3), opening (1), pull        0.25 (1 - tanh(10 d(ee, handle)))                 100
              direction xy (2), handle - ee (3)    + 0.75 clip(opening / 0.10, 0, 1)
============  ===================================  ===============================================  =======

``reach(x) = 1 - tanh(10 d(ee, x))``; ``grasped`` = the cube touches both fingers; ``lift`` = cube height above its
resting height; ``opening`` = drawer slide position (0 closed, 0.20 m fully out); the pull direction is the unit
xy vector the drawer slides out along (toward the robot, with the cabinet's yaw).

Success: Reach ``d(ee, target) < 0.03``; Lift ``lift >= 0.10``; Push ``d_xy(cube, goal) < 0.04`` (the cube's centre on
the 4 cm target disc); PickPlace ``d(cube, goal) < 0.04``; OpenDrawer ``opening >= 0.10`` (half the travel).
Time limits are in 15 Hz steps (3.3 to 8 s): 4-7 times what the scripted experts (``experts.py``) need to first
succeed (Reach <= 8 steps, Lift / PickPlace <= 23, Push <= 29, OpenDrawer <= 16), leaving room to explore.

Initial placement, drawn from the env's RNG every episode (always random, ``randomize`` or not): reach targets in
x 0.35..0.65, y -0.25..0.25, z 0.08..0.35; cubes in x 0.40..0.60, y -0.20..0.20, yaw -pi/4..pi/4; push goals on the
table 0.10..0.20 m from the cube; pick-and-place goals in the air (z 0.10..0.25) at least 0.10 m (xy) from the
cube; the cabinet at x 0.72..0.80, y -0.12..0.12, yaw -0.3..0.3.

Each task has three phrasings of its instruction (DROID annotates each episode three times); one is drawn per
episode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ctrl_rl.envs.manipulation.scene import CUBE_HALF, DRAWER_TRAVEL, TABLE_Z

LIFT_HEIGHT = 0.10
OPEN_FRACTION = 0.5


@dataclass(frozen=True)
class TaskInfo:
    """Static description of one task.

    Attributes:
        name: the id's name (``manip:<name>``).
        instructions: three phrasings of the instruction.
        max_episode_steps: time limit in 15 Hz control steps.
        privileged: names of the privileged state entries, in order (after the 14 proprio entries).
    """

    name: str
    instructions: tuple[str, str, str]
    max_episode_steps: int
    privileged: tuple[str, ...]


def _xyz(name: str) -> tuple[str, ...]:
    return tuple(f"{name}_{c}" for c in "xyz")


TASK_INFO = {
    "Reach": TaskInfo("Reach", ("move the gripper to the green ball", "reach for the green target",
                                "put the gripper tip on the green sphere"), 50,
                      _xyz("target") + _xyz("target_minus_ee")),
    "Lift": TaskInfo("Lift", ("pick up the red cube", "lift the red block off the table",
                              "grab the red cube and raise it"), 100,
                     _xyz("cube") + tuple(f"cube_quat_{c}" for c in "wxyz") + _xyz("cube_minus_ee")),
    "Push": TaskInfo("Push", ("push the red cube onto the green circle", "slide the red block to the green target",
                              "move the red cube to the green mark by pushing it"), 120,
                     _xyz("cube") + tuple(f"cube_quat_{c}" for c in "wxyz") + _xyz("goal") + _xyz("cube_minus_ee")
                     + _xyz("goal_minus_cube")),
    "PickPlace": TaskInfo("PickPlace", ("put the red cube at the green ball",
                                        "pick up the red block and hold it at the green target",
                                        "move the red cube to the green sphere in the air"), 120,
                          _xyz("cube") + tuple(f"cube_quat_{c}" for c in "wxyz") + _xyz("goal") + _xyz("cube_minus_ee")
                          + _xyz("goal_minus_cube")),
    "OpenDrawer": TaskInfo("OpenDrawer", ("open the drawer", "pull the drawer open", "slide the drawer out"), 100,
                           _xyz("handle") + ("opening", "pull_dir_x", "pull_dir_y") + _xyz("handle_minus_ee")),
}
TASKS = tuple(TASK_INFO)


def _reach(d: float) -> float:
    return 1.0 - math.tanh(10.0 * d)


def _yaw_quat(yaw: float) -> np.ndarray:
    return np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def _sample_cube(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    pos = np.array([rng.uniform(0.40, 0.60), rng.uniform(-0.20, 0.20), TABLE_Z + CUBE_HALF])
    return pos, float(rng.uniform(-math.pi / 4, math.pi / 4))


def reset_task(task: str, sim, rng: np.random.Generator) -> None:
    """Place the task's objects and targets for a new episode (``sim`` is a ``ManipSim``; see the docstring)."""
    if task == "Reach":
        sim.set_target([rng.uniform(0.35, 0.65), rng.uniform(-0.25, 0.25), rng.uniform(0.08, 0.35)])
    elif task in ("Lift", "Push", "PickPlace"):
        pos, yaw = _sample_cube(rng)
        sim.set_cube(pos, _yaw_quat(yaw))
        if task == "Push":
            while True:  # rejection sampling: a goal on the table, 0.10..0.20 m from the cube, inside the area
                r, phi = rng.uniform(0.10, 0.20), rng.uniform(-math.pi, math.pi)
                goal = pos[:2] + r * np.array([math.cos(phi), math.sin(phi)])
                if 0.35 <= goal[0] <= 0.70 and abs(goal[1]) <= 0.30:
                    break
            sim.set_target([goal[0], goal[1], TABLE_Z])
        elif task == "PickPlace":
            while True:
                goal = np.array([rng.uniform(0.40, 0.65), rng.uniform(-0.25, 0.25)])
                if np.linalg.norm(goal - pos[:2]) >= 0.10:
                    break
            sim.set_target([goal[0], goal[1], rng.uniform(0.10, 0.25)])
    elif task == "OpenDrawer":
        sim.set_cabinet([rng.uniform(0.72, 0.80), rng.uniform(-0.12, 0.12), TABLE_Z], float(rng.uniform(-0.3, 0.3)))


def privileged(task: str, sim) -> np.ndarray:
    """The task's privileged state ``[P]`` (layout in ``TASK_INFO[task].privileged``)."""
    ee = sim.ee_pos
    if task == "Reach":
        t = sim.target_pos
        return np.concatenate([t, t - ee])
    if task == "OpenDrawer":
        h = sim.handle_pos
        return np.concatenate([h, [sim.drawer_opening], sim.pull_dir, h - ee])
    cube, quat = sim.cube_pose
    if task == "Lift":
        return np.concatenate([cube, quat, cube - ee])
    goal = sim.target_pos
    return np.concatenate([cube, quat, goal, cube - ee, goal - cube])


def evaluate(task: str, sim) -> tuple[float, bool]:
    """``(dense reward, success)`` of the current state (definitions in the module docstring)."""
    ee = sim.ee_pos
    if task == "Reach":
        d = float(np.linalg.norm(sim.target_pos - ee))
        return _reach(d), d < 0.03
    if task == "OpenDrawer":
        opening = sim.drawer_opening
        r = 0.25 * _reach(float(np.linalg.norm(sim.handle_pos - ee)))
        r += 0.75 * min(max(opening / (OPEN_FRACTION * DRAWER_TRAVEL), 0.0), 1.0)
        return r, opening >= OPEN_FRACTION * DRAWER_TRAVEL
    cube = sim.cube_pose[0]
    r = 0.25 * _reach(float(np.linalg.norm(cube - ee)))
    if task == "Lift":
        lift = cube[2] - (TABLE_Z + CUBE_HALF)
        r += 0.25 * sim.cube_grasped() + 0.5 * min(max(lift / LIFT_HEIGHT, 0.0), 1.0)
        return r, lift >= LIFT_HEIGHT
    goal = sim.target_pos
    if task == "Push":
        d = float(np.linalg.norm((goal - cube)[:2]))
        return r + 0.75 * (1.0 - math.tanh(5.0 * d)), d < 0.04
    d = float(np.linalg.norm(goal - cube))  # PickPlace
    return r + 0.25 * sim.cube_grasped() + 0.5 * (1.0 - math.tanh(5.0 * d)), d < 0.04
