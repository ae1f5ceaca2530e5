"""RAVL's edge-of-reach experiment with the true simulator (ALGORITHMS.md §4.1, §4.3).

Sims et al. (NeurIPS 2024) claim that offline model-based RL fails even with the TRUE dynamics: with short rollouts
(k = 5) from dataset states and no penalty, plain model-based SAC's Q-values grow without bound, because the last
states of truncated rollouts ("edge of reach") are bootstrapped from but never trained on; RAVL's EDAC critic
ensemble keeps them bounded. This script runs both with ``--model true`` (``world_models/true_dynamics.py``: the
real MuJoCo simulator, set from the dataset's ``infos/qpos`` and ``infos/qvel``, takes the model's place), the same
rollout settings and seed, side by side (one process and one torch thread each):

    ctrl-rl train mbpo --model true ...   (SAC, 2 critics, clipped double Q, no penalty)
    ctrl-rl train ravl --model true ...   (EDAC: 10 critics, min over all, eta 1)

with k = 5, penalty 0, real ratio 0.05, ``--rollout-starts`` dataset states every ``--rollout-every`` gradient
steps (buffer of 5 rounds). The true simulator steps about 1000 envs in 0.3 s, so the default 2,000 starts per
round is 25x fewer than the paper's 50,000, and ``--steps`` (default 25,000 gradient steps) is about 1% of its
3M. Runs live in ``<runs-dir>/<algo>-s<seed>``; calling the script again resumes them (``--resume``) up to
``--steps``; the results are rewritten every ``--summary-every`` seconds while they run, so a stopped run still
leaves a result.

    python experiments/edge_of_reach/edge_of_reach.py [--steps 25000] [--starts 2000] [--seed 0]
    python experiments/edge_of_reach/edge_of_reach.py --summarize-only      # results from whatever has run
    python experiments/edge_of_reach/edge_of_reach.py --dry-run             # the commands

Writes experiments/edge_of_reach/edge_of_reach.{json,md,png}: ``stats/q_mean`` and ``stats/q_max`` (the critics' mean
and largest Q over each logged batch, real and imagined rows together) and the evaluation return over gradient
steps, against two scales of the true value: the behaviour policy's mean discounted return-to-go over dataset
states, and r_max / (1 - gamma), above which no Q of this task's rewards can truly be.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, runs_commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

PAPER_STEPS, PAPER_STARTS = 3_000_000, 50_000  # ALGORITHMS.md §4.2: 3000 epochs x 1000 steps, 50k starts per epoch
ALGOS = ("mbpo", "ravl")
LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=25_000, help="gradient steps of each run")
    ap.add_argument("--budget", action="append", default=[], metavar="ALGO=STEPS",
                    help="another budget for one run (e.g. ravl=18000: RAVL's 10 critics are ~7x slower than MBPO)")
    ap.add_argument("--starts", type=int, default=2_000, help="dataset states per rollout round (paper 50,000)")
    ap.add_argument("--rollout-every", type=int, default=1_000, help="gradient steps between rollout rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--dataset", default="hopper-medium-v5", help="a generated dataset id (needs infos/qpos, qvel)")
    ap.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    ap.add_argument("--log-every", type=int, default=500)
    ap.add_argument("--eval-every", type=int, default=5_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=1_000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    ap.add_argument("--extra-args", default="", help='extra flags for both runs, e.g. "--batch-size 256"')
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "edge_of_reach")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--summary-every", type=float, default=120.0, help="rewrite the results every this many s")
    ap.add_argument("--summarize-only", action="store_true", help="launch nothing; write the results")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return ap.parse_args(argv)


# ----------------------------------------------------------------------------------------------- running
def steps_of(a: argparse.Namespace, algo: str) -> int:
    """``algo``'s gradient-step budget: its --budget, else --steps."""
    for x in a.budget:
        name, _, n = x.partition("=")
        if name == algo:
            return int(n)
    return a.steps


def run_dir(a: argparse.Namespace, algo: str) -> Path:
    return a.runs_dir.resolve() / f"{algo}-s{a.seed}"


def checkpoint_step(d: Path) -> int | None:
    """The step counter of ``d``'s latest checkpoint (None: no checkpoint)."""
    p = d / "checkpoints" / "latest.pt"
    if not p.is_file():
        return None
    from ctrl_rl.learn.checkpoint import load_checkpoint

    return int(load_checkpoint(p)["counters"]["step"])


def fresh_command(a: argparse.Namespace, algo: str) -> list[str]:
    """The command a run starts with (recorded in the results even when the run was resumed)."""
    return [sys.executable, "-m", "ctrl_rl", "train", algo, "--env", a.env, "--dataset", a.dataset, "--model", "true",
            "--rollout-length", "5", "--penalty", "0", "--real-ratio", "0.05", "--rollout-starts", str(a.starts),
            "--rollout-every", str(a.rollout_every), "--retain-rounds", "5", "--total-steps", str(steps_of(a, algo)),
            "--seed", str(a.seed), "--log-every", str(a.log_every), "--eval-every", str(a.eval_every),
            "--eval-episodes", str(a.eval_episodes), "--checkpoint-every", str(a.checkpoint_every),
            "--threads", str(a.threads), "--run-dir", str(run_dir(a, algo)), "--no-progress",
            *shlex.split(a.extra_args)]


def command(a: argparse.Namespace, algo: str) -> list[str]:
    d = run_dir(a, algo)
    if checkpoint_step(d) is not None:
        return [sys.executable, "-m", "ctrl_rl", "train", algo, "--resume", str(d),
                "--total-steps", str(steps_of(a, algo)),
                "--threads", str(a.threads), "--no-progress"]
    return fresh_command(a, algo)


def dataset_path(a: argparse.Namespace) -> Path | None:
    """The generated dataset's file, None while it does not exist."""
    from ctrl_rl.errors import UserInputError
    from ctrl_rl.storage.datasets.cache import resolve_dataset_id

    try:
        return resolve_dataset_id(a.dataset)
    except UserInputError:
        return None


def ensure_dataset(a: argparse.Namespace) -> Path:
    """The dataset's file, generated first (``ctrl-rl data generate``, a few minutes) when missing."""
    from ctrl_rl.storage.datasets.cache import parse_dataset_id, resolve_dataset_id

    path = dataset_path(a)
    if path is not None:
        return path
    parsed = parse_dataset_id(a.dataset)
    if parsed is None:
        raise SystemExit(f"--dataset {a.dataset!r}: expected a generated dataset id such as hopper-medium-v5 "
                         "(--model true needs the simulator states `ctrl-rl data generate` stores)")
    cmd = [sys.executable, "-m", "ctrl_rl", "data", "generate", "--env", a.env, "--level", parsed[1], "--no-progress"]
    print(f"[data] {shlex.join(cmd)}", flush=True)
    if a.dry_run:
        return Path(a.dataset)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return resolve_dataset_id(a.dataset)


def launch(a: argparse.Namespace, argv: list[str]) -> dict[str, int | None]:
    """Run every incomplete run at once; returns each run's exit code (None: already complete)."""
    procs: dict[str, subprocess.Popen] = {}
    codes: dict[str, int | None] = {}
    for algo in a.algos:
        d = run_dir(a, algo)
        step = checkpoint_step(d)
        if step is not None and step >= steps_of(a, algo):
            print(f"[done] {algo}: complete ({step:,} steps)", flush=True)
            codes[algo] = None
            continue
        cmd = command(a, algo)
        if a.dry_run:
            print(shlex.join(cmd), flush=True)
            continue
        if step is None and d.exists():  # stopped before its first checkpoint: start over
            shutil.rmtree(d)
        d.parent.mkdir(parents=True, exist_ok=True)
        with open(d.parent / "commands.txt", "a") as f:
            f.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {algo}\n{shlex.join(cmd)}\n")
        log = open(d.parent / f"{algo}-s{a.seed}.log", "a")
        print(f"[start] {algo}: {shlex.join(cmd)}", flush=True)
        procs[algo] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, "MPLBACKEND": "Agg"})
    if a.dry_run:
        return codes

    def stop(*_):
        for p in procs.values():  # SIGTERM: each run stops at its last checkpoint and resumes from it
            if p.poll() is None:
                p.terminate()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    last = time.time()
    try:
        while any(p.poll() is None for p in procs.values()):
            time.sleep(5)
            if time.time() - last >= a.summary_every:
                summarize(a, argv, quiet=True)
                last = time.time()
    except KeyboardInterrupt:
        stop_all = [p for p in procs.values() if p.poll() is None]
        for p in stop_all:
            p.terminate()
        for p in stop_all:
            p.wait()
        print("interrupted: the runs stopped at their last checkpoint; run the same command to resume", flush=True)
        summarize(a, argv, quiet=True)
        sys.exit(130)
    for algo, p in procs.items():
        codes[algo] = p.returncode
        print(f"[{'done' if p.returncode == 0 else 'fail'}] {algo}: exit {p.returncode}, at step "
              f"{checkpoint_step(run_dir(a, algo))}", flush=True)
    return codes


# ------------------------------------------------------------------------------------------- summarizing
def value_scales(path: Path, gamma: float) -> dict:
    """Two scales of the true Q of the dataset's task: the behaviour policy's mean discounted return-to-go over
    dataset rows (truncated episodes bootstrap 0, so a slight underestimate there) and r_max / (1 - gamma)."""
    import numpy as np

    from ctrl_rl.storage.datasets import load_dataset

    ds = load_dataset(path, view="trajectory")
    r = ds.reward.double().numpy()  # [S]
    ends = np.zeros(len(r), dtype=bool)  # [S] last row of an episode
    ends[ds.episode_offsets[1:].numpy() - 1] = True
    g = np.empty_like(r)  # [S] discounted return-to-go
    nxt = 0.0
    for t in range(len(r) - 1, -1, -1):
        nxt = r[t] + gamma * (0.0 if ends[t] else nxt)
        g[t] = nxt
    complete = (ds.terminated | ds.truncated)[ds.episode_offsets[1:] - 1].numpy()
    returns = ds.episode_returns().numpy()[complete]
    return {"reward_mean": float(r.mean()), "reward_max": float(r.max()), "gamma": gamma,
            "mc_return_mean": float(g.mean()), "mc_return_max": float(g.max()),
            "q_bound": float(r.max() / (1 - gamma)), "episode_return_mean": float(returns.mean()),
            "episodes": int(complete.sum()), "transitions": len(r)}


def read_run(d: Path) -> dict:
    rows = []
    if (d / "metrics.jsonl").is_file():
        for line in (d / "metrics.jsonl").read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                pass
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    q = [(r["step"], r.get("stats/q_mean"), r.get("stats/q_max")) for r in rows if r.get("stats/q_mean") is not None]
    ev = [(r["step"], r["episode_return"], r.get("normalized_score")) for r in rows
          if r.get("episode_return") is not None]
    ups = [r["updates_per_s"] for r in rows if r.get("updates_per_s")]
    log = d.parent / f"{d.name}.log"
    tail = log.read_text().strip().splitlines()[-3:] if log.is_file() else []
    return {"run_dir": str(d), "config": cfg, "q": q, "eval": ev, "steps_done": rows[-1]["step"] if rows else 0,
            "wall_time_s": rows[-1].get("wall_time") if rows else None,
            "updates_per_s_median": sorted(ups)[len(ups) // 2] if ups else None,
            "rollout_reward_mean": [(r["step"], r["rollout/reward_mean"]) for r in rows if "rollout/reward_mean" in r],
            "log_tail": tail}


def launches(d: Path) -> list[str]:
    """Every command that launched the run in ``d`` (fresh and resumed), from <runs-dir>/commands.txt."""
    f = d.parent / "commands.txt"
    if not f.is_file():
        return []
    return [x.replace(sys.executable, "python").replace(f"{ROOT}/", "") for x in f.read_text().splitlines()
            if not x.startswith("#") and (f"--run-dir {d} " in x or f"--resume {d} " in x)]


def growth(q: list[tuple], frac: float = 0.5) -> float | None:
    """q_mean at the end over q_mean at ``frac`` of the run (None when too short or not positive)."""
    if len(q) < 4:
        return None
    mid = q[int(len(q) * frac)][1]
    return q[-1][1] / mid if mid and mid > 0 else None


def reading(runs: dict, scales: dict | None) -> str:
    """The paragraph of the results, from the numbers (rules stated in the text)."""
    if scales is None:
        return ("The dataset's file is missing, so the Q statistics cannot be set against the task's value range; "
                "see the table.")
    b, m = scales["q_bound"], scales["mc_return_mean"]
    parts, verdict = [], {}
    for algo, r in runs.items():
        if not r["q"]:
            parts.append(f"{algo}: no Q statistics yet")
            continue
        step, qm, qx = r["q"][-1]
        gr = growth(r["q"])
        above = qm > b
        verdict[algo] = (above, gr)
        ret = (f", last evaluation return {r['eval'][-1][1]:.0f} (undiscounted; with Hopper's mostly positive rewards "
               f"about an upper bound on its policy's discounted value from the start states; q_mean is "
               f"{qm / max(r['eval'][-1][1], 1e-9):.2g}x that)"
               if r["eval"] else "")
        parts.append(f"{algo} at step {step:,}: q_mean {qm:.4g} ({qm / b:.2g}x the bound r_max/(1-gamma) = {b:.0f}; "
                     f"{qm / m:.2g}x the data's mean return-to-go {m:.0f}), q_max {qx:.4g}, q_mean grew "
                     f"{'n/a' if gr is None else f'{gr:.2g}x'} over the second half{ret}")
    text = "; ".join(parts) + "."
    if "mbpo" in verdict and "ravl" in verdict:
        (mb_above, mb_gr), (rv_above, _) = verdict["mbpo"], verdict["ravl"]
        common = min(runs["mbpo"]["q"][-1][0], runs["ravl"]["q"][-1][0])
        at = {k: [x[1] for x in runs[k]["q"] if x[0] == common] for k in ("mbpo", "ravl")}
        if at["mbpo"] and at["ravl"] and runs["mbpo"]["q"][-1][0] != runs["ravl"]["q"][-1][0]:  # unequal lengths
            text += (f" At step {common:,}, where both runs have logged, q_mean is {at['mbpo'][0]:.4g} (mbpo) vs "
                     f"{at['ravl'][0]:.4g} (ravl).")
        mb_growing = mb_gr is not None and mb_gr > 1.5
        if mb_above and not rv_above:
            text += (" Reading (rule: a Q above r_max/(1-gamma) is overestimated whatever the policy): MBPO's Q "
                     "exceeds every value this task can have" + (" and is still rising" if mb_growing else "") +
                     ", RAVL's stays below the bound: the paper's claim holds at this budget.")
        elif not mb_above and mb_growing and not rv_above:
            text += (" Reading: MBPO's Q is still below the bound r_max/(1-gamma) but rising fast, RAVL's is bounded; "
                     "consistent with the claim, not yet a blow-up at this budget.")
        elif not mb_above:
            text += (f" Reading: MBPO's Q has not left the task's value range within {runs['mbpo']['steps_done']:,} "
                     "gradient steps; the "
                     "blow-up the paper shows (over 3M steps) is NOT reproduced at this budget.")
        else:
            text += " Reading: both exceed the bound r_max/(1-gamma): RAVL does not keep Q bounded here."
    return text


def summarize(a: argparse.Namespace, argv: list[str], quiet: bool = False) -> dict:
    path = dataset_path(a)
    scales = value_scales(path, 0.99) if path is not None else None  # None: no dataset yet, the Q curves still plot
    runs = {algo: read_run(run_dir(a, algo)) for algo in a.algos}
    runs = {k: v for k, v in runs.items() if v["steps_done"] or v["config"]}
    for algo in runs:
        runs[algo]["command"] = shlex.join(fresh_command(a, algo)).replace(sys.executable, "python").replace(
            f"{ROOT}/", "")
        runs[algo]["seed"] = a.seed
        runs[algo]["budget"] = steps_of(a, algo)
        runs[algo]["complete"] = runs[algo]["steps_done"] >= steps_of(a, algo)
        runs[algo]["launches"] = launches(run_dir(a, algo))
    this = shlex.join(["python", "experiments/edge_of_reach/edge_of_reach.py", *argv])
    budget = {"gradient_steps": {algo: steps_of(a, algo) for algo in a.algos}, "rollout_starts": a.starts,
              "rollout_every": a.rollout_every,
              "rollout_length": 5, "retain_rounds": 5, "real_ratio": 0.05, "penalty": 0.0,
              "paper_gradient_steps": PAPER_STEPS, "paper_rollout_starts": PAPER_STARTS,
              "fraction_of_paper_steps": {algo: steps_of(a, algo) / PAPER_STEPS for algo in a.algos},
              "fraction_of_paper_starts": a.starts / PAPER_STARTS}
    text = reading(runs, scales) if runs else "No run has logged yet."
    payload = {"experiment": "edge-of-reach with the true dynamics (ALGORITHMS.md §4)", "command": this,
               "date": datetime.date.today().isoformat(), "commit": runs_commit(run_dir(a, algo) for algo in runs),
               "env": a.env, "dataset": a.dataset,
               "seed": a.seed, "budget": budget, "value_scales": scales, "reading": text,
               "runs": {k: {kk: vv for kk, vv in v.items() if kk != "config"} | {"run_config": v["config"].get("run"),
                                                                               "algo_config": v["config"].get("config")}
                        for k, v in runs.items()}}
    out = a.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "edge_of_reach.json").write_text(json.dumps(payload, indent=1) + "\n")
    md = markdown(payload)
    (out / "edge_of_reach.md").write_text(md)
    if runs:
        plot(runs, scales, out / "edge_of_reach.png", a)
    if not quiet:
        print(md)
        print(f"wrote {out / 'edge_of_reach.json'}, edge_of_reach.md, edge_of_reach.png")
    return payload


def markdown(p: dict) -> str:
    b, s = p["budget"], p["value_scales"]
    lines = ["# Edge-of-reach with the true dynamics: MBPO vs RAVL (Hopper)", "",
             f"- Script: `{p['command']}` ({p['date']}, commit {p['commit']})",
             f"- Data: `{p['dataset']}` (regenerated D4RL-protocol data on {p['env']}; the simulator is set to its "
             "infos/qpos, infos/qvel), seed "
             f"{p['seed']}",
             "- Budget: " + ", ".join(f"{k} {v:,} gradient steps ({b['fraction_of_paper_steps'][k]:.2%} of the paper's "
                                      f"{b['paper_gradient_steps']:,})" for k, v in b["gradient_steps"].items())
             + f"; {b['rollout_starts']:,} start states per round every "
             f"{b['rollout_every']:,} steps ({b['fraction_of_paper_starts']:.0%} of the paper's "
             f"{b['paper_rollout_starts']:,}), k = {b['rollout_length']}, {b['retain_rounds']} rounds kept, real ratio "
             f"{b['real_ratio']}, no penalty", ""]
    if s:
        lines += [f"Value scales (gamma {s['gamma']}): dataset reward mean {s['reward_mean']:.3f}, max "
                  f"{s['reward_max']:.3f}; r_max/(1-gamma) = **{s['q_bound']:.0f}** (no true Q of this task exceeds "
                  f"it); behaviour policy's discounted return-to-go over dataset rows: mean {s['mc_return_mean']:.0f}, "
                  f"max {s['mc_return_max']:.0f}; episode return mean {s['episode_return_mean']:.0f} "
                  f"({s['episodes']:,} episodes).", ""]
    lines += ["| run | steps | updates/s | q_mean (last log) | q_max (last log) | largest q_max | eval return "
              "(last) | normalized (D4RL ref) |", "|---|---|---|---|---|---|---|---|"]
    for algo, r in p["runs"].items():
        q, ev = r["q"], r["eval"]
        last = q[-1] if q else (None, None, None)
        big = max((x[2] for x in q if x[2] is not None), default=None)

        def f(v):
            return "—" if v is None else f"{v:.4g}"

        todo = "" if r["complete"] else f" (incomplete, of {r['budget']:,})"
        lines.append(f"| {algo} | {r['steps_done']:,}{todo} | "
                     f"{f(r['updates_per_s_median'])} | {f(last[1])} | {f(last[2])} | {f(big)} | "
                     f"{f(ev[-1][1] if ev else None)} | {f(ev[-1][2] if ev else None)} |")
    lines += ["", "Evaluations (deterministic policy, return): " + "; ".join(
        f"{algo}: " + ", ".join(f"{s_:,}: {v:.0f}" for s_, v, _ in r["eval"]) for algo, r in p["runs"].items()), "",
        "Commands (as started; every launch, fresh or resumed, below each):", ""]
    for _algo, r in p["runs"].items():
        lines += [f"    {r['command']}", ""] + [f"    {x}" for x in r.get("launches", [])] + [""]
    lines += ["## Reading", "", p["reading"], "",
              "Plot: `edge_of_reach.png` (q_mean and q_max of each logged batch, log scale, with the two value scales; "
              "evaluation return with the dataset's mean episode return).", ""]
    return "\n".join(lines)


def plot(runs: dict, scales: dict | None, dest: Path, a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for k, (algo, r) in enumerate(runs.items()):
        c = f"C{k}"
        xs = [x[0] for x in r["q"]]
        for ax, i, _name in ((axes[0], 1, "q_mean"), (axes[1], 2, "q_max")):
            ax.plot(xs, [x[i] for x in r["q"]], color=c, lw=1.2, label=algo)
        if r["eval"]:
            axes[2].plot([x[0] for x in r["eval"]], [x[1] for x in r["eval"]], "o-", color=c, lw=1.2, label=algo)
    for ax, name in ((axes[0], "stats/q_mean"), (axes[1], "stats/q_max")):
        vals = [x for r in runs.values() for row in r["q"] for x in row[1:] if x is not None]
        ax.set_yscale("log" if vals and min(vals) > 0 else "symlog")
        if scales:
            ax.axhline(scales["q_bound"], ls="--", color="gray", lw=0.9, label="r_max/(1-γ)")
            ax.axhline(scales["mc_return_mean"], ls=":", color="gray", lw=0.9, label="data return-to-go (mean)")
        ax.set_title(name)
        ax.set_xlabel("gradient steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if scales:
        axes[2].axhline(scales["episode_return_mean"], ls=":", color="gray", lw=0.9, label="dataset mean return")
    axes[2].set_title("evaluation return (deterministic)")
    axes[2].set_xlabel("gradient steps")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"edge-of-reach, true dynamics: {a.dataset}, k=5, {a.starts:,} starts/round, seed {a.seed}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if min(a.steps, a.starts, a.rollout_every) < 1:
        raise SystemExit("--steps, --starts and --rollout-every must be positive")
    if a.summarize_only:
        summarize(a, argv)
        return
    ensure_dataset(a)
    launch(a, argv)
    if not a.dry_run:
        summarize(a, argv)


if __name__ == "__main__":
    main()
