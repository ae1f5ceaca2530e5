"""State-based PPO and SAC on the manipulation tasks: success rate against env steps (issue: robots, section 4).

Every (algorithm, task, seed) is one ``ctrl-rl train`` run in ``<runs-dir>/<algo>-<task>-s<seed>``, two at a time
(``--jobs``). The curves are the training success rate the loops log (``success_rate``: episodes that succeeded at
some step, stochastic policy) against env steps; after training, ``ctrl-rl eval --episodes 20`` gives the final
deterministic success rate. A run that exists is resumed up to its budget (``--resume``), so the script can be
stopped and called again.

Settings: SAC with the library defaults of the off-policy loop but ``--learning-starts 1000`` and an initial
temperature of 0.1 (as DrQ and most manipulation code: the tasks' rewards are at most 1 per step, and with the
default 1.0 the entropy bonus of a 7-dim action outweighed them; Reach had 0/10 evaluation successes at 15k steps
with 1.0, 9/10 at 10k with 0.1, seed 0), 2 envs, 256x256;
PPO with 16 envs, rollouts of 64 steps, 4 epochs, minibatch 256, lr 3e-4, entropy 0, gamma 0.99 (a small-robot
setting; the massive-parallel defaults of ``ctrl-rl train ppo`` are for 10^3+ torch envs). The budgets are
``--budget ALGO:TASK=STEPS``; the defaults fit a 2-core machine in about an hour and are far below the 10^6-10^7
steps lift usually takes, which the results say next to each number.

    python experiments/manipulation_learning/learning.py [--seeds 0 1 2] [--tasks Reach Lift] [--algos sac ppo] \
        [--jobs 2]
    python experiments/manipulation_learning/learning.py --summarize
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import runs_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

BUDGETS = {"sac:Reach": 15_000, "sac:Lift": 30_000, "ppo:Reach": 150_000, "ppo:Lift": 300_000}
FLAGS = {
    "sac": ["--num-envs", "2", "--learning-starts", "1000", "--init-alpha", "0.1", "--log-every", "250",
            "--eval-every", "2500", "--eval-episodes", "10"],
    "ppo": ["--num-envs", "16", "--rollout-steps", "64", "--epochs", "4", "--minibatch-size", "256", "--lr", "3e-4",
            "--ent-coef", "0", "--gamma", "0.99", "--gae-lambda", "0.95", "--log-every", "2",
            "--actor-hidden", "256", "256", "--critic-hidden", "256", "256", "--init-log-std", "-0.5"],
}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", nargs="+", default=["sac", "ppo"], choices=["sac", "ppo"])
    ap.add_argument("--tasks", nargs="+", default=["Reach", "Lift"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--budget", action="append", default=[], metavar="ALGO:TASK=STEPS")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "manip_learning")
    ap.add_argument("--summarize", action="store_true", help="launch nothing; write the results")
    return ap.parse_args(argv)


def budgets(a) -> dict[str, int]:
    out = dict(BUDGETS)
    for b in a.budget:
        k, v = b.split("=")
        out[k] = int(v)
    return out


def run_dir(a, algo, task, seed) -> Path:
    return a.runs_dir / f"{algo}-{task.lower()}-s{seed}"


def command(a, algo, task, seed, steps) -> list[str]:
    d = run_dir(a, algo, task, seed)
    if (d / "checkpoints" / "latest.pt").is_file():
        return [sys.executable, "-m", "ctrl_rl", "train", algo, "--resume", str(d), "--total-steps", str(steps),
                "--no-progress", "--threads", "1"]
    return [sys.executable, "-m", "ctrl_rl", "train", algo, "--env", f"manip:{task}", "--seed", str(seed),
            "--total-steps", str(steps), "--run-dir", str(d), "--no-progress", "--threads", "1", *FLAGS[algo]]


def done_steps(d: Path) -> int:
    m = d / "metrics.jsonl"
    lines = m.read_text().splitlines() if m.is_file() else []
    return json.loads(lines[-1])["step"] if lines else 0


def final_eval(a, job) -> None:
    ev = subprocess.run([sys.executable, "-m", "ctrl_rl", "eval", str(run_dir(a, *job)), "--episodes", "20"],
                        capture_output=True, text=True, cwd=ROOT)
    if ev.returncode == 0:
        (run_dir(a, *job) / "final_eval.json").write_text(ev.stdout)


def launch(a) -> None:
    b = budgets(a)
    todo = [(algo, task, seed) for task in a.tasks for algo in a.algos for seed in a.seeds]
    for job in list(todo):  # finished runs: only their final evaluation, when it is missing
        if done_steps(run_dir(a, *job)) >= b[f"{job[0]}:{job[1]}"]:
            todo.remove(job)
            if not (run_dir(a, *job) / "final_eval.json").is_file():
                final_eval(a, job)
    a.runs_dir.mkdir(parents=True, exist_ok=True)
    log = open(a.runs_dir / "commands.txt", "a")
    running: list[tuple[subprocess.Popen, tuple]] = []
    while todo or running:
        while todo and len(running) < a.jobs:
            job = todo.pop(0)
            cmd = command(a, *job, b[f"{job[0]}:{job[1]}"])
            log.write(shlex.join(cmd) + "\n")
            log.flush()
            out = open(run_dir(a, *job).with_suffix(".log"), "a")
            running.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT), job))
        time.sleep(5)
        for p, job in list(running):
            if p.poll() is not None:
                running.remove((p, job))
                print(f"{job} exited {p.returncode}", flush=True)
                if p.returncode == 0:
                    final_eval(a, job)


def summarize(a, argv) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = budgets(a)
    rows, curves = [], {}
    dirs = [run_dir(a, algo, task, seed) for task in a.tasks for algo in a.algos for seed in a.seeds]
    commit = runs_commit(d for d in dirs if (d / "metrics.jsonl").is_file())
    for task in a.tasks:
        for algo in a.algos:
            for seed in a.seeds:
                d = run_dir(a, algo, task, seed)
                if not (d / "metrics.jsonl").is_file():
                    continue
                ms = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
                pts = [(m["step"], m["success_rate"]) for m in ms if m.get("success_rate") is not None]
                curves[(algo, task, seed)] = pts
                ev = json.loads((d / "final_eval.json").read_text()) if (d / "final_eval.json").is_file() else {}
                last = [s for _, s in pts[-5:]]
                rows.append({"algo": algo, "task": task, "seed": seed, "steps": ms[-1]["step"],
                             "budget": b[f"{algo}:{task}"],
                             "train_success_last": sum(last) / len(last) if last else None,
                             "eval_success": ev.get("success_rate"), "eval_return": ev.get("return_mean"),
                             "wall_s": ms[-1].get("wall_time")})
    fig, axes = plt.subplots(1, len(a.tasks), figsize=(5 * len(a.tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], a.tasks):
        for algo, color in (("sac", "tab:blue"), ("ppo", "tab:orange")):
            for (al, t, seed), pts in curves.items():
                if al == algo and t == task and pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, alpha=0.75, lw=1,
                            label=algo if seed == min(s for (x, y, s) in curves if x == algo and y == task) else None)
        ax.set_title(f"manip:{task} (state)")
        ax.set_xlabel("env steps")
        ax.set_ylabel("training success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "manip_learning.png", dpi=120)
    this = shlex.join(["python", "experiments/manipulation_learning/learning.py", *argv])
    lines = ["# State-based PPO and SAC on the manipulation tasks", "", f"`{this}` (commit {commit}); runs in "
             f"`{a.runs_dir.relative_to(ROOT) if a.runs_dir.is_relative_to(ROOT) else a.runs_dir}`. "
             "Training success: mean of "
             "the last 5 logged intervals (stochastic policy); eval: `ctrl-rl eval --episodes 20` (deterministic).", "",
             "| task | algo | seed | env steps (budget) | training success | eval success (20 ep.) | eval return |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['task']} | {r['algo']} | {r['seed']} | {r['steps']:,} ({r['budget']:,}) | "
                     f"{fmt(r['train_success_last'])} | {fmt(r['eval_success'])} | {fmt(r['eval_return'])} |")
    lines += ["", "![success rate against env steps](manip_learning.png)", ""]
    write_result("manip_learning", {"rows": rows, "budgets": b, "commit": commit,
                                    "curves": {"/".join(map(str, k)): v for k, v in curves.items()}},
                 "\n".join(lines), folder=RESULTS)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if not a.summarize:
        launch(a)
    summarize(a, argv)


if __name__ == "__main__":
    main()
