"""Benchmark 2: wall-clock time to mean training return 3000 on HalfCheetah-v5, ctrl_rl vs stable-baselines3.

  ctrl_rl  `ctrl-rl train ppo --preset halfcheetah --seed S` (envpool, 128 envs). The return is the
           mean over the episodes that finish in one logging interval (128 stochastic-policy episodes,
           since all envs reach the 1000-step limit together); time is the run's own wall clock
           (metrics.jsonl `wall_time`, from the first step; interpreter start-up is reported apart).
  sb3      SB3 PPO with the rl-zoo HalfCheetah hyperparameters (1 env, VecNormalize obs+reward,
           n_steps 512, batch 64, 20 epochs, lr 2.0633e-5, clip 0.1, gamma 0.98, lambda 0.92,
           ent 4.0e-4, vf 0.58, grad clip 0.8, 256x256 ReLU, log_std_init -2, no ortho init). The
           return is the mean of its last 10 finished training episodes; time from the start of learn().

    python experiments/time_to_3000/time_to_3000.py [--seeds 0 1 2] [--budget-s 300] [--skip-sb3]

Writes experiments/time_to_3000/time_to_3000.json and prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ctrl_rl.envs.gymnasium import filter_mujoco_warnings  # also for the baselines' envs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import run_preset, write_result  # noqa: E402
from peers.sb3_runs import ppo_time_to_return  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

TARGET = 3000.0


def ctrl_rl_time(seed: int, budget_steps: int) -> dict:
    rows, total = run_preset("halfcheetah", seed, budget_steps)
    ep = [r for r in rows if r["episode_return"] is not None]
    hit = next((r for r in ep if r["episode_return"] >= TARGET), None)
    return {"seed": seed, "time_s": hit["wall_time"] if hit else None, "step": hit["step"] if hit else None,
            "final_return": ep[-1]["episode_return"], "process_s": total, "startup_s": total - rows[-1]["wall_time"]}


def summarize(ours: list[dict], theirs: list[dict], sb3_budget_s: float) -> dict:
    """Medians of the time to the target. A run that never reached it counts as its budget, and the
    median is then a lower bound (flagged ``*_censored``); the speedup is a lower bound likewise."""

    def med(rs, budget):
        if not rs:
            return None, False
        ts = [r["time_s"] if r["time_s"] is not None else budget for r in rs]
        m = statistics.median(ts)
        return m, any(r["time_s"] is None for r in rs) and m >= budget

    o, o_cens = med(ours, float("inf"))
    t, t_cens = med(theirs, sb3_budget_s)
    out = {"target_return": TARGET, "ctrl_rl": ours, "sb3": theirs, "ctrl_rl_median_s": o, "ctrl_rl_censored": o_cens,
           "sb3_median_s": t, "sb3_censored": t_cens, "sb3_budget_s": sb3_budget_s}
    if o and t and not o_cens:
        out["speedup"] = t / o
        out["speedup_is_lower_bound"] = t_cens
    return out


def main() -> None:
    filter_mujoco_warnings()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget-steps", type=int, default=2_000_000, help="ctrl_rl env-step budget per seed")
    ap.add_argument("--budget-s", type=float, default=300.0, help="SB3 wall-clock budget per seed")
    ap.add_argument("--skip-sb3", action="store_true")
    args = ap.parse_args()
    ours = []
    for s in args.seeds:
        ours.append(ctrl_rl_time(s, args.budget_steps))
        print("ctrl_rl", ours[-1], flush=True)
    theirs = []
    if not args.skip_sb3:
        for s in args.seeds:
            theirs.append(ppo_time_to_return(s, args.budget_s, TARGET))
            print("sb3", theirs[-1], flush=True)

    out = summarize(ours, theirs, args.budget_s)
    print(json.dumps({k: v for k, v in out.items() if k not in ("ctrl_rl", "sb3")}))
    write_result("time_to_3000", out, folder=RESULTS)


if __name__ == "__main__":
    main()
