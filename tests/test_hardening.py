"""Bad input found by trying the CLI with many wrong inputs (issue 11 §5): each is one whole sentence on stderr,
exit code 2, and nothing written; plus the cases that were accepted although wrong."""

import json
import shutil

import h5py
import numpy as np
import pytest

from tests.test_cli import SMALL, cli


def refused(r, *words):
    """Exit 2, one line on stderr naming ``words``, no traceback."""
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.mark.parametrize("args,words", [
    (["train", "ppo", "--num-envs", "1000000000000"], ["--num-envs", "GiB"]),
    (["train", "ppo", "--rollout-steps", "1000000000000"], ["--rollout-steps", "GiB"]),
    (["train", "sac", "--env", "torch:Pendulum", "--buffer-size", "1000000000000"], ["--buffer-size", "GiB"]),
    (["train", "sac", "--env", "torch:Pendulum", "--actor-lr", "nan"], ["actor_lr", "finite"]),
    (["train", "sac", "--env", "torch:Pendulum", "--critic-lr", "-0.001"], ["critic_lr", "positive"]),
    (["train", "iql", "--env", "torch:Pendulum", "--dataset", "x.hdf5", "--value-lr", "-1"], ["value_lr"]),
    (["train", "cql", "--env", "torch:Pendulum", "--dataset", "x.hdf5", "--lagrange-lr", "nan"], ["lagrange_lr"]),
    (["train", "sac_flow", "--env", "torch:Pendulum", "--alpha-lr", "-1"], ["alpha_lr"]),
    (["train", "sac", "--env", "torch:Pendulum", "--actor-hidden", "-5", "64"], ["actor_hidden", "widths"]),
    (["train", "ppo", "--critic-hidden", "0"], ["critic_hidden"]),
    (["train", "ppo", "--max-grad-norm", "nan"], ["max_grad_norm"]),
    (["train", "ppo", "--target-kl", "-1"], ["target_kl"]),
    (["train", "sac", "--env", "torch:Pendulum", "--utd-ratio", "nan"], ["--utd-ratio"]),
    (["train", "rlpd", "--env", "torch:Pendulum", "--offline-ratio", "1.5"], ["--offline-ratio"]),
    (["train", "sac_flow", "--env", "torch:PointMassPixels,image_size=16"], ["flat state observations", "image/top"]),
    (["train", "ppo", "--env", "torch:PointMassPixels,image_size=-3"], ["image_size"]),
])
def test_invalid_values_are_refused_before_anything_is_written(args, words, tmp_path):
    d = tmp_path / "run"
    refused(cli(*args, "--run-dir", d, "--no-progress", cwd=tmp_path), *words)
    assert not d.exists() and not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("hard") / "run"
    r = cli("train", "ppo", "--env", "torch:Pendulum", "--run-dir", d, *SMALL)
    assert r.returncode == 0, r.stderr
    return d


def test_eval_refuses_zero_max_steps_and_a_missing_cuda(ppo_run):
    refused(cli("eval", ppo_run, "--max-steps", "0"), "--max-steps")
    import torch

    if not torch.cuda.is_available():
        refused(cli("eval", ppo_run, "--device", "cuda"), "cuda")


def test_resume_below_the_steps_done_is_refused_and_config_unchanged(ppo_run):
    before = (ppo_run / "config.json").read_text()
    refused(cli("train", "ppo", "--resume", ppo_run, "--total-steps", "100"), "--total-steps 100", "8192")
    assert (ppo_run / "config.json").read_text() == before


def test_resume_with_other_tensor_shapes_is_one_sentence(ppo_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(ppo_run, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["config"]["actor_hidden"] = [8]
    (other / "config.json").write_text(json.dumps(cfg))
    metrics = (other / "metrics.jsonl").read_text()
    refused(cli("train", "ppo", "--resume", other, "--total-steps", "16384"), "does not fit", "networks")
    assert (other / "metrics.jsonl").read_text() == metrics


def _d4rl_file(path, obs_dim, act_dim, n=40):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["observations"] = rng.normal(size=(n, obs_dim)).astype(np.float32)
        f["next_observations"] = rng.normal(size=(n, obs_dim)).astype(np.float32)
        f["actions"] = rng.uniform(-1, 1, size=(n, act_dim)).astype(np.float32)
        f["rewards"] = rng.normal(size=n).astype(np.float32)
        f["terminals"] = np.zeros(n, dtype=bool)
        timeouts = np.zeros(n, dtype=bool)
        timeouts[19::20] = True
        f["timeouts"] = timeouts
    return path


def test_offline_run_without_env_uses_the_task_the_dataset_names(tmp_path):
    data = _d4rl_file(tmp_path / "hopper-medium-v2.hdf5", 11, 3)
    d = tmp_path / "iql"
    r = cli("train", "iql", "--dataset", data, "--run-dir", d, "--total-steps", "4", "--eval-every", "0",
            "--eval-episodes", "1", "--batch-size", "8", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((d / "config.json").read_text())["run"]["env"] == "Hopper-v5"
    unnamed = _d4rl_file(tmp_path / "mydata.hdf5", 11, 3)
    refused(cli("train", "iql", "--dataset", unnamed, "--run-dir", tmp_path / "x", cwd=tmp_path), "--env is needed")
    assert not (tmp_path / "x").exists()


def test_divergence_before_the_first_checkpoint_says_there_is_none(tmp_path, monkeypatch):
    from ctrl_rl.algos.sac import SAC
    from ctrl_rl.learn.config import OffPolicyLoopConfig, RunConfig
    from ctrl_rl.learn.offpolicy import train_offpolicy
    from ctrl_rl.learn.runtime import TrainingDiverged

    real = SAC.update

    def nan_update(self, batch):
        info = real(self, batch)
        info["loss/critic"] = info["loss/critic"] * float("nan")
        return info

    monkeypatch.setattr(SAC, "update", nan_update)
    run = RunConfig(env="torch:Pendulum", num_envs=2, total_steps=200, progress=False, log_every=10,
                    checkpoint_every=1000, threads=1, loop=OffPolicyLoopConfig(batch_size=8, learning_starts=20))
    from ctrl_rl.algos.sac import SACConfig

    with pytest.raises(TrainingDiverged, match="no checkpoint was written yet"):
        train_offpolicy(run, "sac", SACConfig(actor_hidden=(8,), critic_hidden=(8,)), tmp_path / "r")


def test_run_dir_that_is_a_file_or_holds_other_files_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    refused(cli("train", "ppo", "--run-dir", f, *SMALL), "is an existing file")
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    refused(cli("train", "ppo", "--run-dir", other, *SMALL), "not part of a ctrl_rl run")
    assert sorted(p.name for p in other.iterdir()) == ["cat.jpg"]


def test_a_run_killed_before_its_first_checkpoint_restarts_and_cannot_be_resumed(ppo_run, tmp_path):
    d = tmp_path / "killed"
    d.mkdir()
    shutil.copy(ppo_run / "config.json", d / "config.json")  # what a run leaves when killed before checkpointing
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / ".latest.pt.tmp999999").write_bytes(b"half")
    refused(cli("train", "ppo", "--resume", d), "before its first checkpoint", "without --resume")
    r = cli("train", "ppo", "--env", "torch:Pendulum", "--run-dir", d, *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "restarting" in r.stderr
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] > 1 and not list((d / "checkpoints").glob(".*tmp*")) and not (d / ".lock").exists()


def test_a_second_process_on_the_same_run_dir_is_refused(tmp_path):
    import subprocess
    import sys
    import time

    d = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "-m", "ctrl_rl", "train", "sac", "--env", "torch:Pendulum", "--run-dir",
                              str(d), "--total-steps", "1000000", "--no-progress", "--threads", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if (d / "config.json").exists():
                break
            time.sleep(0.1)
        assert (d / ".lock").exists()
        refused(cli("train", "sac", "--env", "torch:Pendulum", "--run-dir", d, "--total-steps", "100"),
                "in use by process", str(first.pid))
    finally:
        first.kill()
        first.wait()
    # the lock of the killed process is stale: a run that resumes takes it over once there is a checkpoint;
    # without one the directory restarts
    r = cli("train", "sac", "--env", "torch:Pendulum", "--run-dir", d, "--total-steps", "300",
            "--learning-starts", "100", "--no-progress", "--threads", "1")
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_checkpoint_with_a_flipped_byte_is_refused(ppo_run, tmp_path):
    d = tmp_path / "flip"
    shutil.copytree(ppo_run, d)
    p = d / "checkpoints" / "latest.pt"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    refused(cli("eval", d), "latest.pt")
    refused(cli("train", "ppo", "--resume", d, "--total-steps", "16384"), "latest.pt")


def test_kill_9_then_resume_equals_the_uninterrupted_run(tmp_path):
    """A real SIGKILL in the middle of training (lock, metrics and checkpoint left as the kill found them),
    then `--resume`: the final networks and the metrics rows equal an uninterrupted run's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import torch

    from ctrl_rl.learn.checkpoint import load_checkpoint

    args = ["train", "ppo", "--env", "torch:Pendulum", "--num-envs", "32", "--rollout-steps", "8",
            "--minibatch-size", "64", "--epochs", "1", "--total-steps", str(32 * 8 * 400), "--checkpoint-every", "7",
            "--log-every", "3", "--threads", "1", "--no-progress", "--seed", "4"]
    full = tmp_path / "full"
    assert cli(*args, "--run-dir", full).returncode == 0
    cut = tmp_path / "cut"
    p = subprocess.Popen([sys.executable, "-m", "ctrl_rl", *args, "--run-dir", str(cut)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    ck = cut / "checkpoints" / "latest.pt"
    for _ in range(1200):
        if ck.exists() and load_checkpoint(ck)["counters"]["iteration"] >= 14:
            break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = load_checkpoint(ck)["counters"]["iteration"]
    assert 14 <= killed_at < 400 and (cut / ".lock").exists()  # killed mid-run: its lock is left behind
    r = cli("train", "ppo", "--resume", cut, "--total-steps", str(32 * 8 * 400), "--no-progress", "--threads", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    a = load_checkpoint(full / "checkpoints" / "latest.pt")["algo_state"]["ac"]
    b = load_checkpoint(ck)["algo_state"]["ac"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [[json.loads(x)["step"] for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (full, cut)]
    assert steps[0] == steps[1]
