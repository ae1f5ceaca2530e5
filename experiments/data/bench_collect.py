"""Collection speed of `ctrl-rl data generate`: transitions/s of ``collect`` per task and number of worker processes.

    python experiments/data/bench_collect.py [--steps 50000] [--num-envs 32] [--workers 1 2] [--tasks Hopper-v5 ...]

The policy is a 256x256 SAC actor (the shipped expert where there is one, else a freshly initialised one: the
cost is the same) with sampled actions, as for the medium and expert levels; ``random`` rows are the uniform
policy. Besides wall time it reports the CPU seconds of this process and its worker processes, so a run on a busy
machine still says what 1M transitions cost: ``cpu_s_per_1M / cores`` is the wall time to expect on idle cores
when the workers keep them busy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ctrl_rl.algos.sac import SACConfig  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.datagen import behaviour as B  # noqa: E402
from ctrl_rl.datagen.generate import collect  # noqa: E402


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime  # workers count once joined


def actor_for(env_id: str):
    try:
        return B.load_behaviour(env_id, "expert")[0]
    except UserInputError:
        return B.build_actor(dataclasses.asdict(SACConfig()), *B.env_dims(env_id), env_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tasks", nargs="+", default=["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"])
    ap.add_argument("--policies", nargs="+", default=["sac", "random"])
    a = ap.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"# load average at start: {load}", flush=True)
    for env_id in a.tasks:
        for kind in a.policies:
            policy = actor_for(env_id) if kind == "sac" else None
            for w in a.workers:
                c0, t0 = cpu_seconds(), time.perf_counter()
                collect(env_id, policy, a.steps, seed=0, num_envs=a.num_envs, workers=w)
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                print(json.dumps({"env": env_id, "policy": kind, "workers": w, "num_envs": a.num_envs,
                                  "transitions": a.steps, "per_s": round(a.steps / wall),
                                  "wall_s_per_1M": round(1e6 * wall / a.steps), "cpu_s_per_1M": round(1e6 * cpu / a.steps)}),
                      flush=True)


if __name__ == "__main__":
    main()
