"""DoMo-AC against IMPALA and PPO at equal env steps (issue: DoMo-AC and the actor-learner architecture, benchmark 2).

Each (algorithm, seed) is one ``ctrl-rl train`` run; the curve is the mean training episode return logged against
env steps, and the table gives the mean of the last ``--tail`` logged returns per run (stochastic policies). IMPALA
and DoMo-AC run on the in-process backend (2 actors, deterministic) with identical settings apart from kappa; PPO
runs with the same total envs, rollout length and network.

    python experiments/actor_learner_learning/learning.py --env torch:CartPole --steps 200000 --seeds 0 1 2
    python experiments/actor_learner_learning/learning.py --env Hopper-v5 --steps 300000 --seeds 0 1 2 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import runs_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="torch:CartPole")
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--num-envs", type=int, default=8, help="envs per actor (PPO: actors x this)")
    ap.add_argument("--unroll", type=int, default=20)
    ap.add_argument("--kappa", type=float, default=0.5)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--broadcast-every", type=int, default=1, help="learner updates between weight broadcasts (lag)")
    ap.add_argument("--tail", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "actor_learner_learning")
    a = ap.parse_args(argv)
    tag = a.env.replace(":", "_").replace(",", "_") + f"_lam{a.lam:g}_b{a.broadcast_every}"
    net = ["--actor-hidden", "64", "64", "--critic-hidden", "64", "64"]
    al = ["--actors", str(a.actors), "--num-envs", str(a.num_envs), "--unroll", str(a.unroll), "--segments-per-update",
          str(a.actors), "--lambda", str(a.lam), "--broadcast-every", str(a.broadcast_every), "--log-every", "5", *net]
    N = a.actors * a.num_envs
    ppo = ["--num-envs", str(N), "--rollout-steps", str(a.unroll), "--epochs", "4", "--minibatch-size",
           str(a.unroll * N // 2), "--ent-coef", "0.01", "--log-every", "5", *net]
    algos = {"impala": ["impala", *al], "domo_ac": ["domo_ac", *al, "--kappa", str(a.kappa)], "ppo": ["ppo", *ppo]}
    jobs = [(name, seed) for seed in a.seeds for name in algos]

    def run(job):
        name, seed = job
        d = a.runs_dir / tag / f"{name}-s{seed}"
        if not (d / "metrics.jsonl").is_file():
            cmd = [sys.executable, "-m", "ctrl_rl", "train", *algos[name], "--env", a.env, "--seed", str(seed),
                   "--total-steps", str(a.steps), "--run-dir", str(d), "--no-progress", "--threads", "1"]
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return job, [(r["step"], r["episode_return"]) for r in rows if r.get("episode_return") is not None]

    with ThreadPoolExecutor(a.jobs) as pool:
        curves = dict(pool.map(run, jobs))
    commit = runs_commit(a.runs_dir / tag / f"{name}-s{seed}" for name, seed in jobs)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    colors = {"impala": "tab:blue", "domo_ac": "tab:red", "ppo": "tab:gray"}
    table = []
    for name in algos:
        finals = []
        for seed in a.seeds:
            pts = curves[(name, seed)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[name], alpha=0.7, lw=1,
                    label=name if seed == a.seeds[0] else None)
            tail = [p[1] for p in pts[-a.tail:]]
            finals.append(sum(tail) / len(tail))
        table.append((name, finals))
    ax.set_xlabel("env steps")
    ax.set_ylabel("training episode return")
    ax.set_title(f"{a.env}: DoMo-AC (kappa {a.kappa}) vs IMPALA vs PPO")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"actor_learner_learning_{tag}.png", dpi=120)
    this = shlex.join(["python", "experiments/actor_learner_learning/learning.py", *argv])
    lines = [f"# DoMo-AC vs IMPALA vs PPO on {a.env}", "", f"`{this}` (commit {commit}): {a.steps:,} env steps, "
             f"seeds {a.seeds}; mean of the last {a.tail} logged training returns per run.", "",
             "| algorithm | mean ± std over seeds | per seed |", "|---|---|---|"]
    for name, finals in table:
        sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
        lines.append(f"| {name} | {statistics.mean(finals):.1f} ± {sd:.1f} | "
                     + ", ".join(f"{x:.1f}" for x in finals) + " |")
        print(lines[-1])
    lines += ["", f"![curves](actor_learner_learning_{tag}.png)", ""]
    write_result(f"actor_learner_learning_{tag}", {"args": {k: str(v) for k, v in vars(a).items()},
                                                  "finals": dict(table), "commit": commit,
                                                  "curves": {f"{k[0]}/{k[1]}": v for k, v in curves.items()}},
                 "\n".join(lines), folder=RESULTS)


if __name__ == "__main__":
    main()
