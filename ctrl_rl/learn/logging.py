"""Run logging: metrics.jsonl (one JSON object per log step) and TensorBoard event files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class RunLogger:
    """Appends metric rows to ``metrics.jsonl`` and mirrors numeric values to TensorBoard.

    On resume, rows past the checkpoint's step (written after the checkpoint, before an interruption)
    are dropped so the file reads as one uninterrupted run.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        keep.append(line)
                except json.JSONDecodeError:
                    continue
            self.path.write_text("".join(k + "\n" for k in keep))
        self.file = open(self.path, "a")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir), purge_step=resume_step)

    def log(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()
        if self.tb is not None:
            step = int(row["step"])
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
