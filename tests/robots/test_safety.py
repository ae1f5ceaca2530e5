"""The safety filter never lets a command leave the limits (property tests over arbitrary proposals, NaN and inf
included), and changes nothing that was already safe."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.safety import RobotState, SafetyConfig, SafetyFilter
from ctrl_rl.robots.spec import ActionSpace, franka_droid

ROBOT = franka_droid()
LO, HI = np.array(ROBOT.joint_pos_low), np.array(ROBOT.joint_pos_high)
VMAX = np.array(ROBOT.joint_vel_limit) / ROBOT.control_hz
WLO, WHI = np.array(ROBOT.workspace_low), np.array(ROBOT.workspace_high)
EPS = 1e-9

anything = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                     st.floats(min_value=-3, max_value=3), st.sampled_from([0.0, 1.0, -1.0, 1e30, -1e30]))


def vec(n):
    return st.lists(anything, min_size=n, max_size=n).map(np.array)


def inside(lo, hi):
    n = len(lo)
    return st.lists(st.floats(0, 1), min_size=n, max_size=n).map(
        lambda u: np.asarray(lo) + np.array(u) * (np.asarray(hi) - np.asarray(lo)))


@settings(max_examples=300, deadline=None)
@given(proposals=st.lists(vec(7), min_size=1, max_size=6), q=inside(LO, HI))
def test_joint_velocity_commands_keep_joints_inside_limits_and_speeds(proposals, q):
    f = SafetyFilter(ROBOT.action_space("joint_velocity"), ROBOT)
    for a in proposals:
        out, reasons = f.filter(a, RobotState(joint_position=q))
        assert np.isfinite(out).all() and (np.abs(out) <= 1).all()
        target = q + out * 0.2
        assert (target >= LO - EPS).all() and (target <= HI + EPS).all()
        assert (np.abs(target - q) <= VMAX + EPS).all()
        if not np.isfinite(a).all():
            assert "nonfinite" in reasons
        q = target  # the robot follows


@settings(max_examples=300, deadline=None)
@given(proposals=st.lists(vec(7), min_size=1, max_size=6), q=inside(LO, HI))
def test_joint_position_targets_stay_inside_and_are_reachable_in_one_step(proposals, q):
    f = SafetyFilter(ROBOT.action_space("joint_position"), ROBOT, SafetyConfig(joint_margin=0.05))
    for a in proposals:
        out, _ = f.filter(a, RobotState(joint_position=q))
        assert np.isfinite(out).all() and (out >= LO - EPS).all() and (out <= HI + EPS).all()
        assert (np.abs(out - q) <= VMAX + EPS).all()
        q = out


@settings(max_examples=300, deadline=None)
@given(proposals=st.lists(vec(7), min_size=1, max_size=6), p=inside(WLO, WHI))
def test_cartesian_commands_keep_the_end_effector_in_the_workspace(proposals, p):
    f = SafetyFilter(ROBOT.action_space("cartesian_velocity"), ROBOT)
    for a in proposals:
        out, _ = f.filter(a, RobotState(ee_position=p))
        assert np.isfinite(out).all() and (np.abs(out) <= 1).all()
        p = p + out[:3] * 0.075
        assert (p >= WLO - EPS).all() and (p <= WHI + EPS).all()


@settings(max_examples=200, deadline=None)
@given(proposals=st.lists(vec(7), min_size=2, max_size=6), p=st.lists(st.floats(-3, 3), min_size=3, max_size=3))
def test_from_outside_the_workspace_no_axis_moves_further_out(proposals, p):
    f = SafetyFilter(ROBOT.action_space("cartesian_velocity"), ROBOT)
    p = np.array(p)
    for a in proposals:
        out, _ = f.filter(a, RobotState(ee_position=p))
        nxt = p + out[:3] * 0.075
        gap_before = np.maximum(WLO - p, 0) + np.maximum(p - WHI, 0)
        gap_after = np.maximum(WLO - nxt, 0) + np.maximum(nxt - WHI, 0)
        assert (gap_after <= gap_before + EPS).all()
        p = nxt


@settings(max_examples=300, deadline=None)
@given(proposals=st.lists(vec(3), min_size=1, max_size=8), d=st.floats(0.01, 1.0))
def test_bounds_and_rate_limit_without_a_robot(proposals, d):
    space = ActionSpace("env", (-2.0, -1.0, 0.0), (2.0, 1.0, 5.0), ("env",) * 3)
    f = SafetyFilter(space, None, SafetyConfig(max_step_change=d))
    prev = None
    for a in proposals:
        out, reasons = f.filter(a)
        assert np.isfinite(out).all() and (out >= space.low).all() and (out <= space.high).all()
        if prev is not None:
            assert (np.abs(out - prev) <= d + EPS).all()
        if not np.isfinite(a).all():  # held: the last safe command, or no motion at the start
            assert "nonfinite" in reasons
            assert np.array_equal(out, prev) if prev is not None else np.array_equal(out, [0.0, 0.0, 0.0])
        prev = out


def test_a_safe_command_passes_unchanged_and_counts_nothing():
    f = SafetyFilter(ROBOT.action_space("cartesian_velocity"), ROBOT)
    a = np.array([0.1, -0.2, 0.3, 0.0, 0.1, -0.1, 0.5])
    out, reasons = f.filter(a, RobotState(ee_position=np.array([0.5, 0.0, 0.3])))
    assert reasons == [] and np.array_equal(out, a)
    assert f.stats()["ticks"] == 1 and all(v == 0 for k, v in f.stats().items() if k.startswith("interventions"))


def test_each_reason_is_reported():
    jv = SafetyFilter(ROBOT.action_space("joint_velocity"), ROBOT)
    q = np.array(ROBOT.home)
    assert jv.filter([math.nan] * 7, RobotState(joint_position=q))[1] == ["nonfinite"]
    assert jv.filter([5.0] + [0.0] * 6, RobotState(joint_position=q))[1] == ["bounds", "joint_velocity"]
    at_limit = q.copy()
    at_limit[0] = HI[0]
    assert "joint_position" in jv.filter([0.5] + [0.0] * 6, RobotState(joint_position=at_limit))[1]
    cv = SafetyFilter(ROBOT.action_space("cartesian_velocity"), ROBOT)
    corner = WHI.copy()
    assert cv.filter([1.0, 0, 0, 0, 0, 0, 0], RobotState(ee_position=corner))[1] == ["workspace"]
    assert cv.stats()["interventions/workspace"] == 1


def test_nonfinite_first_command_of_an_absolute_space_holds_the_current_joints():
    f = SafetyFilter(ROBOT.action_space("joint_position"), ROBOT)
    q = np.array(ROBOT.home)
    out, reasons = f.filter([math.inf] * 7, RobotState(joint_position=q))
    assert reasons == ["nonfinite"] and np.allclose(out, q)


@pytest.mark.parametrize("kw,needle", [(dict(max_step_change=0.0), "max_step_change"),
                                        (dict(joint_margin=-1.0), "joint_margin"),
                                        (dict(vel_fraction=1.5), "vel_fraction")])
def test_bad_safety_settings_are_one_sentence(kw, needle):
    with pytest.raises(UserInputError, match=needle):
        SafetyConfig(**kw)


# -- the rate limit with a robot in the loop: it holds on every output, or the output says a limit overrode it --
def joint_target_is_safe(out, q, step):
    """Independent of the filter: the joint target of ``out`` is inside the margins (from outside: no further out)
    and reachable within one tick."""
    target = q + out * step if step is not None else out
    lo, hi = np.minimum(LO + 0.02, q), np.maximum(HI - 0.02, q)
    return bool((target >= lo - EPS).all() and (target <= hi + EPS).all() and (np.abs(target - q) <= VMAX + EPS).all())


@settings(max_examples=300, deadline=None)
@given(proposals=st.lists(vec(7), min_size=2, max_size=8), q=inside(LO, HI), d=st.floats(0.01, 0.5),
       space=st.sampled_from(["joint_velocity", "joint_position"]))
def test_rate_limit_holds_with_joint_limits_unless_a_limit_overrides_it(proposals, q, d, space):
    f = SafetyFilter(ROBOT.action_space(space), ROBOT, SafetyConfig(max_step_change=d))
    step = 0.2 if space == "joint_velocity" else None
    prev = None
    for a in proposals:
        out, reasons = f.filter(a, RobotState(joint_position=q))
        assert np.isfinite(out).all() and (out >= f.low).all() and (out <= f.high).all()
        assert joint_target_is_safe(out, q, step)
        if prev is not None:
            within = (np.abs(out - prev) <= d + EPS).all()
            assert within != ("rate_overridden" in reasons)
            if not within:  # overriding was needed: the rate box's nearest command would break a joint limit
                nearest = np.clip(out, prev - d, prev + d)
                assert not joint_target_is_safe(nearest, q, step)
        q = q + out * step if step is not None else out  # the robot follows
        prev = out


@settings(max_examples=300, deadline=None)
@given(proposals=st.lists(vec(7), min_size=2, max_size=8), p=inside(WLO, WHI), d=st.floats(0.01, 0.5))
def test_rate_limit_holds_with_the_workspace_unless_the_box_overrides_it(proposals, p, d):
    f = SafetyFilter(ROBOT.action_space("cartesian_velocity"), ROBOT, SafetyConfig(max_step_change=d))
    prev = None
    for a in proposals:
        out, reasons = f.filter(a, RobotState(ee_position=p))
        assert np.isfinite(out).all() and (np.abs(out) <= 1).all()
        nxt = p + out[:3] * 0.075
        assert (nxt >= WLO - EPS).all() and (nxt <= WHI + EPS).all()
        if prev is not None:
            within = (np.abs(out - prev) <= d + EPS).all()
            assert within != ("rate_overridden" in reasons)
            if not within:
                nearest = p + np.clip(out, prev - d, prev + d)[:3] * 0.075
                assert ((nearest < WLO - EPS) | (nearest > WHI + EPS)).any()
        p, prev = nxt, out


def test_a_joint_near_its_limit_after_a_fast_command_overrides_the_rate_and_says_so():
    """The case that broke the rate limit silently: tick 1 sends 0.1, then joint 0 stands beyond its margin."""
    f = SafetyFilter(ROBOT.action_space("joint_velocity"), ROBOT, SafetyConfig(max_step_change=0.1))
    q = np.array(ROBOT.home)
    out, reasons = f.filter([0.1] + [0.0] * 6, RobotState(joint_position=q))
    assert out[0] == 0.1 and reasons == []
    out, reasons = f.filter([0.3] + [0.0] * 6, RobotState(joint_position=q))
    assert out[0] == pytest.approx(0.2) and reasons == ["rate"]
    q[0] = HI[0] - 0.005  # beyond the 0.02 margin: the position limit pulls it back, past the rate limit
    out, reasons = f.filter([0.3] + [0.0] * 6, RobotState(joint_position=q))
    assert out[0] == pytest.approx((HI[0] - 0.02 - q[0]) / 0.2)
    assert "joint_position" in reasons and "rate_overridden" in reasons
    assert f.stats()["interventions/rate_overridden"] == 1
    q[0] = HI[0] - 0.03  # inside the margin: a command within the rate limit is safe, and it is the one sent
    f2 = SafetyFilter(ROBOT.action_space("joint_velocity"), ROBOT, SafetyConfig(max_step_change=0.1))
    f2.filter([0.1] + [0.0] * 6, RobotState(joint_position=np.array(ROBOT.home)))
    out, reasons = f2.filter([0.3] + [0.0] * 6, RobotState(joint_position=q))
    assert abs(out[0] - 0.1) <= 0.1 + 1e-12 and "rate_overridden" not in reasons
    assert q[0] + out[0] * 0.2 <= HI[0] - 0.02 + 1e-12
