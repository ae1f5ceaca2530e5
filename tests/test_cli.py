"""The command line from the outside: smoke runs, eval/plot/list, and every bad-input case."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ctrl_rl.learn.checkpoint import load_checkpoint, save_checkpoint
from tests.scripts import cli

SMALL = ["--num-envs", "32", "--total-steps", "8192", "--rollout-steps", "8", "--minibatch-size", "64",
         "--epochs", "1", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli") / "run"
    r = cli("train", "ppo", "--env", "torch:Pendulum", "--run-dir", d, *SMALL)
    assert r.returncode == 0, r.stderr
    return d, r


def test_train_writes_a_complete_run_directory(trained):
    d, r = trained
    assert (d / "config.json").is_file() and (d / "metrics.jsonl").is_file()
    assert (d / "checkpoints" / "latest.pt").is_file() and (d / "learning_curve.png").is_file()
    assert any(p.name.startswith("events.out.tfevents") for p in d.iterdir())
    summary = json.loads(r.stdout.splitlines()[0])
    assert summary["step"] == 8192 and summary["run_dir"] == str(d)


def test_eval_prints_one_json_line(trained):
    d, _ = trained
    r = cli("eval", d, "--episodes", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["episodes"] == 3 and out["return_std"] >= 0 and -2000 < out["return_mean"] <= 0


def test_plot_and_list(trained, tmp_path):
    d, _ = trained
    r = cli("plot", d, "--out", tmp_path / "c.png")
    assert r.returncode == 0 and (tmp_path / "c.png").stat().st_size > 1000
    assert "ppo" in cli("list", "algos").stdout
    envs = cli("list", "envs").stdout
    assert "torch:Pendulum" in envs and "HalfCheetah-v5" in envs
    presets = cli("list", "presets").stdout
    assert "default" in presets and "halfcheetah" in presets


def test_resume_continues_to_a_larger_budget(trained, tmp_path):
    d, _ = trained
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    r = cli("train", "ppo", "--resume", d2, "--total-steps", "16384", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 16384


@pytest.mark.parametrize("env", ["torch:CartPole", "gym:Pendulum-v1", "HalfCheetah-v5"])
def test_train_smoke_on_other_backends(env, tmp_path):
    r = cli("train", "ppo", "--env", env, "--run-dir", tmp_path / "r", "--num-envs", "4", "--total-steps", "64",
            "--rollout-steps", "8", "--minibatch-size", "16", "--epochs", "1", "--no-progress")
    assert r.returncode == 0, r.stderr


SAC_SMALL = ["--num-envs", "4", "--total-steps", "400", "--learning-starts", "100", "--batch-size", "32",
             "--actor-hidden", "32", "32", "--critic-hidden", "32", "32", "--log-every", "25", "--threads", "1",
             "--no-progress"]


def test_sac_train_eval_and_resume_from_the_cli(tmp_path):
    d = tmp_path / "sac"
    r = cli("train", "sac", "--env", "torch:Pendulum", "--run-dir", d, "--save-replay", *SAC_SMALL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 400
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["updates"] > 0 and "loss/critic" in rows[-1]
    r = cli("eval", d, "--episodes", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["episodes"] == 2
    r = cli("train", "sac", "--resume", d, "--total-steps", "600", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 600


@pytest.mark.parametrize("velocity", ["gated", "decoded", "naive"])
def test_sac_flow_trains_from_the_cli(velocity, tmp_path):
    d = tmp_path / "flow"
    r = cli("train", "sac_flow", "--env", "torch:Pendulum", "--run-dir", d, "--velocity", velocity,
            "--flow-hidden", "32", "--noise-hidden", "32", "--d-model", "16", "--n-layers", "1",
            "--critic-hidden", "32", "32", "--num-envs", "4", "--total-steps", "200", "--learning-starts", "100",
            "--batch-size", "32", "--log-every", "25", "--threads", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["algo"] == "sac_flow" and cfg["config"]["velocity"] == velocity
    assert json.loads(cli("eval", d, "--episodes", "2").stdout)["episodes"] == 2


def test_data_info_reports_episodes_returns_and_normalized_score(tmp_path):
    import h5py
    import numpy as np

    # two hopper episodes in the D4RL layout (3 steps ending in a terminal, 2 ending in a timeout), then a
    # 2-step fragment cut off by the end of the file: counted apart, left out of the return statistics
    path = tmp_path / "hopper-medium-v2.hdf5"
    with h5py.File(path, "w") as f:
        f["observations"] = np.arange(7 * 11, dtype=np.float32).reshape(7, 11)
        f["actions"] = np.zeros((7, 3), dtype=np.float32)
        f["rewards"] = np.array([1, 2, 3, 10, 20, 100, 200], dtype=np.float32)
        f["terminals"] = np.array([0, 0, 1, 0, 0, 0, 0], dtype=bool)
        f["timeouts"] = np.array([0, 0, 0, 0, 1, 0, 0], dtype=bool)
    r = cli("data", "info", path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["episodes"], info["incomplete_episodes"], info["transitions"], info["terminals"], info["timeouts"]) \
        == (2, 1, 7, 1, 1)
    assert info["return_mean"] == 18.0 and info["return_min"] == 6.0 and info["return_max"] == 30.0
    # D4RL hopper references: random -20.272305, expert 3234.3
    assert abs(info["normalized_score"] - 100 * (18.0 + 20.272305) / (3234.3 + 20.272305)) < 1e-6
    assert "D4RL" in info["score_reference"] or "d4rl" in info["score_reference"]
    assert info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()  # what a run on it records


@pytest.mark.parametrize("algo", ["cql", "iql"])
def test_offline_training_and_eval_from_the_cli(algo, tmp_path):
    from tests.learn.test_offline import write_pendulum_dataset

    data = write_pendulum_dataset(tmp_path / "pendulum-random.hdf5")
    d = tmp_path / algo
    r = cli("train", algo, "--env", "torch:Pendulum", "--dataset", data, "--total-steps", "30", "--eval-episodes", "2",
            "--actor-hidden", "32", "--critic-hidden", "32", "--batch-size", "32", "--run-dir", d, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 30
    assert json.loads(cli("eval", d, "--episodes", "2").stdout)["episodes"] == 2


BAD = [
    (["train", "cql", "--env", "torch:Pendulum"], "--dataset"),
    (["train", "iql", "--env", "HalfCheetah-v5", "--dataset", "no/such.hdf5"], "no/such.hdf5"),
    (["data", "info", "no/such/file.hdf5"], "no/such/file.hdf5"),
    (["train", "sac", "--env", "torch:CartPole", "--total-steps", "10"], "continuous actions"),
    (["train", "sac", "--scale-envs", "2"], "--scale-envs"),
    (["train", "sac", "--target-subset", "3"], "target_subset"),
    (["train", "ppo", "--env", "NoSuchEnv-v9"], "NoSuchEnv-v9"),
    (["train", "ppx", "--env", "torch:Pendulum"], "ppx"),
    (["train", "ppo", "--preset", "nonexistent"], "nonexistent"),
    (["train", "ppo", "--lerning-rate", "1"], "--lerning-rate"),
    (["train", "ppo", "--num-envs", "0"], "num-envs"),
    (["train", "ppo", "--total-steps", "-5"], "total-steps"),
    (["train", "ppo", "--epochs", "abc"], "epochs"),
    (["train", "ppo", "--resume", "no/such/dir"], "no/such/dir"),
    (["eval", "no/such/run"], "no/such/run"),
    (["list", "bananas"], "bananas"),
    (["frobnicate"], "frobnicate"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_sentence_exit_2_and_writes_nothing(args, needle, tmp_path):
    run_dir = tmp_path / "should_not_exist"
    extra = ["--run-dir", run_dir] if args[0] == "train" and "--resume" not in args else []
    r = cli(*args, *extra, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in r.stderr
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_resume_refuses_other_algorithms_and_truncated_checkpoints(trained, tmp_path):
    d, _ = trained
    other = tmp_path / "other"
    shutil.copytree(d, other)
    ck = load_checkpoint(other / "checkpoints" / "latest.pt")
    ck["algo"] = "sac"
    save_checkpoint(other / "checkpoints" / "latest.pt", ck)
    r = cli("train", "ppo", "--resume", other)
    assert r.returncode == 2 and "'sac'" in r.stderr and len(r.stderr.strip().splitlines()) == 1

    cut = tmp_path / "cut"
    shutil.copytree(d, cut)
    p = cut / "checkpoints" / "latest.pt"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    before = (cut / "metrics.jsonl").read_text()
    for args in (["train", "ppo", "--resume", cut], ["eval", cut]):
        r = cli(*args)
        assert r.returncode == 2 and "truncated" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (cut / "metrics.jsonl").read_text() == before

    r = cli("train", "ppo", "--resume", d, "--lr", "0.1")
    assert r.returncode == 2 and "--lr" in r.stderr


def test_existing_run_dir_is_not_overwritten(trained):
    d, _ = trained
    r = cli("train", "ppo", "--run-dir", d, *SMALL)
    assert r.returncode == 2 and "already holds a run" in r.stderr


def test_torchrun_two_processes_train_data_parallel(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    d = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", "29517", "-m", "ctrl_rl", "train",
                        "ppo", "--env", "torch:Pendulum", "--run-dir", str(d), *SMALL], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    ck = load_checkpoint(d / "checkpoints" / "latest.pt")
    assert ck["world_size"] == 2 and ck["counters"]["step"] == 8192
    a, b = (ck["ranks"][i]["algo_state"]["ac"] for i in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a)  # gradients averaged: identical replicas
    obs0, obs1 = ck["ranks"][0]["obs"], ck["ranks"][1]["obs"]
    assert obs0.shape == (16, 3) and not torch.equal(obs0, obs1)  # each rank steps its own seeded envs
    assert len((d / "metrics.jsonl").read_text().splitlines()) == 32  # rank 0 alone logs, once per update
