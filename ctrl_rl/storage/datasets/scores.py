"""Normalized scores: ``100 * (R - R_random) / (R_expert - R_random)``, always reported with their source.

Two reference tables:

* ``D4RL_REFERENCES``: D4RL's frozen constants (``d4rl/infos.py``; every ``-v2``/``-v1`` gym-mujoco dataset
  reuses the ``-random-v0`` values, docs/guides/datasets.md#normalized-scores). They were measured on gym v2 /
  mujoco-py, so a
  score on v5 dynamics is only approximately comparable with published tables.
* Local references: random and expert returns measured here on the Gymnasium v5 tasks (100 episodes each,
  Minari's convention), kept in a JSON file that the dataset generation step writes
  (``save_local_references``); ``load_local_references`` refuses clearly when the file is missing.

Every function that returns a normalized score also returns the name of the table it used, so a report
can never mix them up silently.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class ReferenceScores:
    """Undiscounted episode returns of a random and an expert policy on one task."""

    random: float
    expert: float
    env_id: str = ""
    """The environment the returns were measured on (e.g. ``hopper-random-v0``, ``Hopper-v5``)."""
    episodes: int | None = None
    """Episodes averaged per policy, when known."""


D4RL_SOURCE = "D4RL v2 reference returns (d4rl/infos.py)"
D4RL_REFERENCES: Mapping[str, ReferenceScores] = MappingProxyType({
    "halfcheetah": ReferenceScores(-280.178953, 12135.0, "halfcheetah-random-v0"),
    "hopper": ReferenceScores(-20.272305, 3234.3, "hopper-random-v0"),
    "walker2d": ReferenceScores(1.629008, 4592.3, "walker2d-random-v0"),
    "ant": ReferenceScores(-325.6, 3879.7, "ant-random-v0"),
})

LOCAL_REFS_ENV = "CTRL_RL_REFERENCE_SCORES"


@dataclass(frozen=True)
class ReferenceTable:
    """A named set of references: ``source`` is what reports print next to a normalized score."""

    source: str
    scores: Mapping[str, ReferenceScores]


D4RL_TABLE = ReferenceTable(D4RL_SOURCE, D4RL_REFERENCES)

Refs = str | Path | ReferenceTable


def task_key(env: str) -> str:
    """Canonical task name of an env or dataset id: ``Hopper-v5``, ``hopper-medium-v2`` and
    ``mujoco/hopper/medium-v0`` all give ``hopper``; HalfCheetah gives ``halfcheetah``."""
    tokens = [t for t in re.split(r"[/\-_\s]+", env.lower()) if t]
    for tok in tokens:
        if tok in ("halfcheetah", "hopper", "walker2d", "ant", "humanoid", "swimmer", "reacher", "pusher"):
            return tok
    return tokens[0] if tokens else env


def default_local_references_path() -> Path:
    """``$CTRL_RL_REFERENCE_SCORES``, else ``~/.cache/ctrl_rl/reference_scores_v5.json``."""
    env = os.environ.get(LOCAL_REFS_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ctrl_rl" / "reference_scores_v5.json"


def save_local_references(scores: Mapping[str, ReferenceScores], path: str | Path | None = None,
                          source: str = "local v5 references (random and expert policy, 100 episodes)") -> Path:
    """Write measured references (task key -> ReferenceScores) as JSON; returns the path."""
    path = Path(path).expanduser() if path is not None else default_local_references_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"source": source, "scores": {task_key(k): asdict(v) for k, v in scores.items()}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_local_references(path: str | Path | None = None) -> ReferenceTable:
    """The locally measured references, or a UserInputError saying how to make them."""
    path = Path(path).expanduser() if path is not None else default_local_references_path()
    if not path.is_file():
        raise UserInputError(f"no locally measured reference scores at {path}: expected the JSON file that "
                             f"`ctrl-rl data generate` writes (or set {LOCAL_REFS_ENV}), or use the D4RL references")
    try:
        record = json.loads(path.read_text())
        scores = {k: ReferenceScores(**v) for k, v in record["scores"].items()}
        source = str(record.get("source", "local references"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserInputError(f"reference score file {path} is malformed ({e}): expected "
                             f'{{"source": ..., "scores": {{task: {{"random": R, "expert": R}}}}}}') from None
    return ReferenceTable(f"{source} [{path}]", MappingProxyType(scores))


def resolve_references(refs: Refs = "d4rl") -> ReferenceTable:
    """``"d4rl"`` (the frozen table), ``"local"`` (the default local file), a JSON path, or a table."""
    if isinstance(refs, ReferenceTable):
        return refs
    if refs == "d4rl":
        return D4RL_TABLE
    if refs == "local":
        return load_local_references()
    return load_local_references(refs)


def reference_for(env: str, refs: Refs = "d4rl") -> tuple[ReferenceScores, str]:
    """The references of ``env`` in the chosen table and the table's name."""
    table = resolve_references(refs)
    key = task_key(env)
    if key not in table.scores:
        raise UserInputError(f"no reference scores for {env!r} in {table.source}: expected one of "
                             f"{sorted(table.scores)}")
    return table.scores[key], table.source


def normalized_score(env: str, episode_return: Any, refs: Refs = "d4rl") -> tuple[Any, str]:
    """``(100 * (R - random) / (expert - random), source)``; ``R`` may be a float, array or tensor."""
    ref, source = reference_for(env, refs)
    return 100.0 * (episode_return - ref.random) / (ref.expert - ref.random), source


def normalized_score_from(ref_scores: Mapping[str, Any], episode_return: Any) -> tuple[Any, str]:
    """Normalize with a dataset's own record (``{"random", "expert", "source"}``, e.g. ``metadata["ref_scores"]``)."""
    lo, hi = float(ref_scores["random"]), float(ref_scores["expert"])
    return 100.0 * (episode_return - lo) / (hi - lo), str(ref_scores.get("source", "dataset metadata"))
