"""Shared by the benchmark scripts: where results go and how they are written."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"


def write_result(name: str, payload: dict, markdown: str | None = None) -> Path:
    """Write ``experiments/results/<name>.json`` (and ``.md`` when given) and say where."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest = RESULTS / f"{name}.json"
    dest.write_text(json.dumps(payload, indent=2) + "\n")
    if markdown is not None:
        (RESULTS / f"{name}.md").write_text(markdown)
    print(f"wrote {dest}")
    return dest
