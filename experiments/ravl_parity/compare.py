"""Issue 28, section 3: ctrl_rl's RAVL against the official code (anyasims/edge-of-reach) on the same dataset file,
budget and seeds: the dynamics fits' holdout MSE on the same rows, the agents' scores at the same gradient step
with Welch's t-test, and their gradient steps/s.

The official runs come from ``experiments/peers/ravl_official/run.py`` (its README says how to get the official
checkout, ``--checkout`` checks it is there and clean): ``--stage dynamics`` runs with ``--holdout-rows ctrl_rl``
(ctrl_rl's seed-0 holdout rows kept out of its data and scored afterwards, raw and on standardised targets), each
compared with ctrl_rl's fit after as many epochs, and one ``--stage agent`` run per seed, on an official fit or on
ctrl_rl's fit written in the official format (``experiments/peers/ravl_official/convert.py``: the two agents then
imagine with the same model). The ctrl_rl runs are ``ctrl-rl train ravl`` runs of
``experiments/d4rl/run_table.py`` (``<runs>/ravl-s<seed>``) and their dynamics fit (``<runs>/dynamics``), whose
``holdout_mse`` is measured on the same rows (ctrl_rl's seed-0 split) on standardised targets.

    python experiments/ravl_parity/compare.py --checkout /work/peers/edge-of-reach \\
        --official-fit /work/peers/runs/hc-dyn-30ep --official-agents /work/peers/runs/hc-ravl-c{0,1,2} \\
        --ctrl-rl runs/d4rl/halfcheetah-medium-v5 --at 20000

Scores: both normalized with the local v5 references (the official shim's default ``--refs local``). Gradient
steps/s: the official figure is ``run.py``'s (updates and batch sampling between two update logs of one epoch, no
rollouts or evaluation); ctrl_rl's is the median over its log intervals of the rate each row logs, which leaves
out the intervals with a rollout round or an evaluation in the same way. Both ran on the same machine; when they
did not run side by side the ratio carries the machine's drift (say so beside the figure).
Writes ravl_parity.{json,md,png} beside this script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script
OFFICIAL_REPO = "https://github.com/anyasims/edge-of-reach"


def check_checkout(path: Path) -> str:
    """The official checkout's commit; exits with how to get it when it is missing or modified."""
    if not (path / "train_ravl_agent.py").is_file():
        raise SystemExit(f"--checkout {path}: no train_ravl_agent.py there. Get the official code with `git clone "
                         f"{OFFICIAL_REPO} {path}` (commit 18b5085 was used; "
                         "experiments/peers/ravl_official/README.md)")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True).stdout.strip()

    commit, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain")
    if dirty:
        raise SystemExit(f"--checkout {path} has local changes: the comparison runs the official code unmodified")
    return commit


def official_agent(d: Path) -> dict:
    r = json.loads((d / "results.json").read_text())
    return {"seed": r["seed"], "steps": [e["step"] for e in r["evals"]],
            "scores": [e["normalized_mean"] for e in r["evals"]], "grad_steps_per_s": r.get("grad_steps_per_s"),
            "commit": r.get("commit"), "checkout_modified": r.get("checkout_modified"), "model": r.get("model")}


def ctrl_rl_agent(d: Path, env: str) -> dict:
    from ctrl_rl.storage.datasets.scores import normalized_score

    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in rows if "episode_return" in r and r["episode_return"] == r["episode_return"]]
    rates = [r["updates_per_s"] for r in rows[1:] if "updates_per_s" in r]
    code = json.loads((d / "config.json").read_text()).get("code") or {}
    return {"seed": int(d.name.rsplit("-s", 1)[1]), "steps": [r["step"] for r in evals],
            "scores": [float(normalized_score(env, r["episode_return"], "local")[0]) for r in evals],
            "grad_steps_per_s": statistics.median(rates) if rates else None,
            "commit": (code.get("started") or {}).get("git")}


def at_step(run: dict, step: int) -> float | None:
    """The score of the evaluation at exactly ``step`` (both sides evaluate on multiples of their interval)."""
    return next((s for t, s in zip(run["steps"], run["scores"]) if t == step), None)


def welch(a: list[float], b: list[float]) -> dict:
    from scipy import stats

    t = stats.ttest_ind(a, b, equal_var=False)
    return {"t": float(t.statistic), "p": float(t.pvalue), "mean_ctrl_rl": statistics.mean(a),
            "mean_official": statistics.mean(b)}


def fits(official_fits: list[Path], ctrl_fit: Path) -> dict:
    """Holdout MSE (elites, standardised targets, ctrl_rl's seed-0 holdout rows) of each official fit beside ctrl_rl's
    fit after the same number of epochs (its ``holdout_mse_best``: the elites' best weights so far, which is what
    the official code saves), and ctrl_rl's final fit."""
    rows = [json.loads(x) for x in (ctrl_fit / "metrics.jsonl").read_text().splitlines() if x.strip()]
    by_epoch = {r["step"]: r for r in rows}
    equal = []
    for d in official_fits:
        res = json.loads((d / "results.json").read_text())
        o = res["holdout"]
        epochs = max(e["epoch"] for e in res["fit"]["epochs"]) if res.get("fit") else None  # epoch 0: before training
        mine = by_epoch.get(epochs) if epochs is not None else None
        equal.append({"epochs": epochs, "official": {"run": str(d), "rows": o["rows"],
                                                     "standardised_mse_elites": o["standardised_mse_elites"],
                                                     "raw_mse_elites": o["raw_mse_elites"],
                                                     "standardised_mse_per_member": o["standardised_mse"],
                                                     "wall_seconds": res.get("wall_seconds"),
                                                     "threads": res.get("torch_threads")},
                      "ctrl_rl": None if mine is None else {"standardised_mse_elites": mine["holdout_mse_best"],
                                                            "calibration": mine.get("calibration")}})
    return {"equal_epochs": equal,
            "ctrl_rl_final": {"epochs": rows[-1]["step"], "standardised_mse_elites": rows[-1]["holdout_mse_best"],
                              "calibration": rows[-1].get("calibration")}}


def agents_model(official_agents: list[dict]) -> str:
    """Which model the official agents imagined with: ctrl_rl's fit written in the official format (convert.py
    leaves convert.json two levels above the model folder) or an official fit."""
    kinds = {"ctrl_rl's fit (convert.py)" if (Path(r["model"]).parents[1] / "convert.json").is_file()
             else "an official fit" for r in official_agents if r.get("model")}
    return " and ".join(sorted(kinds)) or "unknown"


def markdown(p: dict) -> str:
    f, s, w = p["fits"], p["scores"], p["welch"]
    lines = ["# RAVL: ctrl_rl against the official code (same data, budget and seeds)", "",
             f"{p['date']}; official checkout {p['official_commit'][:7]}; step {p['at']:,}; the official agents "
             f"imagined with {p['official_agents_model']}.", "",
             "| | ctrl_rl | official |", "|---|---|---|",
             f"| score at {p['at']:,} steps, per seed | {', '.join(f'{x:.1f}' for x in s['ctrl_rl'])} | "
             f"{', '.join(f'{x:.1f}' for x in s['official'])} |",
             f"| mean | {w['mean_ctrl_rl']:.1f} | {w['mean_official']:.1f} |",
             f"| gradient steps/s (median of seeds) | {p['speed']['ctrl_rl']:.1f} | {p['speed']['official']:.1f} |"]
    for e in f["equal_epochs"]:
        mine = e["ctrl_rl"]
        lines.append(f"| dynamics holdout MSE after {e['epochs']} epochs (elites, standardised targets, ctrl_rl's "
                     f"seed-0 holdout rows) | {'-' if mine is None else format(mine['standardised_mse_elites'], '.5f')}"
                     f" | {e['official']['standardised_mse_elites']:.5f} |")
    fin = f["ctrl_rl_final"]
    lines += ["", f"ctrl_rl's fit at its end: {fin['standardised_mse_elites']:.5f} after {fin['epochs']} epochs.",
              "", f"Welch's t-test: t = {w['t']:.2f}, p = {w['p']:.3f}. Speed ratio ctrl_rl / official: "
              f"**{p['speed']['ratio']:.2f}**.", "", f"`{p['command']}`", ""]
    return "\n".join(lines)


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, side in enumerate(("ctrl_rl", "official")):
        for run in p["runs"][side]:
            ax.plot(run["steps"], run["scores"], color=f"C{i}", alpha=0.8, lw=1,
                    label=side if run is p["runs"][side][0] else None)
    ax.set_xlabel("gradient steps")
    ax.set_ylabel("normalized score (local v5 references)")
    ax.set_title("RAVL, ctrl_rl vs official")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", type=Path, required=True, help="the official code's git checkout")
    ap.add_argument("--official-fit", type=Path, nargs="*", default=[],
                    help="run.py --stage dynamics --out DIRs (each beside ctrl_rl's fit after as many epochs)")
    ap.add_argument("--official-agents", type=Path, nargs="+", required=True, help="run.py --stage agent --out DIRs")
    ap.add_argument("--ctrl-rl", type=Path, required=True, help="<runs-dir>/<dataset> with dynamics/ and ravl-s*/")
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--at", type=int, default=20_000, help="the gradient step both sides are compared at")
    ap.add_argument("--name", default="ravl_parity")
    a = ap.parse_args()
    commit = check_checkout(a.checkout)
    official = [official_agent(d) for d in a.official_agents]
    ours = [ctrl_rl_agent(d, a.env) for d in sorted(a.ctrl_rl.glob("ravl-s*")) if d.is_dir()]
    seeds = sorted({r["seed"] for r in official} & {r["seed"] for r in ours})
    pick = {side: [next(r for r in runs if r["seed"] == s) for s in seeds]
            for side, runs in (("ctrl_rl", ours), ("official", official))}
    scores = {side: [at_step(r, a.at) for r in runs] for side, runs in pick.items()}
    if any(x is None for v in scores.values() for x in v):
        raise SystemExit(f"not every run has an evaluation at step {a.at}: {scores}")
    speed = {side: statistics.median(r["grad_steps_per_s"] for r in runs) for side, runs in pick.items()}
    speed["ratio"] = speed["ctrl_rl"] / speed["official"]
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "official_commit": commit,
               "command": "python experiments/ravl_parity/compare.py " + " ".join(sys.argv[1:]), "at": a.at,
               "seeds": seeds, "runs": pick, "scores": scores, "welch": welch(scores["ctrl_rl"], scores["official"]),
               "speed": speed, "fits": fits(a.official_fit, a.ctrl_rl / "dynamics"),
               "official_agents_model": agents_model(pick["official"])}
    write_result(a.name, payload, markdown(payload), folder=RESULTS)
    plot(payload, RESULTS / f"{a.name}.png")


if __name__ == "__main__":
    main()
