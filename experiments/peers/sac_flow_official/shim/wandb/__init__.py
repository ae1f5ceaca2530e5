"""wandb stand-in: ``init``/``log``/``finish`` become rows of ``$SAC_FLOW_SHIM_DIR/wandb.jsonl`` (sac_flow_shim.record).
``init`` records ``config`` (the script's resolved ``Args``); ``log`` its dict with ``step``."""

from __future__ import annotations

from sac_flow_shim import record


def init(project=None, entity=None, config=None, name=None, group=None, **kwargs):
    record.write("wandb", {"_event": "init", "project": project, "name": name, "group": group,
                           "config": {k: record.plain(v) for k, v in (config or {}).items()}})


def log(data: dict, step=None, commit=None, **kwargs):
    record.write("wandb", {**data, "step": step})


def finish(*args, **kwargs):
    record.write("wandb", {"_event": "finish"})
