"""Dataset layer: D4RL views vs hand-computed rows, own format and Minari round trips, broken files, scores.

Every file is written here in tmp_path, in the real D4RL (§9.3) and Minari (§9.5) layouts.
"""

import json

import h5py
import numpy as np
import pytest
import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets import (
    D4RL_REFERENCES,
    DatasetMeta,
    ReferenceScores,
    load_d4rl,
    load_dataset,
    load_local_references,
    normalized_score,
    save_local_references,
    to_replay,
    write_dataset,
)
from ctrl_rl.storage.datasets.d4rl import qlearning_rows
from ctrl_rl.storage.datasets.scores import D4RL_SOURCE, normalized_score_from

O, A = 2, 1


def _rows(n):
    """Row i holds obs [i, 10+i], action [i/10], reward i+0.5, so every output row names its source row."""
    obs = np.stack([np.arange(n), 10 + np.arange(n)], 1).astype(np.float32)  # [N,O]
    return obs, (np.arange(n) / 10).astype(np.float32)[:, None], (np.arange(n) + 0.5).astype(np.float32)


def write_d4rl(path, n, terminals=(), timeouts=(), with_timeouts=True, next_obs=False, drop=(), **override):
    """A D4RL-layout file of n rows (gzip like the real ones); ``terminals``/``timeouts`` list the flagged rows."""
    obs, act, rew = _rows(n)
    term, tout = np.zeros(n, bool), np.zeros(n, bool)
    term[list(terminals)], tout[list(timeouts)] = True, True
    data = {"observations": obs, "actions": act, "rewards": rew, "terminals": term,
            "infos/qpos": obs * 2, "infos/action_log_probs": -rew}
    if with_timeouts:
        data["timeouts"] = tout
    if next_obs:
        data["next_observations"] = obs + 100
    data.update(override)
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            if k not in drop:
                f.create_dataset(k, data=v, compression="gzip")
        f["metadata/algorithm"] = "SAC"
        f["metadata/iteration"] = 7
        f["metadata/policy/fc0/weight"] = np.zeros((4, O), np.float32)
    return path


def _src(ds):
    """Source row of every output row (obs[:, 0] is the row number)."""
    return ds.obs[:, 0].long().tolist()


# ----- qlearning view: d4rl.qlearning_dataset, row for row -----

def test_qlearning_view_drops_timeout_rows_and_the_last_row(tmp_path):
    # episode 0: rows 0-2, time limit at row 2; episode 1: rows 3-5, terminal at row 5
    p = write_d4rl(tmp_path / "a.hdf5", 6, terminals=[5], timeouts=[2], next_obs=True)
    ds = load_d4rl(p)
    assert _src(ds) == [0, 1, 3, 4]  # row 2 (timeout) dropped; row 5 never visited (loop stops at N-2)
    assert ds.next_obs[:, 0].tolist() == [1, 2, 4, 5]  # observations[i+1], never next_observations (+100)
    assert ds.action[:, 0].tolist() == pytest.approx([0.0, 0.1, 0.3, 0.4])
    assert ds.reward.tolist() == [0.5, 1.5, 3.5, 4.5]
    assert not ds.terminated.any() and not ds.truncated.any()  # the terminal row 5 is lost with the last row
    assert ds.episode_offsets.tolist() == [0, 2, 4] and ds.infos["qpos"][:, 0].tolist() == [0, 2, 6, 8]
    assert ds.obs.dtype == torch.float32 and ds.terminated.dtype == torch.bool
    assert ds.metadata["d4rl_metadata"] == {"algorithm": "SAC", "iteration": 7}

    # terminate_on_end keeps the timeout row; its done stays terminals[i] (False), its next obs is row 3
    ds = load_d4rl(p, terminate_on_end=True)
    assert _src(ds) == [0, 1, 2, 3, 4] and ds.next_obs[:, 0].tolist() == [1, 2, 3, 4, 5]
    assert ds.truncated.tolist() == [False, False, True, False, False] and not ds.terminated.any()
    assert ds.episode_offsets.tolist() == [0, 3, 5]


def test_qlearning_view_terminal_takes_the_next_episodes_first_obs(tmp_path):
    # episode 0: rows 0-2, terminal at row 2; episode 1: rows 3-5, time limit at row 5
    p = write_d4rl(tmp_path / "b.hdf5", 6, terminals=[2], timeouts=[5])
    ds = load_d4rl(p)
    assert _src(ds) == [0, 1, 2, 3, 4]
    assert ds.terminated.tolist() == [False, False, True, False, False]
    assert ds.next_obs[2].tolist() == [3, 13]  # d4rl's quirk: the reset obs of episode 1
    assert ds.episode_offsets.tolist() == [0, 3, 5] and ds.episode_returns().tolist() == [4.5, 8.0]


def test_qlearning_view_without_timeouts_counts_steps_like_d4rl(tmp_path):
    p = write_d4rl(tmp_path / "c.hdf5", 8, terminals=[1], with_timeouts=False)
    with pytest.raises(UserInputError, match="max_episode_steps"):
        load_d4rl(p)
    # limit 3: after the kept terminal at row 1 d4rl's counter restarts at 1, so row 3 counts as final
    ds = load_d4rl(p, max_episode_steps=3)
    assert _src(ds) == [0, 1, 2, 4, 5] and ds.terminated.tolist() == [False, True, False, False, False]
    ds = load_d4rl(p, max_episode_steps=3, terminate_on_end=True)
    assert _src(ds) == [0, 1, 2, 3, 4, 5, 6]
    assert ds.truncated.tolist() == [False, False, False, True, False, True, False]


def _d4rl_loop(terminals, timeouts, terminate_on_end, max_steps):
    """d4rl.qlearning_dataset's loop written out step by step: (kept rows, done flags)."""
    rows, done, step = [], [], 0
    for i in range(len(terminals) - 1):
        final = bool(timeouts[i]) if timeouts is not None else step == max_steps - 1
        if not terminate_on_end and final:
            step = 0
            continue
        if terminals[i] or final:
            step = 0
        rows.append(i)
        done.append(bool(terminals[i]))
        step += 1
    return rows, done


@pytest.mark.parametrize("use_timeouts", [True, False])
@pytest.mark.parametrize("terminate_on_end", [False, True])
def test_qlearning_rows_match_the_d4rl_loop_on_random_flags(use_timeouts, terminate_on_end):
    g = np.random.default_rng(0)
    term = g.random(500) < 0.03
    tout = (g.random(500) < 0.03) if use_timeouts else None
    rows, _, _ = qlearning_rows(term, tout, terminate_on_end, max_episode_steps=None if use_timeouts else 20)
    ref_rows, ref_done = _d4rl_loop(term, tout, terminate_on_end, 20)
    assert rows.tolist() == ref_rows and term[rows].tolist() == ref_done


# ----- trajectory view -----

def test_trajectory_view_keeps_whole_episodes_and_stored_next_obs(tmp_path):
    p = write_d4rl(tmp_path / "t.hdf5", 7, terminals=[2], timeouts=[5], next_obs=True)  # rows 0-2, 3-5, 6 (open)
    ds = load_dataset(p, view="trajectory")
    assert _src(ds) == list(range(7)) and ds.episode_offsets.tolist() == [0, 3, 6, 7]
    assert ds.terminated.tolist() == [False, False, True, False, False, False, False]
    assert ds.truncated.tolist() == [False, False, False, False, False, True, False]
    assert torch.equal(ds.next_obs, ds.obs + 100) and ds.next_obs_valid.all()
    assert ds.episode_returns().tolist() == [4.5, 13.5, 6.5] and ds.infos["action_log_probs"].shape == (7,)


def test_trajectory_view_without_next_observations_marks_episode_ends(tmp_path):
    p = write_d4rl(tmp_path / "t.hdf5", 6, terminals=[2], timeouts=[5])
    ds = load_dataset(p, view="trajectory")
    assert ds.next_obs_valid.tolist() == [True, True, False, True, True, False]
    assert ds.next_obs[:, 0].tolist() == [1, 2, 2, 4, 5, 5]  # unknown ones are copies of obs
    buf = to_replay(ds)
    assert len(buf) == 4 and buf.obs[:, 0].tolist() == [0, 1, 3, 4]
    # no timeouts key: the episode is cut after max_episode_steps steps (correct count, unlike sequence_dataset)
    p = write_d4rl(tmp_path / "u.hdf5", 7, terminals=[1], with_timeouts=False)
    ds = load_dataset(p, view="trajectory", max_episode_steps=3)
    assert ds.episode_offsets.tolist() == [0, 2, 5, 7] and ds.truncated.nonzero().squeeze(1).tolist() == [4]


def test_to_replay_holds_every_row_on_the_device():
    from ctrl_rl.storage.datasets import OfflineDataset

    obs = torch.arange(10.0).view(5, 2)
    ds = OfflineDataset(obs, torch.ones(5, 3), torch.arange(5.0), obs + 1, torch.tensor([0, 0, 1, 0, 0]).bool(),
                        torch.tensor([0, 0, 0, 0, 1]).bool(), torch.tensor([0, 3, 5]), torch.ones(5, dtype=torch.bool))
    buf = to_replay(ds, "cpu")
    assert buf.capacity == 5 and len(buf) == 5 and torch.equal(buf.next_obs, obs + 1)
    assert buf.terminated.tolist() == [False, False, True, False, False] and buf.truncated[4]
    assert to_replay(ds, capacity=8).capacity == 8
    with pytest.raises(UserInputError, match="capacity"):
        to_replay(ds, capacity=3)


# ----- ctrl_rl's own format -----

def test_own_format_round_trip(tmp_path):
    obs, act, rew = _rows(6)
    term, tout = np.zeros(6, bool), np.zeros(6, bool)
    term[2], tout[5] = True, True
    meta = DatasetMeta("Hopper-v5", "medium", policy="runs/sac/ckpt_300000.pt", seed=3,
                       versions={"gymnasium": "1.4.0"},
                       ref_scores={"random": -20.0, "expert": 3000.0, "source": "local"},
                       extra={"steps": 6})
    p = write_dataset(tmp_path / "sub" / "hopper-medium-v5.hdf5",
                      {"observations": torch.from_numpy(obs), "actions": act, "rewards": rew, "terminals": term,
                       "timeouts": tout, "next_observations": obs + 100, "infos/qpos": obs * 3}, meta)
    with h5py.File(p) as f:  # plain D4RL layout plus one root attribute
        assert sorted(f.keys()) == ["actions", "infos", "next_observations", "observations", "rewards", "terminals",
                                    "timeouts"]
        assert f["terminals"].dtype == bool and f["observations"].compression == "gzip"
    ds = load_dataset(p, view="trajectory")
    assert ds.metadata["format"] == "ctrl_rl" and ds.metadata["env_id"] == "Hopper-v5"
    assert ds.metadata["dataset"] == {**meta.__dict__} and ds.metadata["ref_scores"]["expert"] == 3000.0
    assert torch.equal(ds.obs, torch.from_numpy(obs)) and torch.equal(ds.next_obs, torch.from_numpy(obs + 100))
    assert ds.terminated.tolist() == term.tolist() and ds.truncated.tolist() == tout.tolist()
    assert torch.equal(ds.infos["qpos"], torch.from_numpy(obs * 3))
    assert _src(load_dataset(p)) == [0, 1, 2, 3, 4]  # default view: qlearning
    assert load_d4rl(p).metadata["format"] == "d4rl"  # still a valid plain D4RL file
    with pytest.raises(UserInputError, match="timeouts"):
        write_dataset(tmp_path / "x.hdf5", {"observations": obs, "actions": act, "rewards": rew, "terminals": term},
                      meta)


# ----- Minari -----

def write_minari(root, dataset_id, episodes, minari_version="0.5.4", ref=(-20.0, 3000.0)):
    """A Minari HDF5-backend dataset: <root>/<id>/data/{metadata.json, main_data.hdf5}, one group per episode."""
    from gymnasium.envs.registration import EnvSpec

    data = root / dataset_id / "data"
    data.mkdir(parents=True)
    with h5py.File(data / "main_data.hdf5", "w") as f:
        for i, ep in enumerate(episodes):
            g = f.create_group(f"episode_{i}")
            g.attrs.update(id=i, total_steps=len(ep["rewards"]), seed=123 + i)
            for k, v in ep.items():
                g.create_dataset(k, data=v)
            g.create_group("infos").create_dataset("x_position", data=np.zeros(len(ep["rewards"])))
    box = lambda n, lo, hi: json.dumps({"type": "Box", "dtype": "float32", "shape": [n], "low": [lo] * n,  # noqa: E731
                                        "high": [hi] * n})
    spec = EnvSpec(id="Hopper-v5", entry_point="gymnasium.envs.mujoco.hopper_v5:HopperEnv", max_episode_steps=1000)
    meta = {"dataset_id": dataset_id, "total_episodes": len(episodes),
            "total_steps": sum(len(e["rewards"]) for e in episodes), "data_format": "hdf5",
            "observation_space": box(O, -np.inf, np.inf), "action_space": box(A, -1.0, 1.0),
            "env_spec": spec.to_json(), "algorithm_name": "SAC", "author": ["ctrl_rl tests"],
            "author_email": ["none"], "code_permalink": "none", "minari_version": minari_version,
            "ref_min_score": ref[0], "ref_max_score": ref[1], "num_episodes_average_score": 100,
            "dataset_size": 0.1, "requirements": ["gymnasium[mujoco]>=1.0"]}
    (data / "metadata.json").write_text(json.dumps(meta))
    return root / dataset_id


def _episode(start, T, terminated):
    obs = np.stack([start + np.arange(T + 1), np.zeros(T + 1)], 1).astype(np.float32)  # [T+1,O] incl. final obs
    flags = np.zeros(T, bool)
    return {"observations": obs, "actions": np.full((T, A), 0.5, np.float32),
            "rewards": (start + np.arange(T)).astype(np.float64),
            "terminations": flags | (terminated & (np.arange(T) == T - 1)),
            "truncations": flags | (~terminated & (np.arange(T) == T - 1))}


def test_minari_round_trip(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    root = tmp_path / "minari"
    ds_dir = write_minari(root, "mujoco/hopper/medium-v0", [_episode(0, 3, True), _episode(100, 2, False)])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    ds = load_dataset("mujoco/hopper/medium-v0")  # through minari.load_dataset
    assert ds.obs[:, 0].tolist() == [0, 1, 2, 100, 101] and ds.next_obs[:, 0].tolist() == [1, 2, 3, 101, 102]
    assert ds.terminated.tolist() == [False, False, True, False, False]
    assert ds.truncated.tolist() == [False, False, False, False, True]
    assert ds.episode_offsets.tolist() == [0, 3, 5] and ds.next_obs_valid.all() and ds.action.shape == (5, A)
    assert ds.metadata["format"] == "minari" and ds.metadata["env_id"] == "Hopper-v5"
    assert ds.metadata["ref_scores"]["random"] == -20.0 and ds.metadata["total_steps"] == 5
    for other in (load_dataset("minari:mujoco/hopper/medium-v0"), load_dataset(ds_dir),
                  load_dataset("mujoco/hopper/medium-v0", minari_root=root)):
        assert torch.equal(other.obs, ds.obs) and torch.equal(other.truncated, ds.truncated)
    assert len(to_replay(ds)) == 5
    with pytest.raises(UserInputError, match="trajectory view"):
        load_dataset("mujoco/hopper/medium-v0", view="qlearning")
    with pytest.raises(UserInputError, match="dim 2: expected 11"):
        load_dataset("mujoco/hopper/medium-v0", obs_dim=11)


def test_minari_own_writer_gives_the_same_dataset_as_the_hand_written_layout(tmp_path, monkeypatch):
    """minari.create_dataset_from_buffers needs no jax (only its DataCollector does): a cross-check of write_minari."""
    import warnings

    import gymnasium as gym
    minari = pytest.importorskip("minari")
    from minari.data_collector import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "m"))
    eps = [_episode(0, 3, True), _episode(100, 2, False)]
    buffers = [EpisodeBuffer(seed=123 + i, observations=e["observations"], actions=e["actions"],
                             rewards=e["rewards"].tolist(), terminations=e["terminations"].tolist(),
                             truncations=e["truncations"].tolist(), infos={}) for i, e in enumerate(eps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            "own/hopper/medium-v0", buffers, observation_space=gym.spaces.Box(-np.inf, np.inf, (O,), np.float32),
            action_space=gym.spaces.Box(-1, 1, (A,), np.float32), algorithm_name="SAC", author="t", author_email="t",
            code_permalink="none", data_format="hdf5")
    write_minari(tmp_path / "m", "hand/hopper/medium-v0", eps)
    own, hand = load_dataset("own/hopper/medium-v0"), load_dataset("hand/hopper/medium-v0")
    for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_offsets"):
        assert torch.equal(getattr(own, f), getattr(hand, f)), f


def test_minari_broken_datasets_are_refused(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    short = _episode(0, 3, True)
    short["observations"] = short["observations"][:3]  # T rows instead of T+1
    write_minari(root, "bad/short-v0", [short])
    with pytest.raises(UserInputError, match="episode 0 has 3 observations"):
        load_dataset("minari:bad/short-v0")
    nan = _episode(0, 3, True)
    nan["rewards"][1] = np.nan
    write_minari(root, "bad/nan-v0", [nan])
    with pytest.raises(UserInputError, match="'rewards' holds 1 NaN or inf values"):
        load_dataset("minari:bad/nan-v0")
    write_minari(root, "bad/old-v0", [_episode(0, 3, True)], minari_version="0.1.0")
    with pytest.raises(UserInputError, match="cannot be read by minari"):
        load_dataset("minari:bad/old-v0")
    with pytest.raises(UserInputError, match="is not under"):
        load_dataset("minari:mujoco/absent/medium-v0")


# ----- broken D4RL files: one sentence naming the file and what was expected -----

def _truncated(path):
    write_d4rl(path, 400, timeouts=[399])
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path


def _text(path):
    path.write_text("observations,actions\n1,2\n")
    return path


BROKEN = {
    "missing key": (lambda p: write_d4rl(p, 5, drop=("terminals",)), {}, "has no 'terminals' dataset"),
    "length mismatch": (lambda p: write_d4rl(p, 5, rewards=np.zeros(4, np.float32)), {},
                        "'rewards' has 4 rows but 'observations' has 5"),
    "obs dim": (lambda p: write_d4rl(p, 5), {"obs_dim": 11}, "observations have dim 2: expected 11"),
    "action dim": (lambda p: write_d4rl(p, 5), {"action_dim": 3}, "actions have dim 1: expected 3"),
    "nan": (lambda p: write_d4rl(p, 5, observations=np.where(np.eye(5, 2) > 0, np.nan, 1).astype(np.float32)), {},
            "'observations' holds 2 NaN or inf values \\(first at row 0\\)"),
    "inf": (lambda p: write_d4rl(p, 5, rewards=np.array([0, 0, 0, np.inf, 0], np.float32)), {},
            "'rewards' holds 1 NaN or inf values \\(first at row 3\\)"),
    "obs shape": (lambda p: write_d4rl(p, 5, observations=np.zeros(5, np.float32)), {}, "expected a 2-D array"),
    "empty": (lambda p: write_d4rl(p, 0), {}, "holds no steps"),
    "truncated file": (_truncated, {}, "is a truncated or damaged HDF5 file"),
    "not hdf5": (_text, {}, "is not an HDF5 file"),
    "nonexistent": (lambda p: p, {}, "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_give_one_clear_sentence(tmp_path, monkeypatch, case):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "no-minari"))
    make, kwargs, message = BROKEN[case]
    path = make(tmp_path / f"{case.replace(' ', '_')}.hdf5")
    with pytest.raises(UserInputError, match=message) as info:
        load_dataset(path, **kwargs)
    text = str(info.value)
    assert str(path) in text and "expected" in text and "\n" not in text


def test_other_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "no-minari"))
    with pytest.raises(UserInputError, match="does not exist"):
        load_d4rl(tmp_path / "absent.hdf5")
    with pytest.raises(UserInputError, match="'hopper/medium-v9' is neither an existing file nor a Minari dataset"):
        load_dataset("hopper/medium-v9")
    with pytest.raises(UserInputError, match="is a directory"):
        load_dataset(tmp_path)
    p = write_d4rl(tmp_path / "a.hdf5", 5)
    with pytest.raises(UserInputError, match="unknown dataset view"):
        load_dataset(p, view="episodes")
    with h5py.File(p, "a") as f:
        f.attrs["ctrl_rl"] = '{"env_id": "Hopper-v5"}'  # no level
    with pytest.raises(UserInputError, match="metadata record is malformed"):
        load_dataset(p)


# ----- normalized scores -----

def test_d4rl_normalized_scores_match_the_reference_table():
    assert normalized_score("hopper-medium-v2", 3234.3) == (pytest.approx(100.0), D4RL_SOURCE)
    assert normalized_score("Hopper-v5", -20.272305)[0] == pytest.approx(0.0)
    # 100 * (R - min) / (max - min) with the §9.1 constants, worked by hand
    assert normalized_score("HalfCheetah-v5", 5927.4105235)[0] == pytest.approx(50.0)
    assert normalized_score("walker2d-expert-v2", 2296.9645)[0] == pytest.approx(100 * 2295.335492 / 4590.670992)
    assert normalized_score("mujoco/ant/expert-v0", 3879.7)[0] == pytest.approx(100.0)
    assert D4RL_REFERENCES["ant"].random == -325.6
    scores, _ = normalized_score("hopper", torch.tensor([-20.272305, 3234.3]))
    assert torch.allclose(scores, torch.tensor([0.0, 100.0]))
    with pytest.raises(UserInputError, match="no reference scores for 'antmaze-umaze-v2'"):
        normalized_score("antmaze-umaze-v2", 1.0)
    with pytest.raises(TypeError):
        D4RL_REFERENCES["hopper"] = ReferenceScores(0.0, 1.0)  # frozen table


def test_local_references_save_load_and_refuse_when_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRL_RL_REFERENCE_SCORES", str(tmp_path / "refs.json"))
    with pytest.raises(UserInputError, match="no locally measured reference scores at .*refs.json"):
        normalized_score("Hopper-v5", 100.0, refs="local")
    save_local_references({"Hopper-v5": ReferenceScores(10.0, 110.0, "Hopper-v5", 100)})
    score, source = normalized_score("Hopper-v5", 60.0, refs="local")
    assert score == pytest.approx(50.0) and "local v5" in source and "refs.json" in source
    table = load_local_references(tmp_path / "refs.json")
    assert table.scores["hopper"] == ReferenceScores(10.0, 110.0, "Hopper-v5", 100)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(UserInputError, match="is malformed"):
        load_local_references(tmp_path / "bad.json")
    assert normalized_score_from({"random": 0.0, "expert": 200.0, "source": "Minari"}, 50.0) == (25.0, "Minari")


def test_dataset_fingerprint_hashes_rows_and_lists_videos(tmp_path):
    import hashlib

    from ctrl_rl.storage.datasets.loader import dataset_fingerprint

    f = tmp_path / "rows.hdf5"
    f.write_bytes(b"abc" * 1000)
    assert dataset_fingerprint(f) == {"path": str(f.resolve()), "bytes": 3000,
                                      "sha256": hashlib.sha256(b"abc" * 1000).hexdigest()}
    # a LeRobot directory: every file by path, size and bytes, except encoded videos (path and size)
    d = tmp_path / "lerobot"
    for rel, body in (("meta/info.json", b"{}"), ("data/chunk-000/file-000.parquet", b"rows"),
                      ("videos/cam/chunk-000/file-000.mp4", b"frames")):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(body)
    first = dataset_fingerprint(d)
    assert first["files"] == 3 and first["bytes"] == 2 + 4 + 6 and first["path"] == str(d.resolve())
    video = d / "videos/cam/chunk-000/file-000.mp4"
    video.write_bytes(b"FRAMES")  # same size: the same fingerprint
    assert dataset_fingerprint(d) == first
    video.write_bytes(b"frames!")
    assert dataset_fingerprint(d)["sha256"] != first["sha256"]
    video.write_bytes(b"frames")
    (d / "data/chunk-000/file-000.parquet").write_bytes(b"ROWS")  # a changed row, same size: another fingerprint
    assert dataset_fingerprint(d)["sha256"] != first["sha256"]
    # a Minari dataset directory; a path that is no dataset is refused as load_dataset refuses it
    m = tmp_path / "minari" / "mujoco" / "hopper-v0"
    (m / "data").mkdir(parents=True)
    (m / "data" / "metadata.json").write_text("{}")
    assert dataset_fingerprint(m)["files"] == 1
    with pytest.raises(UserInputError, match="does not exist"):
        dataset_fingerprint(tmp_path / "none.hdf5")
