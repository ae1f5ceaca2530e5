"""Same-run A/B of two commits: PPO HalfCheetah env-steps/s, SAC updates/s and IQL gradient steps/s.

Issue 27 (the structural refactor: packages moved, typed contracts, update() always returns tensors, regimes as
registered objects, env specs without building envs) asks that no benchmark be slower. This script checks out
``--before`` (default e9e2df4, the commit before the refactor) and ``--after`` (default HEAD) as detached git
worktrees under ``/tmp/ctrl_rl_ab/<short-sha>`` (reused when present) and runs the same workloads against both, each
as a ``python -m ctrl_rl train ...`` subprocess with ``PYTHONPATH=<tree>`` and ``cwd=<tree>`` (so the tree's package
shadows the editable install of the main checkout, and presets resolve from the tree's ``experiments/presets``).
Before any run the script asserts that ``import ctrl_rl`` resolves into each tree, and after every run that the
run's ``config.json`` recorded that tree's commit.

Workloads (every figure from the run's own metrics.jsonl, so interpreter start-up and env/dataset set-up are out):

  ppo            ``train ppo --preset halfcheetah`` (envpool, 128 envs): env steps / wall_time of the last row
                 (as experiments/ppo_halfcheetah_sps does); ``ppo_incl_startup`` divides by the process time
  sac_threads0   ``train sac --preset sac-halfcheetah`` (1 env, batch 256, UTD 1), ``--learning-starts W`` random
  sac_threads1   steps, then U updates; updates/s between the first row after learning started and the last
                 (as experiments/sac_updates does); ``--threads 0`` (the default) and ``--threads 1``
  iql            ``train iql --env Hopper-v5 --dataset <synthetic D4RL-layout file>``: gradient steps/s between
                 the first metrics row and the last (the evaluation at the end comes after the last row's clock)

Each workload also reports ``<name>_interval_median``: the median over the run's log intervals (after the first
one) of the rate the row itself logs (``sps`` / ``updates_per_s``). Another process taking a core for a few seconds
drags the whole-run figure down but leaves this one near the undisturbed rate. And ``<name>_per_cpu_s``: the run's
env steps (PPO), updates (SAC) or gradient steps (IQL) per CPU-second of its whole process (user + system time of
all its threads, start-up, warm-up and the final evaluation included): the work the code costs, which waiting for
a core shared with other processes barely changes.

A and B alternate workload by workload (A B for even repeats, B A for odd ones), so drifts of the machine's speed
hit both alike; seed = repeat index for both. The report gives per-repeat figures, medians and the after/before
ratio of the medians (and the ratio within each repeat).

    python experiments/structure_ab/structure_ab.py [--before e9e2df4] [--after HEAD] [--repeats 3]

Writes experiments/structure_ab/structure_ab.{json,md} (``--name`` changes the stem). ~12 min on 2 quiet cores,
18-19 min with other jobs on them (load 2-8).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import AB_TREES, ab_report_head, train, worktree, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

HOPPER_OBS, HOPPER_ACT, EPISODE_LEN = 11, 3, 1000


# ----- data -----

def synthetic_hopper(path: Path, rows: int, seed: int = 0) -> Path:
    """A D4RL-layout HDF5 file of random Hopper-sized rows (obs 11, actions 3 in [-1, 1]), a time-out every 1000
    rows and no terminals; written once."""
    if path.exists():
        return path
    import h5py
    import numpy as np

    rng = np.random.default_rng(seed)
    timeouts = np.zeros(rows, dtype=bool)
    timeouts[EPISODE_LEN - 1::EPISODE_LEN] = True
    timeouts[-1] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        f["observations"] = rng.standard_normal((rows, HOPPER_OBS), dtype=np.float32)
        f["actions"] = rng.uniform(-1, 1, (rows, HOPPER_ACT)).astype(np.float32)
        f["rewards"] = rng.standard_normal(rows, dtype=np.float32)
        f["terminals"] = np.zeros(rows, dtype=bool)
        f["timeouts"] = timeouts
    tmp.rename(path)
    return path


def ppo(tree: dict, a: argparse.Namespace, seed: int, run_dir: Path) -> dict[str, float]:
    rows, seconds, cpu = train(tree, "ppo", ["--preset", "halfcheetah", "--seed", str(seed),
                                        "--total-steps", str(a.ppo_steps)], run_dir)
    last = rows[-1]
    return {"ppo": last["step"] / last["wall_time"], "ppo_incl_startup": last["step"] / seconds,
            "ppo_interval_median": statistics.median(r["sps"] for r in rows[1:]), "ppo_per_cpu_s": last["step"] / cpu}


def sac(tree: dict, a: argparse.Namespace, seed: int, run_dir: Path, threads: int) -> dict[str, float]:
    rows, _, cpu = train(tree, "sac", ["--preset", "sac-halfcheetah", "--seed", str(seed),
                                  "--total-steps", str(a.sac_warmup + a.sac_updates),
                                  "--learning-starts", str(a.sac_warmup), "--threads", str(threads),
                                  "--log-every", str(max(a.sac_updates // 10, 1))], run_dir)
    k = next(i for i, r in enumerate(rows) if r["updates"] > 0)  # the first log row after learning started
    first, last = rows[k], rows[-1]
    return {f"sac_threads{threads}": (last["updates"] - first["updates"]) / (last["wall_time"] - first["wall_time"]),
            f"sac_threads{threads}_interval_median": statistics.median(r["updates_per_s"] for r in rows[k + 1:]),
            f"sac_threads{threads}_per_cpu_s": last["updates"] / cpu}


def iql(tree: dict, a: argparse.Namespace, seed: int, run_dir: Path, dataset: Path) -> dict[str, float]:
    rows, _, cpu = train(tree, "iql", ["--env", "Hopper-v5", "--dataset", str(dataset), "--seed", str(seed),
                                  "--total-steps", str(a.iql_steps), "--eval-every", "0", "--eval-episodes", "1",
                                  "--log-every", str(max(a.iql_steps // 10, 1))], run_dir)
    first, last = rows[0], rows[-1]
    return {"iql": (last["step"] - first["step"]) / (last["wall_time"] - first["wall_time"]),
            "iql_interval_median": statistics.median(r["updates_per_s"] for r in rows[1:]),
            "iql_per_cpu_s": last["step"] / cpu}


# ----- report -----

def markdown(payload: dict) -> str:
    lines = [*ab_report_head(payload, "Same-run A/B"),
             "| workload | unit | before (median) | after (median) | after / before | per repeat before "
             "| per repeat after | per-repeat ratios |",
             "|---|---|---|---|---|---|---|---|"]
    for w, m in payload["median"].items():
        runs = payload["runs"][w]
        before, after = (", ".join(f"{x:,.1f}" for x in runs[side]) for side in ("before", "after"))
        lines.append(f"| {w} | {payload['units'][w]} | {m['before']:,.1f} | {m['after']:,.1f} | "
                     f"**{payload['ratio_after_over_before'][w]:.3f}** | {before} | {after} | "
                     f"{', '.join(f'{x:.3f}' for x in payload['ratio_per_repeat'][w])} |")
    lines += ["", f"`{payload['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default="e9e2df4", help="the commit before the refactor")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["ppo", "sac", "iql"], choices=["ppo", "sac", "iql"])
    ap.add_argument("--ppo-steps", type=int, default=300_000, help="env steps per PPO run")
    ap.add_argument("--sac-warmup", type=int, default=1000, help="random env steps before SAC's updates (untimed)")
    ap.add_argument("--sac-updates", type=int, default=3000, help="timed SAC updates (UTD 1)")
    ap.add_argument("--sac-threads", type=int, nargs="+", default=[0, 1], help="--threads values for SAC")
    ap.add_argument("--iql-steps", type=int, default=5000, help="IQL gradient steps per run")
    ap.add_argument("--iql-rows", type=int, default=50_000, help="rows of the synthetic Hopper dataset")
    ap.add_argument("--name", default="structure_ab", help="stem of the result files")
    args = ap.parse_args()
    t_script = time.perf_counter()

    trees = {"before": worktree(args.before), "after": worktree(args.after)}
    for k, t in trees.items():
        print(f"{k}: {t['short']} {t['subject'][:70]} -> {t['ctrl_rl_file']}", flush=True)
    dataset = synthetic_hopper(AB_TREES / "data" / f"hopper-synthetic-{args.iql_rows}.hdf5", args.iql_rows)
    runs_dir = AB_TREES / "runs"

    jobs = []  # (workload group, function of (tree, seed, run_dir) -> figures)
    if "ppo" in args.workloads:
        jobs.append(("ppo", lambda t, s, d: ppo(t, args, s, d)))
    if "sac" in args.workloads:
        for th in args.sac_threads:
            jobs.append((f"sac_threads{th}", lambda t, s, d, th=th: sac(t, args, s, d, th)))
    if "iql" in args.workloads:
        jobs.append(("iql", lambda t, s, d: iql(t, args, s, d, dataset)))

    runs: dict[str, dict[str, list[float]]] = {}
    seconds: dict[str, dict[str, list[float]]] = {}
    load: list[float] = []
    order_log: list[str] = []
    for rep in range(args.repeats):
        order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
        for job, fn in jobs:
            for side in order:
                load.append(round(os.getloadavg()[0], 2))
                t0 = time.perf_counter()
                figures = fn(trees[side], rep, runs_dir / f"{job}-{side}-{rep}")
                seconds.setdefault(job, {"before": [], "after": []})[side].append(round(time.perf_counter() - t0, 1))
                for w, v in figures.items():
                    runs.setdefault(w, {"before": [], "after": []})[side].append(v)
                order_log.append(f"{rep}:{job}:{side}")
                print(f"repeat {rep} {job:14s} {side:6s} " + ", ".join(f"{w}={v:,.1f}" for w, v in figures.items())
                      + f"  ({seconds[job][side][-1]:.0f} s, load {load[-1]})", flush=True)

    def row_kind(w: str) -> int:  # headline rows first, then the interval medians, then the rates per CPU-second
        return 2 if w.endswith("_per_cpu_s") else 1 if w.endswith("_interval_median") else 0

    runs = {w: runs[w] for w in sorted(runs, key=row_kind)}
    med = {w: {side: statistics.median(v[side]) for side in ("before", "after")} for w, v in runs.items()}
    ratio = {w: m["after"] / m["before"] for w, m in med.items()}
    per_rep = {w: [x / y for x, y in zip(v["after"], v["before"], strict=True)] for w, v in runs.items()}
    units = {w: ("env-steps" if w.startswith("ppo") else "updates" if w.startswith("sac") else "grad steps")
             + ("/CPU-s" if w.endswith("_per_cpu_s") else "/s") for w in runs}
    wall = time.perf_counter() - t_script
    payload = {
        "what": "same-run A/B of the code before and after the issue-27 refactor (experiments/structure_ab)",
        "before": trees["before"], "after": trees["after"],
        "command": "python experiments/structure_ab/structure_ab.py " + " ".join(sys.argv[1:]),
        "setting": {"repeats": args.repeats, "ppo": {"preset": "halfcheetah", "env_steps": args.ppo_steps},
                    "sac": {"preset": "sac-halfcheetah", "warmup_steps": args.sac_warmup,
                            "timed_updates": args.sac_updates, "threads": args.sac_threads},
                    "iql": {"env": "Hopper-v5", "dataset": str(dataset), "rows": args.iql_rows,
                            "gradient_steps": args.iql_steps, "batch": 256},
                    "order": "A and B alternate per workload; before first on even repeats, after first on odd ones",
                    "seeds": "repeat index, the same for both sides"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "torch": metadata.version("torch"), "envpool": metadata.version("envpool")},
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "wall_s": round(wall, 1), "load_avg_1min": load, "order": order_log,
        "units": units, "runs": runs, "process_seconds": seconds, "median": med,
        "ratio_after_over_before": ratio, "ratio_per_repeat": per_rep,
    }
    md = markdown(payload)
    print(md)
    write_result(args.name, payload, md, folder=RESULTS)


if __name__ == "__main__":
    main()
