"""The safety filter between a policy and a robot: what leaves it is inside the limits, whatever went in.

``SafetyFilter.filter(action, state)`` takes the policy's proposed command (the export's ``action`` output, in
the action space's units) and the robot's current state, and returns the command to send plus the reasons it
was changed. The checks run in this order, each on the result of the one before:

1. **non-finite guard**: a command with NaN or inf anywhere is dropped whole and the last safe command is held;
   before any was sent: the current joint positions for a joint-position space, else zeros moved into the bounds
   (no motion for a ``delta`` space). Reason ``nonfinite``.
2. **bounds**: clamp to the action space's ``[low, high]``. Reason ``bounds``.
3. **rate limit**: each component moves at most ``max_step_change`` from the previous command (default: the
   whole range per step, i.e. off; set it to smooth commands). Reason ``rate``.
4. **joint limits** (joint spaces with a known state): the joint target implied by the command
   (``q + a * step_scale`` for ``joint_velocity``, ``a`` for ``joint_position``) is kept inside the position
   limits shrunk by ``joint_margin`` and reached no faster than the velocity limits allow in one control step
   (``|target - q| <= vel_limit * dt * vel_fraction``). The command is the one that produces the projected target.
   Reasons ``joint_position`` and ``joint_velocity``.
5. **workspace** (cartesian spaces with a known end-effector position): the commanded position step
   (``a[:3] * step_scale[:3]``) is shortened per axis so the target stays inside the robot's workspace box; from
   outside the box, only motion back towards it passes. Reason ``workspace``.

After the last step the command is clamped to the bounds once more (a projection can only shrink a command,
but float rounding must not leave the box) and becomes the new last safe command. Plain NumPy, float64 inside:
this runs beside onnxruntime on the robot computer, once per control tick.

A robot without a spec (a simulator task such as Pendulum) gets steps 1-3 with the export's action bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import ActionSpace, RobotSpec

REASONS = ("nonfinite", "bounds", "rate", "joint_position", "joint_velocity", "workspace")


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
            raise UserInputError(f"invalid max_step_change {self.max_step_change!r}: expected a positive number or None")
        if not (np.isfinite(self.joint_margin) and self.joint_margin >= 0):
            raise UserInputError(f"invalid joint_margin {self.joint_margin!r}: expected a non-negative number of radians")
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
            J = self.robot.num_joints
            out[:J] = np.clip(np.asarray(state.joint_position, dtype=np.float64)[:J], self.low[:J], self.high[:J])
        return out

    def filter(self, action, state: RobotState | None = None) -> tuple[np.ndarray, list[str]]:
        """``(safe command [A] float64, reasons it was changed)``; see the module docstring."""
        state = state or RobotState()
        a = np.asarray(action, dtype=np.float64).reshape(-1)  # [A]
        reasons: list[str] = []
        if a.shape != self.low.shape:
            raise ValueError(f"the command has {a.size} components, the action space {self.space.name!r} {self.low.size}")
        if not np.isfinite(a).all():
            a = self._hold(state)
            reasons.append("nonfinite")
        clipped = np.clip(a, self.low, self.high)
        if not np.array_equal(clipped, a):
            reasons.append("bounds")
        a = clipped
        if self.config.max_step_change is not None and self.last is not None:
            d = self.config.max_step_change
            limited = np.clip(a, self.last - d, self.last + d)
            if not np.array_equal(limited, a):
                reasons.append("rate")
            a = limited
        if self.joints and state.joint_position is not None:
            a = self._joint_limits(a, np.asarray(state.joint_position, dtype=np.float64), reasons)
        if self.cartesian and state.ee_position is not None:
            a = self._workspace(a, np.asarray(state.ee_position, dtype=np.float64), reasons)
        a = np.clip(a, self.low, self.high)
        self.last = a.copy()
        self.ticks += 1
        for r in reasons:
            self.counts[r] += 1
        return a, reasons

    def _joint_limits(self, a: np.ndarray, q: np.ndarray, reasons: list[str]) -> np.ndarray:
        r, c = self.robot, self.config
        J = r.num_joints
        q = q[:J]
        lo = np.asarray(r.joint_pos_low) + c.joint_margin  # [J]
        hi = np.asarray(r.joint_pos_high) - c.joint_margin  # [J]
        vmax = np.asarray(r.joint_vel_limit) * r.dt * c.vel_fraction  # [J]: largest move in one tick
        target = q + a[:J] * self.step[:J] if self.step is not None else a[:J].copy()  # [J]
        inside = np.clip(target, lo, np.maximum(lo, hi))
        if not np.allclose(inside, target, rtol=0, atol=1e-12):
            reasons.append("joint_position")
        # from outside the limits (q itself beyond them) the projection moves towards them: still within vmax below
        slow = np.clip(inside, q - vmax, q + vmax)
        if not np.allclose(slow, inside, rtol=0, atol=1e-12):
            reasons.append("joint_velocity")
        # a target outside [lo, hi] may remain when q is far outside and vmax stops the return; it moves towards them
        out = a.copy()
        changed = slow != target  # [J]: untouched joints keep their command bit for bit
        new = (slow - q) / self.step[:J] if self.step is not None else slow
        out[:J] = np.where(changed, new, a[:J])
        return out

    def _workspace(self, a: np.ndarray, p: np.ndarray, reasons: list[str]) -> np.ndarray:
        lo, hi = np.asarray(self.robot.workspace_low), np.asarray(self.robot.workspace_high)  # [3]
        step = a[:3] * self.step[:3]  # [3] m
        target = p[:3] + step
        # inside the box: stay inside; outside on an axis: allow no motion further out on that axis
        new_target = np.clip(target, np.minimum(lo, p[:3]), np.maximum(hi, p[:3]))
        if not np.allclose(new_target, target, rtol=0, atol=1e-12):
            reasons.append("workspace")
        out = a.copy()
        out[:3] = np.where(new_target != target, (new_target - p[:3]) / self.step[:3], a[:3])
        return out

    def stats(self) -> dict:
        """Ticks filtered and the interventions per reason."""
        return {"ticks": self.ticks, **{f"interventions/{r}": n for r, n in self.counts.items()}}
