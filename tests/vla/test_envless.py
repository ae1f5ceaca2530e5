"""Real-robot data without a simulator: a DROID-layout LeRobot dataset (written as LeRobot's DROID port writes it:
``droid_features``, ``robot_type`` "Franka", 15 fps, through ``LeRobotWriter``, whose files are checked against the
library's own in tests/storage/test_lerobot.py) trains ``vla_bc``, ``vla_habc`` and ``iql`` from the CLI with no
``--env``, exports, picks the action keys of the robot's action space, and refuses what names no robot in one
sentence."""

import json
from pathlib import Path

import numpy as np
import pytest

from ctrl_rl.cli import main
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.lerobot import LeRobotWriter, droid_features
from ctrl_rl.storage.datasets.lerobot.robot import action_keys

pytest.importorskip("av")
CAMERAS = ("exterior_1_left", "wrist_left")
TINY = ["--chunk", "2", "--batch-size", "2", "--max-text-len", "12", "--lora-rank", "4", "--image-size", "24x32",
        "--threads", "1", "--no-progress", "--log-every", "1"]


def write_droid(root: Path, robot_type: str = "Franka", drop: tuple[str, ...] = ()) -> Path:
    """Three short episodes in the DROID port's schema (every feature of ``droid_features``, less ``drop``)."""
    feats = {k: v for k, v in droid_features(image_hw=(24, 32), cameras=CAMERAS).items() if k not in drop}
    rng = np.random.default_rng(0)
    with LeRobotWriter(root, 15, feats, robot_type, codec="h264") as w:
        for e, (T, ok) in enumerate([(6, True), (5, False), (7, True)]):
            for t in range(T):
                f = {k: rng.uniform(-1, 1, ft["shape"]).astype(np.float32) for k, ft in feats.items()
                     if ft["dtype"] == "float32"}
                f.update({k: np.full((24, 32, 3), (20 * t + 60 * e) % 256, np.uint8) for k, ft in feats.items()
                          if ft["dtype"] == "video"})
                f.update({k: f"{k} {e}" for k, ft in feats.items() if ft["dtype"] == "string"})
                f["observation.state"] = np.concatenate([f["observation.state.joint_position"],
                                                         f["observation.state.gripper_position"]])
                f["action"] = np.concatenate([f["action.joint_position"], f["action.gripper_position"]])
                if "action.original" in feats:
                    f["action.original"] = np.concatenate([f["action.cartesian_velocity"],
                                                           np.abs(f["action.gripper_position"])])
                f.update({"is_first": t == 0, "is_last": t == T - 1, "is_terminal": t == T - 1,
                          "is_episode_successful": ok, "reward": float(ok and t == T - 1),
                          "language_instruction": "put the marker in the cup"})
                w.add_frame(f, "put the marker in the cup")
            w.save_episode()
    return root


@pytest.fixture(scope="module")
def droid(tmp_path_factory) -> Path:
    return write_droid(tmp_path_factory.mktemp("droid") / "droid")


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("ctrl-rl: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_vla_bc_trains_and_exports_without_an_env(tmp_path, droid, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    d = tmp_path / "bc"
    assert main(["train", "vla_bc", "--dataset", str(droid), "--total-steps", "3", "--run-dir", str(d), *TINY]) == 0, \
        capsys.readouterr().err
    saved = json.loads((d / "config.json").read_text())
    env = saved["run"]["env"]
    assert env == "robot:franka_droid,state=8,cameras=exterior_image_1_left,image_size=24x32,language=true"
    assert saved["config"]["proprio_columns"] == "0:8"  # the robot's state is the proprioception
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3 and rows[-1]["stats/demo_frames"] == 18
    assert not any("episode_return" in r or "eval_success_rate" in r for r in rows)  # no simulator, no evaluation
    capsys.readouterr()
    assert main(["export", str(d), "--format", "onnx"]) == 0, capsys.readouterr().err
    meta = json.loads((d / "export" / "policy.json").read_text())
    assert meta["env"] == env and meta["parity"]["onnx"] <= 1e-5
    assert [i["name"] for i in meta["inputs"]] == ["state", "image.exterior_image_1_left", "language"]
    assert meta["robot"]["name"] == "franka_panda_droid" and meta["action"]["space"] == "cartesian_velocity"
    assert meta["control_hz"] == pytest.approx(15.0)
    capsys.readouterr()
    assert main(["eval", str(d), "--episodes", "1"]) == 2
    assert "without a simulator" in _err(capsys)


def test_habc_and_iql_train_without_an_env(tmp_path, droid, capsys):
    pytest.importorskip("transformers")
    d = tmp_path / "habc"
    assert main(["train", "vla_habc", "--dataset", str(droid), "--total-steps", "2", "--run-dir", str(d),
                 "--cameras", "all", *TINY]) == 0, capsys.readouterr().err
    env = json.loads((d / "config.json").read_text())["run"]["env"]
    assert "cameras=exterior_image_1_left+wrist_image_left" in env
    d = tmp_path / "iql"
    assert main(["train", "iql", "--dataset", str(droid), "--total-steps", "3", "--batch-size", "4", "--run-dir",
                 str(d), "--threads", "1", "--no-progress", "--log-every", "1"]) == 0, capsys.readouterr().err
    assert json.loads((d / "config.json").read_text())["run"]["env"] == "robot:franka_droid,state=8"
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3 and "episode_return" not in rows[-1]


def test_the_action_keys_of_the_robots_action_space_are_picked(droid):
    from ctrl_rl.storage.datasets.lerobot import read_lerobot
    from ctrl_rl.vla.data import load_demos

    feats = read_lerobot(droid).features
    assert action_keys(feats, "cartesian_velocity", 7)[0] == ["action.cartesian_velocity", "action.gripper_velocity"]
    # the manip tasks' joint-velocity action (7 joints + gripper velocity), never the port's `action` (positions)
    assert action_keys(feats, "joint_velocity", 8)[0] == ["action.joint_velocity", "action.gripper_velocity"]
    assert action_keys(feats, "joint_position", 8)[0] == ["action"]
    demos = load_demos(droid, ["exterior_image_1_left"], (24, 32), 2, 7, "cartesian_velocity")
    d = read_lerobot(droid)
    want = np.concatenate([d.column("action.cartesian_velocity"), d.column("action.gripper_velocity")[:, None]], 1)
    assert demos.action_key == "action.cartesian_velocity+action.gripper_velocity"
    np.testing.assert_array_equal(demos.action.numpy(), want)


def test_action_original_alone_is_refused_with_the_flag_that_takes_it(tmp_path):
    from ctrl_rl.storage.datasets.lerobot import read_lerobot

    root = write_droid(tmp_path / "orig", drop=("action.gripper_velocity",))
    feats = read_lerobot(root).features
    with pytest.raises(UserInputError, match="--action-key action.original") as e:
        action_keys(feats, "cartesian_velocity", 7)
    assert str(e.value).count(". ") == 0
    plain = {"action": {"dtype": "float32", "shape": (7,)}, "observation.state": {"dtype": "float32", "shape": (8,)}}
    assert action_keys(plain, "cartesian_velocity", 7)[0] == ["action"]  # outside DROID's vocabulary


def test_data_info_prints_the_robot_and_the_action_mapping(droid, capsys):
    assert main(["data", "info", str(droid)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["robot"] == "franka_droid" and info["robot_from"] == "robot_type 'Franka'"
    cart = info["actions"]["cartesian_velocity"]
    assert cart["keys"] == "action.cartesian_velocity+action.gripper_velocity" and cart["width"] == 7
    assert "gripper *position*" in cart["not"]["action.original"]
    assert info["actions"]["gripper_position"]["keys"] == "action.gripper_position"


def test_a_dataset_naming_no_known_robot_is_one_sentence_and_robot_fixes_it(tmp_path, capsys):
    root = write_droid(tmp_path / "unknown", robot_type="so100_follower")
    d = tmp_path / "run"
    args = ["train", "iql", "--dataset", str(root), "--total-steps", "1", "--batch-size", "4", "--threads", "1",
            "--no-progress", "--run-dir", str(d)]
    assert main(args) == 2
    err = _err(capsys)
    assert "robot_type 'so100_follower'" in err and "--robot NAME" in err and "franka_droid" in err
    assert not d.exists()
    assert main([*args, "--robot", "nope"]) == 2
    assert "unknown robot 'nope'" in _err(capsys)
    assert main([*args, "--robot", "franka_droid"]) == 0, capsys.readouterr().err
    assert json.loads((d / "config.json").read_text())["run"]["env"] == "robot:franka_droid,state=8"
    capsys.readouterr()
    assert main(["train", "iql", "--env", "torch:Pendulum", "--robot", "franka_droid", "--total-steps", "1"]) == 2
    assert "--robot" in _err(capsys)
