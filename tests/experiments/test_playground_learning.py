"""The MuJoCo Playground presets (experiments/presets/go1-joystick.json, panda-pickcube.json) and the study script
experiments/playground_learning/playground_learning.py: each preset loads, matches Playground's batch layout under
``--scale-envs 32`` and trains from the CLI with few envs; the study script trains, resumes, evaluates and summarizes
(on 8 envs: building envpool's pool costs about 0.1 s per env)."""

import json
import shutil

import pytest

from ctrl_rl.learn.config import load_preset
from tests.scripts import cli, experiment_script, plain_iqm

pytest.importorskip("envpool")

PRESETS = {"go1-joystick": "envpool:Go1JoystickFlatTerrain-v1", "panda-pickcube": "envpool:PandaPickCube-v1"}
# Playground's brax PPO (mujoco_playground/config/{locomotion,manipulation}_params.py): samples per update
# (num_minibatches x batch_size x unroll_length), minibatches and epochs (num_updates_per_batch)
PLAYGROUND = {"go1-joystick": (32 * 256 * 20, 32, 4), "panda-pickcube": (32 * 512 * 10, 32, 8)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_scaled_by_32_is_playgrounds_update(name):
    p = load_preset(name)
    assert p.algo == "ppo" and p.run["env"] == PRESETS[name]
    samples, minibatches, epochs = PLAYGROUND[name]
    c = p.config
    assert 32 * p.run["num_envs"] * c["rollout_steps"] == samples
    assert samples // c["minibatch_size"] == minibatches and c["epochs"] == epochs


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_trains_two_iterations_from_the_cli(name, tmp_path):
    d = tmp_path / "run"
    r = cli("train", "ppo", "--preset", name, "--run-dir", d, "--num-envs", "4", "--rollout-steps", "8",
            "--minibatch-size", "16", "--total-steps", "64", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 64
    saved = json.loads((d / "config.json").read_text())
    assert saved["run"]["preset"] == name and saved["run"]["env"] == PRESETS[name]
    assert saved["config"]["critic_parts"] == (["privileged_state"] if name == "go1-joystick" else [])
    assert len((d / "metrics.jsonl").read_text().splitlines()) == 2


def test_study_script_trains_resumes_evaluates_and_summarizes(tmp_path, monkeypatch):
    with experiment_script("experiments/playground_learning/playground_learning.py", "playground_learning") as mod:
        monkeypatch.setattr(mod, "RESULTS", tmp_path / "out")
        monkeypatch.setattr(mod, "iqm_ci", plain_iqm)  # rliable is the bench extra's
        monkeypatch.setattr(mod, "preset", lambda task: {"run": {"env": PRESETS["panda-pickcube"], "num_envs": 8}})
        command = mod.train_command

        def small(run_dir, task, seed, steps):  # the study's command with few envs (a fresh run only)
            cmd = command(run_dir, task, seed, steps)
            return cmd if "--resume" in cmd else cmd + ["--num-envs", "8", "--rollout-steps", "4",
                                                        "--minibatch-size", "32", "--epochs", "1"]

        monkeypatch.setattr(mod, "train_command", small)
        runs = tmp_path / "runs"
        args = ["--task", "panda", "--seeds", "0", "--eval-episodes", "2", "--raw-steps", "64", "--runs-dir", str(runs)]
        mod.main([*args, "--steps", "64"])
        mod.main([*args, "--steps", "128"])  # continues the run with --resume
        evals = [json.loads(x) for x in (runs / "panda-s0/evals.jsonl").read_text().splitlines()]
        assert {64, 128} <= {e["step"] for e in evals} and evals[-1]["step"] == 128
        assert all(0 < e["length"] <= 150 and "reward_lifted/per_step" in e for e in evals)
        out = json.loads((tmp_path / "out/playground_learning.json").read_text())["tasks"]["panda"]
        assert len(out["raw_envpool_sps"]) == 2 and out["fraction_of_raw"] > 0
        assert out["final_iqm"]["return"]["seeds"] == 1 and out["seeds"]["panda-s0"]["steps"] == 128
        assert (tmp_path / "out/playground_learning.png").stat().st_size > 1000
        # the machine replaced: the kept copies stand for the runs (done at 128, read by the summary)
        kept = tmp_path / "out/kept"
        assert {p.name for p in (kept / "panda-s0").iterdir()} == {"config.json.gz", "metrics.jsonl.gz",
                                                                    "evals.jsonl.gz"}
        shutil.rmtree(runs)
        mod.main([*args, "--steps", "128", "--raw-steps", "0"])  # nothing to train: complete in its kept copy
        assert not (runs / "panda-s0").exists()
        again = json.loads((tmp_path / "out/playground_learning.json").read_text())["tasks"]["panda"]
        assert again["seeds"]["panda-s0"]["evals"] == out["seeds"]["panda-s0"]["evals"]
        assert again["raw_envpool_sps"] == out["raw_envpool_sps"]
