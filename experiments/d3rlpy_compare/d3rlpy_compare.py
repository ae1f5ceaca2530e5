"""Model-free rows checked against d3rlpy: IQL and CQL of both libraries on the same regenerated file, budget and seeds.

Each (library, algorithm, seed) is one process on one torch thread, trained for a fixed number of gradient steps on
one D4RL-layout HDF5 file (default hopper-medium-v5, `ctrl-rl data generate`), evaluated every ``--eval-every``
steps by ctrl_rl's own evaluator (``learn.evaluate.run_episodes``: the same env, wrappers, episode seeds and
deterministic actions on both sides), so that the scores differ only by what was learned.

  ctrl_rl   ``ctrl-rl train iql|cql --dataset D`` (its offline loop; metrics.jsonl as any run)
            IQL: its defaults (the official code's locomotion settings: returns scaled by 1000 / (max - min episode
            return), expectile 0.7, beta 3, clip 100, lr 3e-4, cosine actor schedule over 1M updates)
            CQL: d3rlpy's reproduction network and weights instead of ctrl_rl's WSRL defaults (``CQL_MATCHED``)
  d3rlpy    2.8.1 ``IQLConfig`` / ``CQLConfig`` with the settings of its ``reproductions/offline/iql.py`` and
            ``cql.py`` (read at takuseno/d3rlpy 38c34b6): IQL lr 3e-4, actor cosine schedule T_max 500k, batch 256,
            weight_temp 3, max_weight 100, expectile 0.7, ReturnBasedRewardScaler(1000); CQL 3x256 encoders, actor
            lr 1e-4, critic 3e-4, temperature 1e-4, 10 action samples, fixed conservative weight 5 (its rule gives
            10 only to "medium-v0"), alpha lr 0. Trained with ``algo.fit``; the evaluation runs in its epoch callback,
            one epoch = ``--eval-every`` steps.

Differences that stay (each library's own way): d3rlpy's IQL steps Q and V from one optimizer before the actor,
ctrl_rl's V, actor, Q in the official code's order; d3rlpy's CQL TD target uses the deterministic tanh(mu(s')),
ctrl_rl a sample; initialisations. experiments/offline_updates/offline_updates.py lists them with their cost.

Runs live in <runs-dir>/<library>-<algo>-s<seed>/ (metrics.jsonl with ``episode_return`` and ``normalized_score``
rows; result.json when complete). Calling again skips complete runs and starts unfinished ones afresh (d3rlpy's
fit does not resume). ``--summarize`` aggregates what exists.

    python experiments/d3rlpy_compare/d3rlpy_compare.py --algos iql --seeds 0 1 2 3 4 --steps 30000 --jobs 2
    python experiments/d3rlpy_compare/d3rlpy_compare.py --algos cql --seeds 0 1 2 --steps 10000 --jobs 2
    python experiments/d3rlpy_compare/d3rlpy_compare.py --summarize

Writes experiments/d3rlpy_compare/d3rlpy_compare.{md,json} and d3rlpy_compare.png (evaluation curves, mean over seeds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, dataset_info, git_commit  # noqa: E402
from peers.d3rlpy_runs import fit_with_ctrl_rl_eval  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

LIBS = ("ctrl_rl", "d3rlpy")
ALGOS = ("iql", "cql")
CQL_MATCHED = ("--num-critics 2 --target-subset 2 --no-layer-norm --no-actor-layer-norm --final-hidden-scale 1 "
               "--actor-hidden 256 256 256 --critic-hidden 256 256 256 --actor-lr 1e-4 --critic-lr 3e-4 "
               "--alpha-lr 1e-4 "
               "--init-alpha 1 --no-backup-entropy --alpha-cql 5 --no-lagrange --num-cql-samples 10 "
               "--importance-sampling "
               "--no-max-target-backup --no-calql")


# ------------------------------------------------------------------------------------------------------ the grid
def run_dir(runs: Path, lib: str, algo: str, seed: int) -> Path:
    return runs / f"{lib}-{algo}-s{seed}"


def command(a: argparse.Namespace, lib: str, algo: str, seed: int, data: str) -> list[str]:
    d = run_dir(a.runs_dir, lib, algo, seed)
    if lib == "d3rlpy":
        return [sys.executable, str(Path(__file__).resolve()), "--worker", "--algo", algo, "--seed", str(seed),
                "--data", data, "--env", a.env, "--steps", str(a.steps), "--eval-every", str(a.eval_every),
                "--eval-episodes", str(a.eval_episodes), "--run-dir", str(d)]
    extra = shlex.split(CQL_MATCHED) if algo == "cql" else []
    return [sys.executable, "-m", "ctrl_rl", "train", algo, "--dataset", data, "--env", a.env, "--total-steps",
            str(a.steps), "--eval-every", str(a.eval_every), "--eval-episodes", str(a.eval_episodes),
           "--seed", str(seed),
            "--run-dir", str(d), "--threads", "1", "--checkpoint-every", str(a.steps), "--no-progress", *extra,
            *shlex.split(a.ctrl_args)]


def read_curve(d: Path) -> list[dict]:
    """The evaluation rows of a run's metrics.jsonl (none without the file)."""
    from ctrl_rl.learn.logging import read_metrics

    rows = read_metrics(d) if (d / "metrics.jsonl").is_file() else []
    return [r for r in rows if r.get("episode_return") is not None]


def one(a: argparse.Namespace, lib: str, algo: str, seed: int, data: str) -> str:
    d = run_dir(a.runs_dir, lib, algo, seed)
    if (d / "result.json").is_file():
        return f"[done] {d.name}: complete"
    if d.exists():  # an unfinished run: afresh
        shutil.rmtree(d)
    cmd = command(a, lib, algo, seed, data)
    with (a.runs_dir / "commands.txt").open("a") as f:
        f.write(shlex.join(cmd) + "\n")
    t0 = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1", CTRL_RL_FIXED_THREADS="1")
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    curve = read_curve(d)
    if r.returncode != 0 or not curve or curve[-1]["step"] < a.steps:
        (a.runs_dir / f"{d.name}.log").write_text(r.stdout + r.stderr)
        return f"[fail] {d.name}: exit {r.returncode}; log in {d.name}.log"
    (d / "result.json").write_text(json.dumps({"library": lib, "algo": algo, "seed": seed, "steps": a.steps,
                                               "process_seconds": seconds, "curve": curve}) + "\n")
    return f"[done] {d.name}: score {curve[-1]['normalized_score']:.1f} after {seconds:.0f} s"


# ------------------------------------------------------------------------------------------------------ summary
def _ms(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"


def welch(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """Welch's t statistic and its degrees of freedom (None with fewer than two of either)."""
    if len(x) < 2 or len(y) < 2:
        return None
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    if vx + vy == 0:
        return None
    t = (statistics.mean(x) - statistics.mean(y)) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    return t, df


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p of Student's t with ``df`` degrees of freedom: I_x(df/2, 1/2) at x = df / (df + t^2)."""
    return min(1.0, _ibeta(df / (df + t * t), df / 2, 0.5))


def _ibeta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz; no scipy needed)."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point: use the symmetry
        return 1.0 - _ibeta(1.0 - x, b, a)
    lbeta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - lbeta) / a
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + num * d
        d = 1 / (d if abs(d) > 1e-30 else 1e-30)
        c = 1 + num / c
        c = c if abs(c) > 1e-30 else 1e-30
        f *= c * d
        if abs(1 - c * d) < 1e-12:
            break
    return front * (f - 1)


def summarize(a: argparse.Namespace) -> None:
    results = {}
    for p in sorted(a.runs_dir.glob("*/result.json")):
        r = json.loads(p.read_text())
        results.setdefault((r["algo"], r["library"]), []).append(r)
    if not results:
        raise SystemExit(f"no complete runs in {a.runs_dir}")
    grid = json.loads((a.runs_dir / "grid.json").read_text()) if (a.runs_dir / "grid.json").is_file() else {}
    own = dataset_score(grid)
    md = ["# Model-free rows against d3rlpy: IQL and CQL on the same regenerated file, budget and seeds", "",
          f"- Dataset `{grid.get('dataset', '?')}` (`{grid.get('data', '?')}`), env `{grid.get('env', '?')}`; "
          "REGENERATED D4RL-protocol data on Gymnasium MuJoCo v5, not D4RL's files",
          f"- Grid commands: see `{a.runs_dir.relative_to(ROOT) if a.runs_dir.is_relative_to(ROOT) else a.runs_dir}"
          "/commands.txt`; settings in the docstring of `experiments/d3rlpy_compare/d3rlpy_compare.py`",
          "- Each run: one process, one torch thread; evaluation by ctrl_rl's evaluator on both sides (same env, "
          "episode seeds, deterministic actions); normalized with the D4RL v2 references; best of run is the "
          "highest evaluation of each run (optimistic: it picks with the test episodes); process s includes data "
          "loading and the evaluations (the same episodes on both sides); runs of both libraries ran in turns, "
          "two at a time",
          "- The dataset itself: mean return of its complete episodes "
          + (f"{own[0]:.1f}, normalized {own[1]:.1f} (`ctrl-rl data info`; dashed line in the plot)" if own else
             "not available"),
          f"- Summarized {datetime.date.today()} at commit {git_commit()}", "",
          "| algo | library | steps | seeds | final score (mean ± std) | per seed | median | best of run (mean) "
          "| gradient steps/s (median) | process s (median) |", "|---|---|---|---|---|---|---|---|---|---|"]
    payload = {"grid": grid, "rows": []}
    for (algo, lib), rs in sorted(results.items()):
        rs.sort(key=lambda r: r["seed"])
        finals = [r["curve"][-1]["normalized_score"] for r in rs]
        best = [max(c["normalized_score"] for c in r["curve"]) for r in rs]
        rate = [train_rate(r) for r in rs]
        proc = [r['process_seconds'] for r in rs]
        md.append(f"| {algo} | {lib} | {rs[0]['steps']:,} | {', '.join(str(r['seed']) for r in rs)} | {_ms(finals)} | "
                  f"{', '.join(f'{x:.1f}' for x in finals)} | {statistics.median(finals):.1f} | {_ms(best)} | "
                  f"{statistics.median(rate):.1f} | {statistics.median(proc):.0f} |")
        payload["rows"].append({"algo": algo, "library": lib, "seeds": [r["seed"] for r in rs], "final": finals,
                                "best": best, "steps_per_s": rate,
                                "process_seconds": proc})
    md.append("")
    for algo in ALGOS:
        x = [r["curve"][-1]["normalized_score"] for r in results.get((algo, "ctrl_rl"), [])]
        y = [r["curve"][-1]["normalized_score"] for r in results.get((algo, "d3rlpy"), [])]
        w = welch(x, y)
        if w is None:
            continue
        t, df = w
        md.append(f"- {algo.upper()}: ctrl_rl − d3rlpy = {statistics.mean(x) - statistics.mean(y):+.1f} points "
                  f"(Welch t = {t:.2f}, df = {df:.1f}, two-sided p = {t_two_sided_p(t, df):.2f}; "
                 f"n = {len(x)} vs {len(y)})")
    (RESULTS / "d3rlpy_compare.md").write_text("\n".join(md) + "\n")
    (RESULTS / "d3rlpy_compare.json").write_text(json.dumps(payload, indent=1) + "\n")
    plot(results, RESULTS / "d3rlpy_compare.png", own[1] if own else None)
    print("\n".join(md))
    print(f"wrote {RESULTS / 'd3rlpy_compare.md'}, .json, .png")


def train_rate(r: dict) -> float:
    """Gradient steps/s without the evaluations: ctrl_rl's loop logs ``updates_per_s`` (median of its rows); d3rlpy's
    worker times its fit and its evaluations (steps / (fit time - evaluation time), fit set-up included)."""
    if r["library"] == "ctrl_rl":
        return statistics.median(c["updates_per_s"] for c in r["curve"] if c.get("updates_per_s"))
    last = r["curve"][-1]
    return last["step"] / (last["wall_time"] - last["eval_time"])


def dataset_score(grid: dict) -> tuple[float, float] | None:
    """(mean episode return, D4RL-normalized score) of the grid's data file (`ctrl-rl data info`), or None."""
    if not grid.get("data") or not Path(grid["data"]).is_file():
        return None
    info = dataset_info(grid["data"], grid["env"])
    return (info["return_mean"], info["normalized_score"]) if info else None


def plot(results: dict, path: Path, dataset_level: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = sorted({k[0] for k in results})
    fig, axes = plt.subplots(1, len(algos), figsize=(5 * len(algos), 3.6), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        for lib, colour in zip(LIBS, ("tab:blue", "tab:orange")):
            rs = results.get((algo, lib), [])
            for r in rs:
                ax.plot([c["step"] for c in r["curve"]], [c["normalized_score"] for c in r["curve"]], color=colour,
                        alpha=0.25, lw=0.8)
            if rs:
                steps = [c["step"] for c in rs[0]["curve"]]
                mean = [statistics.mean(r["curve"][i]["normalized_score"] for r in rs if len(r["curve"]) > i)
                        for i in range(len(steps))]
                ax.plot(steps, mean, color=colour, lw=2, label=f"{lib} (n={len(rs)})")
        if dataset_level is not None:
            ax.axhline(dataset_level, color="grey", ls="--", lw=1, label="dataset's own average")
        ax.set_title(algo.upper())
        ax.set_xlabel("gradient steps")
        ax.set_ylabel("D4RL-normalized score")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="hopper-medium-v5", help="dataset id or HDF5 path")
    ap.add_argument("--env", default=None, help="default: the dataset's task, v5")
    ap.add_argument("--algos", nargs="+", choices=ALGOS, default=["iql"])
    ap.add_argument("--libs", nargs="+", choices=LIBS, default=list(LIBS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=30_000, help="gradient steps per run")
    ap.add_argument("--eval-every", type=int, default=5_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--ctrl-args", default="", help="extra `ctrl-rl train` flags of the ctrl_rl runs")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "d3rlpy_compare")
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--algo", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.env is None:
        name = Path(a.dataset).stem.split("-")[0]
        a.env = {"hopper": "Hopper-v5", "walker2d": "Walker2d-v5", "halfcheetah": "HalfCheetah-v5",
                 "ant": "Ant-v5"}.get(name)
        if a.env is None:
            ap.error(f"cannot tell the env of dataset {a.dataset!r}: pass --env")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.worker:
        return fit_with_ctrl_rl_eval(a)
    a.runs_dir = a.runs_dir.resolve()
    if a.summarize:
        return summarize(a)
    from ctrl_rl.storage.datasets.cache import resolve_dataset_id

    data = str(Path(a.dataset).resolve()) if Path(a.dataset).is_file() else str(resolve_dataset_id(a.dataset))
    a.runs_dir.mkdir(parents=True, exist_ok=True)
    grid_file = a.runs_dir / "grid.json"
    grid = json.loads(grid_file.read_text()) if grid_file.is_file() else {}
    if grid.get("data", data) != data:
        raise SystemExit(f"{a.runs_dir} holds runs on {grid['data']}: pass another --runs-dir for {data}")
    grid.update(dataset=a.dataset, data=data, env=a.env)
    for algo in a.algos:
        grid[algo] = {"steps": a.steps, "eval_every": a.eval_every, "eval_episodes": a.eval_episodes,
                      "ctrl_args": a.ctrl_args}
    grid_file.write_text(json.dumps(grid, indent=1) + "\n")
    jobs = [(lib, algo, s) for algo in a.algos for s in a.seeds for lib in a.libs]  # libraries interleaved
    with ThreadPoolExecutor(a.jobs) as pool:
        for msg in pool.map(lambda j: one(a, *j, data), jobs):
            print(msg, flush=True)
    summarize(a)


if __name__ == "__main__":
    main()
