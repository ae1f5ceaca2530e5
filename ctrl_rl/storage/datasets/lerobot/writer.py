"""Writing LeRobot v3.0 datasets with pyarrow and PyAV: ``LeRobotWriter`` and the DROID port's features.

Shape letters: T frames of an episode, K episodes, D a feature's width, H x W image size.

The files written are those ``lerobot-dataset`` 0.4.4 writes (layout in ``layout.py``; checked against
``tests/storage/fixtures/lerobot_v30_reference``, which that library wrote, and read back by it):

* ``data/chunk-{c:03d}/file-{f:03d}.parquet``: one row group per episode, columns in the features' order, the index
  features last, vectors as fixed-size lists, the ``huggingface`` schema metadata of ``datasets`` 4;
* ``videos/<key>/chunk-{c:03d}/file-{f:03d}.mp4``: the episodes of a video key back to back (``video.py``);
* ``meta/episodes/chunk-000/file-000.parquet``: per episode its tasks, length, data and video locations,
  ``stats/<feature>/<stat>`` and ``meta/episodes/{chunk,file}_index``, then the caller's ``extra`` columns;
* ``meta/tasks.parquet`` (task strings as the pandas index, so that ``pandas.read_parquet`` gives LeRobot's
  frame), ``meta/stats.json`` and ``meta/info.json``.

A data or video file is closed for a new one once it holds ``data_files_size_in_mb`` /
``video_files_size_in_mb`` (an episode never spans files; a video file may exceed the limit by its last
episode, since its encoded size is known only afterwards), and a chunk directory holds ``chunks_size`` files.

Statistics, per episode and for the dataset (LeRobot's ``compute_episode_stats`` / ``aggregate_stats``):
``min``, ``max``, ``mean``, ``std`` (population), ``count`` and the quantiles ``q01 q10 q50 q90 q99`` of
every numeric feature over the episode's frames, per element (shape ``(D,)``); for videos per channel over
pixels scaled to [0, 1] (shape ``(3, 1, 1)``), from the frames LeRobot samples (all of an episode shorter than
100 frames, else ``max(100, T**0.75)`` evenly spaced), subsampled in space to about ``STATS_SIDE`` pixels a
side when a side is 300 or more. LeRobot 0.4.4 squares the uint8 pixels before averaging (the squares wrap
around at 256), so its image ``std`` is wrong; here it is the true one. Dataset statistics pool the episodes:
count-weighted means, the pooled variance, min of mins, max of maxes; quantiles are the count-weighted mean of
the episodes' quantiles, as LeRobot aggregates them (an approximation). Per-episode quantiles here are exact
(``numpy.quantile``, linear), where LeRobot estimates them from histograms, so they differ slightly from
LeRobot's on the same data.

Atomic: everything is written in a hidden sibling directory (``.<name>.partial-<random>``) that ``finalize``
renames to ``root``; an error while writing, ``abort()``, leaving a ``with`` block by an exception, or the
writer being garbage-collected unfinished removes it, so a failed write leaves nothing at ``root``.

In the ``lerobot`` sub-package's order (layout < video < reader, writer) it imports ``layout`` and ``video``; it
never reads a dataset back, so it does not import the reader (the tests read what it wrote).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.lerobot.layout import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_MB,
    DATA_PATH,
    EPISODES_PATH,
    INDEX_FEATURES,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_FILE_MB,
    VIDEO_PATH,
    arrow_type,
    check_features,
    hf_features_metadata,
    import_pyarrow,
)
from ctrl_rl.storage.datasets.lerobot.video import VideoFileWriter, pick_encoder, video_info

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STATS_SIDE = 150  # video statistics subsample frames of 300 pixels or more a side to about this many


class LeRobotWriter:
    """Write a LeRobot v3.0 dataset frame by frame: ``add_frame`` ... ``save_episode`` per episode, then
    ``finalize`` (or use it as a context manager: finalized on a normal exit, removed on an exception).

    Args:
        root: where the dataset goes; must not exist yet.
        fps: frames per second of the recording (frame t of an episode is at ``t / fps`` seconds).
        features: ``{name: {"dtype", "shape", "names"}}`` without LeRobot's index features (added here);
            dtypes: the numeric ones of ``layout.NUMERIC_DTYPES`` with shape ``(1,)`` or ``(D,)``,
            ``"string"`` with shape ``(1,)``, ``"video"`` with shape ``(H, W, 3)``.
        robot_type: recorded in ``meta/info.json`` (DROID: ``"Franka"``).
        codec: video encoder (``"libsvtav1"``, ``"libaom-av1"``, ``"libx264"``, or LeRobot's ``"av1"``/``"h264"``);
            default the first of these PyAV has. ``crf``, ``gop`` and ``preset`` (SVT-AV1 only) are LeRobot's
            defaults.
    """

    def __init__(self, root: str | Path, fps: int, features: dict[str, dict[str, Any]], robot_type: str | None = None,
                 *, codec: str | None = None, crf: int = 30, gop: int = 2, preset: int = 12,
                 chunks_size: int = CHUNKS_SIZE, data_files_size_in_mb: float = DATA_FILE_MB,
                 video_files_size_in_mb: float = VIDEO_FILE_MB):
        self.root = Path(root).expanduser()
        source = f"LeRobot dataset to write at {self.root}"
        if self.root.exists():
            raise UserInputError(f"{source} already exists: expected a path that does not exist yet")
        if not isinstance(fps, (int, np.integer)) or isinstance(fps, bool) or fps <= 0:
            raise UserInputError(f"{source}: fps is {fps!r}: expected a positive integer")
        fps = int(fps)
        if not isinstance(chunks_size, int) or chunks_size < 1:
            raise UserInputError(f"{source}: chunks_size is {chunks_size!r}: expected a positive integer")
        user = check_features(source, features)
        for name, ft in user.items():
            if name in INDEX_FEATURES:
                raise UserInputError(f"{source}: feature {name!r} is one of LeRobot's index features, which the "
                                     f"writer adds: expected other names")
            if "/" in name:
                raise UserInputError(f"{source}: feature {name!r} contains '/': expected a name without it "
                                     f"(LeRobot uses '/' in the episodes table's column names)")
            if ft["dtype"] != "video" and len(ft["shape"]) != 1:
                raise UserInputError(f"{source}: feature {name!r} has shape {list(ft['shape'])}: expected (1,) or "
                                     f"(D,) for a non-video feature")
            if ft["dtype"] == "string" and ft["shape"] != (1,):
                raise UserInputError(f"{source}: string feature {name!r} has shape {list(ft['shape'])}: "
                                     f"expected [1]")
        self.fps, self.robot_type = fps, robot_type
        self.features = {**{k: {**ft, "shape": list(ft["shape"]), "names": ft.get("names")} for k, ft in user.items()},
                         **{k: dict(ft) for k, ft in INDEX_FEATURES.items()}}
        self._user = user
        self._videos = [k for k, ft in user.items() if ft["dtype"] == "video"]
        self._encoder = pick_encoder(codec) if self._videos else None
        self._video_options = {"crf": crf, "gop": gop, "preset": preset}
        self._chunks, self._data_mb, self._video_mb = chunks_size, data_files_size_in_mb, video_files_size_in_mb
        self._tasks: dict[str, int] = {}
        self._buffer: dict[str, list] = {k: [] for k in user}
        self._buffer_tasks: list[int] = []
        self._episodes: list[dict[str, Any]] = []
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self._frames = 0
        self._data: dict[str, Any] = {"writer": None, "chunk": 0, "file": -1, "bytes": 0}
        self._video: dict[str, dict[str, Any]] = {k: {"writer": None, "chunk": 0, "file": -1} for k in self._videos}
        self._video_info: dict[str, dict[str, Any]] = {}
        self._schema = import_pyarrow().schema(
            [(k, arrow_type(ft)) for k, ft in self.features.items() if ft["dtype"] != "video"],
            metadata={b"huggingface": hf_features_metadata(self.features)})
        self._tmp = self.root.parent / f".{self.root.name}.partial-{uuid.uuid4().hex[:8]}"
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir()
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        self._state = "open"

    # ----- the recording API -----
    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    def add_frame(self, frame: dict[str, Any], task: str) -> None:
        """Append one frame to the current episode: a value for every feature given at construction (scalars
        or ``[1]`` arrays for shape ``(1,)``; uint8 ``[H,W,3]`` for videos), and its task (instruction)."""
        self._check_open()
        source = f"frame {len(self._buffer_tasks)} of episode {self.num_episodes} for {self.root}"
        if not isinstance(frame, dict):
            raise UserInputError(f"{source} is a {type(frame).__name__}: expected a dict of feature values")
        missing = [k for k in self._user if k not in frame]
        extra = [k for k in frame if k not in self._user]
        if missing or extra:
            what = f"has no value for {missing[0]!r}" if missing else f"has the unknown key {extra[0]!r}"
            raise UserInputError(f"{source} {what}: expected exactly the features {list(self._user)} (the index "
                                 f"features are added by the writer)")
        if not isinstance(task, str) or not task:
            raise UserInputError(f"{source} has task {task!r}: expected a non-empty instruction string")
        values = {k: _frame_value(source, k, frame[k], ft) for k, ft in self._user.items()}
        for k, v in values.items():
            self._buffer[k].append(v)
        self._buffer_tasks.append(self._tasks.setdefault(task, len(self._tasks)))

    def clear_episode(self) -> None:
        """Drop the frames added since the last ``save_episode``."""
        for v in self._buffer.values():
            v.clear()
        self._buffer_tasks.clear()

    def save_episode(self, extra: dict[str, Any] | None = None) -> int:
        """Write the frames added since the last call as one episode; returns its index. ``extra`` adds
        per-episode columns to the episodes table (JSON-like values, e.g. ``{"success": True}``), the same
        keys for every episode."""
        self._check_open()
        source = f"episode {self.num_episodes} for {self.root}"
        T = len(self._buffer_tasks)
        if T == 0:
            raise UserInputError(f"{source} has no frames: expected add_frame before save_episode")
        extra = dict(extra or {})
        reserved = [k for k in extra if k in _EPISODE_COLUMNS or "/" in k]
        if reserved:
            raise UserInputError(f"{source}: extra key {reserved[0]!r} is a column the writer fills: expected other "
                                 f"names (without '/')")
        if self._episodes and sorted(extra) != sorted(self._episodes[0]["extra"]):
            raise UserInputError(f"{source} has extra keys {sorted(extra)}: expected the keys of episode 0, "
                                 f"{sorted(self._episodes[0]['extra'])}")
        try:
            self._write_episode(T, extra)
        except BaseException:
            self.abort()
            raise
        self.clear_episode()
        return self.num_episodes - 1

    def finalize(self) -> Path:
        """Close the files, write the metadata and move the dataset to ``root``; returns ``root``."""
        self._check_open()
        if self._buffer_tasks:
            raise UserInputError(f"LeRobot dataset to write at {self.root} has {len(self._buffer_tasks)} frames not "
                                 f"saved as an episode: expected save_episode (or clear_episode) before finalize")
        if not self._episodes:
            raise UserInputError(f"LeRobot dataset to write at {self.root} has no episodes: expected at least one "
                                 f"save_episode before finalize")
        try:
            self._close_files()
            self._write_meta()
            if self.root.exists():
                raise UserInputError(f"LeRobot dataset to write at {self.root} appeared while writing: expected a "
                                     f"path that does not exist")
            os.rename(self._tmp, self.root)
        except BaseException:
            self.abort()
            raise
        self._cleanup.detach()
        self._state = "done"
        return self.root

    def abort(self) -> None:
        """Stop writing and remove everything written so far (nothing appears at ``root``)."""
        if self._state != "open":
            return
        self._state = "aborted"
        if self._data["writer"] is not None:
            try:
                self._data["writer"].close()
            except Exception:  # the directory goes anyway
                pass
        for v in self._video.values():
            if v["writer"] is not None:
                v["writer"].abort()
        self._cleanup()

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.finalize()

    # ----- internals -----
    def _check_open(self) -> None:
        if self._state != "open":
            raise UserInputError(f"LeRobot writer for {self.root} is {self._state}: expected an open writer")

    def _write_episode(self, T: int, extra: dict[str, Any]) -> None:
        pa = import_pyarrow()
        e = self.num_episodes
        arrays = {k: np.stack(self._buffer[k]) if ft["dtype"] != "string" else np.asarray(self._buffer[k], object)
                  for k, ft in self._user.items()}  # [T,*shape] ([T] for shape (1,))
        frame_index = np.arange(T, dtype=np.int64)  # [T]
        index_cols = {"timestamp": (frame_index / self.fps).astype(np.float32), "frame_index": frame_index,
                      "episode_index": np.full(T, e, np.int64), "index": self._frames + frame_index,
                      "task_index": np.asarray(self._buffer_tasks, np.int64)}
        columns = []
        for name, ft in self.features.items():
            if ft["dtype"] == "video":
                continue
            value = index_cols[name] if name in index_cols else arrays[name]
            columns.append(_arrow_column(pa, value, self._schema.field(name).type, ft))
        table = pa.Table.from_arrays(columns, schema=self._schema)
        chunk, file = self._data_file(table.nbytes)
        self._data["writer"].write_table(table)
        self._data["bytes"] += table.nbytes
        row: dict[str, Any] = {"episode_index": e, "tasks": list(dict.fromkeys(_task_names(self._tasks,
                                                                                          self._buffer_tasks))),
                               "length": T, "data/chunk_index": chunk, "data/file_index": file,
                               "dataset_from_index": self._frames, "dataset_to_index": self._frames + T}
        for key in self._videos:
            v = self._video_file(key)
            start, stop = v["writer"].add_episode(arrays[key])
            row.update({f"videos/{key}/chunk_index": v["chunk"], f"videos/{key}/file_index": v["file"],
                        f"videos/{key}/from_timestamp": start, f"videos/{key}/to_timestamp": stop})
        stats = {k: episode_stats(arrays[k] if k in arrays else index_cols[k], ft)
                 for k, ft in self.features.items() if ft["dtype"] != "string"}
        row["extra"] = extra
        self._episodes.append(row)
        self._episode_stats.append(stats)
        self._frames += T

    def _data_file(self, nbytes: int) -> tuple[int, int]:
        """The (chunk, file) the next episode's rows go to, opening a new file when the current one is full."""
        pq = import_pyarrow().parquet
        d = self._data
        full = d["writer"] is not None and d["bytes"] + nbytes >= self._data_mb * 1024 ** 2
        if d["writer"] is None or full:
            if d["writer"] is not None:
                d["writer"].close()
            d["chunk"], d["file"] = _next_file(d["chunk"], d["file"], self._chunks)
            path = self._tmp / DATA_PATH.format(chunk_index=d["chunk"], file_index=d["file"])
            path.parent.mkdir(parents=True, exist_ok=True)
            d["writer"], d["bytes"] = pq.ParquetWriter(path, self._schema), 0
        return d["chunk"], d["file"]

    def _video_file(self, key: str) -> dict[str, Any]:
        v = self._video[key]
        if v["writer"] is None or v["writer"].bytes >= self._video_mb * 1024 ** 2:
            if v["writer"] is not None:
                v["writer"].close()
            v["chunk"], v["file"] = _next_file(v["chunk"], v["file"], self._chunks)
            H, W, _ = self._user[key]["shape"]
            path = self._tmp / VIDEO_PATH.format(video_key=key, chunk_index=v["chunk"], file_index=v["file"])
            assert self._encoder is not None  # picked in __init__ whenever the features have a video key
            v["writer"] = VideoFileWriter(path, self.fps, H, W, self._encoder, **self._video_options)
        return v

    def _close_files(self) -> None:
        if self._data["writer"] is not None:
            self._data["writer"].close()
            self._data["writer"] = None
        for key, v in self._video.items():
            if v["writer"] is not None:
                v["writer"].close()
                self._video_info[key] = video_info(v["writer"].path)
                v["writer"] = None

    def _write_meta(self) -> None:
        pa = import_pyarrow()
        pq = pa.parquet
        K = self.num_episodes
        # tasks: task_index with the strings as the pandas index, as pandas.DataFrame.to_parquet writes it
        names = _task_names(self._tasks, range(len(self._tasks)))
        tasks = pa.table({"task_index": pa.array(range(len(names)), pa.int64()),
                          "__index_level_0__": pa.array(names, pa.large_string())})
        tasks = tasks.replace_schema_metadata({b"pandas": _pandas_index_metadata("task_index", "__index_level_0__")})
        _write_parquet(pq, tasks, self._tmp / TASKS_PATH)
        # episodes: locations, stats/<feature>/<stat>, meta/episodes indices, then the caller's extra columns
        cols: dict[str, list] = {}
        for row, stats in zip(self._episodes, self._episode_stats):
            flat = {k: v for k, v in row.items() if k != "extra"}
            for feat, st in stats.items():
                for name, value in st.items():
                    flat[f"stats/{feat}/{name}"] = value.tolist()
            flat.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, **row["extra"]})
            for k, v in flat.items():
                cols.setdefault(k, []).append(v)
        try:
            episodes = pa.table({k: pa.array(v) for k, v in cols.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise UserInputError(f"LeRobot dataset to write at {self.root}: the extra episode values do not form "
                                 f"columns ({e}): expected one JSON-like type per key") from None
        _write_parquet(pq, episodes, self._tmp / EPISODES_PATH.format(chunk_index=0, file_index=0))
        stats = {k: aggregate_stats([s[k] for s in self._episode_stats]) for k in self._episode_stats[0]}
        _write_json(self._tmp / STATS_PATH, {k: {n: v.tolist() for n, v in st.items()} for k, st in stats.items()})
        features = {}
        for k, ft in self.features.items():
            ft = {"dtype": ft["dtype"], "shape": list(ft["shape"]), "names": ft.get("names")}
            if k in self._video_info:
                ft["info"] = self._video_info[k]
            features[k] = ft
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type, "total_episodes": K,
                "total_frames": self._frames, "total_tasks": len(self._tasks), "chunks_size": self._chunks,
                "data_files_size_in_mb": self._data_mb, "video_files_size_in_mb": self._video_mb, "fps": self.fps,
                "splits": {"train": f"0:{K}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self._videos else None, "features": features}
        _write_json(self._tmp / INFO_PATH, info)


_EPISODE_COLUMNS = {"episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"}


def _next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """The (chunk, file) after ``(chunk, file)``; ``file == -1`` starts at (chunk, 0)."""
    if file + 1 >= chunks_size:
        return chunk + 1, 0
    return chunk, file + 1


def _task_names(tasks: dict[str, int], indices) -> list[str]:
    by_index = {i: t for t, i in tasks.items()}
    return [by_index[int(i)] for i in indices]


def _frame_value(source: str, name: str, value: Any, ft: dict[str, Any]) -> Any:
    """One frame's value of a feature, checked and cast: a str, a scalar for shape (1,), else ``[*shape]``."""
    dtype, shape = ft["dtype"], tuple(ft["shape"])
    if dtype == "string":
        value = value.item() if isinstance(value, np.ndarray) and value.size == 1 else value
        if not isinstance(value, str):
            raise UserInputError(f"{source}: {name!r} is {type(value).__name__}: expected a string")
        return value
    arr = np.asarray(value)
    if dtype == "video":
        if arr.dtype != np.uint8 or arr.shape != shape:
            raise UserInputError(f"{source}: video {name!r} is {arr.dtype} {list(arr.shape)}: expected uint8 "
                                 f"{list(shape)} (height, width, RGB)")
        return arr
    if arr.dtype.kind not in "biuf":
        raise UserInputError(f"{source}: {name!r} has dtype {arr.dtype}: expected numbers of dtype {dtype}")
    if not np.can_cast(arr.dtype, dtype, "same_kind"):
        raise UserInputError(f"{source}: {name!r} has dtype {arr.dtype}, which does not cast to {dtype} without "
                             f"changing its kind: expected {dtype} values")
    if shape == (1,):
        if arr.size != 1 or arr.ndim > 1:
            raise UserInputError(f"{source}: {name!r} has shape {list(arr.shape)}: expected a scalar or [1]")
        return arr.reshape(()).astype(dtype)
    if arr.shape != shape:
        raise UserInputError(f"{source}: {name!r} has shape {list(arr.shape)}: expected {list(shape)}")
    return arr.astype(dtype)


def _arrow_column(pa, value: np.ndarray, type_, ft: dict[str, Any]):
    if ft["dtype"] == "string":
        return pa.array(value.tolist(), type_)
    if pa.types.is_fixed_size_list(type_):
        flat = pa.array(np.ascontiguousarray(value).reshape(-1), type_.value_type)
        return pa.FixedSizeListArray.from_arrays(flat, type=type_)
    return pa.array(value, type_)


def _write_parquet(pq, table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False), encoding="utf-8")


def _pandas_index_metadata(column: str, index: str) -> bytes:
    """The ``pandas`` schema metadata that makes ``pandas.read_parquet`` use ``index`` (strings) as the index."""
    return json.dumps({
        "index_columns": [index],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [{"name": column, "field_name": column, "pandas_type": "int64", "numpy_type": "int64",
                     "metadata": None},
                    {"name": None, "field_name": index, "pandas_type": "unicode", "numpy_type": "object",
                     "metadata": None}],
        "attributes": {}, "creator": {"library": "pyarrow", "version": import_pyarrow().__version__},
        "pandas_version": "2.2.3",
    }).encode()


# ----- statistics -----

def episode_stats(values: np.ndarray, ft: dict[str, Any]) -> dict[str, np.ndarray]:
    """LeRobot's statistics of one feature over one episode (see the module docstring)."""
    if ft["dtype"] == "video":
        T, H, W, _ = values.shape
        n = T if T < 100 else max(100, min(int(T ** 0.75), 10_000))  # LeRobot's number of sampled frames
        frames = np.unique(np.linspace(0, T - 1, n).round().astype(int))
        step = max(1, max(H, W) // STATS_SIDE) if max(H, W) >= 2 * STATS_SIDE else 1
        x = values[frames, ::step, ::step].reshape(-1, 3).astype(np.float64) / 255.0  # [N*h*w,3]
        out = _stats(x, x, len(frames))
        return {k: v if k == "count" else v.reshape(3, 1, 1) for k, v in out.items()}
    x = values.reshape(len(values), -1)  # [T,D]
    return _stats(x, x.astype(np.float64), len(values))


def _stats(x: np.ndarray, xf: np.ndarray, count: int) -> dict[str, np.ndarray]:
    """min/max in the data's dtype, the rest in float64, per column of ``x`` ``[N,D]``; LeRobot's key order."""
    out = {"min": x.min(0), "max": x.max(0), "mean": xf.mean(0), "std": xf.std(0),
           "count": np.array([count], np.int64)}
    qs = np.quantile(xf, list(QUANTILES.values()), axis=0)  # [Q,D]
    out.update({name: q for name, q in zip(QUANTILES, qs)})
    return out


def aggregate_stats(episodes: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Pool per-episode statistics of one feature (count-weighted, as LeRobot's ``aggregate_stats``)."""
    counts = np.array([s["count"][0] for s in episodes], np.float64)  # [K]
    total = counts.sum()

    def weighted(key: str) -> np.ndarray:
        v = np.stack([s[key] for s in episodes])  # [K,*stat shape]
        return (v * counts.reshape(-1, *[1] * (v.ndim - 1))).sum(0) / total

    mean = weighted("mean")
    second = np.stack([s["std"] ** 2 + (s["mean"] - mean) ** 2 for s in episodes])  # [K,*]
    var = (second * counts.reshape(-1, *[1] * (second.ndim - 1))).sum(0) / total
    out = {"min": np.min(np.stack([s["min"] for s in episodes]), 0),
           "max": np.max(np.stack([s["max"] for s in episodes]), 0), "mean": mean, "std": np.sqrt(var),
           "count": np.array([int(total)], np.int64)}
    out.update({name: weighted(name) for name in QUANTILES})
    return out


# ----- DROID, as LeRobot ports it -----

DROID_CAMERAS = ("exterior_1_left", "exterior_2_left", "wrist_left")
DROID_FPS = 15
DROID_ROBOT_TYPE = "Franka"
_JOINTS = [f"joint_{i}" for i in range(7)]
_POSE = ["x", "y", "z", "roll", "pitch", "yaw"]


def droid_features(image_hw: tuple[int, int] = (180, 320), cameras: Sequence[str] = DROID_CAMERAS,
                   metadata: bool = True) -> dict[str, dict[str, Any]]:
    """The features of LeRobot's port of DROID (``lerobot/droid_1.0.1``; the schema of its ``port_droid.py``).

    ``observation.state`` (8) = joint positions (7) + gripper (1), with the parts ``observation.state.
    {joint_position, cartesian_position, gripper_position}``; ``action`` (8) = joint position (7) + gripper
    position (1), with ``action.{cartesian_position, cartesian_velocity, joint_position, joint_velocity,
    gripper_position, gripper_velocity}`` and ``action.original`` (RLDS's 7-vector: cartesian velocity +
    gripper); one video ``observation.images.<camera>`` per camera (``image_hw`` + 3 channels); the step flags
    ``is_first``, ``is_last``, ``is_terminal``; ``reward``, ``discount``; ``is_episode_successful`` (the same on
    every frame of an episode); the instructions ``language_instruction{,_2,_3}`` (the first is also the
    frame's task). ``metadata`` adds the port's per-episode strings (``task_category``, ``building``,
    ``collector_id``, ``date``) and the extrinsics ``camera_extrinsics.<camera>`` (6) of each camera.
    """
    H, W = image_hw

    def vec(names):
        return {"dtype": "float32", "shape": (len(names),), "names": {"axes": list(names)}}

    def flag():
        return {"dtype": "bool", "shape": (1,), "names": None}

    def text():
        return {"dtype": "string", "shape": (1,), "names": None}

    out: dict[str, dict[str, Any]] = {
        "is_first": flag(), "is_last": flag(), "is_terminal": flag(),
        "language_instruction": text(), "language_instruction_2": text(), "language_instruction_3": text(),
        "observation.state.gripper_position": vec(["gripper"]),
        "observation.state.cartesian_position": vec(_POSE),
        "observation.state.joint_position": vec(_JOINTS),
        "observation.state": vec([*_JOINTS, "gripper"]),
    }
    for cam in cameras:
        out[f"observation.images.{cam}"] = {"dtype": "video", "shape": (H, W, 3),
                                            "names": ["height", "width", "channels"]}
    out.update({
        "action.gripper_position": vec(["gripper"]), "action.gripper_velocity": vec(["gripper"]),
        "action.cartesian_position": vec(_POSE), "action.cartesian_velocity": vec(_POSE),
        "action.joint_position": vec(_JOINTS), "action.joint_velocity": vec(_JOINTS),
        "action.original": vec([*_POSE, "gripper"]), "action": vec([*_JOINTS, "gripper"]),
        "discount": {"dtype": "float32", "shape": (1,), "names": None},
        "reward": {"dtype": "float32", "shape": (1,), "names": None},
    })
    if metadata:
        out.update({k: text() for k in ("task_category", "building", "collector_id", "date")})
        out.update({f"camera_extrinsics.{cam}": vec(_POSE) for cam in cameras})
    out["is_episode_successful"] = flag()
    return out
