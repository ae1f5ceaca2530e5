"""Issue 30 part 2: wall time to an evaluation return of 3000 (and 5000) on HalfCheetah-v5, the FastSAC preset
against ctrl_rl's default SAC and SB3 SAC with rl-zoo's HalfCheetah settings, in one invocation.

Variants (each run a fresh process; for every seed each variant in turn, the order rotated from seed to seed so that
a drift of the machine's speed hits every variant alike):

  fastsac  ``python -m ctrl_rl train sac --preset fastsac-halfcheetah --seed S`` (16 envpool envs, batch 256,
           UTD 1/4, 3-step returns, observation normalization, plain critics)
  sac      ``python -m ctrl_rl train sac --env HalfCheetah-v5 --seed S``: ctrl_rl's default SAC (1 env, batch 256,
           UTD 1, 5k random steps, the SAC paper's settings)
  sb3      SB3 SAC with rl-zoo's ``hyperparams/sac.yml`` HalfCheetah entry (``learning_starts`` 10k, SB3's defaults
           otherwise; ``experiments/peers/sb3_runs.py`` ``sac_eval_curve``), in a worker process of this script

Every variant evaluates its deterministic policy every ``--eval-every`` env steps from step 0 (``--eval-episodes``
episodes; ctrl_rl: envpool envs, one episode each; SB3: a gymnasium env, episodes in turn). The time of an evaluation
is the run's **training** wall time when it starts: the run's clock (ctrl_rl: ``wall_time`` in metrics.jsonl, from the
first step; SB3: from the start of ``learn()``) less the time spent in earlier evaluations (ctrl_rl logs each one's
``eval_s``). Interpreter start-up and imports are not counted (reported apart for ctrl_rl). The time to a return is
the time of the first evaluation that reaches it; a run that never does counts as its last training time (its true
time is longer), and a median at or above such a censored value is then a lower bound (flagged ``censored``).

A run stops at its variant's ``--budget-steps`` env steps or ``--budget-s`` training seconds, whichever comes first
(ctrl_rl: the script stops the process; the last evaluation it logged is its final return). Results go to
``<--name>.json`` after every run (resumable: a (variant, seed) already in it with the same settings is not run
again; ``--fresh`` starts over), with each run's curve ``[step, train_s, wall_s, eval_return]``, the git commit,
the machine and the load average; ``<--name>.png`` (also rewritten after every run) plots evaluation return against
training wall time and env steps.

    python experiments/fast_sac/fast_sac.py                          # 3 seeds, all variants (hours: README)
    python experiments/fast_sac/fast_sac.py --seeds 0 --budget-steps fastsac=30000 sac=8000 sb3=12000 \\
        --eval-every 4000 --eval-episodes 2 --name smoke             # a check of the script (~5 min)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py, peers/
from common import ROOT, git_commit, write_result  # noqa: E402

RESULTS = HERE  # this benchmark's folder: its results live beside the script
VARIANTS = ("fastsac", "sac", "sb3")
TARGETS = (3000.0, 5000.0)
CTRL_RL_ARGS = {"fastsac": ["--preset", "fastsac-halfcheetah"], "sac": ["--env", "HalfCheetah-v5"]}
BUDGET_STEPS = {"fastsac": 1_000_000, "sac": 1_000_000, "sb3": 1_000_000}
BUDGET_S = {"fastsac": 3600.0, "sac": 1800.0, "sb3": 1800.0}


def per_variant(values: list[str] | None, defaults: dict, cast, flag: str) -> dict:
    """``VARIANT=VALUE`` flags over the defaults."""
    out = dict(defaults)
    for v in values or []:
        name, sep, value = v.partition("=")
        if not sep or name not in VARIANTS:
            raise SystemExit(f"{flag} {v!r}: expected VARIANT=VALUE with VARIANT one of {VARIANTS}")
        out[name] = cast(value)
    return out


# ----- one run each -----

def envs_per_iteration(variant: str) -> int:
    """Env steps per ctrl_rl loop iteration of a variant: its preset's ``num_envs`` (1 without a preset)."""
    args = CTRL_RL_ARGS[variant]
    if "--preset" not in args:
        return 1
    from ctrl_rl.learn.config import load_preset
    return int(load_preset(args[args.index("--preset") + 1]).run.get("num_envs", 1))


def ctrl_rl_command(variant: str, seed: int, steps: int, a: argparse.Namespace, run_dir: Path) -> tuple[list, bool]:
    """The ``python -m ctrl_rl train sac`` command of a run, and whether it resumes one. Without ``--work-dir`` a run
    writes no checkpoint; with it, a checkpoint (replay included) every ``--checkpoint-every`` env steps, and a run
    directory that holds one is continued (``--resume``) instead of started again."""
    base = [sys.executable, "-m", "ctrl_rl", "train", "sac"]
    if a.work_dir is not None and (run_dir / "checkpoints" / "latest.pt").is_file():
        return [*base, "--resume", str(run_dir), "--total-steps", str(steps), "--no-progress"], True
    # ctrl_rl counts --checkpoint-every in loop iterations (num_envs env steps each); this script's flag is env steps
    every = max(1, a.checkpoint_every // envs_per_iteration(variant))
    keep = ["--checkpoint-every", str(every), "--save-replay"] if a.work_dir is not None else \
        ["--checkpoint-every", str(10**9)]
    return [*base, *CTRL_RL_ARGS[variant], "--seed", str(seed), "--total-steps", str(steps), "--eval-every",
            str(a.eval_every), "--eval-episodes", str(a.eval_episodes), "--run-dir", str(run_dir), "--no-progress",
            *keep], False


def ctrl_rl_run(variant: str, seed: int, steps: int, budget_s: float, a: argparse.Namespace, tmp: Path) -> dict:
    """``python -m ctrl_rl train sac ...`` in a fresh process, stopped at ``budget_s`` training seconds (read from its
    metrics.jsonl every few seconds); returns its evaluation curve. With ``--work-dir`` the run directory persists
    and an interrupted run continues from its last checkpoint."""
    run_dir = (a.work_dir / a.name if a.work_dir is not None else tmp) / f"{variant}-s{seed}"
    cmd, resumed = ctrl_rl_command(variant, seed, steps, a, run_dir)
    metrics = run_dir / "metrics.jsonl"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(run_dir.parent / f"{variant}-s{seed}.log", "a" if resumed else "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        stopped = False
        while proc.poll() is None:
            time.sleep(2.0)
            if metrics.exists() and train_seconds(read_rows(metrics)) >= budget_s:
                proc.send_signal(signal.SIGINT)  # stop at the budget; the metrics logged so far are the run
                stopped = True
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    process_s = time.perf_counter() - t0
    if proc.returncode != 0 and not stopped:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{(run_dir.parent / f'{variant}-s{seed}.log').read_text()[-3000:]}")
    rows = read_rows(metrics)
    curve, spent = [], 0.0
    for r in rows:
        if "eval_return" in r:
            curve.append([r["step"], round(r["wall_time"] - spent, 3), r["wall_time"], r["eval_return"]])
            spent += r.get("eval_s", 0.0)
    last = rows[-1] if rows else {}
    out = {"curve": curve, "steps_run": last.get("step", 0), "eval_s": round(spent, 3), "stopped_at_budget": stopped,
           "process_s": round(process_s, 1), "startup_s": round(process_s - last.get("wall_time", 0.0), 1)}
    if a.work_dir is not None:
        out.update(run_dir=str(run_dir), resumed=resumed)  # True: this invocation continued an interrupted run
    return out


def read_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return rows


def train_seconds(rows: list[dict]) -> float:
    """Training wall time of a run's metrics so far: its clock less its evaluations."""
    if not rows:
        return 0.0
    return rows[-1]["wall_time"] - sum(r.get("eval_s", 0.0) for r in rows if "eval_return" in r)


def sb3_run(seed: int, steps: int, budget_s: float, a: argparse.Namespace, tmp: Path) -> dict:
    out = tmp / f"sb3-s{seed}.json"
    cmd = [sys.executable, __file__, "--sb3-worker", "--seeds", str(seed), "--budget-steps", f"sb3={steps}",
           "--budget-s", f"sb3={budget_s}", "--eval-every", str(a.eval_every), "--eval-episodes",
           str(a.eval_episodes), "--worker-out", str(out), "--sb3-threads", str(a.sb3_threads)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    if r.returncode != 0:
        raise RuntimeError(f"SB3 worker failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    res = json.loads(out.read_text())
    res["process_s"] = round(time.perf_counter() - t0, 1)
    return res


def sb3_worker(a: argparse.Namespace) -> None:
    from peers.sb3_runs import sac_eval_curve

    from ctrl_rl.envs.gymnasium import filter_mujoco_warnings

    filter_mujoco_warnings()
    if a.sb3_threads:
        import torch

        torch.set_num_threads(a.sb3_threads)
    steps, budget_s = per_variant(a.budget_steps, BUDGET_STEPS, int, "--budget-steps")["sb3"], \
        per_variant(a.budget_s, BUDGET_S, float, "--budget-s")["sb3"]
    res = sac_eval_curve(a.seeds[0], steps, budget_s, a.eval_every, a.eval_episodes)
    res["stopped_at_budget"] = res["steps_run"] < steps
    Path(a.worker_out).write_text(json.dumps(res))


# ----- summary -----

def cpu_name(info: str | None = None) -> str:
    """The CPU's model name and its widest vector extension, from ``info`` (default: /proc/cpuinfo); runs on other
    CPUs compare only through their same-invocation ratios."""
    if info is None:
        try:
            info = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or "unknown"
    name = next((x.split(":", 1)[1].strip() for x in info.splitlines() if x.startswith("model name")), "unknown")
    flags = next((x for x in info.splitlines() if x.startswith("flags")), "")
    ext = "AMX" if " amx_tile" in flags else "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "-"
    return f"{name} ({ext})"


def first_reach(curve: list[list[float]], target: float) -> dict | None:
    hit = next((c for c in curve if c[3] >= target), None)
    return None if hit is None else {"step": hit[0], "train_s": hit[1]}


def summarize(runs: dict) -> dict:
    """Per variant and target: each seed's time to the target, the median (``censored`` when a seed that never got
    there makes it a lower bound), and the final evaluation; the ratios of each baseline's median to fastsac's."""
    out: dict = {}
    for v in VARIANTS:
        rs = [r for k, r in sorted(runs.items()) if k.split("/")[0] == v]
        if not rs:
            continue
        row: dict = {"seeds": [r["seed"] for r in rs],
                     "final_return": [r["curve"][-1][3] if r["curve"] else None for r in rs],
                     "final_step": [r["curve"][-1][0] if r["curve"] else None for r in rs]}
        for t in TARGETS:
            hits = [first_reach(r["curve"], t) for r in rs]
            # a seed that never reached the target counts as its last training time (its time is at least that)
            times = [h["train_s"] if h else (r["curve"][-1][1] if r["curve"] else 0.0) for h, r in zip(hits, rs)]
            med = statistics.median(times)
            upper = sorted(times)[len(times) // 2]  # the median (odd count) or the upper of the two it averages
            row[f"to_{t:.0f}"] = {"train_s": [h["train_s"] if h else None for h in hits],
                                  "step": [h["step"] if h else None for h in hits], "median_s": med,
                                  # a censored seed that enters the median makes it a lower bound
                                  "censored": any(h is None and x <= upper for h, x in zip(hits, times))}
        finals = [f for f in row["final_return"] if f is not None]
        row["final_return_median"] = statistics.median(finals) if finals else None
        out[v] = row
    if "fastsac" in out:
        for v in ("sac", "sb3"):
            if v not in out:
                continue
            for t in TARGETS:
                f, o = out["fastsac"][f"to_{t:.0f}"], out[v][f"to_{t:.0f}"]
                if not f["censored"] and f["median_s"] > 0:
                    out[f"speedup_vs_{v}_to_{t:.0f}"] = {"ratio": round(o["median_s"] / f["median_s"], 2),
                                                         "lower_bound": o["censored"]}
                per_seed = seed_ratios(runs, v, t)
                if per_seed:
                    out[f"speedup_vs_{v}_to_{t:.0f}"] = {**out.get(f"speedup_vs_{v}_to_{t:.0f}", {}),
                                                         "per_seed": per_seed, **median_ratio(per_seed)}
    return out


def seed_ratios(runs: dict, baseline: str, target: float) -> dict[str, dict]:
    """Per seed that both ran: the baseline's time to ``target`` over fastsac's, from the same invocation (a ratio
    that carries across machines and days where times do not). A baseline that never got there gives a lower bound
    (its last training time); a fastsac that never got there gives no ratio."""
    out = {}
    for k, r in sorted(runs.items()):
        v, seed = k.split("/")
        o = runs.get(f"{baseline}/{seed}")
        if v != "fastsac" or o is None or not r["curve"] or not o["curve"]:
            continue
        f, b = first_reach(r["curve"], target), first_reach(o["curve"], target)
        if f is None or f["train_s"] <= 0:
            continue
        b_s = b["train_s"] if b else o["curve"][-1][1]
        out[seed] = {"ratio": round(b_s / f["train_s"], 2), "lower_bound": b is None}
    return out


def median_ratio(per_seed: dict[str, dict]) -> dict:
    """The median of the per-seed ratios, a lower bound when a censored ratio is at or below the upper median."""
    xs = sorted(per_seed.values(), key=lambda x: x["ratio"])
    upper = xs[len(xs) // 2]["ratio"]
    return {"median_of_seed_ratios": round(statistics.median(x["ratio"] for x in xs), 2),
            "median_of_seed_ratios_lower_bound": any(x["lower_bound"] and x["ratio"] <= upper for x in xs)}


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fastsac": "tab:red", "sac": "tab:blue", "sb3": "tab:green"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, r in sorted(runs.items()):
        v = k.split("/")[0]
        if not r["curve"]:
            continue
        steps, train_s, _, ret = zip(*r["curve"])
        label = v if k.endswith("/" + str(min(x["seed"] for kk, x in runs.items() if kk.startswith(v + "/")))) else None
        axes[0].plot(train_s, ret, color=colors[v], alpha=0.8, label=label)
        axes[1].plot(steps, ret, color=colors[v], alpha=0.8, label=label)
    for ax, xl in zip(axes, ("training wall time (s, evaluations excluded)", "env steps")):
        for t in TARGETS:
            ax.axhline(t, color="grey", ls=":", lw=1)
        ax.set_xlabel(xl)
        ax.set_ylabel("evaluation return")
        ax.legend()
    axes[0].set_title("HalfCheetah-v5: return vs wall time")
    axes[1].set_title("return vs env steps")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--budget-steps", nargs="*", metavar="VARIANT=STEPS",
                    help=f"env-step budget per variant (default {BUDGET_STEPS})")
    ap.add_argument("--budget-s", nargs="*", metavar="VARIANT=SECONDS",
                    help=f"training wall-time budget per variant (default {BUDGET_S})")
    ap.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations (every variant)")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--name", default="fast_sac", help="results file stem (JSON and PNG beside this script)")
    ap.add_argument("--fresh", action="store_true", help="ignore the runs already in the results file")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="keep ctrl_rl's run directories here (under --name), with a checkpoint and the replay every "
                         "--checkpoint-every env steps, and continue an interrupted run from it (default: a temporary "
                         "directory, no checkpoints: nothing slows the timed runs)")
    ap.add_argument("--checkpoint-every", type=int, default=100_000, help="env steps between checkpoints (--work-dir)")
    ap.add_argument("--sb3-threads", type=int, default=0,
                    help="torch threads of the SB3 runs (0: torch's default, as a user runs SB3; 1 on a shared "
                         "machine, where two threads that wait on each other slow SB3 down many times)")
    ap.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.sb3_worker:
        sb3_worker(a)
        return
    steps = per_variant(a.budget_steps, BUDGET_STEPS, int, "--budget-steps")
    budget_s = per_variant(a.budget_s, BUDGET_S, float, "--budget-s")
    dest = RESULTS / f"{a.name}.json"
    old = json.loads(dest.read_text()) if dest.exists() and not a.fresh else {}
    runs: dict = old.get("runs", {})
    with tempfile.TemporaryDirectory(prefix="fast_sac_") as d:
        tmp = Path(d)
        for i, seed in enumerate(a.seeds):
            k = i % len(a.variants)
            for v in a.variants[k:] + a.variants[:k]:  # the order rotated from seed to seed
                key = f"{v}/{seed}"
                setting = {"budget_steps": steps[v], "budget_s": budget_s[v], "eval_every": a.eval_every,
                           "eval_episodes": a.eval_episodes, **({"sb3_threads": a.sb3_threads} if v == "sb3" else {})}
                if key in runs and runs[key].get("setting") == setting:
                    print(f"{key}: in {dest.name} already")
                    continue
                load = os.getloadavg()[0]
                t0 = time.time()
                if v == "sb3":
                    res = sb3_run(seed, steps[v], budget_s[v], a, tmp)
                else:
                    res = ctrl_rl_run(v, seed, steps[v], budget_s[v], a, tmp)
                runs[key] = {"variant": v, "seed": seed, "setting": setting, "load_avg_1min": round(load, 2),
                             "cpu": cpu_name(),
                             "started": datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).isoformat(
                                 timespec="seconds"), "commit": git_commit(), **res}
                hits = {f"to_{t:.0f}": first_reach(res["curve"], t) for t in TARGETS}
                print(key, hits, "final", res["curve"][-1] if res["curve"] else None, flush=True)
                payload = {"benchmark": "issue 30 part 2: time to evaluation return 3000/5000, HalfCheetah-v5",
                           "commit": git_commit(), "cpus": os.cpu_count(), "budget_steps": steps,
                           "budget_s": budget_s, "eval_every": a.eval_every, "eval_episodes": a.eval_episodes,
                           "summary": summarize(runs), "runs": runs}
                write_result(a.name, payload, folder=RESULTS)
                plot(runs, RESULTS / f"{a.name}.png")  # current after every run, as the JSON
    summary = summarize(runs)
    print(json.dumps({k: v for k, v in summary.items() if k.startswith("speedup")}, indent=1))
    for v in VARIANTS:
        if v in summary:
            s = summary[v]
            print(v, {t: (s[f"to_{t:.0f}"]["median_s"], s[f"to_{t:.0f}"]["censored"]) for t in TARGETS},
                  "final median", s["final_return_median"])
    plot(runs, RESULTS / f"{a.name}.png")


if __name__ == "__main__":
    main()
