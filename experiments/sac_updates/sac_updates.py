"""Benchmark: SAC updates/s on HalfCheetah-v5 with env stepping included, ctrl_rl vs stable-baselines3.

Both run the same setting: one env, 256x256 ReLU actor and two critics, batch 256, one update per env
step (UTD 1), replay 1M. Each run takes ``--warmup`` random steps (not timed) and then ``--updates``
steps with one update each; updates/s is measured over those steps from the run's own clock
(ctrl_rl: its metrics.jsonl; SB3: a callback), so start-up and warm-up are excluded for both.

  ctrl_rl      `ctrl-rl train sac --preset sac-halfcheetah` (envpool env), torch threads as given
  sb3          stable_baselines3.SAC on gymnasium HalfCheetah-v5 with the same settings

    python experiments/sac_updates/sac_updates.py [--updates 3000] [--repeats 3] [--threads 1 2]

Writes experiments/sac_updates/sac_updates.json and prints medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from ctrl_rl.envs.gymnasium import filter_mujoco_warnings  # also for the baselines' envs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import run_preset, write_result  # noqa: E402
from peers.sb3_runs import sac_updates_per_s  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script


def ctrl_rl_run(warmup: int, updates: int, seed: int, threads: int, extra: tuple[str, ...]) -> float:
    log_every = max(updates // 10, 1)
    rows, _ = run_preset("sac-halfcheetah", seed, warmup + updates, algo="sac",
                         extra=("--learning-starts", str(warmup), "--threads", str(threads),
                                "--log-every", str(log_every),
                                "--checkpoint-every", str(10**9), *extra))
    first = next(r for r in rows if r["updates"] > 0)  # the first log row after learning started
    last = rows[-1]
    return (last["updates"] - first["updates"]) / (last["wall_time"] - first["wall_time"])


def main() -> None:
    filter_mujoco_warnings()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--compile", action="store_true", help="also measure ctrl_rl with --compile (torch.compile)")
    args = ap.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    variants: dict[str, list[float]] = {}
    for rep in range(args.repeats):  # interleaved, so drifts of the machine's speed hit every variant alike
        for th in args.threads:
            variants.setdefault(f"ctrl_rl_threads{th}", []).append(ctrl_rl_run(args.warmup, args.updates, rep, th, ()))
            if args.compile:
                variants.setdefault(f"ctrl_rl_compile_threads{th}", []).append(
                    ctrl_rl_run(args.warmup, args.updates, rep, th, ("--compile",)))
            variants.setdefault(f"sb3_threads{th}", []).append(sac_updates_per_s(args.warmup, args.updates, rep, th))
        print({k: round(v[-1], 1) for k, v in variants.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in variants.items()}
    best_sb3 = max(v for k, v in med.items() if k.startswith("sb3"))
    best_ours = max(v for k, v in med.items() if k.startswith("ctrl_rl"))
    payload = {"setting": {"env": "HalfCheetah-v5", "num_envs": 1, "hidden": [256, 256], "batch": 256, "utd": 1,
                           "warmup_steps": args.warmup, "timed_updates": args.updates, "repeats": args.repeats},
               "runs": variants, "median_updates_per_s": med,
               "ratio_best_ctrl_rl_vs_best_sb3": best_ours / best_sb3}
    for k, v in med.items():
        print(f"{k:28s} {v:8.1f} updates/s")
    print(f"best ctrl_rl / best SB3: {best_ours / best_sb3:.2f}x  (target >= 3x and >= 165 updates/s)")
    write_result("sac_updates", payload, folder=RESULTS)


if __name__ == "__main__":
    main()
