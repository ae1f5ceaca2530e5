"""Offline loop end to end on a small D4RL-layout dataset of torch:Pendulum: CQL, Cal-QL and IQL train,
evaluate in the env with a normalized score (or say why there is none), and resume exactly."""

import json

import h5py
import numpy as np
import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.envs.registry import make_env
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OfflineLoopConfig, RunConfig
from ctrl_rl.learn.offline import train_offline

SMALL = dict(actor_hidden=(32, 32), critic_hidden=(32, 32))
CONFIGS = {"cql": registry.get("cql").default_config(**SMALL, num_critics=4),
           "calql": registry.get("calql").default_config(**SMALL, num_critics=4),
           "iql": registry.get("iql").default_config(**SMALL, value_hidden=(32, 32), cosine_steps=40)}


@pytest.fixture(scope="module")
def pendulum_dataset(tmp_path_factory):
    return write_pendulum_dataset(tmp_path_factory.mktemp("data") / "pendulum-random.hdf5")


def write_pendulum_dataset(path) -> str:
    """Two 200-step episodes of uniformly random actions, each ending in a time limit, in the D4RL layout; actions
    stored in the env's units ([-2, 2], as a dataset holds them), which loading maps to the agent's [-1, 1]."""
    env = make_env("torch:Pendulum", num_envs=2, device="cpu", seed=0)
    obs = env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    rows = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    for _ in range(200):
        a = torch.rand(2, 1, generator=g) * 4 - 2  # [N,A] in the env's bounds [-2, 2]
        out = env.step(a)
        for k, v in (("observations", obs), ("actions", a), ("rewards", out.reward),
                     ("next_observations", out.final_obs), ("terminals", out.terminated), ("timeouts", out.truncated)):
            rows[k].append(v)
        obs = out.obs
    with h5py.File(path, "w") as f:
        for k, v in rows.items():
            arr = torch.stack(v, 1).flatten(0, 1).numpy()  # [N*T,...] episode after episode
            f[k] = arr.astype(np.float32) if arr.dtype != np.bool_ else arr
    assert rows["timeouts"][-1].all()
    return str(path)


def _run(dataset, **kw):
    base = dict(env="torch:Pendulum", dataset=dataset, total_steps=40, seed=0, progress=False, log_every=10,
                checkpoint_every=20, eval_every=20, eval_episodes=2, threads=1)
    return RunConfig(**{**base, **kw}, loop=OfflineLoopConfig(batch_size=32, clip_actions=0.99999))


@pytest.mark.parametrize("algo", ["cql", "calql", "iql"])
def test_offline_algorithms_train_and_evaluate_in_the_env(algo, pendulum_dataset, tmp_path):
    res = train_offline(_run(pendulum_dataset), algo, CONFIGS[algo], tmp_path / "r")
    assert res.step == 40 and res.algo.parameters_finite()
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "episode_return" in r]
    assert [r["step"] for r in evals] == [20, 40]
    # no reference table knows torch:Pendulum: the score is null and the row says why
    assert evals[-1]["normalized_score"] is None and "Pendulum" in evals[-1]["score_reference"]
    assert -2000 < evals[-1]["episode_return"] < 0
    assert load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt", expect_algo=algo)["counters"]["step"] == 40


def test_resume_equals_uninterrupted(pendulum_dataset, tmp_path):
    run = _run(pendulum_dataset, eval_every=0)
    full = train_offline(run, "cql", CONFIGS["cql"], tmp_path / "full")
    train_offline(run, "cql", CONFIGS["cql"], tmp_path / "cut", max_iterations=20)
    resumed = train_offline(run, "cql", CONFIGS["cql"], tmp_path / "cut", resume=True)
    a, b = full.algo.state_dict(), resumed.algo.state_dict()
    assert all(torch.equal(x, y) for x, y in zip(a["critic"].values(), b["critic"].values()))
    assert all(torch.equal(x, y) for x, y in zip(a["actor"].values(), b["actor"].values()))


def test_config_records_the_data_and_a_resume_on_other_data_is_refused(pendulum_dataset, tmp_path):
    import hashlib
    import shutil

    data = tmp_path / "pendulum-random.hdf5"
    shutil.copy(pendulum_dataset, data)
    run = _run(str(data), eval_every=0)
    train_offline(run, "iql", CONFIGS["iql"], tmp_path / "r", max_iterations=20)
    config = tmp_path / "r" / "config.json"
    recorded = json.loads(config.read_text())["data"]
    assert recorded == {"dataset": str(data), "path": str(data.resolve()), "bytes": data.stat().st_size,
                        "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}
    # the same id, other rows (a regenerated file): refused before anything is written, the run left as it was
    with h5py.File(data, "r+") as f:
        rewards = f["rewards"]
        assert isinstance(rewards, h5py.Dataset)
        rewards[0] = rewards[0] + 1.0
    before = {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    with pytest.raises(UserInputError, match=r"cannot resume .*now holds other data .*expected the same data"):
        train_offline(run, "iql", CONFIGS["iql"], tmp_path / "r", resume=True)
    assert {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()} == before
    # the data it trained on again: the resume runs to the end and keeps the record
    shutil.copy(pendulum_dataset, data)
    assert train_offline(run, "iql", CONFIGS["iql"], tmp_path / "r", resume=True).step == 40
    assert json.loads(config.read_text())["data"]["sha256"] == recorded["sha256"]


def test_dataset_must_match_the_env(pendulum_dataset, tmp_path):
    with pytest.raises(UserInputError, match="needs --dataset"):
        train_offline(_run(None), "cql", CONFIGS["cql"], tmp_path / "a")
    with pytest.raises(UserInputError, match="pendulum-random.hdf5"):
        train_offline(_run(pendulum_dataset, env="torch:Reacher"), "cql", CONFIGS["cql"], tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
