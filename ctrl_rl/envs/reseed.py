"""Checkpoint state of simulators that cannot save themselves (envpool, gymnasium, dm_control).

Such an adapter keeps its seed and two counters; its ``state_dict`` is that metadata, and loading it
schedules a re-seed of the next ``reset()`` with a fresh seed derived from it, so a resumed run is
deterministic but does not replay its first episodes (and is not bit-exact with an uninterrupted run).
"""

from __future__ import annotations

from typing import Any


def metadata_state(env_id: str, backend: str, seed: int, resets: int, episodes: int) -> dict[str, Any]:
    """The metadata-only state_dict of a simulator that cannot save itself."""
    return {"env_id": env_id, "backend": backend, "seed": seed, "resets": resets, "episodes": episodes, "exact": False}


def resume_seed(d: dict[str, Any]) -> int:
    """A fresh seed derived from a metadata state_dict, so a resumed run does not replay its first episodes."""
    return (int(d["seed"]) * 1_000_003 + int(d["resets"]) + int(d["episodes"]) + 1) % (2**31 - 1)


def load_metadata_state(d: dict[str, Any], env_id: str) -> tuple[int, int, int]:
    """Check a metadata state_dict belongs to ``env_id``; returns (seed for the next reset, resets, episodes)."""
    if d.get("env_id") != env_id:
        raise ValueError(f"state_dict is for env {d.get('env_id')!r}, not {env_id!r}.")
    return resume_seed(d), int(d["resets"]), int(d["episodes"])
