"""D4RL-protocol generation: collection layout, qpos/qvel, sampled actions, stitching, replay rows, behaviour files."""

import json

import numpy as np
import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets import load_dataset
from ctrl_rl.storage.datasets.behaviour import load_behaviour, load_manifest
from ctrl_rl.storage.datasets.generate import collect, complete_returns, generate, replay_rows, stitch

pytest.importorskip("mujoco")


@pytest.fixture(scope="module")
def hopper_rows():
    actor, _ = load_behaviour("hopper", "medium")
    return collect("Hopper-v5", actor, 300, seed=0, num_envs=4, workers=1, max_episode_steps=50), actor


def test_collected_rows_have_the_d4rl_layout_and_reproduce_the_observation(hopper_rows):
    rows, _ = hopper_rows
    assert rows["observations"].shape == (300, 11) and rows["actions"].shape == (300, 3)
    assert rows["terminals"].dtype == np.bool_ and rows["timeouts"].dtype == np.bool_
    assert not (rows["terminals"] & rows["timeouts"]).any() and rows["timeouts"].any()  # kept apart; 50-step limit
    # Hopper-v5 obs = qpos[1:] and clip(qvel, -10, 10), recorded before each step
    assert np.allclose(rows["observations"][:, :5], rows["infos/qpos"][:, 1:], atol=1e-5)
    assert np.allclose(rows["observations"][:, 5:], np.clip(rows["infos/qvel"], -10, 10), atol=1e-5)
    # episodes are contiguous: inside an episode next_observations[t] == observations[t + 1]
    ends = rows["terminals"] | rows["timeouts"]
    inside = ~ends[:-1]
    assert np.allclose(rows["next_observations"][:-1][inside], rows["observations"][1:][inside])


def test_actions_are_sampled_and_their_log_probs_are_the_actors(hopper_rows):
    rows, actor = hopper_rows
    obs = torch.as_tensor(rows["observations"])
    with torch.no_grad():
        mode = actor.mode(obs).numpy()
    assert np.abs(rows["actions"] - mode).mean() > 1e-3  # not the mean action
    from ctrl_rl.core.distributions import tanh_log_det

    with torch.no_grad():
        mean, log_std = actor(obs)
        a = torch.as_tensor(rows["actions"]).clamp(-1 + 1e-6, 1 - 1e-6)
        u = torch.atanh(a)
        logp = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1) - tanh_log_det(u)
    ok = (np.abs(rows["actions"]) < 0.99).all(1)  # float32 tanh saturates near +-1, where atanh loses u
    assert ok.sum() > 50
    assert np.allclose(rows["infos/action_log_probs"][ok], logp.numpy()[ok], atol=5e-2)


def test_stitch_cuts_the_first_part_at_its_last_complete_episode():
    first = {"rewards": np.ones(7, np.float32), "terminals": np.array([0, 0, 1, 0, 0, 0, 0], bool),
             "timeouts": np.array([0, 0, 0, 0, 1, 0, 0], bool)}
    second = {"rewards": np.full(3, 2, np.float32), "terminals": np.zeros(3, bool), "timeouts": np.array([0, 0, 1], bool)}
    out = stitch(first, second)
    assert len(out["rewards"]) == 5 + 3 and out["rewards"][5:].tolist() == [2, 2, 2]
    assert complete_returns(out).tolist() == [3.0, 2.0, 6.0]


def test_replay_rows_keep_insertion_order_and_refuse_a_wrapped_buffer():
    n = 10
    replay = {"obs": torch.arange(n).float()[:, None], "action": torch.zeros(n, 1), "reward": torch.ones(n),
              "next_obs": torch.arange(1, n + 1).float()[:, None], "terminated": torch.zeros(n, dtype=torch.bool),
              "truncated": torch.zeros(n, dtype=torch.bool), "added": n, "capacity": n, "size": n, "position": 0}
    rows = replay_rows(replay, 6)
    assert rows["observations"][:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(UserInputError, match="wrapped"):
        replay_rows({**replay, "added": 2 * n}, 6)
    with pytest.raises(UserInputError, match="expected at least"):
        replay_rows(replay, 20)


def test_shipped_behaviour_policies_and_manifest_load():
    manifest = load_manifest()
    for task in manifest["tasks"]:
        for level in ("medium", "expert"):
            actor, record = load_behaviour(task, level)
            assert record["level"] == level and not actor.training


def test_malformed_behaviour_file_is_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(UserInputError, match="bad.pt"):
        load_behaviour(str(bad))


def test_generate_writes_a_dataset_that_loads_by_id_and_prints_info(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CTRL_RL_DATA_DIR", str(tmp_path))
    [summary] = generate("Hopper-v5", "random", steps=500, num_envs=2, progress=False, workers=1)
    assert summary["transitions"] == 500 and (tmp_path / "hopper-random-v5.hdf5").is_file()
    ds = load_dataset("hopper-random-v5")
    assert len(ds) > 0 and ds.metadata["env_id"] == "Hopper-v5" and ds.metadata["format"] == "ctrl_rl"
    assert main(["data", "info", "hopper-random-v5"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["transitions"] == 500 and info["normalized_score"] is not None


@pytest.mark.parametrize("argv, match", [
    (["--env", "Ant-v5", "--level", "medium"], "Ant-v5"),
    (["--env", "Hopper-v5", "--level", "mediocre"], "mediocre"),
    (["--env", "Hopper-v5", "--level", "random", "--steps", "0"], "steps"),
])
def test_bad_generate_input_exits_2_and_writes_nothing(argv, match, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CTRL_RL_DATA_DIR", str(tmp_path / "cache"))
    assert main(["data", "generate", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
