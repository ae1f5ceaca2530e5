"""The LeRobot dataset layout (v2.0, v2.1, v3.0): paths, versions, feature specs and their Arrow types, shared by
the reader (``reader.py``) and the writer (``writer.py``). Nothing here reads or writes a file.

Bottom of the ``lerobot`` sub-package: imports no module of it (order: layout < video < reader, writer).

Sources: the LeRobotDataset v3.0 documentation and the files ``lerobot-dataset`` 0.4.4 writes (one is kept in
``tests/storage/fixtures/lerobot_v30_reference``, with the script that made it); v2.x from datasets of that
version on the Hugging Face hub and LeRobot's v2.1 -> v3.0 conversion script. Nothing here is copied from
LeRobot; the names and templates are the format's.

v3.0 (``codebase_version`` "v3.0")::

    meta/info.json                               fps, robot_type, totals, chunks_size, file size limits,
                                                 data_path / video_path templates, features {dtype, shape, names}
    meta/stats.json                              per feature: min, max, mean, std, count, q01..q99
    meta/tasks.parquet                           task_index, with the task string as the (pandas) index
    meta/episodes/chunk-000/file-000.parquet     one row per episode: episode_index, tasks, length,
                                                 data/{chunk,file}_index, dataset_{from,to}_index,
                                                 videos/<key>/{chunk_index,file_index,from_timestamp,to_timestamp},
                                                 stats/<feature>/<stat>, meta/episodes/{chunk,file}_index
    data/chunk-000/file-000.parquet              frames of many episodes (one row group per episode)
    videos/<key>/chunk-000/file-000.mp4          many episodes back to back; an episode's frame t is at
                                                 from_timestamp + timestamp[t]

v2.0 / v2.1::

    meta/info.json                               as above with total_chunks, total_videos and the templates
        data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet and
        videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4
    meta/episodes.jsonl                          {"episode_index", "tasks", "length"} per line
    meta/tasks.jsonl                             {"task_index", "task"} per line
    meta/episodes_stats.jsonl (v2.1), meta/stats.json (v2.0)

Every frame row also holds LeRobot's index features: ``timestamp`` (float32, seconds from the episode's start),
``frame_index`` (within the episode), ``episode_index``, ``index`` (over the dataset) and ``task_index``.
A feature of shape ``(1,)`` is a scalar column; a vector ``(N,)`` a fixed-size list column (variable lists are
read too); ``string`` features are string columns; ``video`` features live only in the mp4 files, shape
``(H, W, 3)``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ctrl_rl.errors import UserInputError

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
EPISODES_PATH = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V2_EPISODES_PATH = "meta/episodes.jsonl"
V2_TASKS_PATH = "meta/tasks.jsonl"
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

VERSIONS = ("v2.0", "v2.1", "v3.0")
"""The ``codebase_version`` values the reader accepts."""
CODEBASE_VERSION = "v3.0"
"""The version the writer writes."""
CHUNKS_SIZE = 1000  # files per chunk directory
DATA_FILE_MB = 100  # a data file is closed once it holds this much (uncompressed), an episode never spans files
VIDEO_FILE_MB = 200

INDEX_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
"""The features LeRobot adds to every dataset, in its order (after the user's features)."""

NUMERIC_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
                  "uint64", "bool")
DTYPES = (*NUMERIC_DTYPES, "string", "video")


def import_pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (the submodule is used through pyarrow.parquet)
    except ImportError:
        raise UserInputError("reading or writing LeRobot datasets needs the pyarrow package: expected "
                             "`pip install pyarrow av`") from None
    return pyarrow


def check_features(source: str, features: Any) -> dict[str, dict[str, Any]]:
    """A features dict ``{name: {"dtype", "shape", "names"}}`` with known dtypes and positive shapes (as tuples)."""
    if not isinstance(features, dict) or not features:
        raise UserInputError(f"{source}: 'features' is {type(features).__name__}: expected a non-empty object "
                             f"{{name: {{dtype, shape, names}}}}")
    out = {}
    for name, ft in features.items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise UserInputError(f"{source}: feature {name!r} is {ft!r}: expected an object with 'dtype' and 'shape'")
        dtype, shape = ft["dtype"], ft["shape"]
        if dtype == "image":
            raise UserInputError(f"{source}: feature {name!r} has dtype 'image' (frames stored as PNG in the parquet "
                                 f"files): expected 'video' or a numeric dtype (images are not supported)")
        if dtype not in DTYPES:
            raise UserInputError(f"{source}: feature {name!r} has dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        if (not isinstance(shape, (list, tuple)) or not shape
                or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)):
            raise UserInputError(f"{source}: feature {name!r} has shape {shape!r}: expected a list of positive sizes")
        if dtype == "video" and (len(shape) != 3 or shape[2] != 3):
            raise UserInputError(f"{source}: video feature {name!r} has shape {list(shape)}: expected "
                                 f"[height, width, 3]")
        out[name] = {**ft, "shape": tuple(shape)}
    return out


def video_keys(features: dict[str, dict[str, Any]]) -> list[str]:
    return [k for k, ft in features.items() if ft["dtype"] == "video"]


# ----- Arrow types of the data files -----

def arrow_type(ft: dict[str, Any]):
    """The Arrow type LeRobot (through Hugging Face ``datasets``) gives a non-video feature of shape ``(1,)`` or
    ``(N,)``: a scalar, or a fixed-size list whose child field is named ``element``."""
    pa = import_pyarrow()
    value = pa.string() if ft["dtype"] == "string" else pa.from_numpy_dtype(np.dtype(ft["dtype"]))
    shape = tuple(ft["shape"])
    if shape == (1,):
        return value
    assert len(shape) == 1, shape
    return pa.list_(pa.field("element", value), shape[0])


def hf_features_metadata(features: dict[str, dict[str, Any]]) -> bytes:
    """The ``huggingface`` schema metadata of a data file (what ``datasets`` 4 records for these columns), so
    that the Hugging Face loaders see the same feature types as in LeRobot's own files."""
    out = {}
    for name, ft in features.items():
        if ft["dtype"] == "video":
            continue
        value = {"dtype": ft["dtype"], "_type": "Value"}
        out[name] = value if tuple(ft["shape"]) == (1,) else {"feature": value, "length": ft["shape"][0],
                                                               "_type": "List"}
    return json.dumps({"info": {"features": out}}).encode()
