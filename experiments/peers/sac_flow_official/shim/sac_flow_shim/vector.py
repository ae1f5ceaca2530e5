"""``SyncVectorEnv`` with Gymnasium 0.29's step API on Gymnasium 1.x, and the run monitor it calls.

The official scripts were written for Gymnasium 0.29.1 (their requirements.txt) and read, after each vector step,
``infos["final_info"]`` as an array of the per-env info dicts of the envs whose episode just ended (the return is
``info["episode"]["r"]``) and ``infos["final_observation"][i]`` as the last observation of env ``i`` on truncation,
with the env already reset in that same step. Gymnasium 1.x resets on the *next* step by default and, in its
same-step mode, reports ``final_obs`` and a ``final_info`` of batched arrays instead. Hopper-v5 needs Gymnasium
>= 1.0. ``OldApiSyncVectorEnv`` is Gymnasium 1.4's ``SyncVectorEnv`` in same-step mode (reset inside the step, as
0.29) with those two 0.29 entries (and their ``_`` masks) in place of 1.x's; observations, rewards, flags, seeding
(``reset(seed=s)`` seeds env i with s + i in both) and the spaces are 1.4's own.

``RunMonitor`` is called at the start of every ``step()`` with the env steps done so far and once more from
``close()``: it writes clock rows (shim.jsonl) and runs the deterministic evaluation when due, before the step is
taken, so an evaluation at N env steps sees the parameters after the updates of those N steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from . import record


class KeepLast(gym.Wrapper):
    """Remembers the observation and info of its env's last step: the final ones when an episode ends."""

    def step(self, action):
        out = self.env.step(action)
        self.last_obs, self.last_info = out[0], out[4]
        return out


class RunMonitor:
    """The env-step clock and the evaluation schedule.

    Clock rows (``{"_event": "clock", "env_steps", "cpu_s", "eval_s", "eval_cpu_s"}``: ``cpu_s`` the process's CPU
    time, all threads, ``eval_s`` and ``eval_cpu_s`` the wall and CPU seconds spent in evaluations before the row)
    at every ``clock_every`` env steps, at ``learning_starts`` and the two steps after it (the first update
    compiles), and at the end; an evaluation at every multiple of ``eval_every`` (0: none), after the clock row.
    ``_t`` of a row (sac_flow_shim.record) is the wall clock."""

    def __init__(self, eval_every: int, evaluate: Callable[[int], None] | None, learning_starts: Callable[[], int],
                 clock_every: int = 500):
        self.eval_every, self.evaluate, self.clock_every = eval_every, evaluate, clock_every
        self.learning_starts = learning_starts
        self.marks: set[int] | None = None
        self.eval_s, self.eval_cpu_s, self.last = 0.0, 0.0, -1

    def __call__(self, steps: int, final: bool = False) -> None:
        if self.marks is None:
            ls = self.learning_starts()
            self.marks = {ls, ls + 1, ls + 2}
        if final or steps in self.marks or steps % self.clock_every == 0:
            record.write("shim", {"_event": "clock", "env_steps": steps, "cpu_s": round(time.process_time(), 4),
                                  "eval_s": round(self.eval_s, 4), "eval_cpu_s": round(self.eval_cpu_s, 4),
                                  "final": final})
        if self.evaluate is not None and self.eval_every and steps % self.eval_every == 0 and steps != self.last:
            self.last = steps
            t, c = time.perf_counter(), time.process_time()
            self.evaluate(steps)
            self.eval_s += time.perf_counter() - t
            self.eval_cpu_s += time.process_time() - c


class OldApiSyncVectorEnv(SyncVectorEnv):
    """Gymnasium 0.29's ``SyncVectorEnv`` step API on 1.x (module docstring). ``monitor``: set by launch.py."""

    monitor: RunMonitor | None = None

    def __init__(self, env_fns, copy: bool = True, **kwargs):
        kwargs.pop("autoreset_mode", None)
        super().__init__([lambda f=f: KeepLast(f()) for f in env_fns], copy=copy,
                         autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
        self.env_steps = 0

    def step(self, actions):
        if self.monitor is not None:
            self.monitor(self.env_steps)
        obs, rewards, terminations, truncations, infos = super().step(actions)
        self.env_steps += 1
        done = np.logical_or(terminations, truncations)
        for key in ("final_obs", "_final_obs", "final_info", "_final_info"):
            infos.pop(key, None)
        if done.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            final_info = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i], final_info[i] = self.envs[i].last_obs, self.envs[i].last_info
            infos["final_observation"], infos["_final_observation"] = final_obs, done.copy()
            infos["final_info"], infos["_final_info"] = final_info, done.copy()
        return obs, rewards, terminations, truncations, infos

    def close(self, **kwargs):
        if self.monitor is not None and not self.closed:
            self.monitor(self.env_steps, final=True)
        super().close(**kwargs)
