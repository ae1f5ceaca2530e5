"""`ctrl-rl data generate --env manip:TASK --level scripted --format lerobot`: expert episodes in the LeRobot layout
with DROID's keys, read back by the reader; bad requests exit 2 and write nothing."""

import json

import numpy as np
import pytest

from ctrl_rl.cli import main

pytest.importorskip("pyarrow")
pytest.importorskip("av")


def test_scripted_reach_round_trip(tmp_path, capsys):
    out = tmp_path / "reach"
    assert main(["data", "generate", "--env", "manip:Reach", "--level", "scripted", "--format", "lerobot",
                 "--episodes", "3", "--num-envs", "2", "--cameras", "wrist", "--image-size", "32x48", "--out", str(out),
                 "--no-progress"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 3 and summary["success_rate"] == 1.0 and summary["cameras"] == ["wrist_left"]
    from ctrl_rl.storage.datasets.lerobot import lerobot_info, read_lerobot

    info = lerobot_info(out)
    assert info["episodes"] == 3 and info["frames"] == summary["frames"] and info["robot_type"] == "Franka"
    assert info["cameras"] == {"observation.images.wrist_left": [32, 48, 3]} and info["success_rate"] == 1.0
    d = read_lerobot(out)
    for e in range(3):
        f = d.frames(e)
        T = len(f["frame_index"])
        assert f["is_first"][0] and f["is_last"][-1] and f["is_terminal"][-1] and not f["is_terminal"][:-1].any()
        assert np.allclose(f["action"],
                           np.concatenate([f["action.joint_position"], f["action.gripper_position"][:, None]], 1))
        assert np.allclose(f["action.original"][:, :6], f["action.cartesian_velocity"])
        # the joints an action reached are the next frame's observed joints
        assert np.allclose(f["action.joint_position"][:-1], f["observation.state.joint_position"][1:], atol=1e-6)
        assert len({f["language_instruction"][0], f["language_instruction_2"][0], f["language_instruction_3"][0]}) == 3
        assert d.video_frames("observation.images.wrist_left", e).shape == (T, 32, 48, 3)
    assert main(["data", "info", str(out)]) == 0 and json.loads(capsys.readouterr().out)["episodes"] == 3


@pytest.mark.parametrize("args,needle", [
    (["--env", "Hopper-v5", "--level", "scripted", "--format", "lerobot"], "manip:TASK"),
    (["--env", "manip:Lift", "--level", "medium", "--format", "lerobot"], "--level scripted"),
    (["--env", "manip:Fly", "--level", "scripted", "--format", "lerobot"], "Fly"),
    (["--env", "manip:Lift", "--level", "scripted", "--format", "lerobot", "--episodes", "0"], "--episodes"),
    (["--env", "manip:Lift", "--level", "scripted", "--format", "lerobot", "--noise", "-1"], "--noise"),
    (["--env", "manip:Lift", "--level", "scripted", "--format", "lerobot", "--mis-grasp", "1.5"], "--mis-grasp"),
])
def test_bad_requests_are_one_sentence_and_write_nothing(tmp_path, capsys, args, needle):
    out = tmp_path / "x"
    assert main(["data", "generate", *args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_mis_grasp_episodes_never_close_the_gripper_and_are_marked_failed(tmp_path, capsys):
    out = tmp_path / "lift"
    assert main(["data", "generate", "--env", "manip:Lift", "--level", "scripted", "--format",
                 "lerobot", "--episodes", "2", "--num-envs", "2", "--cameras", "none", "--mis-grasp", "1",
                 "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["success_rate"] == 0.0 and summary["mis_grasp"] == 1.0
    from ctrl_rl.storage.datasets.lerobot import read_lerobot

    d = read_lerobot(out)
    for e in range(2):
        f = d.frames(e)
        assert (f["action.gripper_velocity"] == -1).all() and not f["is_episode_successful"].any()


def test_an_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "x"
    out.mkdir()
    assert main(["data", "generate", "--env", "manip:Reach", "--level", "scripted", "--format", "lerobot", "--out",
                 str(out), "--no-progress"]) == 2
    assert "--force" in capsys.readouterr().err and list(out.iterdir()) == []
