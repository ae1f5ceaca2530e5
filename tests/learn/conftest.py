"""Shared fixtures of the model-based loop tests: a small random Hopper-v5 dataset in the D4RL layout with the
simulator state of every row, and a tiny dynamics run fitted on it from the CLI."""

import gymnasium as gym
import h5py
import numpy as np
import pytest

from ctrl_rl.cli import main

DYN_FLAGS = ["--members", "3", "--elites", "2", "--hidden", "16", "16", "--weight-decay", "0", "0", "0",
             "--min-epochs", "1", "--patience", "1", "--batch-size", "64"]


@pytest.fixture(scope="session")
def hopper_dataset(tmp_path_factory):
    """600 steps of random actions in Hopper-v5 (episodes end when the hopper falls), with infos/qpos, infos/qvel."""
    env = gym.make("Hopper-v5")
    rng = np.random.default_rng(0)
    rows = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts",
                            "infos/qpos", "infos/qvel")}
    obs, _ = env.reset(seed=0)
    for t in range(600):
        qpos, qvel = env.unwrapped.data.qpos.copy(), env.unwrapped.data.qvel.copy()
        a = rng.uniform(-1, 1, 3).astype(np.float32)
        nxt, r, term, trunc, _ = env.step(a)
        trunc = trunc or (t == 599 and not term)
        for k, v in zip(rows, (obs, a, r, nxt, term, trunc, qpos, qvel)):
            rows[k].append(v)
        obs = env.reset()[0] if term or trunc else nxt
    path = tmp_path_factory.mktemp("data") / "hopper-random-v5.hdf5"
    with h5py.File(path, "w") as f:
        for k, v in rows.items():
            arr = np.asarray(v)
            f[k] = arr if arr.dtype == np.bool_ else arr.astype(np.float32)
    assert np.asarray(rows["terminals"]).sum() >= 3
    return str(path)


@pytest.fixture(scope="session")
def model_run(hopper_dataset, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs") / "dyn"
    code = main(["train", "dynamics", "--env", "Hopper-v5", "--dataset", hopper_dataset, *DYN_FLAGS,
                 "--total-steps", "3", "--run-dir", str(d), "--no-progress", "--threads", "1"])
    assert code == 0
    return d


