"""The export's robot metadata comes from the env's spec (``EnvSpec.robot``, ``action_units``, ``action_space_name``):
a manipulation policy's ``policy.json`` names the robot, the units and the action space; a plain env's names none."""

import json

import pytest

from ctrl_rl.cli import main
from ctrl_rl.deploy.sidecar import read_export
from ctrl_rl.robots.spec import franka_droid

pytestmark = pytest.mark.filterwarnings("ignore")

SAC = ["--num-envs", "2", "--total-steps", "32", "--learning-starts", "16", "--batch-size", "16", "--actor-hidden",
       "16", "--critic-hidden", "16", "--threads", "1", "--no-progress"]


def _export(env_id: str, d, capsys) -> dict:
    assert main(["train", "sac", "--env", env_id, *SAC, "--run-dir", str(d)]) == 0, capsys.readouterr().err
    assert main(["export", str(d), "--format", "pt2", "--out", str(d / "out")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return read_export(d / "out")


def test_a_manipulation_export_carries_the_robot_units_and_action_space(tmp_path, capsys):
    pytest.importorskip("mujoco")
    pytest.importorskip("envpool_assets")
    meta = _export("manip:Reach,action=joint_velocity", tmp_path / "manip", capsys)
    assert meta["robot"] == json.loads(json.dumps(franka_droid().to_dict()))
    assert meta["action"]["units"] == ["rad"] * 7 + ["1"] and meta["action"]["space"] == "joint_velocity"
    assert meta["control_hz"] == pytest.approx(15.0)


def test_a_plain_export_names_no_robot(tmp_path, capsys):
    meta = _export("torch:Pendulum", tmp_path / "pendulum", capsys)
    assert meta["robot"] is None and meta["action"]["units"] == ["env"] and meta["action"]["space"] is None
