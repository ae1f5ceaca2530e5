"""LeRobot datasets: ctrl_rl's writer and reader against each other, against files the LeRobot library wrote
(``fixtures/lerobot_v30_reference``, by ``lerobot-dataset`` 0.4.4) and against a hand-made v2.1 dataset
(``fixtures/lerobot_v21_tiny``); malformed datasets give one sentence naming the path; a failed write leaves
nothing behind.

Video tolerance: frames decode to within a mean absolute error of 4 (uint8 units) of what was written, for AV1
at LeRobot's crf 30 and H.264 on these small colourful test images (4:2:0 chroma subsampling accounts for most
of it); measured 1.6-1.9 (AV1) and 2.6-3.1 (H.264). Everything else is compared exactly.
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pyarrow")
pytest.importorskip("av")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.storage.datasets import to_replay  # noqa: E402
from ctrl_rl.storage.datasets.lerobot import (  # noqa: E402
    LeRobotWriter,
    droid_features,
    lerobot_info,
    load_lerobot,
    pick_encoder,
    read_lerobot,
    to_offline_dataset,
)
from ctrl_rl.storage.datasets.lerobot import writer as lerobot_write  # noqa: E402
from tests.scripts import experiment_script  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "lerobot_v30_reference"
V21 = FIXTURES / "lerobot_v21_tiny"
MAE = 4.0  # video tolerance, uint8 units (module docstring)


@pytest.fixture(scope="module")
def ref():
    """The reference fixture's generating script: FEATURES, LENGTHS, TASKS, FPS and expected_frame(e, t)."""
    with experiment_script("tests/storage/fixtures/lerobot_v30_reference/make_reference.py", "lerobot_ref") as mod:
        yield mod


@pytest.fixture(scope="module")
def v21():
    with experiment_script("tests/storage/fixtures/lerobot_v21_tiny/make_fixture.py", "lerobot_v21") as mod:
        yield mod


def write_like_reference(root, ref, **kwargs) -> Path:
    """The reference fixture's content written by ctrl_rl's writer (plus a per-episode ``success`` column)."""
    with LeRobotWriter(root, ref.FPS, ref.FEATURES, robot_type="Franka", **kwargs) as w:
        for e, T in enumerate(ref.LENGTHS):
            for t in range(T):
                w.add_frame(ref.expected_frame(e, t), ref.TASKS[e])
            w.save_episode({"success": e != 1})
    return Path(root)


def mae(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int64) - b.astype(np.int64)).mean())


def one_sentence(info, path) -> str:
    text = str(info.value)
    assert str(path) in text and "expected" in text and "\n" not in text, text
    return text


# ----- reading what LeRobot wrote -----

def test_reference_fixture_reads_back_the_values_its_script_wrote(ref):
    d = read_lerobot(REFERENCE)
    assert (d.version, d.fps, d.robot_type, d.num_episodes, d.num_frames) == ("v3.0", 15, "Franka", 3, 19)
    assert d.tasks == ["pick up the red block", "open the drawer"]
    assert d.episode_lengths().tolist() == list(ref.LENGTHS)
    assert d.episodes.column("tasks").to_pylist() == [[t] for t in ref.TASKS]
    for e, T in enumerate(ref.LENGTHS):
        f = d.frames(e)
        np.testing.assert_array_equal(f["frame_index"], np.arange(T))
        np.testing.assert_array_equal(f["episode_index"], np.full(T, e))
        np.testing.assert_array_equal(f["index"], sum(ref.LENGTHS[:e]) + np.arange(T))
        np.testing.assert_array_equal(f["timestamp"], (np.arange(T) / ref.FPS).astype(np.float32))
        assert [d.tasks[i] for i in f["task_index"]] == [ref.TASKS[e]] * T
        for key, ft in ref.FEATURES.items():
            want = np.stack([ref.expected_frame(e, t)[key] for t in range(T)])  # [T,...]
            if ft["dtype"] == "video":
                got = d.video_frames(key, e)
                assert got.shape == want.shape and got.dtype == np.uint8
                assert mae(got, want) < MAE, (key, e, mae(got, want))
            else:
                np.testing.assert_array_equal(f[key], want.reshape(f[key].shape))


def test_reference_fixture_info(ref):
    info = lerobot_info(REFERENCE)
    assert info["codebase_version"] == "v3.0" and info["robot_type"] == "Franka" and info["fps"] == 15
    assert (info["episodes"], info["frames"]) == (3, 19)
    assert info["cameras"] == {"observation.images.front": [32, 48, 3], "observation.images.wrist": [24, 32, 3]}
    assert info["codecs"] == {"observation.images.front": "av1", "observation.images.wrist": "av1"}
    assert info["instructions"] == ["pick up the red block", "open the drawer"]
    assert info["success_rate"] == pytest.approx(2 / 3)  # is_episode_successful: episodes 0 and 2
    assert info["features"] == {"observation.state": [4], "action": [3], "reward": [1], "is_terminal": [1],
                                "is_episode_successful": [1]}


# ----- writing: round trip, structure of LeRobot's files, episode boundaries -----

def test_round_trip_returns_what_was_written(tmp_path, ref):
    root = write_like_reference(tmp_path / "ds", ref)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temporary directory left
    d = read_lerobot(root)
    assert (d.num_episodes, d.num_frames, d.tasks) == (3, 19, ["pick up the red block", "open the drawer"])
    assert d.episodes.column("success").to_pylist() == [True, False, True]
    for e, T in enumerate(ref.LENGTHS):
        f = d.frames(e)
        np.testing.assert_array_equal(f["timestamp"], (np.arange(T) / ref.FPS).astype(np.float32))
        np.testing.assert_array_equal(f["index"], sum(ref.LENGTHS[:e]) + np.arange(T))
        np.testing.assert_array_equal(f["task_index"], np.full(T, 0 if e != 1 else 1))
        for key, ft in ref.FEATURES.items():
            want = np.stack([ref.expected_frame(e, t)[key] for t in range(T)])
            if ft["dtype"] == "video":
                assert mae(d.video_frames(key, e), want) < MAE
            else:
                assert f[key].dtype == np.dtype(ft["dtype"])
                np.testing.assert_array_equal(f[key], want.reshape(f[key].shape))


def test_writer_output_has_the_structure_of_lerobots_files(tmp_path, ref):
    """Same info.json (video info included when SVT-AV1 is there), same parquet schemas and Hugging Face
    feature metadata, same statistics keys and shapes, and the same statistics where LeRobot computes them right
    (not image std, nor its histogram quantiles)."""
    root = write_like_reference(tmp_path / "ds", ref)
    ours, theirs = (json.loads((r / "meta/info.json").read_text()) for r in (root, REFERENCE))
    if pick_encoder() != "libsvtav1":  # the codec is recorded as written
        for k in ("observation.images.front", "observation.images.wrist"):
            ours["features"][k]["info"]["video.codec"] = "av1"
    assert ours == theirs
    for rel in ("data/chunk-000/file-000.parquet", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet"):
        a, b = pq.read_schema(root / rel), pq.read_schema(REFERENCE / rel)
        fields = [f for f in a if f.name != "success"]  # our extra column
        assert pa.schema(fields).equals(b.remove_metadata()), rel
    hf = {r: json.loads(pq.read_schema(r / "data/chunk-000/file-000.parquet").metadata[b"huggingface"])
          for r in (root, REFERENCE)}
    assert hf[root]["info"]["features"] == hf[REFERENCE]["info"]["features"]
    assert pq.ParquetFile(root / "data/chunk-000/file-000.parquet").metadata.num_row_groups == 3  # one per episode
    ours, theirs = (json.loads((r / "meta/stats.json").read_text()) for r in (root, REFERENCE))
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert sorted(ours[key]) == sorted(theirs[key]), key
        for stat in theirs[key]:
            assert np.shape(ours[key][stat]) == np.shape(theirs[key][stat]), (key, stat)
        exact = ("min", "max", "count") if "images" in key else ("min", "max", "mean", "std", "count")
        for stat in exact:
            np.testing.assert_allclose(np.asarray(ours[key][stat], float), np.asarray(theirs[key][stat], float),
                                       rtol=1e-6, atol=1e-7, err_msg=f"{key} {stat}")


def test_tasks_parquet_reads_as_lerobots_pandas_frame(tmp_path, ref):
    """LeRobot loads meta/tasks.parquet with pandas: the task strings must come back as the index (the
    ``pandas`` schema metadata names the index column as in LeRobot's file; pandas reads it when installed)."""
    root = write_like_reference(tmp_path / "ds", ref)
    ours, theirs = (json.loads(pq.read_schema(r / "meta/tasks.parquet").metadata[b"pandas"]) for r in (root, REFERENCE))
    assert ours["index_columns"] == theirs["index_columns"] == ["__index_level_0__"]
    assert [c["field_name"] for c in ours["columns"]] == [c["field_name"] for c in theirs["columns"]]
    assert [c["name"] for c in ours["columns"]] == [c["name"] for c in theirs["columns"]]
    tables = [pq.read_table(r / "meta/tasks.parquet").to_pydict() for r in (root, REFERENCE)]
    assert tables[0] == tables[1]
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(root / "meta/tasks.parquet")
    assert list(frame.index) == ["pick up the red block", "open the drawer"]
    assert frame["task_index"].tolist() == [0, 1]


def test_episode_boundaries_across_shared_and_rolled_over_files(tmp_path):
    """Odd episode lengths, several episodes per mp4, and files closed by the size limits (data and video, two
    files per chunk): every episode decodes to its own frames, never a neighbour's."""
    lengths = [5, 1, 7, 4, 6, 3]
    features = {"x": {"dtype": "float32", "shape": (2,), "names": None},
                "observation.images.cam": {"dtype": "video", "shape": (32, 48, 3), "names": None}}
    rng = np.random.default_rng(0)
    levels = rng.permutation(40)[: sum(lengths)] * 6 + 10  # [S] a distinct grey per frame, 10..244
    frames = np.broadcast_to(levels[:, None, None, None], (sum(lengths), 32, 48, 3)).astype(np.uint8)
    with LeRobotWriter(tmp_path / "ds", 15, features, data_files_size_in_mb=1e-4, video_files_size_in_mb=4e-4,
                       chunks_size=2) as w:
        row = 0
        for T in lengths:
            for _ in range(T):
                w.add_frame({"x": np.array([row, -row], np.float32), "observation.images.cam": frames[row]}, "go")
                row += 1
            w.save_episode()
    d = read_lerobot(tmp_path / "ds")
    eps = d.episodes.to_pydict()
    data_files = {(c, f) for c, f in zip(eps["data/chunk_index"], eps["data/file_index"])}
    video_files = list(zip(eps["videos/observation.images.cam/chunk_index"],
                           eps["videos/observation.images.cam/file_index"]))
    assert len(data_files) > 2 and 1 < len(set(video_files)) < len(lengths)  # shared and rolled over
    assert (1, 0) in data_files  # a second chunk directory
    starts = eps["videos/observation.images.cam/from_timestamp"]
    stops = eps["videos/observation.images.cam/to_timestamp"]
    for e in range(len(lengths)):
        shared = e > 0 and video_files[e] == video_files[e - 1]
        assert starts[e] == pytest.approx(stops[e - 1] if shared else 0.0)
        assert stops[e] - starts[e] == pytest.approx(lengths[e] / 15)
    row = 0
    for e, T in enumerate(lengths):
        np.testing.assert_array_equal(d.frames(e)["x"][:, 0], np.arange(row, row + T))
        got = d.video_frames("observation.images.cam", e).reshape(T, -1).mean(1)  # [T] grey levels
        nearest = np.abs(got[:, None] - levels[None, :]).argmin(1)  # the frame each decoded one looks like
        np.testing.assert_array_equal(nearest, np.arange(row, row + T))
        row += T


def test_h264_and_strings_and_droid_features(tmp_path):
    feats = droid_features(image_hw=(36, 64), cameras=("exterior_1_left", "wrist_left"))
    assert feats["observation.state"]["shape"] == (8,) and feats["action"]["shape"] == (8,)
    assert feats["action.original"]["shape"] == (7,)
    assert feats["observation.images.wrist_left"]["shape"] == (36, 64, 3)
    for key in ("observation.state.joint_position", "observation.state.cartesian_position",
                "observation.state.gripper_position", "action.cartesian_velocity", "action.gripper_position",
                "is_first", "is_last", "is_terminal", "reward", "discount", "is_episode_successful",
                "language_instruction"):
        assert key in feats, key
    rng = np.random.default_rng(1)
    written = []
    with LeRobotWriter(tmp_path / "droid", 15, feats, "Franka", codec="h264") as w:
        for e, (T, ok) in enumerate([(4, True), (3, False)]):
            ep = []
            for t in range(T):
                joints, grip = rng.normal(size=7).astype(np.float32), np.float32([t / T])
                frame = {k: rng.normal(size=ft["shape"]).astype(np.float32) for k, ft in feats.items()
                         if ft["dtype"] == "float32"}
                frame.update({k: np.full((36, 64, 3), 40 * t + 100 * e, np.uint8) for k, ft in feats.items()
                              if ft["dtype"] == "video"})
                frame.update({k: f"{k} of episode {e}" for k, ft in feats.items() if ft["dtype"] == "string"})
                frame.update({"observation.state.joint_position": joints, "observation.state.gripper_position": grip,
                              "observation.state": np.concatenate([joints, grip]), "is_first": t == 0,
                              "is_last": t == T - 1, "is_terminal": ok and t == T - 1, "is_episode_successful": ok,
                              "reward": float(ok and t == T - 1), "language_instruction": f"task {e}"})
                w.add_frame(frame, f"task {e}")
                ep.append(frame)
            w.save_episode()
            written.append(ep)
    d = read_lerobot(tmp_path / "droid")
    assert d.info["features"]["observation.images.wrist_left"]["info"]["video.codec"] == "h264"
    for e, ep in enumerate(written):
        f = d.frames(e)
        for key, ft in feats.items():
            if ft["dtype"] == "video":
                assert mae(d.video_frames(key, e), np.stack([fr[key] for fr in ep])) < MAE
            elif ft["dtype"] == "string":
                assert f[key].tolist() == [fr[key] for fr in ep]
            else:
                np.testing.assert_array_equal(f[key], np.stack([np.asarray(fr[key], ft["dtype"]) for fr in ep])
                                              .reshape(f[key].shape))
    info = lerobot_info(tmp_path / "droid")
    assert info["success_rate"] == 0.5 and info["instructions"] == ["task 0", "task 1"]
    assert info["robot_type"] == "Franka" and info["codecs"]["observation.images.exterior_1_left"] == "h264"


# ----- v2.1 -----

def test_v21_fixture(v21):
    d = read_lerobot(V21)
    assert (d.version, d.fps, d.num_episodes, d.num_frames) == ("v2.1", 10, 2, 10)
    assert d.tasks == list(v21.TASKS)
    for e, T in enumerate(v21.LENGTHS):
        f = d.frames(e)
        np.testing.assert_array_equal(f["observation.state"], np.stack([v21.state(e, t) for t in range(T)]))
        np.testing.assert_array_equal(f["action"], np.stack([v21.action(e, t) for t in range(T)]))  # variable lists
        np.testing.assert_array_equal(f["next.done"], np.arange(T) == T - 1)
        video = d.video_frames("observation.images.top", e)
        assert mae(video, np.stack([v21.image(e, t) for t in range(T)])) < MAE  # H.264 with B-frames
    info = lerobot_info(V21)
    assert info["success_rate"] is None and info["codecs"] == {"observation.images.top": "h264"}
    assert info["instructions"] == list(v21.TASKS)
    ds = load_lerobot(V21)
    assert ds.metadata["reward_key"] == "next.reward" and ds.metadata["terminal_key"] == "next.done"
    np.testing.assert_array_equal(ds.terminated.nonzero().squeeze(1).numpy(), [3, 9])


# ----- the offline learners' view -----

def test_to_offline_dataset(tmp_path, ref):
    d = read_lerobot(write_like_reference(tmp_path / "ds", ref))
    ds = to_offline_dataset(d, cameras=True)
    S = 19
    assert len(ds) == S and ds.num_episodes == 3 and ds.episode_offsets.tolist() == [0, 6, 14, 19]
    assert [(p.name, p.shape, p.dtype) for p in ds.obs_parts] == [
        ("state", (4,), torch.float32), ("image/front", (3, 32, 48), torch.uint8),
        ("image/wrist", (3, 24, 32), torch.uint8)]
    state = np.concatenate([np.stack([ref.expected_frame(e, t)["observation.state"] for t in range(T)])
                            for e, T in enumerate(ref.LENGTHS)])  # [S,4]
    np.testing.assert_array_equal(ds.obs["state"].numpy(), state)
    inside = np.ones(S, bool)
    inside[[5, 13, 18]] = False  # last frames
    np.testing.assert_array_equal(ds.next_obs["state"].numpy()[inside], state[1:][inside[:-1]])
    # every episode ends in is_terminal: its last row is kept (a terminal row never bootstraps)
    np.testing.assert_array_equal(ds.terminated.nonzero().squeeze(1).numpy(), [5, 13, 18])
    assert ds.truncated.sum() == 0 and bool(ds.next_obs_valid.all())
    np.testing.assert_array_equal(ds.reward.nonzero().squeeze(1).numpy(), [5, 18])
    assert ds.infos["task_index"].tolist() == [0] * 6 + [1] * 8 + [0] * 5
    assert ds.metadata["tasks"] == d.tasks and ds.metadata["cameras"] == d.video_keys
    flat = to_offline_dataset(d, obs_keys=("observation.state", "action"), terminal_key=None, episodes=[1])
    assert flat.obs.shape == (8, 7) and flat.metadata["reward_key"] == "reward"
    assert not flat.truncated.any() and flat.terminated.tolist() == [False] * 7 + [True]
    assert len(to_replay(to_offline_dataset(d))) == S  # every row usable: no truncated episode end
    assert len(to_replay(ds)) == S  # with the camera parts


def test_to_offline_dataset_truncates_episodes_without_termination(v21, tmp_path):
    shutil.copytree(V21, tmp_path / "v21")
    ds = to_offline_dataset(read_lerobot(tmp_path / "v21"), reward_key="next.reward", terminal_key=None)
    assert ds.metadata["terminal_key"] == "next.done"  # auto-detected
    info = json.loads((tmp_path / "v21/meta/info.json").read_text())
    del info["features"]["next.done"]
    (tmp_path / "v21/meta/info.json").write_text(json.dumps(info))
    ds = to_offline_dataset(read_lerobot(tmp_path / "v21"))
    assert ds.terminated.sum() == 0
    np.testing.assert_array_equal(ds.truncated.nonzero().squeeze(1).numpy(), [3, 9])
    assert (~ds.next_obs_valid).nonzero().squeeze(1).tolist() == [3, 9]
    assert len(to_replay(ds)) == 8  # the two truncated episode ends are dropped


# ----- malformed datasets -----

def _broken(tmp_path, source=REFERENCE) -> Path:
    root = tmp_path / "broken"
    shutil.copytree(source, root)
    return root


def _edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def _edit_episodes(root: Path, column: str, values) -> None:
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    i = table.column_names.index(column)
    table = table.set_column(i, column, pa.array(values, table.schema.field(column).type))
    pq.write_table(table, path)


@pytest.mark.parametrize("breakage, where, match", [
    ("no info", "meta/info.json", "does not exist"),
    ("bad json", "meta/info.json", "cannot be read as JSON"),
    ("version", "meta/info.json", "codebase_version 'v1.6'"),
    ("no data file", "data/chunk-000/file-000.parquet", "does not exist"),
    ("no video file", "videos/observation.images.wrist/chunk-000/file-000.mp4", "does not exist"),
    ("state shape", "data/chunk-000/file-000.parquet", "holds 4 values per row: expected 5"),
    ("scalar shape", "data/chunk-000/file-000.parquet", "holds one value per row"),
    ("missing column", "data/chunk-000/file-000.parquet", "has no column 'reward'"),
    ("video shape", "videos/observation.images.front/chunk-000/file-000.mp4", "frames of shape [32, 48, 3]"),
    ("lengths", "data/chunk-000/file-000.parquet", "holds 19 rows but the episodes table places 20"),
    ("from/to", "meta/episodes", "expected a positive length equal to to_index - from_index"),
    ("episode order", "meta/episodes", "episode indices [0, 1, 3]"),
    ("totals", "meta/info.json", "total_frames 20"),
    ("timestamp", "videos/observation.images.front/chunk-000/file-000.mp4", "has no frame"),
    ("tasks", "meta/tasks.parquet", "cannot be read as parquet"),
    ("no episodes table", "meta/episodes", "holds no chunk-*/file-*.parquet"),
])
def test_malformed_v30_dataset_is_refused_in_one_sentence(tmp_path, breakage, where, match):
    root = _broken(tmp_path)
    info = root / "meta/info.json"
    if breakage == "no info":
        info.unlink()
    elif breakage == "bad json":
        info.write_text("{not json")
    elif breakage == "version":
        _edit_json(info, lambda v: v.update(codebase_version="v1.6"))
    elif breakage in ("no data file", "no video file", "tasks"):
        (root / where).unlink() if breakage != "tasks" else (root / where).write_bytes(b"not parquet")
    elif breakage == "state shape":
        _edit_json(info, lambda v: v["features"]["observation.state"].update(shape=[5]))
    elif breakage == "scalar shape":
        _edit_json(info, lambda v: v["features"]["reward"].update(shape=[2]))
    elif breakage == "missing column":
        path = root / where
        pq.write_table(pq.read_table(path).drop_columns(["reward"]), path)
    elif breakage == "video shape":
        _edit_json(info, lambda v: v["features"]["observation.images.front"].update(shape=[30, 48, 3]))
    elif breakage == "lengths":
        _edit_episodes(root, "length", [6, 9, 5])
        _edit_episodes(root, "dataset_to_index", [6, 15, 19])
        _edit_episodes(root, "dataset_from_index", [0, 6, 14])
        _edit_json(info, lambda v: v.update(total_frames=20))
    elif breakage == "from/to":
        _edit_episodes(root, "dataset_to_index", [6, 15, 19])
    elif breakage == "episode order":
        _edit_episodes(root, "episode_index", [0, 1, 3])
    elif breakage == "totals":
        _edit_json(info, lambda v: v.update(total_frames=20))
    elif breakage == "timestamp":
        _edit_episodes(root, "videos/observation.images.front/from_timestamp", [0.0, 0.4, 5.0])
    elif breakage == "no episodes table":
        shutil.rmtree(root / "meta/episodes")
    with pytest.raises(UserInputError, match=re.escape(match)) as exc:
        d = read_lerobot(root)
        for e in range(d.num_episodes):  # some breakages show only when frames are read
            d.frames(e)
            for key in d.video_keys:
                d.video_frames(key, e)
    text = one_sentence(exc, root)
    assert where in text or where.startswith("meta/episodes"), text


@pytest.mark.parametrize("breakage, match", [
    ("episode length", "holds 4 rows of episode 0: expected 5"),
    ("list length", "has a row of 3 values (row 0): expected 2"),
    ("no video", "does not exist"),
    ("no tasks", "tasks.jsonl does not exist"),
    ("bad line", "line 3 is not JSON"),
])
def test_malformed_v21_dataset_is_refused_in_one_sentence(tmp_path, breakage, match):
    root = _broken(tmp_path, V21)
    if breakage == "episode length":
        lines = (root / "meta/episodes.jsonl").read_text().splitlines()
        lines[0] = json.dumps({**json.loads(lines[0]), "length": 5})
        (root / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
        _edit_json(root / "meta/info.json", lambda v: v.update(total_frames=11))
    elif breakage == "list length":
        path = root / "data/chunk-000/episode_000000.parquet"
        table = pq.read_table(path)
        i = table.column_names.index("action")
        table = table.set_column(i, "action", pa.array([[1.0, 2.0, 3.0]] * 4, pa.list_(pa.float32())))
        pq.write_table(table, path)
    elif breakage == "no video":
        (root / "videos/chunk-000/observation.images.top/episode_000001.mp4").unlink()
    elif breakage == "no tasks":
        (root / "meta/tasks.jsonl").unlink()
    elif breakage == "bad line":
        with open(root / "meta/episodes.jsonl", "a") as f:
            f.write("{oops\n")
    with pytest.raises(UserInputError, match=re.escape(match)) as exc:
        d = read_lerobot(root)
        for e in range(d.num_episodes):
            d.frames(e)
    one_sentence(exc, root)


def test_not_a_dataset_directory(tmp_path):
    with pytest.raises(UserInputError, match="is not a directory") as exc:
        read_lerobot(tmp_path / "nothing")
    one_sentence(exc, tmp_path / "nothing")


# ----- writer input errors and atomic writes -----

def _small_writer(root, **kwargs):
    features = {"a": {"dtype": "float32", "shape": (2,), "names": None},
                "n": {"dtype": "int64", "shape": (1,), "names": None},
                "observation.images.cam": {"dtype": "video", "shape": (16, 32, 3), "names": None}}
    return LeRobotWriter(root, 10, features, **kwargs)


def _frame(t=0):
    return {"a": np.array([t, 1.0], np.float32), "n": t, "observation.images.cam": np.full((16, 32, 3), 9, np.uint8)}


@pytest.mark.parametrize("frame, match", [
    ({"a": np.zeros(2, np.float32), "n": 0}, "has no value for 'observation.images.cam'"),
    ({**_frame(), "b": 1.0}, "unknown key 'b'"),
    ({**_frame(), "a": np.zeros(3, np.float32)}, "'a' has shape \\[3\\]: expected \\[2\\]"),
    ({**_frame(), "n": 1.5}, "'n' has dtype float64, which does not cast to int64"),
    ({**_frame(), "a": np.array(["x", "y"])}, "'a' has dtype <U1"),
    ({**_frame(), "observation.images.cam": np.zeros((16, 32, 3), np.float32)}, "expected uint8 \\[16, 32, 3\\]"),
])
def test_a_wrong_frame_is_refused_and_the_writer_goes_on(tmp_path, frame, match):
    w = _small_writer(tmp_path / "ds")
    with pytest.raises(UserInputError, match=match) as exc:
        w.add_frame(frame, "task")
    one_sentence(exc, tmp_path / "ds")
    w.add_frame(_frame(), "task")
    w.save_episode()
    assert read_lerobot(w.finalize()).num_frames == 1


@pytest.mark.parametrize("features, match", [
    ({"timestamp": {"dtype": "float32", "shape": (1,)}}, "index features"),
    ({"a/b": {"dtype": "float32", "shape": (1,)}}, "contains '/'"),
    ({"img": {"dtype": "image", "shape": (8, 8, 3)}}, "dtype 'image'"),
    ({"v": {"dtype": "video", "shape": (3, 8, 8)}}, "expected \\[height, width, 3\\]"),
    ({"m": {"dtype": "float32", "shape": (2, 2)}}, "expected \\(1,\\) or \\(D,\\)"),
    ({"x": {"dtype": "complex64", "shape": (1,)}}, "dtype 'complex64'"),
])
def test_bad_features_are_refused(tmp_path, features, match):
    with pytest.raises(UserInputError, match=match) as exc:
        LeRobotWriter(tmp_path / "ds", 10, features)
    one_sentence(exc, tmp_path / "ds")
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_existing_root_empty_episodes_and_unsaved_frames(tmp_path):
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserInputError, match="already exists"):
        _small_writer(tmp_path / "exists")
    w = _small_writer(tmp_path / "ds")
    with pytest.raises(UserInputError, match="has no frames"):
        w.save_episode()
    with pytest.raises(UserInputError, match="has no episodes"):
        w.finalize()
    w.add_frame(_frame(), "task")
    with pytest.raises(UserInputError, match="1 frames not saved"):
        w.finalize()
    w.clear_episode()
    w.add_frame(_frame(), "task")
    w.save_episode({"success": True})
    w.add_frame(_frame(), "task")
    with pytest.raises(UserInputError, match="expected the keys of episode 0"):
        w.save_episode({"other": 1})
    w.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]


def test_a_failure_while_encoding_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def fail_second(self, frames):
        calls.append(len(frames))
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return original(self, frames)

    original = lerobot_write.VideoFileWriter.add_episode
    monkeypatch.setattr(lerobot_write.VideoFileWriter, "add_episode", fail_second)
    w = _small_writer(tmp_path / "ds")
    w.add_frame(_frame(), "task")
    w.save_episode()
    w.add_frame(_frame(1), "task")
    with pytest.raises(OSError, match="simulated"):
        w.save_episode()
    assert list(tmp_path.iterdir()) == []  # neither the dataset nor its temporary directory
    with pytest.raises(UserInputError, match="is aborted"):
        w.add_frame(_frame(), "task")


def test_a_failure_while_finalizing_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("cannot write (simulated)")

    monkeypatch.setattr(lerobot_write, "_write_json", fail)
    w = _small_writer(tmp_path / "ds")
    w.add_frame(_frame(), "task")
    w.save_episode()
    with pytest.raises(OSError, match="simulated"):
        w.finalize()
    assert list(tmp_path.iterdir()) == []


def test_an_exception_in_a_with_block_or_an_abandoned_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with _small_writer(tmp_path / "ds") as w:
            w.add_frame(_frame(), "task")
            w.save_episode()
            raise RuntimeError("the robot stopped")
    assert list(tmp_path.iterdir()) == []
    w = _small_writer(tmp_path / "ds")
    w.add_frame(_frame(), "task")
    w.save_episode()
    assert len(list(tmp_path.iterdir())) == 1  # the hidden temporary directory, while writing
    del w
    import gc

    gc.collect()
    assert list(tmp_path.iterdir()) == []
