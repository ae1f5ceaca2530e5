"""LeRobot datasets (v3.0 and v2.x) read with pyarrow and PyAV, without the ``lerobot`` package.

Shape letters: T frames of an episode, S rows (frames) in all, K episodes, O state dim, A action dim,
H x W image size.

The layout and where it is documented: ``layout.py``. ``read_lerobot(root)`` checks the metadata
(``meta/info.json``, the episodes and tasks tables) against the files that hold the frames (their row counts and
column types) and returns a ``LeRobotData``; frames are read per episode on demand:

* ``frames(e)`` -> ``{feature: [T,*shape]}`` for every non-video feature (``[T]`` for shape ``(1,)``, strings as
  object arrays), index features included;
* ``video_frames(key, e)`` -> uint8 ``[T,H,W,3]``, decoded with PyAV at the episode's timestamps (v3.0: the
  episode starts at its ``from_timestamp`` inside a file shared with other episodes);
* ``to_offline_dataset(data)`` -> the ``OfflineDataset`` the offline learners take (state vector, actions,
  rewards, termination/truncation, next observations; optionally the camera images as ``image/<camera>`` parts);
* ``lerobot_info(root)`` -> a summary: episodes, frames, fps, cameras, instructions, success rate, robot type.

A dataset that disagrees with itself (missing files, shapes that are not the data's, an episodes table whose
lengths are not the files' row counts) is refused with a ``UserInputError`` of one sentence naming the path.

In the ``lerobot`` sub-package's order (layout < video < reader, writer) it imports ``layout`` and ``video``, never
the writer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.lerobot.layout import (
    EPISODES_DIR,
    INDEX_FEATURES,
    INFO_PATH,
    TASKS_PATH,
    V2_EPISODES_PATH,
    V2_TASKS_PATH,
    VERSIONS,
    check_features,
    import_pyarrow,
    video_keys,
)
from ctrl_rl.storage.datasets.lerobot.robot import robot_report
from ctrl_rl.storage.datasets.lerobot.video import decode_frames
from ctrl_rl.storage.datasets.offline import OfflineDataset

IMAGE_PREFIX = "observation.images."
SUCCESS_KEYS = ("is_episode_successful", "success")
"""Where a success flag is looked for: a frame feature (DROID's port), else a column of the episodes table."""
REWARD_KEYS = ("reward", "next.reward")
TERMINAL_KEYS = ("is_terminal", "next.done")


@dataclass
class _Episode:
    """Where one episode's frames are (paths relative to the root) and its span of the global ``index``."""

    length: int
    start: int  # dataset_from_index
    data: str
    videos: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (mp4 path, from_timestamp)


class LeRobotData:
    """A LeRobot dataset on disk whose metadata has been checked; frames are read per episode (see module doc)."""

    def __init__(self, root: Path, info: dict[str, Any], features: dict[str, dict[str, Any]], tasks: list[str],
                 episodes, eps: list[_Episode]):
        self.root = root
        self.info = info
        self.features = features
        self.tasks = tasks
        self.episodes = episodes  # pyarrow.Table, one row per episode (stats/ columns left out)
        self._eps = eps
        self._cache: tuple[str, Any, dict[int, tuple[int, int]]] | None = None  # last data file read

    # ----- metadata -----
    @property
    def version(self) -> str:
        return self.info["codebase_version"]

    @property
    def fps(self) -> int:
        return self.info["fps"]

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def num_episodes(self) -> int:
        return len(self._eps)

    @property
    def num_frames(self) -> int:
        return sum(e.length for e in self._eps)

    @property
    def video_keys(self) -> list[str]:
        return video_keys(self.features)

    def episode_lengths(self) -> np.ndarray:
        return np.array([e.length for e in self._eps], np.int64)  # [K]

    def episode_tasks(self, episode: int) -> list[str]:
        return list(self.episodes.column("tasks")[self._check_episode(episode)].as_py() or [])

    def __repr__(self) -> str:
        return (f"LeRobotData({str(self.root)!r}, {self.version}, {self.num_episodes} episodes, {self.num_frames} "
                f"frames, {self.fps} fps, videos {self.video_keys})")

    # ----- frames -----
    def frames(self, episode: int, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The non-video features of ``episode``: ``{name: [T,*shape]}`` (``[T]`` for shape ``(1,)``)."""
        ep = self._eps[self._check_episode(episode)]
        names = [k for k, ft in self.features.items() if ft["dtype"] != "video"] if columns is None else list(columns)
        for name in names:
            if name not in self.features or self.features[name]["dtype"] == "video":
                raise UserInputError(f"{self.root}: {name!r} is not a non-video feature of this dataset: expected "
                                     f"one of {[k for k, f in self.features.items() if f['dtype'] != 'video']}")
        table, lo, n = self._episode_rows(episode, ep)
        path = self.root / ep.data
        if n != ep.length:
            raise UserInputError(f"{path} holds {n} rows of episode {episode}: expected {ep.length}, its length in "
                                 f"the episodes table")
        rows = table.slice(lo, n)
        out = {}
        for name in names:
            if name not in rows.column_names:
                raise UserInputError(f"{path} has no column {name!r}: expected every non-video feature of "
                                     f"meta/info.json as a column")
            out[name] = column_to_numpy(str(path), name, rows.column(name), self.features[name])
        if "frame_index" in rows.column_names:
            fi = rows.column("frame_index").to_numpy(zero_copy_only=False)  # [T]
            if not np.array_equal(fi, np.arange(n)):
                raise UserInputError(f"{path}: the rows of episode {episode} have frame_index {fi[:5].tolist()}...: "
                                     f"expected 0, 1, ..., {n - 1} in order")
        return out

    def video_frames(self, key: str, episode: int) -> np.ndarray:
        """The frames of video ``key`` for ``episode``: uint8 ``[T,H,W,3]``, at ``from_timestamp + timestamp``."""
        if key not in self.video_keys:
            raise UserInputError(f"{self.root}: {key!r} is not a video feature of this dataset: expected one of "
                                 f"{self.video_keys}")
        ep = self._eps[self._check_episode(episode)]
        path, start = ep.videos[key]
        times = self.frames(episode, ["timestamp"])["timestamp"].astype(np.float64) + start  # [T] seconds
        return decode_frames(self.root / path, times, self.fps, self.features[key]["shape"])

    def column(self, name: str) -> np.ndarray:
        """One non-video feature over the whole dataset, episode after episode: ``[S,*shape]`` (reads only that
        column of each data file)."""
        if name not in self.features or self.features[name]["dtype"] == "video":
            raise UserInputError(f"{self.root}: {name!r} is not a non-video feature of this dataset: expected one "
                                 f"of {[k for k, f in self.features.items() if f['dtype'] != 'video']}")
        parts: dict[int, np.ndarray] = {}
        files: dict[str, list[int]] = {}
        for e, ep in enumerate(self._eps):
            files.setdefault(ep.data, []).append(e)
        for rel, episodes in files.items():
            path = self.root / rel
            table = _read_parquet(path, "the frames of its episodes", columns=list(dict.fromkeys([name,
                                                                                                  "episode_index"])))
            values = column_to_numpy(str(path), name, table.column(name), self.features[name])  # [N,*shape]
            spans = _spans(path, table)
            for e in episodes:
                lo, n = spans.get(e, (0, 0))
                if n != self._eps[e].length:
                    raise UserInputError(f"{path} holds {n} rows of episode {e}: expected {self._eps[e].length}, "
                                         f"its length in the episodes table")
                parts[e] = values[lo:lo + n]
        return np.concatenate([parts[e] for e in range(self.num_episodes)])

    def _check_episode(self, episode: int) -> int:
        if not isinstance(episode, (int, np.integer)) or not 0 <= episode < self.num_episodes:
            raise UserInputError(f"{self.root}: episode {episode!r} does not exist: expected an index in "
                                 f"[0, {self.num_episodes})")
        return int(episode)

    def _episode_rows(self, episode: int, ep: _Episode):
        """``(table of the episode's data file, first row, row count)``; the last file read is kept."""
        if self._cache is None or self._cache[0] != ep.data:
            path = self.root / ep.data
            table = _read_parquet(path, "the frames of the episodes that the episodes table places there")
            self._cache = (ep.data, table, _spans(path, table))
        _, table, spans = self._cache
        lo, n = spans.get(episode, (0, 0))
        return table, lo, n


# ----- opening and checking a dataset -----

def read_lerobot(root: str | Path) -> LeRobotData:
    """Open the LeRobot dataset (v2.0, v2.1 or v3.0) at ``root`` and check its metadata against its files."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise UserInputError(f"LeRobot dataset {root} is not a directory: expected a dataset root holding "
                             f"meta/info.json")
    info = load_json(root / INFO_PATH, "the LeRobot dataset's meta/info.json")
    source = str(root / INFO_PATH)
    if not isinstance(info, dict):
        raise UserInputError(f"{source} holds a {type(info).__name__}: expected a JSON object")
    version = info.get("codebase_version")
    if version not in VERSIONS:
        raise UserInputError(f"{source} has codebase_version {version!r}: expected one of {', '.join(VERSIONS)}")
    fps = info.get("fps")
    if isinstance(fps, float) and fps.is_integer():
        fps = info["fps"] = int(fps)
    if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
        raise UserInputError(f"{source} has fps {fps!r}: expected a positive integer")
    features = check_features(source, info.get("features"))
    missing = [k for k in ("timestamp", "episode_index") if k not in features]
    if missing:
        raise UserInputError(f"{source} has no {missing[0]!r} feature: expected LeRobot's index features "
                             f"{', '.join(INDEX_FEATURES)}")
    for key in ("data_path", *(["video_path"] if video_keys(features) else [])):
        if not isinstance(info.get(key), str):
            raise UserInputError(f"{source} has {key} {info.get(key)!r}: expected a path template")
    if version == "v3.0":
        tasks = _tasks_v3(root)
        episodes, eps = _episodes_v3(root, info, features)
    else:
        tasks = _tasks_v2(root)
        episodes, eps = _episodes_v2(root, info, features)
    data = LeRobotData(root, info, features, tasks, episodes, eps)
    _check_totals(source, info, data, tasks)
    _check_data_files(data)
    return data


def _tasks_v3(root: Path) -> list[str]:
    pa = import_pyarrow()
    path = root / TASKS_PATH
    table = _read_parquet(path, "the tasks table (task_index and task strings)")
    names = table.column_names
    text = "task" if "task" in names else None
    if text is None:  # pandas writes the task strings as the frame's index: find its column
        meta = (table.schema.metadata or {}).get(b"pandas")
        index_cols = [c for c in (json.loads(meta).get("index_columns", []) if meta else []) if isinstance(c, str)]
        text = next((c for c in (*index_cols, "__index_level_0__") if c in names), None)
    if text is None or "task_index" not in names:
        raise UserInputError(f"{path} has columns {names}: expected 'task_index' and the task strings (a 'task' "
                             f"column or the pandas index)")
    col = table.column(text)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise UserInputError(f"{path}: column {text!r} has type {col.type}: expected the task strings")
    return _ordered_tasks(path, table.column("task_index").to_pylist(), col.to_pylist())


def _tasks_v2(root: Path) -> list[str]:
    path = root / V2_TASKS_PATH
    rows = load_jsonl(path, 'one {"task_index": i, "task": "..."} object per line')
    try:
        return _ordered_tasks(path, [r["task_index"] for r in rows], [r["task"] for r in rows])
    except KeyError as e:
        raise UserInputError(f"{path}: a line has no {e.args[0]!r}: expected task_index and task on every "
                             f"line") from None


def _ordered_tasks(path: Path, index: list, text: list) -> list[str]:
    if sorted(index) != list(range(len(index))) or not all(isinstance(t, str) for t in text):
        raise UserInputError(f"{path} has task indices {sorted(index)[:10]}: expected 0, 1, ..., "
                             f"{len(index) - 1} once each, with a string task for each")
    out = [""] * len(index)
    for i, t in zip(index, text):
        out[i] = t
    return out


def _episodes_v3(root: Path, info: dict[str, Any], features: dict[str, dict[str, Any]]):
    pa = import_pyarrow()
    files = sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not files:
        raise UserInputError(f"{root / EPISODES_DIR} holds no chunk-*/file-*.parquet: expected the episodes table "
                             f"of a v3.0 dataset")
    tables = []
    for path in files:
        schema = _read_schema(path, "the episodes table")
        keep = [n for n in schema.names if not n.startswith("stats/")]
        tables.append(_read_parquet(path, "the episodes table", columns=keep))
    try:
        table = pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise UserInputError(f"{root / EPISODES_DIR}: the episode files do not share columns ({e}): expected one "
                             f"episodes table") from None
    source = str(root / EPISODES_DIR)
    keys = video_keys(features)
    required = ["episode_index", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index",
                "data/file_index"]
    for key in keys:
        required += [f"videos/{key}/{c}" for c in ("chunk_index", "file_index", "from_timestamp")]
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise UserInputError(f"{source}: the episodes table has no column {missing[0]!r}: expected "
                             f"{', '.join(required)}")
    order = np.argsort(_ints(source, table, "episode_index"), kind="stable")
    table = table.take(pa.array(order))
    col = {c: _ints(source, table, c) for c in required if not c.endswith("timestamp")}
    K = len(order)
    if not np.array_equal(col["episode_index"], np.arange(K)):
        raise UserInputError(f"{source} has episode indices {col['episode_index'][:10].tolist()}: expected 0, 1, "
                             f"..., {K - 1} once each")
    length = col["length"]
    span = col["dataset_to_index"] - col["dataset_from_index"]
    bad = np.flatnonzero((length < 1) | (span != length))
    if bad.size:
        e = int(bad[0])
        raise UserInputError(f"{source}: episode {e} has length {length[e]} and dataset indices "
                             f"[{col['dataset_from_index'][e]}, {col['dataset_to_index'][e]}): expected a positive "
                             f"length equal to to_index - from_index")
    eps = []
    for e in range(K):
        data = info["data_path"].format(chunk_index=int(col["data/chunk_index"][e]),
                                        file_index=int(col["data/file_index"][e]))
        videos = {}
        for key in keys:
            start = table.column(f"videos/{key}/from_timestamp")[e].as_py()
            if not isinstance(start, (int, float)) or start < 0:
                raise UserInputError(f"{source}: episode {e} has videos/{key}/from_timestamp {start!r}: expected "
                                     f"a time in seconds >= 0")
            path = info["video_path"].format(video_key=key, chunk_index=int(col[f"videos/{key}/chunk_index"][e]),
                                             file_index=int(col[f"videos/{key}/file_index"][e]))
            videos[key] = (path, float(start))
        eps.append(_Episode(int(length[e]), int(col["dataset_from_index"][e]), data, videos))
    if "tasks" not in table.column_names:
        table = table.append_column("tasks", pa.array([[] for _ in range(K)], pa.list_(pa.string())))
    return table, eps


def _episodes_v2(root: Path, info: dict[str, Any], features: dict[str, dict[str, Any]]):
    pa = import_pyarrow()
    path = root / V2_EPISODES_PATH
    rows = load_jsonl(path, 'one {"episode_index", "tasks", "length"} object per line')
    rows = sorted(rows, key=lambda r: r.get("episode_index", -1) if isinstance(r.get("episode_index"), int) else -1)
    K = len(rows)
    index = [r.get("episode_index") for r in rows]
    if index != list(range(K)):
        raise UserInputError(f"{path} has episode indices {index[:10]}: expected 0, 1, ..., {K - 1} once each")
    lengths: list[int] = []
    for e, r in enumerate(rows):
        n = r.get("length")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UserInputError(f"{path}: episode {e} has length {n!r}: expected a positive integer")
        lengths.append(n)
    chunks = info.get("chunks_size", 1000)
    if not isinstance(chunks, int) or chunks < 1:
        raise UserInputError(f"{root / INFO_PATH} has chunks_size {chunks!r}: expected a positive integer")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if K else np.zeros(0, np.int64)
    eps = []
    for e in range(K):
        data = info["data_path"].format(episode_chunk=e // chunks, episode_index=e)
        videos = {key: (info["video_path"].format(episode_chunk=e // chunks, video_key=key, episode_index=e), 0.0)
                  for key in video_keys(features)}
        eps.append(_Episode(lengths[e], int(starts[e]), data, videos))
    tasks = [[t for t in (r.get("tasks") or []) if isinstance(t, str)] for r in rows]
    table = pa.table({"episode_index": pa.array(index, pa.int64()), "tasks": pa.array(tasks, pa.list_(pa.string())),
                      "length": pa.array(lengths, pa.int64()), "dataset_from_index": pa.array(starts, pa.int64()),
                      "dataset_to_index": pa.array(starts + np.asarray(lengths, np.int64), pa.int64())})
    return table, eps


def _check_totals(source: str, info: dict[str, Any], data: LeRobotData, tasks: list[str]) -> None:
    for key, have in (("total_episodes", data.num_episodes), ("total_frames", data.num_frames),
                      ("total_tasks", len(tasks))):
        if key in info and info[key] != have:
            raise UserInputError(f"{source} has {key} {info[key]!r} but the episodes and tasks tables give {have}: "
                                 f"expected the same count")
    if data.num_episodes == 0:
        raise UserInputError(f"{source}: the dataset holds no episodes: expected at least one")


def _check_data_files(data: LeRobotData) -> None:
    """Every data and video file the episodes name exists; for v3.0 every data file has exactly the rows of its
    episodes and columns of the features' types (read from the parquet footers only)."""
    pa = import_pyarrow()
    rows: dict[str, int] = {}
    for ep in data._eps:
        rows[ep.data] = rows.get(ep.data, 0) + ep.length
    videos = {path for ep in data._eps for path, _ in ep.videos.values()}
    for rel in (*rows, *sorted(videos)):
        if not (data.root / rel).is_file():
            what = "the frames of its episodes" if rel in rows else "the video of its episodes"
            raise UserInputError(f"{data.root / rel} does not exist: expected {what} (named by the episodes table "
                                 f"and meta/info.json's path templates)")
    check = list(rows) if data.version == "v3.0" else list(rows)[:1]
    for rel in check:
        path = data.root / rel
        meta = _read_metadata(path)
        if data.version == "v3.0" and meta.num_rows != rows[rel]:
            raise UserInputError(f"{path} holds {meta.num_rows} rows but the episodes table places {rows[rel]} "
                                 f"frames there: expected the same count")
        schema = meta.schema.to_arrow_schema()
        for name, ft in data.features.items():
            if ft["dtype"] == "video":
                continue
            if name not in schema.names:
                raise UserInputError(f"{path} has no column {name!r}: expected every non-video feature of "
                                     f"meta/info.json as a column")
            t = schema.field(name).type
            if pa.types.is_fixed_size_list(t) and len(ft["shape"]) == 1 and t.list_size != ft["shape"][0]:
                raise UserInputError(f"{path}: column {name!r} holds {t.list_size} values per row: expected "
                                     f"{ft['shape'][0]} (feature shape {list(ft['shape'])} in meta/info.json)")
            scalar = not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
            if scalar and tuple(ft["shape"]) != (1,):
                raise UserInputError(f"{path}: column {name!r} holds one value per row: expected "
                                     f"{list(ft['shape'])} (feature shape in meta/info.json)")


# ----- reading the files: JSON metadata, parquet tables, data columns -----

def load_json(path: Path, what: str) -> Any:
    """A JSON file, refused in one sentence when missing or malformed."""
    if not path.is_file():
        raise UserInputError(f"{path} does not exist: expected {what}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserInputError(f"{path} cannot be read as JSON ({type(e).__name__}: {e}): expected {what}") from None


def load_jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, one per non-empty line."""
    if not path.is_file():
        raise UserInputError(f"{path} does not exist: expected {what}")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UserInputError(f"{path} line {n} is not JSON ({e}): expected {what}") from None
        if not isinstance(row, dict):
            raise UserInputError(f"{path} line {n} is not a JSON object: expected {what}")
        rows.append(row)
    return rows


def numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def column_to_numpy(source: str, name: str, column, ft: dict[str, Any]) -> np.ndarray:
    """A data-file column as ``[T,*shape]`` (``[T]`` for shape ``(1,)``) of the feature's dtype.

    Accepts scalar columns, fixed-size and variable lists (nested for more dimensions); a column whose row size
    is not the feature's shape is refused in one sentence naming the file."""
    pa = import_pyarrow()
    import pyarrow.compute as pc

    shape = tuple(ft["shape"])
    rows = len(column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) and rows:
        # call_function: pyarrow.compute makes list_value_length and list_flatten at import, so no stub has them
        lengths = pc.call_function("list_value_length", [column]).to_numpy(zero_copy_only=False)  # [T]: all shape[0]
        if (lengths != shape[0]).any():
            bad = int(np.flatnonzero(lengths != shape[0])[0])
            raise UserInputError(f"{source}: column {name!r} has a row of {lengths[bad]} values (row {bad}): "
                                 f"expected {shape[0]} (feature shape {list(shape)} in meta/info.json)")
    values = column
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or \
            pa.types.is_fixed_size_list(values.type):
        values = pc.call_function("list_flatten", [values])
    if ft["dtype"] == "string":
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            raise UserInputError(f"{source}: column {name!r} has Arrow type {column.type}: expected strings "
                                 f"(feature dtype 'string')")
        arr = np.asarray(values.to_pylist(), dtype=object)
    else:
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
                or pa.types.is_boolean(values.type)):
            raise UserInputError(f"{source}: column {name!r} has Arrow type {column.type}: expected numbers of "
                                 f"dtype {ft['dtype']}")
        if values.null_count:
            raise UserInputError(f"{source}: column {name!r} holds {values.null_count} missing values: expected "
                                 f"one value per element")
        arr = values.to_numpy(zero_copy_only=False).astype(ft["dtype"], copy=False)
    n = numel(shape)
    if arr.shape[0] != rows * n:
        per_row = arr.shape[0] / rows if rows else 0
        raise UserInputError(f"{source}: column {name!r} holds {per_row:g} values per row: expected {n} (feature "
                             f"shape {list(shape)} in meta/info.json)")
    return arr if shape == (1,) else arr.reshape(rows, *shape)


def _spans(path: Path, table) -> dict[int, tuple[int, int]]:
    """``{episode: (first row, row count)}`` of a data file, whose episodes must each be one run of rows."""
    if "episode_index" not in table.column_names:
        raise UserInputError(f"{path} has no 'episode_index' column: expected LeRobot's index features")
    idx = table.column("episode_index").to_numpy(zero_copy_only=False)  # [N]
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]]) if len(idx) else np.zeros(0, int)  # run starts
    spans: dict[int, tuple[int, int]] = {}
    for lo, stop in zip(starts, np.r_[starts[1:], len(idx)]):
        e = int(idx[lo])
        if e in spans:
            raise UserInputError(f"{path}: the rows of episode {e} are not contiguous: expected each episode's "
                                 f"frames in one run")
        spans[e] = (int(lo), int(stop - lo))
    return spans


def _read_parquet(path: Path, what: str, columns: list[str] | None = None):
    pq = import_pyarrow().parquet
    if not path.is_file():
        raise UserInputError(f"{path} does not exist: expected {what}")
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError
        raise UserInputError(f"{path} cannot be read as parquet ({type(e).__name__}: {e}): expected {what}") from None


def _read_schema(path: Path, what: str):
    return _read_metadata(path, what).schema.to_arrow_schema()


def _read_metadata(path: Path, what: str = "a parquet file"):
    pq = import_pyarrow().parquet
    try:
        return pq.read_metadata(path)
    except (OSError, ValueError) as e:
        raise UserInputError(f"{path} cannot be read as parquet ({type(e).__name__}: {e}): expected {what}") from None


def _ints(source: str, table, name: str) -> np.ndarray:
    pa = import_pyarrow()
    col = table.column(name)
    if not pa.types.is_integer(col.type) or col.null_count:
        raise UserInputError(f"{source}: column {name!r} of the episodes table has type {col.type}"
                             f"{' with missing values' if col.null_count else ''}: expected integers")
    return col.to_numpy().astype(np.int64)


# ----- summary -----

def lerobot_info(root: str | Path) -> dict[str, Any]:
    """What a LeRobot dataset holds: ``codebase_version``, ``robot_type``, ``fps``, ``episodes``, ``frames``,
    ``cameras`` ({video key: [H, W, 3]}), ``codecs`` ({video key: codec}), ``instructions`` (the distinct tasks),
    ``success_rate`` (None when the dataset records no success), ``features`` ({name: shape}), and the robot it was
    recorded on with the keys that feed each of its action spaces (``robot.robot_report``: ``robot``,
    ``robot_from``, ``actions``)."""
    data = read_lerobot(root)
    return {
        "path": str(data.root), "codebase_version": data.version, "robot_type": data.robot_type, "fps": data.fps,
        "episodes": data.num_episodes, "frames": data.num_frames,
        "cameras": {k: list(data.features[k]["shape"]) for k in data.video_keys},
        "codecs": {k: (data.features[k].get("info") or {}).get("video.codec") for k in data.video_keys},
        "instructions": list(dict.fromkeys(t for t in data.tasks if t)),
        "success_rate": success_rate(data),
        "features": {k: list(ft["shape"]) for k, ft in data.features.items()
                     if ft["dtype"] != "video" and k not in INDEX_FEATURES},
        **robot_report(data.features, data.robot_type),
    }


def episode_success(data: LeRobotData) -> np.ndarray | None:
    """Per-episode success ``[K]`` bool from a frame feature (true on any frame) or an episodes-table column
    named in ``SUCCESS_KEYS``; None when the dataset has neither."""
    for key in SUCCESS_KEYS:
        if key in data.features and data.features[key]["dtype"] != "string":
            values = data.column(key).reshape(data.num_frames, -1).any(1)  # [S]
            offsets = np.concatenate([[0], np.cumsum(data.episode_lengths())[:-1]])  # [K]
            return np.logical_or.reduceat(values, offsets)  # [K] true on any frame
        if key in data.episodes.column_names:
            values = data.episodes.column(key).to_pylist()
            if all(isinstance(v, (bool, int, float)) for v in values):
                return np.asarray(values, dtype=float) > 0
    return None


def success_rate(data: LeRobotData) -> float | None:
    ok = episode_success(data)
    return None if ok is None else float(ok.mean())


# ----- the offline learners' view -----

def to_offline_dataset(data: LeRobotData, obs_keys: Sequence[str] = ("observation.state",), action_key: str = "action",
                       reward_key: str | None = None, terminal_key: str | None = None,
                       cameras: Sequence[str] | bool = False, episodes: Sequence[int] | None = None) -> OfflineDataset:
    """The frames of ``episodes`` (default all) as an ``OfflineDataset``, one row per frame.

    * observation: the ``obs_keys`` features flattened and concatenated, float32 ``[S,O]``; with ``cameras``
      (True: every video key, or a list of keys) a dict ``{"state": [S,O], "image/<camera>": uint8 [S,3,H,W]}``
      where ``<camera>`` is the key without ``observation.images.``;
    * action: ``action_key`` float32 ``[S,A]`` (keys joined by + are concatenated: ``action.cartesian_velocity+
      action.gripper_velocity``);
    * reward: ``reward_key``, else the first of ``reward``, ``next.reward`` the dataset has, else zeros
      (``metadata["reward_key"]`` is None then); row t's reward is the one received after action t;
    * terminated: ``terminal_key``, else the first of ``is_terminal``, ``next.done``, else never;
    * next observation: the next frame of the same episode. The last frame of an episode has none: a terminal
      last frame keeps its row (it never bootstraps), any other is marked truncated with ``next_obs_valid`` False
      so that ``to_replay`` drops it.

    ``infos["task_index"]`` [S] holds each row's task (``metadata["tasks"]`` the strings).
    """
    source = f"LeRobot dataset {data.root}"
    numeric = {k for k, ft in data.features.items() if ft["dtype"] not in ("video", "string")}
    act_keys = action_key.split("+")
    for key in (*obs_keys, *act_keys):
        if key not in numeric:
            raise UserInputError(f"{source} has no numeric feature {key!r}: expected one of {sorted(numeric)}")
    reward_key = _pick(source, numeric, reward_key, REWARD_KEYS, "reward")
    terminal_key = _pick(source, numeric, terminal_key, TERMINAL_KEYS, "terminal")
    cams = data.video_keys if cameras is True else list(cameras or [])
    for key in cams:
        if key not in data.video_keys:
            raise UserInputError(f"{source} has no video {key!r}: expected one of {data.video_keys}")
    chosen = list(range(data.num_episodes)) if episodes is None else [data._check_episode(e) for e in episodes]
    if not chosen:
        raise UserInputError(f"{source}: no episode was chosen: expected at least one")
    cols = [*obs_keys, *act_keys, *(c for c in (reward_key, terminal_key) if c), "task_index"]
    obs, act, rew, term, task, images, lengths = [], [], [], [], [], {k: [] for k in cams}, []
    for e in chosen:
        f = data.frames(e, [c for c in dict.fromkeys(cols) if c in data.features])
        T = data._eps[e].length
        obs.append(np.concatenate([f[k].reshape(T, -1).astype(np.float32) for k in obs_keys], 1))  # [T,O]
        act.append(np.concatenate([f[k].reshape(T, -1).astype(np.float32) for k in act_keys], 1))  # [T,A]
        rew.append(f[reward_key].reshape(T).astype(np.float32) if reward_key else np.zeros(T, np.float32))  # [T]
        term.append(f[terminal_key].reshape(T) != 0 if terminal_key else np.zeros(T, bool))  # [T]
        task.append(f["task_index"].reshape(T).astype(np.int64) if "task_index" in f else np.zeros(T, np.int64))
        for k in cams:
            images[k].append(data.video_frames(k, e).transpose(0, 3, 1, 2))  # [T,3,H,W]
        lengths.append(T)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # [K+1]
    last = np.zeros(offsets[-1], bool)
    last[offsets[1:] - 1] = True  # [S] last frame of its episode
    terminated = np.concatenate(term)  # [S]
    nxt = np.arange(offsets[-1]) + 1  # [S] row of the next observation
    nxt[last] -= 1  # an episode's last row: its own observation (unused: terminal or dropped)
    state = torch.from_numpy(np.concatenate(obs))  # [S,O]
    o: Any = state
    if cams:
        o = {"state": state, **{f"image/{_camera(k)}": torch.from_numpy(np.concatenate(v)) for k, v in images.items()}}
    idx = torch.from_numpy(nxt)
    next_obs = {k: v[idx] for k, v in o.items()} if isinstance(o, dict) else o[idx]
    truncated = last & ~terminated
    return OfflineDataset(
        obs=o, action=torch.from_numpy(np.concatenate(act)), reward=torch.from_numpy(np.concatenate(rew)),
        next_obs=next_obs, terminated=torch.from_numpy(terminated), truncated=torch.from_numpy(truncated),
        episode_offsets=torch.from_numpy(offsets), next_obs_valid=torch.from_numpy(~truncated),
        infos={"task_index": torch.from_numpy(np.concatenate(task))},
        metadata={"source": source, "format": "lerobot", "view": "episodes", "codebase_version": data.version,
                  "fps": data.fps, "robot_type": data.robot_type, "obs_keys": list(obs_keys), "action_key": action_key,
                  "reward_key": reward_key, "terminal_key": terminal_key, "cameras": cams, "tasks": list(data.tasks),
                  "episodes": chosen, "env_id": None},
    )


def load_lerobot(root: str | Path, **kwargs) -> OfflineDataset:
    """``to_offline_dataset(read_lerobot(root), **kwargs)``."""
    return to_offline_dataset(read_lerobot(root), **kwargs)


def _pick(source: str, numeric: set[str], given: str | None, defaults: tuple[str, ...], what: str) -> str | None:
    if given is not None:
        if given not in numeric:
            raise UserInputError(f"{source} has no numeric feature {given!r} for the {what}: expected one of "
                                 f"{sorted(numeric)}")
        return given
    return next((k for k in defaults if k in numeric), None)


def _camera(key: str) -> str:
    return key[len(IMAGE_PREFIX):] if key.startswith(IMAGE_PREFIX) else key
