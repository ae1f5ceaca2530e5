"""Issue 28, section 2: do MOPO and RAVL learn above their data? Per-seed curves, rliable aggregates and a plot from
the runs ``experiments/d4rl/run_table.py`` made (see README.md for the commands).

For every dataset and method the script reads ``<runs-dir>/<dataset>/<method>-s<seed>/`` (metrics.jsonl: every
evaluation row's ``episode_return`` against gradient steps; config.json: the commit the run recorded, and the one
of its last resume), the dataset's own average return (``ctrl-rl data info``) and the dynamics fit the agents
shared (``<runs-dir>/<dataset>/dynamics``: epochs, holdout MSE, calibration, wall time). Scores are normalized
with the local v5 references of the regenerated datasets (uniform-random and expert SAC policies,
``~/.cache/ctrl_rl/reference_scores_v5.json``), the references their generator reports, so that the dataset's
average and the agents' scores are on one scale.

Aggregates (rliable): the IQM over seeds of the final score and of the score at the last step every method
reached, with 95% stratified-bootstrap confidence intervals (2,000 resamples), and each method's IQM minus the
dataset's average.

    python experiments/model_based_learning/summarize.py --runs-dir /work/runs/d4rl \\
        --variant ravl_medium=/work/runs/d4rl_medium:ravl [--datasets halfcheetah-medium-v5 hopper-medium-v5]

``--variant NAME=DIR:METHOD`` adds the runs of METHOD in another runs dir under NAME (RAVL with
``--matmul-precision medium``). Writes ``<name>.{json,md,png}`` beside this script, or in ``--out`` (section 5's
NeuBay comparison: ``--datasets hopper-random-v5 --methods iql mopo neubay ravl --name neubay_hopper_random --out
experiments/neubay_hopper_random``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, dataset_info, iqm_ci, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script
ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
METHODS = ("iql", "mopo", "ravl")
# the papers' budgets in gradient steps (ALGORITHMS.md: MOPO and RAVL 1-3M on D4RL locomotion, IQL 1M; NeuBay's
# official configs/d4rl_loco/base.yaml: grad_steps 2M)
PAPER_STEPS = {"iql": 1_000_000, "mopo": 1_000_000, "ravl": 3_000_000, "neubay": 2_000_000}


def env_of(dataset: str) -> str:
    return ENVS[dataset.split("-", 1)[0]]


def local_score(env: str, ret: float) -> float:
    from ctrl_rl.storage.datasets.scores import normalized_score

    return float(normalized_score(env, ret, "local")[0])


def read_run(run_dir: Path, env: str) -> dict | None:
    """One run's evaluation curve and provenance, or None when it has not evaluated yet."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    evals = [r for r in rows if "episode_return" in r and r["episode_return"] == r["episode_return"]]
    if not evals:
        return None
    code = json.loads((run_dir / "config.json").read_text()).get("code") or {}
    return {"steps": [r["step"] for r in evals], "returns": [r["episode_return"] for r in evals],
            "scores": [local_score(env, r["episode_return"]) for r in evals],
            "wall_time_s": rows[-1].get("wall_time"), "last_step": rows[-1]["step"],
            "commit": (code.get("started") or {}).get("git"), "resumed_commit": (code.get("resumed") or {}).get("git")}


def read_fit(fit_dir: Path) -> dict | None:
    metrics = fit_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    code = json.loads((fit_dir / "config.json").read_text()).get("code") or {}
    last = rows[-1]
    per_member = None
    if (fit_dir / "model.pt").is_file():  # the kept weights' holdout MSE of every member, and which are elites
        from ctrl_rl.learn.checkpoint import load_checkpoint

        state = load_checkpoint(fit_dir / "model.pt")["state"]
        per_member = {"holdout_mse": [float(x) for x in state["holdout_mse"]],
                      "elites": [int(x) for x in state["elite_ids"]]}
    return {"per_member": per_member, "epochs": last["step"], "finished": (fit_dir / "model.pt").is_file(),
            "wall_time_s": last["wall_time"],
            "holdout_mse_best_elites": last.get("holdout_mse_best"), "calibration": last.get("calibration"),
            "holdout_mse_per_epoch": [r["holdout_mse_best"] for r in rows],
            "commit": (code.get("started") or {}).get("git")}


def score_at(run: dict, step: int) -> float | None:
    """The score of the last evaluation at or before ``step``."""
    got = [s for t, s in zip(run["steps"], run["scores"]) if t <= step]
    return got[-1] if got else None


def plot(payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(payload["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        d = payload["datasets"][name]
        for i, (method, runs) in enumerate(d["runs"].items()):
            color = f"C{i}"
            for run in runs.values():
                ax.plot(run["steps"], run["scores"], color=color, alpha=0.35, lw=0.8)
            agg = d["aggregate"]["final"].get(method)
            seeds = f"{len(runs)} seed{'' if len(runs) == 1 else 's'}"
            label = f"{method} ({seeds}" + (f", final IQM {agg['iqm']:.1f})" if agg else ")")
            # the mean over the seeds that evaluated at each step (a run still going contributes where it got to)
            steps = sorted({t for r in runs.values() for t in r["steps"]})
            at = [[sc for r in runs.values() for t2, sc in zip(r["steps"], r["scores"]) if t2 == t] for t in steps]
            ax.plot(steps, [sum(v) / len(v) for v in at], color=color, lw=2, label=label)
        if d.get("dataset_score") is not None:
            ax.axhline(d["dataset_score"], color="k", ls="--", lw=1,
                       label=f"dataset average ({d['dataset_score']:.1f})")
        ax.set_title(name)
        ax.set_xlabel("gradient steps")
        ax.set_ylabel("normalized score (local v5 references)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _iqm(a: dict | None) -> str:
    return f"{a['iqm']:.1f} [{a['ci95'][0]:.1f}, {a['ci95'][1]:.1f}]" if a else ""


def markdown(p: dict) -> str:
    lines = ["# Model-based offline RL on the regenerated D4RL-protocol datasets", "",
             f"{p['date']}; scores normalized with the local v5 references; IQM over seeds with 95% stratified "
             "bootstrap CIs (rliable).", ""]
    for name, d in p["datasets"].items():
        fit = d.get("dynamics") or {}
        lines += [f"## {name}", "",
                  f"Dataset average: return {d.get('dataset_return', float('nan')):.1f}, score "
                  f"{d.get('dataset_score', float('nan')):.1f}. Dynamics fit: {fit.get('epochs')} epochs, "
                  f"holdout MSE (best elites, standardised targets) {fit.get('holdout_mse_best_elites')}, "
                  f"calibration {fit.get('calibration')}, finished {fit.get('finished')}, "
                  f"{(fit.get('wall_time_s') or 0) / 60:.1f} min"
                  + (f"; holdout MSE per member {[round(x, 5) for x in fit['per_member']['holdout_mse']]}, elites "
                     f"{fit['per_member']['elites']}" if fit.get("per_member") else "") + ".", "",
                  f"| method | seeds | last step | share of the paper's steps | final IQM [95% CI] | IQM at "
                  f"{d['common_step']:,} steps [95% CI] | final IQM - dataset | commits |",
                  "|---|---|---|---|---|---|---|---|"]
        for method, runs in d["runs"].items():
            fin, com = d["aggregate"]["final"].get(method), d["aggregate"]["common"].get(method)
            last = min(r["last_step"] for r in runs.values())
            base = method.split("_")[0]
            share = f"{last / PAPER_STEPS[base]:.1%}" if base in PAPER_STEPS else ""
            commits = ", ".join(sorted({str(r["commit"]) for r in runs.values()}))
            diff = f"{fin['iqm'] - d['dataset_score']:+.1f}" if fin and d.get("dataset_score") is not None else ""
            lines.append(f"| {method} | {len(runs)} | {last:,} | {share} | {_iqm(fin)} | {_iqm(com)} | {diff} | "
                         f"{commits} |")
        lines.append("")
    lines += [f"`{p['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "d4rl")
    ap.add_argument("--datasets", nargs="+", default=["halfcheetah-medium-v5", "hopper-medium-v5"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR:METHOD")
    ap.add_argument("--name", default="model_based_learning")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="the study folder for the results (default: this one)")
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        name, rest = v.split("=", 1)
        d, method = rest.rsplit(":", 1)
        variants.append((name, Path(d), method))
    payload: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                     "command": "python experiments/model_based_learning/summarize.py " + " ".join(sys.argv[1:]),
                     "datasets": {}}
    for ds in a.datasets:
        env = env_of(ds)
        sources = [(m, a.runs_dir, m) for m in a.methods] + variants
        runs: dict[str, dict] = {}
        for name, root, method in sources:
            for seed_dir in sorted((root / ds).glob(f"{method}-s*")):
                if not seed_dir.is_dir():
                    continue
                run = read_run(seed_dir, env)
                if run is not None:
                    runs.setdefault(name, {})[seed_dir.name.rsplit("-s", 1)[1]] = run
        if not runs:
            continue
        info = dataset_info(ds, env, "local")
        common = min(r["steps"][-1] for m in runs.values() for r in m.values())
        d = {"env": env, "runs": runs, "common_step": common, "dynamics": read_fit(a.runs_dir / ds / "dynamics"),
             "dataset_return": info["return_mean"] if info else None,
             "dataset_score": info["normalized_score"] if info else None}
        d["aggregate"] = {"final": iqm_ci({m: [r["scores"][-1] for r in rs.values()] for m, rs in runs.items()}),
                          "common": iqm_ci({m: [s for s in (score_at(r, common) for r in rs.values()) if s is not None]
                                            for m, rs in runs.items()})}
        payload["datasets"][ds] = d
    write_result(a.name, payload, markdown(payload), folder=a.out)
    plot(payload, a.out / f"{a.name}.png")


if __name__ == "__main__":
    main()
