"""Datasets that are wrong in ways a loader must catch: one sentence naming the file and what was expected.

Empty after the qlearning view, non-numeric arrays, NaN or non-0/1 flags, a dataset scored against an env of
other sizes, outputs that cannot be written; and ``infer_env_id`` on small files in the real D4RL, ctrl_rl and
Minari layouts.
"""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from ctrl_rl.cli import main
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets import DatasetMeta, infer_env_id, load_dataset, write_dataset
from ctrl_rl.storage.datasets.cache import check_writable
from ctrl_rl.storage.datasets.loader import V5_TASKS, env_spec
from tests.storage.test_datasets import _episode, write_d4rl, write_minari


@pytest.fixture(autouse=True)
def _no_minari(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "no-minari"))
    monkeypatch.setenv("CTRL_RL_DATA_DIR", str(tmp_path / "cache"))


def one_sentence(info, path) -> str:
    text = str(info.value)
    assert str(path) in text and "expected" in text and "\n" not in text
    return text


def write_task_file(path, obs_dim, action_dim, n=6, meta=None, terminals=None, timeouts=None):
    """A D4RL-layout file of n rows with the given sizes (an episode ending in a time-out, then a cut one);
    ``terminals``/``timeouts`` replace the flag arrays as given (any dtype)."""
    tout = np.zeros(n, bool)
    tout[n // 2 - 1] = True
    with h5py.File(path, "w") as f:
        f["observations"] = np.zeros((n, obs_dim), np.float32)
        f["actions"] = np.zeros((n, action_dim), np.float32)
        f["rewards"] = np.ones(n, np.float32)
        f["terminals"] = np.zeros(n, bool) if terminals is None else terminals
        f["timeouts"] = tout if timeouts is None else timeouts
        if meta is not None:
            f.attrs["ctrl_rl"] = meta.to_json()
    return path


# ----- empty after the qlearning view -----

@pytest.mark.parametrize("n, timeouts, why", [
    (1, [], "last row is always dropped"),
    (4, [0, 1, 2, 3], "rows before the last are all time-outs"),
])
def test_a_file_the_qlearning_view_empties_is_refused(tmp_path, n, timeouts, why):
    p = write_d4rl(tmp_path / "few.hdf5", n, timeouts=timeouts)
    with pytest.raises(UserInputError, match=why) as info:
        load_dataset(p)
    assert "keeps none of its" in one_sentence(info, p)
    assert len(load_dataset(p, view="trajectory")) == n  # every row is still there for the other view


def test_a_file_without_timeouts_the_step_counter_empties_is_refused(tmp_path):
    p = write_d4rl(tmp_path / "short.hdf5", 3, with_timeouts=False)
    with pytest.raises(UserInputError, match="max_episode_steps=1") as info:
        load_dataset(p, max_episode_steps=1)
    one_sentence(info, p)


# ----- dtypes and flags -----

NON_NUMERIC = {
    "byte strings": dict(observations=np.array([[b"1.0", b"2"]] * 5)),
    "strings": dict(actions=np.array([["0.1"]] * 5, dtype=h5py.string_dtype())),
    "rewards": dict(rewards=np.array([b"x"] * 5)),
    "infos": {"infos/qpos": np.array([[b"a", b"b"]] * 5)},
}


@pytest.mark.parametrize("case", sorted(NON_NUMERIC))
def test_non_numeric_arrays_are_refused(tmp_path, case):
    p = write_d4rl(tmp_path / "text.hdf5", 5, timeouts=[4], **NON_NUMERIC[case])
    key = next(iter(NON_NUMERIC[case]))
    with pytest.raises(UserInputError, match=f"'{key}' has dtype .*expected numbers") as info:
        load_dataset(p)
    one_sentence(info, p)


@pytest.mark.parametrize("key, values, first", [
    ("terminals", [0, 0, np.nan, 0, 1], "nan at row 2"),
    ("timeouts", [0, 2, 0, 0, 1], "2.0 at row 1"),
    ("terminals", [0, -1, 0, 0, 0], "-1.0 at row 1"),
])
def test_flags_other_than_0_and_1_are_refused(tmp_path, key, values, first):
    p = write_task_file(tmp_path / "flags.hdf5", 2, 1, n=5, **{key: np.array(values, np.float32)})
    with pytest.raises(UserInputError, match=f"'{key}' holds 1 values other than 0 and 1 \\(first {first}\\)") as info:
        load_dataset(p)
    one_sentence(info, p)


def test_float_and_integer_0_1_flags_still_load(tmp_path):
    p = write_task_file(tmp_path / "ok.hdf5", 2, 1, terminals=np.array([0, 0, 1, 0, 0, 0], np.float64),
                        timeouts=np.array([0, 0, 0, 0, 1, 0], np.int8))
    ds = load_dataset(p, view="trajectory")
    assert ds.terminated.tolist() == [False, False, True, False, False, False]
    assert ds.truncated.tolist() == [False, False, False, False, True, False]


def test_write_dataset_refuses_non_numeric_arrays_and_nan_flags(tmp_path):
    rows = {"observations": np.zeros((3, 2), np.float32), "actions": np.zeros((3, 1), np.float32),
            "rewards": np.zeros(3, np.float32), "terminals": np.zeros(3, bool), "timeouts": np.zeros(3, bool)}
    meta = DatasetMeta(env_id="torch:Pendulum", level="random")
    with pytest.raises(UserInputError, match="'observations' has dtype object"):
        write_dataset(tmp_path / "a.hdf5", {**rows, "observations": np.array([["a", 1]] * 3, dtype=object)}, meta)
    with pytest.raises(UserInputError, match="'terminals' holds 1 values other than 0 and 1"):
        write_dataset(tmp_path / "a.hdf5", {**rows, "terminals": np.array([0, np.nan, 0])}, meta)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the temporary file


def test_minari_flags_and_empty_episodes_are_refused(tmp_path):
    pytest.importorskip("minari")
    root = tmp_path / "minari"
    nan = _episode(0, 3, True)
    nan["terminations"] = np.array([0, np.nan, 1], np.float32)
    write_minari(root, "bad/nan-flags-v0", [nan])
    with pytest.raises(UserInputError, match="'terminations' holds 1 values other than 0 and 1"):
        load_dataset("bad/nan-flags-v0", minari_root=root)
    write_minari(root, "bad/empty-v0", [_episode(0, 0, True)])  # one observation, no step
    with pytest.raises(UserInputError, match="episode of no steps: expected at least one step"):
        load_dataset("bad/empty-v0", minari_root=root)


# ----- data info against an env of other sizes -----

def test_data_info_refuses_an_env_of_other_sizes(tmp_path, capsys):
    p = write_task_file(tmp_path / "data.hdf5", 11, 3)
    assert main(["data", "info", str(p), "--env", "torch:Pendulum"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(p) in err
    assert "observations of dim 11 and actions of dim 3" in err and "observations of dim 3 and actions of dim 1" in err
    p2 = write_task_file(tmp_path / "pendulum.hdf5", 3, 1)
    assert main(["data", "info", str(p2), "--env", "torch:Pendulum"]) == 0
    assert json.loads(capsys.readouterr().out)["transitions"] == 6


def test_data_info_checks_the_env_its_record_names_when_it_can_be_made(tmp_path, capsys):
    wrong = write_task_file(tmp_path / "wrong.hdf5", 11, 3, meta=DatasetMeta(env_id="torch:Pendulum", level="x"))
    assert main(["data", "info", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert "env 'torch:Pendulum' has observations of dim 3" in err and "dim 11" in err
    # a recorded env that cannot be made here: the rest of the information is still printed
    other = write_task_file(tmp_path / "other.hdf5", 11, 3, meta=DatasetMeta(env_id="NoSuchSim-v0", level="x"))
    assert main(["data", "info", str(other)]) == 0
    assert json.loads(capsys.readouterr().out)["env"] == "NoSuchSim-v0"


# ----- infer_env_id -----

D4RL_FILES = [
    ("hopper-medium-v2.hdf5", 11, 3, "Hopper-v5"),
    ("hopper_medium-v2.hdf5", 11, 3, "Hopper-v5"),  # D4RL's download names
    ("halfcheetah_medium_replay-v2.hdf5", 17, 6, "HalfCheetah-v5"),
    ("walker2d-medium-expert-v2.hdf5", 17, 6, "Walker2d-v5"),
    ("hopper_random.hdf5", 11, 3, "Hopper-v5"),  # v0 names had no version
    ("ant-medium-v2.hdf5", 111, 8, None),  # D4RL's Ant observes contact forces of 14 bodies, Ant-v5 of 13
    ("hopper-medium-v2.hdf5", 2, 1, None),  # named after hopper, but not its sizes
    ("my-data.hdf5", 11, 3, None),
    ("hopper.hdf5", 11, 3, None),  # no level: not a D4RL name
]


@pytest.mark.parametrize("name, obs_dim, action_dim, expected", D4RL_FILES)
def test_infer_env_id_of_d4rl_files_by_name_and_sizes(tmp_path, name, obs_dim, action_dim, expected):
    assert infer_env_id(write_task_file(tmp_path / name, obs_dim, action_dim)) == expected


def test_infer_env_id_prefers_the_ctrl_rl_record(tmp_path):
    meta = DatasetMeta(env_id="torch:Pendulum", level="random")
    assert infer_env_id(write_task_file(tmp_path / "hopper-medium-v2.hdf5", 3, 1, meta=meta)) == "torch:Pendulum"


def test_infer_env_id_of_generated_ids_and_minari_datasets(tmp_path):
    assert infer_env_id("walker2d-medium-replay-v5") == "Walker2d-v5"  # known before the file is generated
    root = tmp_path / "minari"
    ds_dir = write_minari(root, "mujoco/hopper/medium-v0", [_episode(0, 3, True)])  # env spec Hopper-v5
    for ref in ("mujoco/hopper/medium-v0", "minari:mujoco/hopper/medium-v0"):
        assert infer_env_id(ref, minari_root=root) == "Hopper-v5"
    assert infer_env_id(ds_dir) == "Hopper-v5"
    meta = json.loads((ds_dir / "data" / "metadata.json").read_text())
    (ds_dir / "data" / "metadata.json").write_text(json.dumps({**meta, "env_spec": None}))
    assert infer_env_id(ds_dir) is None


def test_infer_env_id_refuses_what_does_not_exist(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        infer_env_id(tmp_path / "absent.hdf5")
    with pytest.raises(UserInputError, match="neither an existing file nor a Minari dataset"):
        infer_env_id("hopper/medium-v9")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(UserInputError, match="is not an HDF5 file"):
        infer_env_id(tmp_path / "text.hdf5")


@pytest.mark.parametrize("task", sorted(V5_TASKS))
def test_the_v5_sizes_infer_env_id_relies_on_are_the_envs(task):
    pytest.importorskip("mujoco")
    env_id, obs_dim, action_dim = V5_TASKS[task]
    spec = env_spec(env_id)
    assert (spec.obs_dim, spec.action_dim) == (obs_dim, action_dim)


# ----- outputs that cannot be written (tests run as root: permission bits would not stop a write) -----

def test_check_writable(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(UserInputError, match="is a file, so .* cannot be created"):
        check_writable(blocker / "sub" / "out.hdf5", "--out X")
    with pytest.raises(UserInputError, match="/proc is not writable"):
        check_writable(Path("/proc/ctrl_rl_test/out.hdf5"), "--out X")
    with pytest.raises(UserInputError, match="is a directory"):
        check_writable(tmp_path, "--out X")
    check_writable(tmp_path / "new" / "dir" / "out.hdf5", "--out X")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # the probe left nothing behind
