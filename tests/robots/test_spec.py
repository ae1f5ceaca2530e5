"""RobotSpec: the DROID Franka's figures, and inverted or missing limits refused in one sentence."""

import dataclasses
import json
import math

import pytest

from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import ActionSpace, RobotSpec, franka_droid, get_robot


def test_franka_droid_matches_droid():
    r = franka_droid()
    assert r.num_joints == 7 and r.control_hz == 15.0 and r.dt == pytest.approx(1 / 15)
    assert r.home == pytest.approx((0.0, -math.pi / 5, 0.0, -4 * math.pi / 5, 0.0, 3 * math.pi / 5, 0.0))
    cart = r.action_space()  # the default
    assert cart.name == "cartesian_velocity" and cart.kind == "delta" and cart.dim == 7
    assert cart.step_scale == (0.075,) * 3 + (0.15,) * 3 + (0.25,)
    assert cart.units == ("m",) * 3 + ("rad",) * 3 + ("1",)
    assert r.action_space("joint_velocity").step_scale == (0.2,) * 7
    jp = r.action_space("joint_position")
    assert jp.kind == "absolute" and jp.low == r.joint_pos_low and jp.high == r.joint_pos_high
    assert r.action_space("gripper_position").low == (0.0,) and r.action_space("gripper_position").high == (1.0,)
    # the home pose lies inside the limits (checked at construction) and joint 4 is always bent
    assert all(hi < 0 for hi in r.joint_pos_high[3:4])
    assert get_robot("franka_droid") == r


def test_round_trip_through_json():
    r = franka_droid()
    assert RobotSpec.from_dict(json.loads(r.to_json())) == r


BASE = dict(name="arm", joint_names=("j1", "j2"), joint_pos_low=(-1.0, -1.0), joint_pos_high=(1.0, 1.0),
            joint_vel_limit=(1.0, 1.0), joint_effort_limit=(5.0, 5.0), control_hz=10.0, home=(0.0, 0.0))


@pytest.mark.parametrize("change,needle", [
    (dict(joint_pos_low=(-1.0, 2.0)), "inverted"),
    (dict(joint_pos_high=(1.0,)), "2 values"),
    (dict(joint_vel_limit=(1.0, -1.0)), "joint_vel_limit"),
    (dict(joint_effort_limit=(float("nan"), 1.0)), "NaN"),
    (dict(joint_pos_low=None), "list of numbers"),
    (dict(joint_names=()), "no joints"),
    (dict(control_hz=0), "control_hz"),
    (dict(home=(0.0, 3.0)), "home pose"),
    (dict(workspace_low=(0.0, 0.0, 2.0)), "workspace"),
    (dict(gripper_low=1.0, gripper_high=0.0), "gripper"),
    (dict(action_spaces=(ActionSpace("a", (0.0,), (1.0,), ("m",)),), default_action="b"), "default action"),
])
def test_bad_limits_are_one_sentence(change, needle):
    with pytest.raises(UserInputError) as e:
        RobotSpec(**{**BASE, **change})
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw,needle", [
    (dict(low=(1.0,), high=(0.0,)), "inverted"),
    (dict(units=("m", "m")), "one unit per component"),
    (dict(kind="delta"), "step_scale"),
    (dict(kind="delta", step_scale=(-0.1,)), "step_scale"),
    (dict(kind="velocity"), "'delta' or 'absolute'"),
])
def test_bad_action_spaces_are_one_sentence(kw, needle):
    with pytest.raises(UserInputError, match=needle):
        ActionSpace(**{**dict(name="a", low=(0.0,), high=(1.0,), units=("m",)), **kw})


def test_unknown_names_say_what_exists():
    with pytest.raises(UserInputError, match="cartesian_velocity"):
        franka_droid().action_space("torque")
    with pytest.raises(UserInputError, match="franka_droid"):
        get_robot("ur5")
    with pytest.raises(UserInputError, match="unknown fields"):
        RobotSpec.from_dict({**dataclasses.asdict(franka_droid()), "payload": 3})
