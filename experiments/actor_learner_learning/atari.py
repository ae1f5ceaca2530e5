"""DoMo-AC against IMPALA and PPO on Atari at equal frames (issue: DoMo-AC and the actor-learner architecture).

The Atari counterpart of ``learning.py``: each (algorithm, seed) is one ``ctrl-rl train`` run on an envpool Atari task,
whose observation is the uint8 stack ``image/frames`` [4,84,84] read by the CNN of ``core/encoders`` (envpool's
defaults: frame skip 4, no sticky actions, 30 no-ops, fire reset, whole games as episodes, reward *not* clipped; see
``ctrl_rl/envs/envpool.py``). All three share the envs (actors x envs per actor), the unroll / rollout length and the
network (CNN + 64x64 heads). IMPALA and DoMo-AC run in-process with identical settings apart from kappa; the weights
reach the actors every ``--broadcast-every`` updates. Each lambda of ``--lams`` gives an IMPALA and a DoMo-AC run (PPO
does not use it): with on-policy data and lambda = 1, DoMo-AC's advantage equals IMPALA's for every kappa
(algos/domo_ac.py); a lag of a few updates kept the batch-mean importance ratio within 0.2% of 1 on Breakout, and at
lambda = 1 the two runs logged identical returns. lambda < 1 is where kappa acts.

The curve is the mean training return of the games that ended in each logging window, against emulator frames
(agent steps x frame skip); the table gives the mean of the last ``--tail`` logged returns per run (stochastic
policies; the greedy policy of a barely trained Breakout agent often never serves and plays out the 27,000-step
limit, so no separate evaluation is run).

    nice -n 19 python experiments/actor_learner_learning/atari.py --steps 192000 --seeds 0   # the results file
    nice -n 19 python experiments/actor_learner_learning/atari.py --steps 192000 --seeds 0 --lams 1 0.9  # + lambda 0.9
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import runs_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

PAPER_FRAMES = 200_000_000  # IMPALA (Espeholt et al. 2018): 200M frames per Atari game
COLORS = {"impala": "tab:blue", "domo_ac": "tab:red", "ppo": "tab:gray"}
# Random play's score (Mnih et al. 2015, Extended Data Table 2; the IMPALA paper normalises with the same numbers).
RANDOM_SCORE = {"Breakout-v5": 1.7, "Pong-v5": -20.7}


def frame_skip(env_id: str) -> int:
    """Emulator frames per agent step of an ``envpool:<Atari task>[,options]`` id (envpool's default: 4)."""
    import envpool

    from ctrl_rl.envs.registry import split_env_options

    base, options = split_env_options(env_id)
    return int(options.get("frame_skip", envpool.make_spec(base.partition(":")[2]).config.frame_skip))


def commands(a: argparse.Namespace) -> dict[str, list[str]]:
    """The ``ctrl-rl train`` arguments of each run, keyed by its label (``impala-lam1``, ``domo_ac-lam0.9``, ``ppo``),
    without env, seed, budget and run directory."""
    net = ["--cnn-layers", str(a.cnn_layers), "--actor-hidden", "64", "64", "--critic-hidden", "64", "64"]
    out = {}
    for lam in a.lams:
        al = ["--actors", str(a.actors), "--num-envs", str(a.num_envs), "--unroll", str(a.unroll),
              "--segments-per-update", str(a.actors), "--lambda", str(lam), "--broadcast-every", str(a.broadcast_every),
              "--log-every", "5", *net]
        out[f"impala-lam{lam:g}"] = ["impala", *al]
        out[f"domo_ac-lam{lam:g}"] = ["domo_ac", *al, "--kappa", str(a.kappa)]
    n = a.actors * a.num_envs
    out["ppo"] = ["ppo", "--num-envs", str(n), "--rollout-steps", str(a.unroll), "--epochs", "4", "--minibatch-size",
                  str(a.unroll * n // 2), "--ent-coef", "0.01", "--log-every", "5", *net]
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="envpool:Breakout-v5")
    ap.add_argument("--steps", type=int, default=192_000, help="agent steps per run (x frame skip = frames)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--num-envs", type=int, default=8, help="envs per actor (PPO: actors x this)")
    ap.add_argument("--unroll", type=int, default=20, help="IMPALA's unroll length; PPO's rollout length")
    ap.add_argument("--kappa", type=float, default=0.5)
    ap.add_argument("--lams", nargs="+", type=float, default=[1.0], help="V-trace lambdas (an IMPALA and a DoMo-AC "
                    "run each; the paper's 1 by default, add e.g. 0.9 to see kappa act)")
    ap.add_argument("--broadcast-every", type=int, default=4, help="learner updates between weight broadcasts (lag)")
    ap.add_argument("--cnn-layers", type=int, default=2, help="conv layers of the DrQ encoder (2: half the CPU of 4)")
    ap.add_argument("--tail", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--name", default="actor_learner_atari", help="result files <name>.* beside this script")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "actor_learner_atari")
    a = ap.parse_args(argv)
    skip = frame_skip(a.env)
    algos = commands(a)
    jobs = [(name, seed) for seed in a.seeds for name in algos]

    def run(job):
        name, seed = job
        tag = "" if name == "ppo" else f"-b{a.broadcast_every}"  # PPO's run does not depend on lambda or the lag
        d = a.runs_dir / a.env.replace(":", "_").replace(",", "_") / f"{name}{tag}-s{seed}"
        if not (d / "metrics.jsonl").is_file():
            cmd = [sys.executable, "-m", "ctrl_rl", "train", *algos[name], "--env", a.env, "--seed", str(seed),
                   "--total-steps", str(a.steps), "--run-dir", str(d), "--no-progress", "--threads", "1"]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            print(f"{name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        curve = [(r["step"] * skip, r["episode_return"]) for r in rows if r.get("episode_return") is not None]
        wall = rows[-1]["wall_time"]
        rho = [r["stats/rho_mean"] for r in rows if "stats/rho_mean" in r]
        return job, {"curve": curve, "wall_time": wall, "sps": rows[-1]["step"] / wall, "dir": str(d),
                     "rho_mean_max_dev": max((abs(x - 1) for x in rho), default=None)}

    with ThreadPoolExecutor(a.jobs) as pool:
        runs = dict(pool.map(run, jobs))
    commit = runs_commit(r["dir"] for r in runs.values())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    table = []
    for name in algos:
        finals = []
        for seed in a.seeds:
            pts = runs[(name, seed)]["curve"]
            algo, _, lam = name.partition("-lam")
            style = "-" if not lam or float(lam) == a.lams[0] else "--"
            ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], color=COLORS[algo], ls=style, alpha=0.8, lw=1,
                    label=name if seed == a.seeds[0] else None)
            tail = [p[1] for p in pts[-a.tail:]]
            finals.append(sum(tail) / len(tail) if tail else float("nan"))
        table.append((name, finals))
    frames = a.steps * skip
    task = a.env.split(",")[0].partition(":")[2]
    if task in RANDOM_SCORE:
        ax.axhline(RANDOM_SCORE[task], color="k", ls=":", lw=1, label="random play")
    ax.set_xlabel("emulator frames (millions)")
    ax.set_ylabel("training episode return (game score)")
    ax.set_title(f"{a.env}: DoMo-AC (kappa {a.kappa}) vs IMPALA vs PPO", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"{a.name}.png", dpi=120)

    this = shlex.join(["python", "experiments/actor_learner_learning/atari.py", *argv])
    n = a.actors * a.num_envs
    lines = [f"# DoMo-AC vs IMPALA vs PPO on {a.env}", "",
             f"`{this}` (commit {commit}): {a.steps:,} agent steps = {frames:,} frames per run (frame skip "
             f"{skip}), {frames / PAPER_FRAMES:.2%} of the IMPALA paper's {PAPER_FRAMES // 10**6}M; seeds {a.seeds}. "
             f"Value: mean of the last {a.tail} logged training returns (game score, unclipped; each the mean of the "
             "games that ended in a 5-update window).", "",
             f"Shared: {n} envs, unroll / rollout {a.unroll}, DrQ CNN with {a.cnn_layers} conv layers + 64x64 tanh "
             f"heads. IMPALA and DoMo-AC (kappa {a.kappa}): in-process, {a.actors} actors x {a.num_envs} envs, "
             f"{a.actors} segments per update, lambda as labelled, weights broadcast every {a.broadcast_every} "
             "updates, "
             "RMSProp 6e-4. PPO: 4 epochs x 2 minibatches, Adam 3e-4, entropy 0.01. envpool defaults (no reward clip, "
             "no episodic life, 30 no-ops, fire reset, no sticky actions). One thread per run, runs one after another.",
             "", "| algorithm | final return, mean ± std over seeds | per seed | wall time per run | env steps/s |",
             "|---|---|---|---|---|"]
    for name, finals in table:
        sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
        walls = [runs[(name, s)]["wall_time"] for s in a.seeds]
        sps = [runs[(name, s)]["sps"] for s in a.seeds]
        lines.append(f"| {name} | {statistics.mean(finals):.1f} ± {sd:.1f} | " + ", ".join(f"{x:.1f}" for x in finals)
                     + f" | {statistics.mean(walls) / 60:.1f} min | {statistics.mean(sps):.0f} |")
        print(lines[-1])
    lines.append("")
    if task in RANDOM_SCORE:
        lines.append(f"Random play scores {RANDOM_SCORE[task]:g} on {task} (Mnih et al. 2015).  ")
    for lam in a.lams:
        pair = [(f"impala-lam{lam:g}", s) for s in a.seeds], [(f"domo_ac-lam{lam:g}", s) for s in a.seeds]
        same = all(runs[i]["curve"] == runs[d]["curve"] for i, d in zip(*pair))
        dev = max(runs[k]["rho_mean_max_dev"] for k in pair[0] + pair[1])
        lines.append(f"lambda {lam:g}: IMPALA's and DoMo-AC's logged returns are "
                     f"{'identical' if same else 'different'}; the batch-mean importance ratio stayed within {dev:.2%} "
                     "of 1.  ")
    lines.append("Wall times and steps/s come from a shared 2-core machine whose load changed during the runs; "
                 "IMPALA and DoMo-AC cost the same per step.")
    lines += ["", f"![curves]({a.name}.png)", "", f"Solid lines: lambda {a.lams[0]:g} (and PPO); dashed: the other "
              "lambdas. Identical runs draw one line over the other.", ""]
    write_result(a.name, {"args": {k: str(v) for k, v in vars(a).items()}, "frame_skip": skip,
                          "frames_per_run": frames, "finals": dict(table), "commit": commit,
                          "runs": {f"{k[0]}/{k[1]}": v for k, v in runs.items()}},
                 "\n".join(lines), folder=RESULTS)


if __name__ == "__main__":
    main()
