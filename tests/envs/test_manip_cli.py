"""CLI smoke for every manipulation task: a few SAC steps, evaluation with a success rate, and bad ids exit 2."""

import json

import pytest

from ctrl_rl.cli import main
from ctrl_rl.envs.manipulation import TASKS


@pytest.mark.parametrize("task", TASKS)
def test_each_task_trains_and_evaluates_from_the_cli(task, tmp_path, capsys):
    d = tmp_path / task
    assert main(["train", "sac", "--env", f"manip:{task}", "--num-envs", "2", "--total-steps", "64",
                 "--learning-starts", "32", "--batch-size", "16", "--actor-hidden", "16", "16", "--critic-hidden", "16",
                 "16", "--threads", "1", "--no-progress", "--run-dir", str(d)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["eval", str(d), "--episodes", "1", "--max-steps", "400"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 1 and out["success_rate"] in (0.0, 1.0)


@pytest.mark.parametrize("env_id,needle", [("manip:Juggle", "Juggle"), ("manip:Reach,cameras=top", "top"),
                                           ("manip:Lift,image_size=0x0", "image_size")])
def test_bad_task_ids_exit_2_with_one_sentence(env_id, needle, tmp_path, capsys):
    assert main(["train", "sac", "--env", env_id, "--total-steps", "10", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and not (tmp_path / "r").exists()
