"""Stands in for ``torch.utils.tensorboard`` (launch.py registers it under that name): ``SummaryWriter`` records
``add_scalar``/``add_scalars``/``add_text`` as rows of ``tensorboard.jsonl`` and creates its log folder as the real
one does (the scripts save their model into it). No event files are written, so tensorboard is not installed."""

from __future__ import annotations

import os

from . import record


class SummaryWriter:
    def __init__(self, log_dir: str | None = None, *args, **kwargs):
        self.log_dir = log_dir or "runs"
        os.makedirs(self.log_dir, exist_ok=True)
        record.write("tensorboard", {"_event": "init", "log_dir": self.log_dir})

    def add_scalar(self, tag, scalar_value, global_step=None, *args, **kwargs):
        record.write("tensorboard", {"tag": tag, "value": scalar_value, "step": global_step})

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, *args, **kwargs):
        for tag, value in tag_scalar_dict.items():
            self.add_scalar(f"{main_tag}/{tag}", value, global_step)

    def add_text(self, tag, text_string, global_step=None, *args, **kwargs):
        record.write("tensorboard", {"tag": tag, "text": text_string, "step": global_step})

    def flush(self):
        pass

    def close(self):
        record.write("tensorboard", {"_event": "close"})
