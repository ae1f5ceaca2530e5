"""The robot of a MuJoCo Playground legged task (``envs/playground.py``): the model file read as XML
(``envs/mjcf.py``) equals what MuJoCo compiles from it, and the Go1 joystick spec carries the joints in actuator
order, the ``home`` keyframe as default pose, envpool's gains, action scale and rate, without a simulator."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from ctrl_rl.envs.mjcf import read_mjcf
from ctrl_rl.envs.registry import make_env, spec_of
from ctrl_rl.errors import UserInputError

envpool = pytest.importorskip("envpool")

from ctrl_rl.envs.playground import ROBOT_FILES  # noqa: E402  (after the skip)

GO1 = "Go1JoystickFlatTerrain-v1"
GO1_JOINTS = tuple(f"{leg}_{j}_joint" for leg in ("FR", "FL", "RR", "RL") for j in ("hip", "thigh", "calf"))
GO1_HOME = (0.1, 0.9, -1.8, -0.1, 0.9, -1.8, 0.1, 0.9, -1.8, -0.1, 0.9, -1.8)


def _compiled(path: str):
    mujoco = pytest.importorskip("mujoco")
    return mujoco.MjModel.from_xml_path(path)


def _check_against_mujoco(path: str) -> None:
    m, model = read_mjcf(path), _compiled(path)
    assert [j.name for j in m.joints] == [model.joint(i).name for i in range(model.njnt)]
    assert [j.qpos_adr for j in m.joints] == list(model.jnt_qposadr)
    for i, j in enumerate(m.joints):
        if model.jnt_limited[i]:
            assert j.range == pytest.approx(tuple(model.jnt_range[i]), abs=1e-12)
        else:
            assert j.range is None
    assert [a.joint for a in m.actuators] == [model.joint(model.actuator_trnid[i, 0]).name for i in range(model.nu)]
    for i, a in enumerate(m.actuators):
        assert a.kp == model.actuator_gainprm[i, 0]
        # MuJoCo gives (0, 0) where a range is not set
        assert (a.ctrlrange or (0, 0)) == pytest.approx(tuple(model.actuator_ctrlrange[i]), abs=1e-12)
        assert (a.forcerange or (0, 0)) == pytest.approx(tuple(model.actuator_forcerange[i]))
    scalar = [j.qpos_adr for j in m.joints if j.type in ("hinge", "slide")]  # MuJoCo normalises the quaternions
    for k in range(model.nkey):
        key = m.keyframes[model.key(k).name]
        assert [key[a] for a in scalar] == pytest.approx([model.key_qpos[k, a] for a in scalar])


@pytest.mark.parametrize("task", sorted(ROBOT_FILES))
def test_the_task_model_read_as_xml_equals_the_compiled_model(task):
    base = envpool.make_spec(task).config.base_path
    _check_against_mujoco(os.path.join(base, ROBOT_FILES[task][1]))


def test_classes_childclass_degrees_and_includes(tmp_path):
    """MJCF's defaults the reader follows on a small model: degrees by default, nested classes, a body's childclass,
    an actuator's ``inheritrange`` and an included file."""
    (tmp_path / "arm.xml").write_text("""<mujoco><worldbody><body name="b" childclass="arm">
        <joint name="free" type="free"/><geom size="0.1"/>
        <body name="c"><joint name="j1"/><geom size="0.1"/>
          <body name="d"><joint name="j2" class="wide" range="-10 20"/><joint name="s" type="slide" range="0 0.5"/>
            <geom size="0.1"/></body></body></body></worldbody></mujoco>""")
    (tmp_path / "scene.xml").write_text("""<mujoco>
      <default><joint range="-90 90"/><position kp="7"/>
        <default class="arm"><joint range="-45 45"/><default class="wide"><position kp="9" inheritrange="0.5"/>
        </default></default></default>
      <include file="arm.xml"/>
      <actuator><position name="a2" class="wide" joint="j2"/><position name="a1" joint="j1" ctrlrange="-30 30"
        forcerange="-2 2"/></actuator>
      <keyframe><key name="k" qpos="0 0 1 1 0 0 0 0.1 0.2 0.3"/></keyframe></mujoco>""")
    path = str(tmp_path / "scene.xml")
    _check_against_mujoco(path)
    m = read_mjcf(path)
    assert m.joint("j1").range == pytest.approx((-math.pi / 4, math.pi / 4))  # the body's childclass, in radians
    assert m.actuators[0].kp == 9 and m.actuators[0].ctrlrange == pytest.approx(
        (math.radians(-10 + 7.5), math.radians(20 - 7.5)))  # half the joint's range about its middle
    assert m.joint("s").qpos_adr == 9 and m.joint("s").range == (0.0, 0.5)  # slides are not converted
    # an actuator of another type would shift the ctrl order: refused in one sentence
    (tmp_path / "motor.xml").write_text((tmp_path / "scene.xml").read_text().replace(
        '<actuator>', '<actuator><motor name="m" joint="j1"/>'))
    with pytest.raises(UserInputError, match=r"actuator <motor name='m'> is not a position actuator"):
        read_mjcf(str(tmp_path / "motor.xml"))


def test_go1_spec_carries_its_robot_without_a_simulator(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("spec_of built an envpool simulator")

    monkeypatch.setattr(envpool, "make", refuse)
    spec = spec_of(f"envpool:{GO1}")
    robot = spec.robot
    assert robot is not None and robot.name == "unitree_go1"
    assert robot.joint_names == GO1_JOINTS and robot.home == GO1_HOME
    assert robot.joint_stiffness == (35.0,) * 12 and robot.joint_damping == (0.5,) * 12
    assert robot.control_hz == pytest.approx(50.0) and spec.dt == pytest.approx(0.02)
    assert robot.joint_pos_low == (-0.863, -0.686, -2.818) * 4 and robot.joint_pos_high == (0.863, 4.501, -0.888) * 4
    assert robot.joint_effort_limit == (23.7, 23.7, 35.55) * 4 and robot.joint_vel_limit == (30.1,) * 12
    space = robot.action_space(spec.action_space_name)
    assert space.kind == "absolute" and space.step_scale == (0.5,) * 12 and space.offset == GO1_HOME
    assert (space.low, space.high) == (spec.action_low, spec.action_high) and spec.action_units == ("rad",) * 12
    assert spec_of("envpool:Go1JoystickRoughTerrain-v1").robot == robot
    assert spec_of("envpool:Go1Getup-v1").robot is None  # its action moves the current pose: not this form
    # envpool's settings are followed (an option of envpool.make changes the exported figures)
    other = spec_of("envpool:Go1JoystickFlatTerrain-v1,action_scale=0.3,kp=20.0")
    assert other.robot is not None and other.robot.action_space().step_scale == (0.3,) * 12
    assert other.robot.joint_stiffness == (20.0,) * 12


def test_go1_resets_to_the_default_pose_the_spec_names():
    """The installed envpool starts an episode at its default pose: ``privileged_state``'s joint positions relative
    to that pose (after state[48], gyro, accelerometer, gravity, local and global velocities: columns 63-74) are zero
    at reset, and the robot's ``home`` is where the joints are then."""
    env = make_env(f"envpool:{GO1}", num_envs=2)
    try:
        obs = env.reset(seed=0)
        assert isinstance(obs, dict)
        rel = obs["privileged_state"][:, 63:75].numpy()
        np.testing.assert_array_equal(rel, np.zeros((2, 12), np.float32))
        assert env.spec.robot == spec_of(f"envpool:{GO1}").robot
    finally:
        env.close()
