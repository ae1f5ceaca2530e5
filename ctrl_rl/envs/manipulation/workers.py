"""Envs spread over worker processes (``workers=K``): each worker owns a ``SimGroup`` of a contiguous slice of envs.

The processes are ``ctrl_rl.core.workers.WorkerPool``'s (spawned: a fork would copy the parent's OpenGL context
and torch thread pools, which are not fork-safe). ``step`` and ``reset`` reach every worker before any answer is
read, so the workers run in parallel; each runs MuJoCo and its renderer on one thread, and the parent only
concatenates their NumPy results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ctrl_rl.core.workers import WorkerPool
from ctrl_rl.envs.manipulation.sim import SimGroup


def _concat(parts: list[Any]) -> Any:
    """Concatenate the workers' results along the env axis (dicts recursively, arrays on axis 0)."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    return np.concatenate(parts, axis=0)


class ProcessSimGroup:
    """``num_envs`` envs over ``workers`` processes, with the ``SimGroup`` interface (reset, step, instructions,
    close)."""

    def __init__(self, task: str, cfg, robot, num_envs: int, workers: int) -> None:
        workers = min(int(workers), int(num_envs))
        sizes = [num_envs // workers + (1 if i < num_envs % workers else 0) for i in range(workers)]
        self._bounds = np.cumsum([0] + sizes)  # [K+1] env index where each worker's slice starts
        args = [(task, cfg, robot, size, int(start)) for size, start in zip(sizes, self._bounds[:-1])]
        self._pool = WorkerPool(SimGroup, args, name=f"manip:{task} worker")

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        return _concat(self._pool.call_all("reset", [(seed,)] * len(self._pool)))

    def step(self, actions: np.ndarray) -> dict[str, Any]:
        b = self._bounds
        return _concat(self._pool.call_all("step", [(actions[b[i]: b[i + 1]],) for i in range(len(self._pool))]))

    def instructions(self) -> list[str]:
        return [s for part in self._pool.call_all("instructions") for s in part]

    def close(self) -> None:
        self._pool.close()
