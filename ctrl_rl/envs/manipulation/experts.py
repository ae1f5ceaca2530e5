"""Scripted experts for the manipulation tasks: the flat ``state`` (proprio + privileged, ``sim.py``) -> a cartesian
velocity action (``control.py``), for demonstrations, tests and baselines.

Each expert is stateless: the phase (approach, descend, grasp, lift / push / pull) is read from the state every
step, so one expert drives a whole batch through auto-resets with no memory, and recovers when a grasp slips (the
gripper then reads fully closed on nothing, opens and starts over). Motions are proportional: ``a = clip(k (x* -
x) / 0.075, -1, 1)`` for positions and ``clip(rotvec(R* R^T) / 0.15, -1, 1)`` for the orientation, which is held
pointing down with a task-chosen yaw (the cube's faces, the drawer's pull direction; the 90-degree symmetry of
the cube is used to turn the least). Geometry used: the fingertips reach 0.05 m beyond the end-effector site, so a
cube (5 cm) is grasped with the site 0.03 m above its centre and the handle with the site 0.015 m above its axis.

``expert_actions(task, state)`` takes ``[N,O]`` (NumPy or a CPU tensor) and returns ``[N,7]`` float32 NumPy;
``ScriptedExpert(task)`` is the same as a callable policy mapping tensors to tensors.
Measured success over seeded episodes: the ``experts`` tests (``tests/envs/test_manipulation.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ctrl_rl.envs.manipulation.control import euler_to_mat, rotvec
from ctrl_rl.envs.manipulation.scene import CUBE_HALF, TABLE_Z
from ctrl_rl.envs.manipulation.tasks import TASKS

LIN, ROT = 0.075, 0.15  # m / rad per step at command 1 (RobotSpec step scales)
GRASP_ABOVE = 0.03  # site height above the cube centre when grasping
HOVER = 0.10  # approach height above the grasp point
_DOWN = np.diag([1.0, -1.0, -1.0])  # end-effector rotation pointing down with yaw 0


def _move(ee: np.ndarray, target: np.ndarray, gain: float = 1.0, limit: float = 1.0) -> np.ndarray:
    return np.clip(gain * (target - ee) / LIN, -limit, limit)


def _turn(euler: np.ndarray, yaw: float) -> np.ndarray:
    """Angular command that turns the gripper to point down with ``yaw``."""
    c, s = math.cos(yaw), math.sin(yaw)
    target = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ _DOWN
    return np.clip(rotvec(target @ euler_to_mat(euler).T) / ROT, -1.0, 1.0)


def _ee_yaw(euler: np.ndarray) -> float:
    r = euler_to_mat(euler)
    return math.atan2(r[1, 0], r[0, 0])


def _nearest_yaw(current: float, base: float, period: float) -> float:
    """The angle ``base + k * period`` closest to ``current``."""
    return base + period * round((current - base) / period)


def _cube_yaw(quat: np.ndarray) -> float:
    w, x, y, z = quat
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _grasp_then(ee, euler, g, cube, quat, carry_to) -> np.ndarray:
    """Pick the cube and move it so its centre goes to ``carry_to`` (``None``: lift straight up 0.15 m)."""
    yaw = _nearest_yaw(_ee_yaw(euler), _cube_yaw(quat), math.pi / 2)
    grasp = cube + np.array([0.0, 0.0, GRASP_ABOVE])
    rel = cube - ee
    between = np.linalg.norm(rel[:2]) < 0.02 and abs(rel[2] + GRASP_ABOVE) < 0.02  # the cube sits in the hand
    a = np.zeros(7)
    if g > 0.85:  # closed on nothing: open and go up
        a[2], a[6] = 1.0, -1.0
    elif g > 0.3 and between:  # holding it: carry
        goal = cube + np.array([0.0, 0.0, 0.15]) if carry_to is None else carry_to
        a[:3] = _move(ee, ee + (goal - cube), gain=0.7, limit=0.6)
        a[6] = 1.0
    else:
        xy_err = np.linalg.norm((grasp - ee)[:2])
        yaw_err = abs(_ee_yaw(euler) - yaw)
        if xy_err > 0.012 or yaw_err > 0.08:  # above the cube first
            hover = grasp + np.array([0.0, 0.0, HOVER])
            target = np.array([hover[0], hover[1], max(hover[2], ee[2])]) if xy_err > 0.05 else hover
            a[:3] = _move(ee, target)
            a[6] = -1.0
        else:  # descend, then close where the fingers straddle it
            a[:3] = _move(ee, grasp, limit=0.5)
            a[6] = 1.0 if abs(ee[2] - grasp[2]) < 0.01 else -1.0
    a[3:6] = _turn(euler, yaw)
    return a


def _reach(s: np.ndarray) -> np.ndarray:
    ee, euler = s[7:10], s[10:13]
    a = np.zeros(7)
    a[:3] = _move(ee, s[14:17])
    a[3:6] = _turn(euler, _ee_yaw(euler))  # keep pointing down
    a[6] = -1.0
    return a


def _lift(s: np.ndarray) -> np.ndarray:
    return _grasp_then(s[7:10], s[10:13], s[13], s[14:17], s[17:21], None)


def _pick_place(s: np.ndarray) -> np.ndarray:
    return _grasp_then(s[7:10], s[10:13], s[13], s[14:17], s[17:21], s[21:24])


def _push(s: np.ndarray) -> np.ndarray:
    ee, euler, cube, goal = s[7:10], s[10:13], s[14:17], s[21:24]
    d = (goal - cube)[:2]
    u = d / max(np.linalg.norm(d), 1e-6)  # push direction
    push_z = TABLE_Z + 0.06  # fingertips ~1 cm above the table
    rel = (ee - cube)[:2]
    along = float(rel @ u)
    lateral = rel - along * u
    a = np.zeros(7)
    a[6] = 1.0  # closed fingers make a stiff pusher
    if np.linalg.norm(d) < 0.01:
        a[:3] = _move(ee, np.array([ee[0], ee[1], push_z + 0.05]), limit=0.3)  # done: back off upward
    elif along < -0.02 and np.linalg.norm(lateral) < 0.015 and ee[2] < push_z + 0.02:  # behind it: push
        target = cube[:2] + u * (np.linalg.norm(d) - (CUBE_HALF + 0.015))  # fingers' centre stops behind the goal
        a[:2] = _move(ee[:2], target, gain=0.6, limit=0.4) - 0.8 * lateral / LIN
        a[2] = _move(ee[2:3], np.array([push_z]))[0]
    else:  # go behind it, over the top
        pre = cube[:2] - u * (CUBE_HALF + 0.045)
        far = np.linalg.norm(ee[:2] - pre)
        if far > 0.015:
            high = push_z + 0.08
            if ee[2] < high - 0.02 and np.linalg.norm(rel) < 0.09:
                a[2] = 1.0  # rise before crossing near the cube
            else:
                a[:3] = _move(ee, np.array([pre[0], pre[1], high]))
        else:
            a[:3] = _move(ee, np.array([pre[0], pre[1], push_z]), limit=0.6)
    a[3:6] = _turn(euler, _nearest_yaw(_ee_yaw(euler), math.atan2(u[1], u[0]), math.pi))
    return a


def _open_drawer(s: np.ndarray) -> np.ndarray:
    ee, euler, g = s[7:10], s[10:13], s[13]
    handle, pull = s[14:17], s[18:20]  # s[17], the opening, is not needed: holding the handle, keep pulling
    # fingers close along the pull direction: the gripper's y axis (sin yaw, -cos yaw) parallel to it
    yaw = _nearest_yaw(_ee_yaw(euler), math.atan2(pull[1], pull[0]) + math.pi / 2, math.pi)
    grasp = handle + np.array([0.0, 0.0, 0.015])
    near = np.linalg.norm(grasp - ee) < 0.02
    a = np.zeros(7)
    if g > 0.85:  # closed on nothing
        a[2], a[6] = 1.0, -1.0
    elif g > 0.25 and near:  # holding the handle: pull
        target = grasp + np.r_[pull, 0.0] * 0.06
        a[:3] = _move(ee, target, gain=0.7, limit=0.5)
        a[6] = 1.0
    else:
        xy_err = np.linalg.norm((grasp - ee)[:2])
        if xy_err > 0.012 or abs(_ee_yaw(euler) - yaw) > 0.08:
            hover = grasp + np.array([0.0, 0.0, 0.08])
            a[:3] = _move(ee, hover if xy_err < 0.05 else np.array([hover[0], hover[1], max(hover[2], ee[2])]))
            a[6] = -1.0
        else:
            a[:3] = _move(ee, grasp, limit=0.5)
            a[6] = 1.0 if abs(ee[2] - grasp[2]) < 0.01 else -1.0
    a[3:6] = _turn(euler, yaw)
    return a


_EXPERTS = {"Reach": _reach, "Lift": _lift, "Push": _push, "PickPlace": _pick_place, "OpenDrawer": _open_drawer}
assert set(_EXPERTS) == set(TASKS)


def expert_actions(task: str, state) -> np.ndarray:
    """``[N,7]`` float32 cartesian-velocity actions of ``task``'s expert for states ``[N,O]`` (module docstring).

    A loop over the N rows: the experts are for data collection and tests, not a training hot path."""
    s = np.asarray(state.cpu() if isinstance(state, torch.Tensor) else state, dtype=np.float64)
    fn = _EXPERTS[task]
    return np.stack([fn(row) for row in s]).astype(np.float32)  # [N,7]


class ScriptedExpert:
    """``task``'s expert as a policy: ``expert(state [N,O] tensor) -> actions [N,7] tensor`` on the state's device."""

    def __init__(self, task: str) -> None:
        if task not in _EXPERTS:
            from ctrl_rl.errors import UserInputError

            raise UserInputError(f"no scripted expert for task {task!r}: expected one of {', '.join(TASKS)}.")
        self.task = task

    def __call__(self, state):
        import torch

        if isinstance(state, dict):
            state = state["state"]
        return torch.from_numpy(expert_actions(self.task, state)).to(state.device)
