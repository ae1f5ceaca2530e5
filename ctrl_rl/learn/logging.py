"""Run logging: metrics.jsonl (one JSON object per log step) and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

_SCAN_CHUNK = 1 << 16


def _tail_offset(path: Path) -> int:
    """Byte length of ``path`` up to and including its last newline (0 for an empty or missing file):
    a row cut by a kill mid-write has no newline and lies past this offset."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            start = max(0, pos - _SCAN_CHUNK)
            f.seek(start)
            block = f.read(pos - start)
            i = block.rfind(b"\n")
            if i >= 0:
                return start + i + 1
            pos = start
    return 0


def _offset_after_step(path: Path, step: int) -> int:
    """Byte offset of the first complete row whose ``step`` exceeds ``step`` (or of a cut last row; else
    the file's length), found by scanning: rows logged after a checkpoint at ``step`` start there."""
    end = _tail_offset(path)
    pos = 0
    with open(path, "rb") as f:
        while pos < end:
            line = f.readline()
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                row = None
            if isinstance(row, dict) and isinstance(row.get("step"), (int, float)) and row["step"] > step:
                return pos
            pos += len(line)
    return end


class RunLogger:
    """Appends metric rows to ``metrics.jsonl`` and mirrors numeric values to TensorBoard.

    The file is only ever appended to and, on resume, cut with ``os.truncate`` (one atomic metadata
    operation): it is never read into memory and written back, so a kill at any moment leaves every
    row that was there. Rows written after the resumed checkpoint, before the interruption, are dropped
    so the file reads as one uninterrupted run:

    - ``resume_offset``: the ``offset`` stored in the checkpoint; the file is truncated to that length.
      If the file is shorter than that, or the offset does not fall at the end of a row, a warning is
      printed and ``resume_step`` is used instead.
    - ``resume_step`` (fallback when no offset is known, e.g. checkpoints written before the offset was
      stored): the file is truncated before the first row whose ``step`` exceeds it. It also sets
      TensorBoard's ``purge_step``, so pass it together with ``resume_offset``.

    A last row cut by a kill mid-write (no trailing newline) is always dropped before appending.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None, tensorboard: bool = True,
                 resume_offset: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if self.path.exists():
            keep = None
            if resume_offset is not None:
                keep = self._checked_offset(int(resume_offset))
            if keep is None and resume_step is not None:
                keep = _offset_after_step(self.path, resume_step)
            if keep is None:
                keep = _tail_offset(self.path)
            if keep != self.path.stat().st_size:
                os.truncate(self.path, keep)
        self.file = open(self.path, "ab")
        self._offset = self.file.tell()
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir), purge_step=resume_step)

    def _checked_offset(self, offset: int) -> int | None:
        size = self.path.stat().st_size
        ok = 0 <= offset <= size
        if ok and offset > 0:
            with open(self.path, "rb") as f:
                f.seek(offset - 1)
                ok = f.read(1) == b"\n"
        if ok:
            return offset
        print(f"ctrl-rl: warning: {str(self.path)!r} ({size} bytes) does not end a row at the checkpoint's offset "
              f"{offset}; finding the checkpoint's step in it instead", file=sys.stderr)
        return None

    @property
    def offset(self) -> int:
        """Bytes of metrics.jsonl after the last row written (and flushed): store it in the checkpoint and
        pass it back as ``resume_offset``. Call ``sync()`` first if the checkpoint must survive a power loss
        together with the rows it counts."""
        return self._offset

    def log(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        line = (json.dumps(clean) + "\n").encode()
        self.file.write(line)
        self.file.flush()
        self._offset += len(line)
        if self.tb is not None:
            step = int(row["step"])
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def sync(self) -> None:
        """Flush metrics.jsonl to disk (fsync), e.g. just before writing the checkpoint that stores ``offset``."""
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl; lines that are not a JSON object (a row cut by a kill) are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
