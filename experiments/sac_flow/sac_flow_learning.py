"""Benchmark: learning curves of SAC, SAC Flow-G, Flow-T and the naive flow on HalfCheetah-v5 and Hopper-v5.

Every run has the same budget and backbone (presets sac-<task> and sac_flow-<task>: one envpool env,
256x256 critics, batch 256, UTD 1, 5k random steps; the flows use K = 4 and width 256, Flow-T the paper's
d_model 96 with 2 layers). Returns are those of the training episodes (stochastic policy).

Runs are resumable: each lives in runs/bench_sac_flow/<task>-<variant>-s<seed>/ and writes a checkpoint
(with its replay buffer) every 25k steps, so calling the script again continues unfinished runs and
skips finished ones (an interrupted envpool run is re-seeded on resume, so it is not bit-identical
to an uninterrupted one). ``--jobs 2`` runs two at a time with one torch thread each (2 cores).

    python experiments/sac_flow/sac_flow_learning.py [--steps 200000] [--tasks halfcheetah hopper] [--jobs 2]
    python experiments/sac_flow/sac_flow_learning.py --summarize      # table + plot from whatever has run

Writes experiments/sac_flow/sac_flow_learning.{json,md,png}: final return (mean of the episodes in the last
10% of the budget) and area under the curve (mean return over the whole budget, trapezoid over steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

# name -> (algo, preset prefix, extra flags). The flows run with torch.compile: it changes no setting, and on
# this CPU it made Flow-T's update 1.35x faster after a ~90 s compile (SAC's plain MLPs gained nothing).
VARIANTS = {
    "sac": ("sac", "sac", ()),
    "flow-g": ("sac_flow", "sac_flow", ("--velocity", "gated", "--compile")),
    "flow-t": ("sac_flow", "sac_flow", ("--velocity", "decoded", "--compile")),
    "naive-flow": ("sac_flow", "sac_flow", ("--velocity", "naive", "--compile")),
}
RUNS = ROOT / "runs" / "bench_sac_flow"


def run_dir(task: str, variant: str, seed: int) -> Path:
    return RUNS / f"{task}-{variant}-s{seed}"


def done_steps(d: Path) -> int:
    rows = _rows(d)
    return rows[-1]["step"] if rows else 0


def _rows(d: Path) -> list[dict]:
    p = d / "metrics.jsonl"
    if not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def train(task: str, variant: str, seed: int, steps: int) -> str:
    algo, prefix, extra = VARIANTS[variant]
    d = run_dir(task, variant, seed)
    py = [sys.executable, "-m", "ctrl_rl", "train", algo]
    common = ["--total-steps", str(steps), "--threads", "1", "--no-progress"]
    if (d / "checkpoints" / "latest.pt").is_file():
        if done_steps(d) >= steps:
            return f"{d.name}: done"
        cmd = [*py, "--resume", str(d), *common]
    else:
        cmd = [*py, "--preset", str(ROOT / f"experiments/presets/{prefix}-{task}.json"), "--seed", str(seed),
               "--run-dir", str(d), "--save-replay", *extra, *common]
        if d.exists():  # a run killed before its first checkpoint: start over
            import shutil

            shutil.rmtree(d)
    t0 = time.time()
    with open(RUNS / f"{d.name}.log", "a") as log:
        r = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MPLBACKEND": "Agg"})
    return f"{d.name}: exit {r.returncode} after {time.time() - t0:.0f} s, at step {done_steps(d)}"


def curve(d: Path) -> tuple[list[int], list[float]]:
    rows = [r for r in _rows(d) if r.get("episode_return") is not None]
    return [r["step"] for r in rows], [r["episode_return"] for r in rows]


def summarize(tasks: list[str], seed: int, steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table: dict[str, dict[str, dict]] = {}
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for variant in VARIANTS:
            d = run_dir(task, variant, seed)
            xs, ys = curve(d)
            if not xs:
                continue
            last = [y for x, y in zip(xs, ys) if x > 0.9 * max(xs)]
            area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))
            table.setdefault(task, {})[variant] = {
                "steps": max(xs), "final_return": sum(last) / len(last),
                "auc_mean_return": area / (xs[-1] - xs[0]) if len(xs) > 1 else ys[0],
                "wall_time_s": _rows(d)[-1]["wall_time"], "run_dir": d.name}
            ax.plot(xs, ys, label=variant, lw=1.2)
        ax.set_title(f"{task} (seed {seed}, training episodes)")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "sac_flow_learning.png", dpi=110)
    lines = ["| task | variant | steps | final return (last 10%) | AUC (mean return) | wall time |",
             "|---|---|---|---|---|---|"]
    for task, rows in table.items():
        for variant, r in rows.items():
            lines.append(f"| {task} | {variant} | {r['steps']:,} | {r['final_return']:.0f} | "
                         f"{r['auc_mean_return']:.0f} | "
                         f"{r['wall_time_s'] / 60:.0f} min |")
    md = "\n".join(lines) + "\n"
    print(md)
    write_result("sac_flow_learning", {"seed": seed, "budget_steps": steps, "results": table}, md, folder=RESULTS)


def main() -> None:
    global RUNS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", nargs="+", default=["halfcheetah", "hopper"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--summarize", action="store_true", help="only write the table and plot")
    ap.add_argument("--runs-dir", type=Path, default=RUNS, help="where the runs live (default runs/bench_sac_flow)")
    args = ap.parse_args()
    RUNS = args.runs_dir.resolve()
    if not args.summarize:
        RUNS.mkdir(parents=True, exist_ok=True)
        jobs = [(t, v) for v in args.variants for t in args.tasks]
        with ThreadPoolExecutor(args.jobs) as pool:
            for msg in pool.map(lambda tv: train(tv[0], tv[1], args.seed, args.steps), jobs):
                print(msg, flush=True)
    summarize(args.tasks, args.seed, args.steps)


if __name__ == "__main__":
    main()
