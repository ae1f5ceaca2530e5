"""D4RL-protocol generation: collection layout, qpos/qvel, sampled actions, stitching, replay rows, behaviour files."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.datagen.behaviour import load_behaviour, load_manifest
from ctrl_rl.datagen.generate import RERUN_THREADS, collect, complete_returns, generate, replay_rows, stitch
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets import load_dataset

pytest.importorskip("mujoco")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Datasets and the local reference file go to tmp_path, never to the user's ~/.cache."""
    monkeypatch.setenv("CTRL_RL_DATA_DIR", str(tmp_path / "datasets"))
    monkeypatch.setenv("CTRL_RL_REFERENCE_SCORES", str(tmp_path / "refs.json"))


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
    second = {"rewards": np.full(3, 2, np.float32), "terminals": np.zeros(3, bool),
              "timeouts": np.array([0, 0, 1], bool)}
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
    # an explicit --refs wins over the file's own record
    assert main(["data", "info", "hopper-random-v5", "--refs", "d4rl"]) == 0
    d4rl = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d4rl["score_reference"].startswith("D4RL") and d4rl["return_mean"] == info["return_mean"]
    assert d4rl["normalized_score"] == pytest.approx(100 * (info["return_mean"] + 20.272305) / (3234.3 + 20.272305))


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


# -- collection on a tiny policy --------------------------------------------------------------------------------
def tiny_actor(obs_dim=11, action_dim=3, scale=0.3):
    """A 16-unit SAC actor with small weights and std ~0.2, so its actions stay well inside (-1, 1)."""
    from ctrl_rl.algos.sac import SACConfig
    from ctrl_rl.datagen.behaviour import build_actor

    torch.manual_seed(0)
    actor = build_actor({**SACConfig().__dict__, "actor_hidden": [16, 16]}, obs_dim, action_dim)
    with torch.no_grad():
        for p in actor.parameters():
            p.mul_(scale)
        actor.net[-1].bias[action_dim:] = -1.5  # log-std half of the output layer
    return actor


def test_log_probs_are_the_tanh_gaussian_density_of_the_sampled_actions():
    from ctrl_rl.core.distributions import normal_log_prob, tanh_log_det

    actor = tiny_actor()
    rows = collect("Hopper-v5", actor, 200, seed=3, num_envs=3, workers=1)
    obs, act = torch.as_tensor(rows["observations"]), torch.as_tensor(rows["actions"], dtype=torch.float64)
    with torch.no_grad():
        mean, log_std = actor(obs)
        u = torch.atanh(act)
        logp = normal_log_prob(u, mean.double(), log_std.double()) - tanh_log_det(u)
        mode = actor.mode(obs).numpy()
    assert np.abs(rows["actions"]).max() < 0.999
    assert np.allclose(rows["infos/action_log_probs"], logp.numpy(), atol=2e-3)
    assert np.abs(rows["actions"] - mode).mean() > 0.05  # sampled, not the mean action
    assert rows["infos/action_log_probs"].dtype == np.float32 and rows["infos/qpos"].shape == (200, 6)


def test_uniform_random_level_and_seeding():
    a = collect("Hopper-v5", None, 150, seed=5, num_envs=2, workers=1)
    b = collect("Hopper-v5", None, 150, seed=5, num_envs=2, workers=1)
    c = collect("Hopper-v5", None, 150, seed=6, num_envs=2, workers=1)
    assert np.abs(a["actions"]).max() <= 1 and a["actions"].std() > 0.4  # uniform on [-1, 1]: std 0.577
    assert np.allclose(a["infos/action_log_probs"], -3 * np.log(2))
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(a["actions"], c["actions"])
    assert a["terminals"].any()  # random Hopper falls: true terminations, no time limit reached
    assert not a["timeouts"].any()


def test_rows_do_not_depend_on_the_number_of_worker_processes():
    actor = tiny_actor()
    one = collect("Hopper-v5", actor, 240, seed=1, num_envs=4, workers=1, max_episode_steps=30)
    two = collect("Hopper-v5", actor, 240, seed=1, num_envs=4, workers=2, max_episode_steps=30)
    assert all(np.array_equal(one[k], two[k]) for k in one)


def test_episodes_are_whole_and_the_file_ends_with_the_cut_one():
    rows = collect("Hopper-v5", tiny_actor(), 100, seed=0, num_envs=3, workers=1, max_episode_steps=30)
    ends = np.flatnonzero(rows["terminals"] | rows["timeouts"]) + 1
    lengths = np.diff(np.concatenate([[0], ends]))
    # time-limited episodes are exactly 30 rows; terminated ones at most 30; the rest is one cut episode
    assert (lengths[rows["timeouts"][ends - 1]] == 30).all() and (lengths <= 30).all()
    assert 0 < 100 - ends[-1] < 30 and not (rows["terminals"][ends[-1]:] | rows["timeouts"][ends[-1]:]).any()
    # an episode starts at a reset state: qpos near Hopper's initial pose (x = 0, z = 1.25)
    starts = np.concatenate([[0], ends])
    assert np.allclose(rows["infos/qpos"][starts, :2], [0.0, 1.25], atol=0.02)


def test_replay_rows_of_several_envs_keep_episodes_contiguous():
    # 2 envs interleaved row by row over 4 iterations; env 0's episode ends at iteration 1, env 1's at 2
    n = 8
    obs = torch.tensor([[10 * (i % 2) + i // 2] for i in range(n)], dtype=torch.float32)  # env*10 + iteration
    term = torch.zeros(n, dtype=torch.bool)
    term[2 * 1 + 0] = True  # env 0, iteration 1
    trunc = torch.zeros(n, dtype=torch.bool)
    trunc[2 * 2 + 1] = True  # env 1, iteration 2
    replay = {"obs": obs, "action": torch.zeros(n, 1), "reward": torch.ones(n), "next_obs": obs + 1,
              "terminated": term, "truncated": trunc, "added": n, "capacity": 16, "size": n}
    rows = replay_rows(replay, n, num_envs=2)
    assert rows["observations"][:, 0].tolist() == [0, 1, 10, 11, 12]  # unfinished episodes dropped
    assert rows["terminals"].tolist() == [0, 1, 0, 0, 0] and rows["timeouts"].tolist() == [0, 0, 0, 0, 1]


# -- behaviour files, export script, all levels from a tiny SAC run ------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 400-step SAC run on Hopper-v5 with 16-unit networks, snapshots every 200 steps and the replay saved."""
    from ctrl_rl.algos.sac import SACConfig
    from ctrl_rl.learn.config import OffPolicyLoopConfig, RunConfig
    from ctrl_rl.learn.offpolicy import train_offpolicy

    d = tmp_path_factory.mktemp("tiny") / "run"
    run = RunConfig(env="Hopper-v5", num_envs=1, total_steps=400, seed=0, run_dir=str(d), progress=False,
                    log_every=100, checkpoint_every=1000,
                    loop=OffPolicyLoopConfig(batch_size=32, learning_starts=200, save_replay=True, keep_every=200))
    cfg = SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16))
    train_offpolicy(run, "sac", cfg, d)
    return d


@pytest.fixture(scope="module")
def tiny_behaviour(tiny_run, tmp_path_factory):
    """The export script run on tiny_run: behaviour files and manifest in their own directory."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "data" / "export_behaviour.py"
    spec = importlib.util.spec_from_file_location("export_behaviour", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path_factory.mktemp("behaviour")
    argv = ["--run", str(tiny_run), "--env", "Hopper-v5", "--episodes", "2", "--ref-episodes", "3",
            "--out-dir", str(out), "--workers", "1"]
    assert script.main(argv) == 0
    return out


def test_export_script_writes_both_policies_and_the_manifest(tiny_behaviour, tiny_run):
    from ctrl_rl.learn.checkpoint import load_checkpoint

    manifest = load_manifest(tiny_behaviour)
    entry = manifest["tasks"]["hopper"]
    assert {entry["medium"]["checkpoint_step"], entry["expert"]["checkpoint_step"]} <= {200, 400}
    assert entry["medium"]["checkpoint_step"] <= entry["expert"]["checkpoint_step"]
    assert entry["references"]["random"]["episodes"] == 3 and entry["medium_replay"]["env_steps"] == \
        entry["medium"]["checkpoint_step"]
    assert "--save-replay" in entry["training"]["command"] and entry["training"]["run"]["seed"] == 0
    for level in ("medium", "expert"):
        actor, record = load_behaviour(tiny_behaviour / f"hopper-v5-{level}.pt")
        step = entry[level]["checkpoint_step"]
        ck = load_checkpoint(tiny_run / "checkpoints" / f"step_{step:09d}.pt")
        assert all(torch.equal(v, ck["algo_state"]["actor"][k]) for k, v in actor.state_dict().items())
        assert record["source"]["checkpoint_step"] == step and record["obs_dim"] == 11 and record["action_dim"] == 3
        assert record["sac_config"]["actor_hidden"] == [16, 16] and record["env_id"] == "Hopper-v5"
        assert load_behaviour("hopper", level, tiny_behaviour)[1]["path"] == record["path"]


def test_script_picks_expert_as_best_and_medium_near_a_third():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "data" / "export_behaviour.py"
    spec = importlib.util.spec_from_file_location("export_behaviour", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # random return 0; best 300 at steps 40 and 60 (the later wins); a third of it is 100 -> step 20 (90)
    means = [10.0, 90.0, 300.0, 150.0, 300.0, 100.0]
    assert script.pick([10, 20, 30, 40, 50, 60], means, 0.0) == (1, 4)
    assert script.pick([10, 20], [5.0, 5.0], 5.0) == (0, 1)


@pytest.mark.parametrize("damage, match", [
    (lambda r: {**r, "format": "something else"}, "not a ctrl_rl behaviour policy"),
    (lambda r: {**r, "version": 99}, "version 99"),
    (lambda r: {k: v for k, v in r.items() if k != "sac_config"}, "sac_config"),
    (lambda r: {**r, "source": {"run_command": "x"}}, "source"),
    (lambda r: {**r, "action_dim": 5}, "does not match"),
])
def test_damaged_behaviour_files_are_refused_with_one_sentence(damage, match, tiny_behaviour, tmp_path):
    record = torch.load(tiny_behaviour / "hopper-v5-medium.pt", weights_only=True)
    bad = tmp_path / "hopper-v5-medium.pt"
    torch.save(damage(record), bad)
    with pytest.raises(UserInputError, match=match) as e:
        load_behaviour(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserInputError, match="no behaviour policy file"):
        load_behaviour("walker2d", "medium", tmp_path)


def test_all_levels_from_the_tiny_run(tiny_behaviour, tiny_run, tmp_path, monkeypatch):
    import h5py

    monkeypatch.setenv("CTRL_RL_BEHAVIOUR_DIR", str(tiny_behaviour))
    out = generate("Hopper-v5", "all", steps=120, num_envs=2, progress=False, workers=1, from_run=str(tiny_run))
    by = {s["dataset"]: s for s in out}
    assert list(by) == [f"hopper-{lv}-v5" for lv in ("random", "medium", "expert", "medium-expert", "medium-replay")]
    assert all(s["transitions"] == 120 and not s["reused"] for s in out[:3])
    assert all("local v5 references" in s["score_reference"] for s in out)
    # medium-expert: medium cut after its last complete episode, then all of expert
    with h5py.File(by["hopper-medium-v5"]["path"]) as m, h5py.File(by["hopper-medium-expert-v5"]["path"]) as me:
        cut = int(np.flatnonzero(m["terminals"][()] | m["timeouts"][()])[-1]) + 1
        assert me["rewards"].shape[0] == cut + 120
        assert np.array_equal(me["infos/qpos"][:cut], m["infos/qpos"][:cut])
    # medium-replay: the run's first medium_step replay rows in insertion order, no infos
    step = load_manifest(tiny_behaviour)["tasks"]["hopper"]["medium"]["checkpoint_step"]
    from ctrl_rl.learn.checkpoint import load_checkpoint

    replay = load_checkpoint(tiny_run / "checkpoints" / "latest.pt")["replay"]
    with h5py.File(by["hopper-medium-replay-v5"]["path"]) as f:
        assert f["observations"].shape[0] == step and "infos" not in f
        assert np.array_equal(f["observations"][()], replay["obs"][:step].numpy())
        assert np.array_equal(f["timeouts"][()], replay["truncated"][:step].numpy())
        meta = json.loads(f.attrs["ctrl_rl"])
    assert meta["level"] == "medium-replay" and meta["extra"]["request"]["env_steps"] == step
    # the local references were written for --refs local
    assert json.loads((tmp_path / "refs.json").read_text())["scores"]["hopper"]["episodes"] == 3
    # a second call reuses every file; a different request for an existing file is refused
    again = generate("Hopper-v5", "all", steps=120, num_envs=2, progress=False, workers=1, from_run=str(tiny_run))
    assert all(s["reused"] for s in again)
    with pytest.raises(UserInputError, match="steps=120 instead of 130"):
        generate("Hopper-v5", "medium", steps=130, num_envs=2, progress=False, workers=1)
    forced = generate("Hopper-v5", "medium", steps=130, num_envs=2, progress=False, workers=1, force=True)
    assert forced[0]["transitions"] == 130 and not forced[0]["reused"]


def test_medium_replay_re_run_reproduces_the_runs_replay(tiny_behaviour, tiny_run, tmp_path, monkeypatch):
    import h5py

    monkeypatch.setenv("CTRL_RL_BEHAVIOUR_DIR", str(tiny_behaviour))
    [a] = generate("Hopper-v5", "medium-replay", out=str(tmp_path / "a.hdf5"), progress=False,
                   from_run=str(tiny_run))
    [b] = generate("Hopper-v5", "medium-replay", out=str(tmp_path / "b.hdf5"), progress=False)
    with h5py.File(a["path"]) as fa, h5py.File(b["path"]) as fb:
        assert sorted(fa) == sorted(fb) and all(np.array_equal(fa[k][()], fb[k][()]) for k in fa)
        extra_a, extra_b = (json.loads(str(f.attrs["ctrl_rl"]))["extra"] for f in (fa, fb))
    # the re-run records how it ran (its rows depend on the thread count and the machine); --from-run read a replay
    assert extra_b["threads"] == RERUN_THREADS == 1 and extra_b["cpu"] and extra_b["source"].startswith("re-run")
    assert "threads" not in extra_a and "cpu" not in extra_a


def test_from_run_without_replay_or_of_another_run_is_refused(tiny_behaviour, tiny_run, tmp_path, monkeypatch):
    import shutil

    from ctrl_rl.learn.checkpoint import load_checkpoint, save_checkpoint

    monkeypatch.setenv("CTRL_RL_BEHAVIOUR_DIR", str(tiny_behaviour))
    no_replay = tmp_path / "no_replay"
    shutil.copytree(tiny_run, no_replay)
    ck = load_checkpoint(no_replay / "checkpoints" / "latest.pt")
    save_checkpoint(no_replay / "checkpoints" / "latest.pt", {**ck, "replay": None})
    with pytest.raises(UserInputError, match="--save-replay"):
        generate("Hopper-v5", "medium-replay", progress=False, from_run=str(no_replay))
    step = load_manifest(tiny_behaviour)["tasks"]["hopper"]["medium"]["checkpoint_step"]
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    snap = other / "checkpoints" / f"step_{step:09d}.pt"
    ck = load_checkpoint(snap)
    ck["algo_state"]["actor"] = {k: v + 1 for k, v in ck["algo_state"]["actor"].items()}
    save_checkpoint(snap, ck)
    with pytest.raises(UserInputError, match="not the medium behaviour policy"):
        generate("Hopper-v5", "medium-replay", progress=False, from_run=str(other))
    assert not (tmp_path / "datasets").exists()


def test_an_interrupted_write_leaves_nothing_behind(tmp_path, monkeypatch):
    import ctrl_rl.datagen.generate as G

    def crash(path, arrays, meta):
        path.write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(G, "write_dataset", crash)
    with pytest.raises(KeyboardInterrupt):
        generate("Hopper-v5", "random", steps=50, num_envs=2, progress=False, workers=1)
    assert not any((tmp_path / "datasets").iterdir())


@pytest.mark.parametrize("argv, match", [
    (["--env", "Hopper-v5", "--level", "random", "--from-run", "x"], "--from-run"),
    (["--env", "Hopper-v5", "--level", "medium"], "no behaviour policy file"),
    (["--env", "Hopper-v5", "--level", "medium-replay", "--from-run", "no/such/run"], "no/such/run"),
    (["--env", "hopper", "--level", "random"], "Hopper-v5"),
    (["--env", "Hopper-v5", "--level", "random", "--num-envs", "0"], "num-envs"),
    (["--level", "random"], "--env"),
])
def test_more_bad_generate_input(argv, match, tmp_path, monkeypatch, capsys):
    if "--from-run" not in argv:  # else the shipped Hopper policies get as far as the run directory
        monkeypatch.setenv("CTRL_RL_BEHAVIOUR_DIR", str(tmp_path / "empty"))
    assert main(["data", "generate", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "datasets").exists()


def test_a_missing_generated_id_says_how_to_make_it():
    with pytest.raises(UserInputError, match="ctrl-rl data generate --env Walker2d-v5 --level medium-replay"):
        load_dataset("walker2d-medium-replay-v5")


@pytest.mark.parametrize("where", ["under a file", "proc", "reference file under a file"])
def test_an_unwritable_output_is_refused_before_any_work(where, tmp_path, monkeypatch, capsys):
    """Tests run as root, where permission bits do not stop a write: a path under a regular file, or in /proc, does.
    Nothing is generated (collect would raise) and nothing is written, not even the local reference file."""
    import ctrl_rl.datagen.generate as G

    def no_work(*args, **kwargs):
        raise AssertionError("generation started before the outputs were checked")

    monkeypatch.setattr(G, "collect", no_work)
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    out = {"under a file": blocker / "sub" / "out.hdf5", "proc": Path("/proc/ctrl_rl_test/out.hdf5"),
           "reference file under a file": tmp_path / "new" / "out.hdf5"}[where]
    if where == "reference file under a file":
        monkeypatch.setenv("CTRL_RL_REFERENCE_SCORES", str(blocker / "refs.json"))
    argv = ["data", "generate", "--env", "Hopper-v5", "--level", "random", "--steps", "50", "--num-envs", "2",
            "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected" in err
    assert ("local reference file" in err) if where.startswith("reference") else (f"--out {out}" in err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"] and blocker.read_text() == "x"
