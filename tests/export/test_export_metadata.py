"""The export's ``deploy`` block: what the robot side needs without building the task (joint names, default joint
positions, PD gains, action scale / offset / kind, control rate, observation layout), written to ``policy.json`` and
the ONNX model's ``metadata_props`` and read back equal; the runtime takes the robot and the filter's state from it.
Franka: a tiny manip:Reach run exported end to end; a legged robot: a RobotSpec with gains and a joint-offset action
(the shape of MuJoCo Playground's Go1) through the same functions; Go1: a tiny PPO run on
envpool:Go1JoystickFlatTerrain-v1 exported end to end (the task's own robot spec) and deployed against the task."""

import json
import math

import numpy as np
import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.core.obs import ObsPart
from ctrl_rl.deploy.export import deploy_metadata, onnx_deploy_props, parse_onnx_deploy_props
from ctrl_rl.deploy.runtime import export_robot, robot_state
from ctrl_rl.deploy.sidecar import read_export
from ctrl_rl.envs import spec_of
from ctrl_rl.envs.protocol import EnvSpec, RobotStateLayout
from ctrl_rl.robots.spec import ActionSpace, RobotSpec, franka_droid

pytestmark = pytest.mark.filterwarnings("ignore")

SAC = ["--num-envs", "2", "--total-steps", "32", "--learning-starts", "16", "--batch-size", "16", "--actor-hidden",
       "16", "--critic-hidden", "16", "--threads", "1", "--no-progress"]


def _onnx_props(path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}



def assert_onnx_carries(path, meta: dict, dep: dict) -> None:
    """The ONNX model holds the whole sidecar as JSON and the deploy fields flat, equal to ``policy.json``'s."""
    props = _onnx_props(path)
    assert json.loads(props["ctrl_rl"]) == meta
    flat = parse_onnx_deploy_props(props)
    for k in ("joint_names", "default_joint_pos", "joint_stiffness", "joint_damping", "action_scale",
              "action_offset", "robot", "action_space", "action_kind", "control_hz"):
        assert flat[k] == dep[k], k
    assert flat["observation_names"] == ["state"]

def test_a_franka_export_carries_the_robot_side_metadata_and_it_reads_back_equal(tmp_path, capsys):
    pytest.importorskip("mujoco")
    pytest.importorskip("envpool_assets")
    pytest.importorskip("onnxruntime")
    d = tmp_path / "reach"
    assert main(["train", "sac", "--env", "manip:Reach", *SAC, "--run-dir", str(d)]) == 0, capsys.readouterr().err
    assert main(["export", str(d), "--out", str(d / "out")]) == 0, capsys.readouterr().err
    meta = read_export(d / "out")
    dep = meta["deploy"]
    robot = franka_droid()
    assert dep["robot"] == robot.name and dep["joint_names"] == list(robot.joint_names)
    assert dep["default_joint_pos"] == pytest.approx(list(robot.home))
    assert dep["joint_stiffness"] is None and dep["joint_damping"] is None  # the policy commands no PD loop
    assert dep["action_space"] == "cartesian_velocity" and dep["action_kind"] == "delta"
    assert dep["action_scale"] == pytest.approx([0.075] * 3 + [0.15] * 3 + [0.25]) and dep["action_offset"] == [0] * 7
    assert dep["control_hz"] == pytest.approx(15.0)
    (state,) = dep["observation"]
    O = spec_of("manip:Reach").obs_dim  # 14 proprio + the task's privileged state
    assert state["name"] == "state" and state["shape"] == [O] and state["dtype"] == "float32"
    assert state["slices"] == [{"name": "joint_position", "start": 0, "stop": 7, "units": "rad"},
                               {"name": "ee_position", "start": 7, "stop": 10, "units": "m"}]
    # the ONNX model holds the same: the whole sidecar as JSON, and the deploy fields flat
    assert_onnx_carries(d / "out" / "policy.onnx", meta, dep)
    # the runtime's view: the robot spec and the filter's state without building the task
    assert export_robot(meta) == robot
    obs = np.arange(O, dtype=np.float32)
    s = robot_state(meta, {"state": obs})
    assert s.joint_position is not None and s.ee_position is not None
    np.testing.assert_array_equal(s.joint_position, obs[:7])
    np.testing.assert_array_equal(s.ee_position, obs[7:10])


def legged() -> RobotSpec:
    """A 12-joint legged robot as MuJoCo Playground's Go1 joystick task drives it: joint targets = default pose +
    0.3 * action, PD gains 35 / 0.5, 50 Hz (the figures are the shape of the test, not a robot spec of ctrl_rl)."""
    names = tuple(f"{leg}_{j}_joint" for leg in ("FR", "FL", "RR", "RL") for j in ("hip", "thigh", "calf"))
    home = (0.1, 0.9, -1.8, -0.1, 0.9, -1.8, 0.1, 0.9, -1.8, -0.1, 0.9, -1.8)
    low, high = (-1.0, -1.5, -2.7) * 4, (1.0, 3.4, -0.8) * 4
    space = ActionSpace("joint_position_offset", (-1.0,) * 12, (1.0,) * 12, ("rad",) * 12, "absolute",
                        step_scale=(0.3,) * 12, offset=home, description="default pose + 0.3 * action")
    return RobotSpec("legged_test", names, low, high, (30.0,) * 12, (23.7,) * 12, 50.0, home, action_spaces=(space,),
                     default_action=space.name, joint_stiffness=(35.0,) * 12, joint_damping=(0.5,) * 12)


def test_a_legged_robots_gains_and_joint_offsets_round_trip():
    robot = legged()
    assert RobotSpec.from_dict(json.loads(robot.to_json())) == robot
    spec = EnvSpec("envpool:LeggedTest", (48,), False, 12, (-1.0,) * 12, (1.0,) * 12, dt=0.02, backend="envpool",
                   obs_parts=(ObsPart("state", (48,), torch.float32),), robot=robot, action_units=("rad",) * 12,
                   action_space_name="joint_position_offset",
                   robot_state_layout=RobotStateLayout(joint_position=(12, 24), ee_position=(0, 0)))
    dep = deploy_metadata(spec, spec, ["state"])
    assert dep["joint_stiffness"] == [35.0] * 12 and dep["joint_damping"] == [0.5] * 12
    assert dep["action_kind"] == "absolute" and dep["action_scale"] == [0.3] * 12
    assert dep["action_offset"] == list(robot.home) and dep["default_joint_pos"] == list(robot.home)
    assert dep["control_hz"] == pytest.approx(50.0)
    assert dep["observation"][0]["slices"] == [{"name": "joint_position", "start": 12, "stop": 24, "units": "rad"}]
    dep = json.loads(json.dumps(dep))
    flat = parse_onnx_deploy_props(onnx_deploy_props(dep))
    assert all(flat[k] == dep[k] for k in ("joint_names", "default_joint_pos", "joint_stiffness", "joint_damping",
                                           "action_scale", "action_offset", "control_hz"))
    s = robot_state({"deploy": dep}, {"state": np.arange(48.0)})
    assert s.ee_position is None and s.joint_position is not None and s.joint_position.tolist() == list(range(12, 24))


def test_a_robot_spec_refuses_half_gains_and_misfit_offsets():
    from ctrl_rl.errors import UserInputError

    r = legged()
    with pytest.raises(UserInputError, match="both PD gains"):
        RobotSpec(**{**r.__dict__, "joint_damping": ()})
    with pytest.raises(UserInputError, match="12 gains"):
        RobotSpec(**{**r.__dict__, "joint_stiffness": (1.0,) * 3})
    with pytest.raises(UserInputError, match="offset"):
        ActionSpace("v", (-1.0,), (1.0,), ("rad",), "delta", step_scale=(0.2,), offset=(0.0,))
    assert math.isclose(ActionSpace("p", (-1.0,), (1.0,), ("rad",)).scale[0], 1.0)


GO1 = "envpool:Go1JoystickFlatTerrain-v1"
GO1_JOINTS = [f"{leg}_{j}_joint" for leg in ("FR", "FL", "RR", "RL") for j in ("hip", "thigh", "calf")]
GO1_HOME = [0.1, 0.9, -1.8, -0.1, 0.9, -1.8, 0.1, 0.9, -1.8, -0.1, 0.9, -1.8]  # the scene's "home" keyframe


def test_a_go1_export_carries_the_robot_side_metadata_and_deploys(tmp_path, capsys):
    """PPO on MuJoCo Playground's Go1 (a few steps), exported: the deploy block and the ONNX metadata hold the 12
    joints in actuator order, the home keyframe as default pose and as the action's offset, envpool's gains and
    action scale, 50 Hz and the robot's observation only; the deploy runtime then drives the simulator with it."""
    pytest.importorskip("envpool")
    pytest.importorskip("onnxruntime")
    d = tmp_path / "go1"
    args = ["train", "ppo", "--env", GO1, "--num-envs", "2", "--total-steps", "64", "--rollout-steps", "32",
            "--minibatch-size", "32", "--epochs", "1", "--threads", "1", "--no-progress", "--run-dir", str(d)]
    assert main(args) == 0, capsys.readouterr().err
    assert main(["export", str(d), "--out", str(d / "out")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    meta = read_export(d / "out")
    dep = meta["deploy"]
    assert dep["robot"] == "unitree_go1" and dep["joint_names"] == GO1_JOINTS
    assert dep["default_joint_pos"] == GO1_HOME
    assert dep["joint_stiffness"] == [35.0] * 12 and dep["joint_damping"] == [0.5] * 12
    assert dep["action_space"] == "joint_position_offset" and dep["action_kind"] == "absolute"
    assert dep["action_scale"] == [0.5] * 12 and dep["action_offset"] == GO1_HOME  # target = home + 0.5 * action
    assert dep["control_hz"] == pytest.approx(50.0)
    (state,) = dep["observation"]  # the policy's part only: privileged_state is the simulator's
    assert (state["name"], state["part"], state["shape"], state["dtype"]) == ("state", "state", [48], "float32")
    assert [i["name"] for i in meta["inputs"]] == ["state"]
    assert meta["action"]["units"] == ["rad"] * 12
    assert_onnx_carries(d / "out" / "policy.onnx", meta, dep)
    assert export_robot(meta) == spec_of(GO1).robot  # the robot side reads the whole spec back

    assert main(["deploy", str(d / "out"), "--sim", GO1, "--episodes", "1", "--max-steps", "50", "--rate", "0"]) == 0, \
        capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ticks"] == 50, summary
