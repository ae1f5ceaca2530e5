"""The safety filter between a policy and a robot: what leaves it is inside the limits, whatever went in.

``SafetyFilter.filter(action, state)`` takes the policy's proposed command (the export's ``action`` output, in
the action space's units) and the robot's current state, and returns the command to send plus the reasons it
was changed. Every limit is a box on the command, one interval per component, so the filter intersects them:

1. **non-finite guard**: a command with NaN or inf anywhere is dropped whole and the last safe command is held;
   before any was sent: the current joint positions for a joint-position space, else zeros moved into the bounds
   (no motion for a ``delta`` space). Reason ``nonfinite``.
2. **bounds**: the action space's ``[low, high]``. Reason ``bounds``.
3. **joint limits** (joint spaces with a known state): the joint target implied by the command
   (``q + a * step_scale`` for ``joint_velocity``, ``a`` for ``joint_position``) stays inside the position
   limits shrunk by ``joint_margin`` and is reached no faster than the velocity limits allow in one control step
   (``|target - q| <= vel_limit * dt * vel_fraction``). From outside the position limits the target moves back
   towards them at that speed. Reasons ``joint_position`` and ``joint_velocity``.
4. **workspace** (cartesian spaces with a known end-effector position): the commanded position step
   (``a[:3] * step_scale[:3]``) keeps the target inside the robot's workspace box; from outside the box, only
   motion back towards it passes. Reason ``workspace``.
5. **rate limit**: each component moves at most ``max_step_change`` from the previous command (default: off; set
   it to smooth commands). Reason ``rate``.

The command sent is the proposal clipped into the intersection of all five boxes, so the rate limit holds on
every output together with every projection. When the boxes do not meet (the previous command was fast towards a
limit that is now close, or the robot stands beyond a limit and the rate limit would keep it there), the
priority is: **bounds > joint position / velocity limits and workspace > rate limit**. The command is then the
point of the safe box nearest to the rate limit's box, and the reasons include ``rate_overridden``: the change
from the previous command is larger than ``max_step_change`` on that tick. Plain NumPy, float64 inside: this runs
beside onnxruntime on the robot computer, once per control tick.

A robot without a spec (a simulator task such as Pendulum) gets the guard, the bounds and the rate limit with the
export's action bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import ActionSpace, RobotSpec

REASONS = ("nonfinite", "bounds", "rate", "joint_position", "joint_velocity", "workspace", "rate_overridden")


@dataclass(frozen=True)
class SafetyConfig:
    max_step_change: float | None = None
    """Largest change of any command component from one tick to the next (the space's units; None: no limit)."""
    joint_margin: float = 0.02
    """Distance (rad) kept from every joint position limit."""
    vel_fraction: float = 1.0
    """Fraction of the joint velocity limits a joint target may demand within one control step."""

    def __post_init__(self) -> None:
        if self.max_step_change is not None and not (np.isfinite(self.max_step_change) and self.max_step_change > 0):
            raise UserInputError(f"invalid max_step_change {self.max_step_change!r}: "
                                 "expected a positive number or None")
        if not (np.isfinite(self.joint_margin) and self.joint_margin >= 0):
            raise UserInputError(f"invalid joint_margin {self.joint_margin!r}: "
                                 "expected a non-negative number of radians")
        if not (np.isfinite(self.vel_fraction) and 0 < self.vel_fraction <= 1):
            raise UserInputError(f"invalid vel_fraction {self.vel_fraction!r}: expected a number in (0, 1]")


@dataclass
class RobotState:
    """What the filter needs to know of the robot now (any field may be unknown: None)."""

    joint_position: np.ndarray | None = None
    """q [J] (rad)."""
    ee_position: np.ndarray | None = None
    """End-effector position [3] (m, robot base frame)."""


@dataclass
class SafetyFilter:
    """See the module docstring. ``space`` is the commanded action space; ``robot`` its robot (optional)."""

    space: ActionSpace
    robot: RobotSpec | None = None
    config: SafetyConfig = field(default_factory=SafetyConfig)

    def __post_init__(self) -> None:
        self.low = np.asarray(self.space.low, dtype=np.float64)  # [A]
        self.high = np.asarray(self.space.high, dtype=np.float64)  # [A]
        self.step = np.asarray(self.space.step_scale, dtype=np.float64) if self.space.kind == "delta" else None
        self.last: np.ndarray | None = None
        self.counts = {r: 0 for r in REASONS}
        self.ticks = 0
        r = self.robot
        self.joints = r is not None and self.space.name in ("joint_velocity", "joint_position") \
            and self.space.dim >= r.num_joints
        self.cartesian = r is not None and self.space.name.startswith("cartesian") and self.space.dim >= 3 \
            and self.step is not None

    def reset(self) -> None:
        """Forget the last command (a new episode); the intervention counts are kept."""
        self.last = None

    def _hold(self, state: RobotState) -> np.ndarray:
        """The last safe command; before any: the current joints for a joint-position space, else zeros (no
        motion for a delta space, the neutral command of an unknown one) moved into the bounds."""
        out = np.clip(np.zeros_like(self.low), self.low, self.high)
        if self.last is not None:
            return self.last.copy()
        if self.joints and self.step is None and state.joint_position is not None:
            assert self.robot is not None  # self.joints needs a robot
            J = self.robot.num_joints
            out[:J] = np.clip(np.asarray(state.joint_position, dtype=np.float64)[:J], self.low[:J], self.high[:J])
        return out

    def filter(self, action, state: RobotState | None = None) -> tuple[np.ndarray, list[str]]:
        """``(safe command [A] float64, reasons it was changed)``; see the module docstring."""
        state = state or RobotState()
        a = np.asarray(action, dtype=np.float64).reshape(-1)  # [A]
        reasons: list[str] = []
        if a.shape != self.low.shape:
            raise ValueError(f"the command has {a.size} components, the action space {self.space.name!r} "
                             f"{self.low.size}")
        if not np.isfinite(a).all():
            a = self._hold(state)
            reasons.append("nonfinite")
        if ((a < self.low) | (a > self.high)).any():
            reasons.append("bounds")
        lo, hi = self.low.copy(), self.high.copy()  # [A]: the safe box, narrowed by each limit in turn
        if self.joints and state.joint_position is not None:
            self._joint_box(np.asarray(state.joint_position, dtype=np.float64), np.clip(a, lo, hi), lo, hi, reasons)
        if self.cartesian and state.ee_position is not None:
            self._workspace_box(np.asarray(state.ee_position, dtype=np.float64), np.clip(a, lo, hi), lo, hi, reasons)
        out = np.clip(a, lo, hi)  # [A]
        if self.config.max_step_change is not None and self.last is not None:
            d = self.config.max_step_change
            r_lo, r_hi = self.last - d, self.last + d  # [A]
            if ((out < r_lo) | (out > r_hi)).any():
                reasons.append("rate")
            # clip into the rate box, then into the safe box: inside both where they meet, else the safe point
            # nearest the rate box (a limit wins over smoothness)
            out = np.clip(np.clip(out, r_lo, r_hi), lo, hi)
            if ((out < r_lo - 1e-12) | (out > r_hi + 1e-12)).any():
                reasons.append("rate_overridden")
        # untouched components keep their proposal bit for bit (np.clip of an inside value returns it)
        self.last = out.copy()
        self.ticks += 1
        for r in reasons:
            self.counts[r] += 1
        return out, reasons

    def _joint_box(self, q: np.ndarray, a: np.ndarray, lo: np.ndarray, hi: np.ndarray, reasons: list[str]) -> None:
        """Narrow ``lo``/``hi`` [A] in place to the commands whose joint targets respect the position and velocity
        limits; ``a`` (inside the bounds) only decides which reasons are reported."""
        r, c = self.robot, self.config
        assert r is not None
        J = r.num_joints
        q = q[:J]
        p_lo = np.asarray(r.joint_pos_low) + c.joint_margin  # [J]
        p_hi = np.maximum(p_lo, np.asarray(r.joint_pos_high) - c.joint_margin)  # [J]
        vmax = np.asarray(r.joint_vel_limit) * r.dt * c.vel_fraction  # [J]: largest move in one tick
        v_lo, v_hi = q - vmax, q + vmax  # [J]
        # targets inside both; where they do not meet (q beyond a limit by more than vmax) the reachable target
        # nearest the limits: the joint moves back at full allowed speed
        t_lo = np.clip(p_lo, v_lo, v_hi)  # [J]
        t_hi = np.clip(p_hi, v_lo, v_hi)  # [J]
        target = q + a[:J] * self.step[:J] if self.step is not None else a[:J]  # [J]
        if ((target < p_lo - 1e-12) | (target > p_hi + 1e-12)).any():
            reasons.append("joint_position")
        inside = np.clip(target, p_lo, p_hi)
        if ((inside < v_lo - 1e-12) | (inside > v_hi + 1e-12)).any():
            reasons.append("joint_velocity")
        if self.step is not None:  # joint velocity: a = (target - q) / step, step > 0
            c_lo, c_hi = (t_lo - q) / self.step[:J], (t_hi - q) / self.step[:J]
        else:  # joint position: the command is the target
            c_lo, c_hi = t_lo, t_hi
        lo[:J], hi[:J] = _meet(lo[:J], hi[:J], c_lo, c_hi)

    def _workspace_box(self, p: np.ndarray, a: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                       reasons: list[str]) -> None:
        """Narrow ``lo``/``hi`` [A] in place to the commands whose position step keeps the end effector inside the
        workspace box (from outside on an axis: no motion further out on that axis)."""
        assert self.robot is not None and self.step is not None
        w_lo = np.minimum(np.asarray(self.robot.workspace_low), p[:3])  # [3]
        w_hi = np.maximum(np.asarray(self.robot.workspace_high), p[:3])  # [3]
        target = p[:3] + a[:3] * self.step[:3]  # [3] m
        if ((target < w_lo - 1e-12) | (target > w_hi + 1e-12)).any():
            reasons.append("workspace")
        c_lo, c_hi = (w_lo - p[:3]) / self.step[:3], (w_hi - p[:3]) / self.step[:3]  # [3], contain 0
        lo[:3], hi[:3] = _meet(lo[:3], hi[:3], c_lo, c_hi)

    def stats(self) -> dict:
        """Ticks filtered and the interventions per reason."""
        return {"ticks": self.ticks, **{f"interventions/{r}": n for r, n in self.counts.items()}}


def _meet(lo: np.ndarray, hi: np.ndarray, c_lo: np.ndarray, c_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of the boxes ``[lo, hi]`` (the bounds, which always hold) and ``[c_lo, c_hi]``; where they
    do not meet, the single point of ``[lo, hi]`` nearest the other box."""
    new_lo = np.clip(c_lo, lo, hi)
    new_hi = np.clip(c_hi, lo, hi)
    return new_lo, np.maximum(new_lo, new_hi)
