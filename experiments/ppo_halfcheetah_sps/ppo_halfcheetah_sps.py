"""Benchmark 1: PPO end-to-end env-steps/s on HalfCheetah-v5 (envpool) vs stable-baselines3 and raw envpool.

Measured in one run on one machine, each figure the median of --repeats runs:
  raw      envpool stepping with random actions (the simulator's ceiling), same env count
  ctrl_rl  `ctrl-rl train ppo --preset halfcheetah` (envpool, 64x64 tanh nets), steps/s over the
           whole run including learning, logging and checkpoints
  sb3_same SB3 PPO with the same network, env count, rollout length, minibatch size and epochs
           (DummyVecEnv of gymnasium HalfCheetah-v5, as SB3 users run it)
  sb3_ref  SB3 PPO with its defaults and 8 envs (the 1.9k steps/s reference measured on this machine)

    python experiments/ppo_halfcheetah_sps/ppo_halfcheetah_sps.py [--steps 400000] [--repeats 3]

Writes experiments/ppo_halfcheetah_sps/ppo_halfcheetah_sps.json and prints the ratios. The machine's 1-minute load
average is recorded before every repeat: on a shared machine other processes compete for the cores,
which slows every figure (and a multi-threaded update disproportionately; see learn/onpolicy.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from ctrl_rl.envs.gymnasium import filter_mujoco_warnings  # also for the baselines' envs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, run_preset, write_result  # noqa: E402
from peers.sb3_runs import ppo_steps_per_s  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

PRESET = json.loads((ROOT / "experiments/presets/halfcheetah.json").read_text())


def raw_envpool(num_envs: int, steps: int) -> float:
    import envpool
    import numpy as np

    env = envpool.make("HalfCheetah-v5", env_type="gymnasium", num_envs=num_envs, seed=0)
    env.reset()
    rng = np.random.default_rng(0)
    acts = rng.uniform(-1, 1, size=(64, num_envs, 6)).astype(np.float32)
    n = steps // num_envs
    t = time.perf_counter()
    for i in range(n):
        env.step(acts[i % 64])
    return n * num_envs / (time.perf_counter() - t)


def ctrl_rl_run(steps: int, seed: int) -> tuple[float, float]:
    rows, wall = run_preset("halfcheetah", seed, steps)
    return rows[-1]["step"] / rows[-1]["wall_time"], rows[-1]["step"] / wall


def main() -> None:
    filter_mujoco_warnings()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400_000, help="env steps per ctrl_rl / raw run")
    ap.add_argument("--sb3-steps", type=int, default=40_960, help="env steps per SB3 run (SB3 is slow)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out: dict = {"machine": {"cpus": os.cpu_count()}, "steps": args.steps, "sb3_steps": args.sb3_steps,
                 "repeats": args.repeats}
    res: dict[str, list[float]] = {"raw": [], "ctrl_rl": [], "ctrl_rl_incl_startup": [], "sb3_same": [], "sb3_ref": []}
    out["load_avg_1min"] = []
    for k in range(args.repeats):
        out["load_avg_1min"].append(os.getloadavg()[0])
        res["raw"].append(raw_envpool(PRESET["run"]["num_envs"], args.steps))
        a, b = ctrl_rl_run(args.steps, k)
        res["ctrl_rl"].append(a)
        res["ctrl_rl_incl_startup"].append(b)
        res["sb3_same"].append(ppo_steps_per_s(args.sb3_steps, k, PRESET))
        res["sb3_ref"].append(ppo_steps_per_s(args.sb3_steps, k))
        print(f"repeat {k}: " + ", ".join(f"{n}={v[-1]:,.0f}" for n, v in res.items()), flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    out["runs"] = res
    out["median_steps_per_s"] = med
    out["ratios"] = {
        "ctrl_rl / sb3_same": med["ctrl_rl"] / med["sb3_same"],
        "ctrl_rl / sb3_ref": med["ctrl_rl"] / med["sb3_ref"],
        "ctrl_rl / raw_envpool": med["ctrl_rl"] / med["raw"],
    }
    print("\nmedian env-steps/s:")
    for k, v in med.items():
        print(f"  {k:22s} {v:>10,.0f}")
    for k, v in out["ratios"].items():
        print(f"  {k:22s} {v:>10.2f}x")
    write_result("ppo_halfcheetah_sps", out, folder=RESULTS)


if __name__ == "__main__":
    main()
