"""The edge-of-reach check over seeds: MBPO's and RAVL's Q-values against the task's value range and against their
policies' true values, per seed and aggregated (issue 28, section 4).

``edge_of_reach.py --seed S`` runs MBPO (SAC, 2 critics, clipped double Q) and RAVL (EDAC, 10 critics) side by side
on the true simulator (``--model true``) with k = 5 rollouts from dataset states and no penalty, one seed per call.
This script reads those runs for every seed in ``--seeds`` and, for each run:

- its logged batch Q (``stats/q_mean``, ``stats/q_max``) against gradient steps, and the first logged step where
  q_mean exceeds r_max / (1 - gamma), the largest value any policy of this task can have (a blow-up: no
  policy's value is that large, whatever the policy);
- ``q_truth.measure`` on its latest checkpoint: the critics' Q at (s, a ~ pi) against the Monte Carlo value G of
  the same policy in the real simulator from the same states (``Q / G``: how far the critics overestimate the value
  of the policy they train; ``corr(Q, G)``: whether they rank states), cached beside the run per checkpoint step;
- its evaluation returns.

Each summary keeps every run's record in seeds.json; a later call takes a run's record from there when its directory
is missing (``--carry``: a finished seed need not be rerun on a new machine), and says so in seeds.md.

Aggregates with rliable (IQM and 95% stratified-bootstrap CIs over seeds) of the final Q / G and the final q_mean,
and the probability that RAVL's Q / G is below MBPO's over seed pairs. Writes seeds.{json,md,png} in
``--out-dir`` (default: this folder).

    python experiments/edge_of_reach/seeds.py --runs-dir runs/edge_of_reach --seeds 0 1 2 \\
        [--dataset hopper-medium-v5] [--states 200] [--horizon 500]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # this study's folder: its results live beside the script
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py
sys.path.insert(0, str(HERE))  # edge_of_reach.py, q_truth.py
from common import iqm_ci, runs_commit, write_result  # noqa: E402
from edge_of_reach import ALGOS, PAPER_STEPS, checkpoint_step, read_run, value_scales  # noqa: E402


def first_above(q: list, bound: float) -> int | None:
    """The first logged step whose q_mean exceeds ``bound`` (None: never)."""
    return next((step for step, qm, _ in q if qm is not None and qm > bound), None)


def truth(run_dir: Path, ds, states: int, horizon: int, seed: int) -> dict | None:
    """``q_truth.measure`` on the run's latest checkpoint, cached in ``<run>.q_truth.json`` keyed by its step and
    the measurement's settings (None without a checkpoint)."""
    step = checkpoint_step(run_dir)
    if step is None:
        return None
    cache = run_dir.parent / f"{run_dir.name}.q_truth.json"
    key = f"{step}:{states}:{horizon}:{seed}"
    got = json.loads(cache.read_text()) if cache.is_file() else {}
    if key not in got:
        from q_truth import measure

        got[key] = measure(run_dir, ds, states, horizon, seed)
        cache.write_text(json.dumps(got, indent=1) + "\n")
    return got[key]


def carried(path: Path | None, states: int, horizon: int) -> dict[str, dict[str, dict]]:
    """The per-run records of an earlier ``seeds.json`` measured with the same Q-against-truth settings, of runs
    that had finished: a run whose directory is gone (a new machine) keeps its record instead of being rerun (an
    unfinished one is rerun). Empty without the file."""
    if path is None or not path.is_file():
        return {}
    p = json.loads(path.read_text())
    if p.get("truth_settings") != {"states": states, "horizon": horizon}:
        return {}
    return {algo: {s: {**r, "carried_from": r.get("carried_from") or f"{path.name} of {p.get('date')}"}
                   for s, r in rs.items() if r.get("finished")} for algo, rs in p.get("runs", {}).items()}


def collect(runs_dir: Path, seeds: list[int], ds, scales: dict, states: int, horizon: int,
            earlier: dict[str, dict[str, dict]] | None = None) -> dict:
    """Every (algo, seed) run in ``runs_dir``: curves, first step above the bound, Q against the truth. A run
    missing from ``runs_dir`` takes its record from ``earlier`` (``carried``) when that has one."""
    out: dict[str, dict[str, dict]] = {}
    for algo in ALGOS:
        for seed in seeds:
            d = runs_dir / f"{algo}-s{seed}"
            if not (d / "metrics.jsonl").is_file():
                if (old := (earlier or {}).get(algo, {}).get(str(seed))) is not None:
                    out.setdefault(algo, {})[str(seed)] = old
                continue
            r = read_run(d)
            t = truth(d, ds, states, horizon, seed) if ds is not None else None
            out.setdefault(algo, {})[str(seed)] = {
                "run_dir": str(d), "commit": runs_commit([d]), "steps_done": r["steps_done"],
                "finished": r["steps_done"] >= ((r["config"].get("run") or {}).get("total_steps") or float("inf")),
                "q": r["q"],
                "eval": r["eval"], "updates_per_s_median": r["updates_per_s_median"],
                "wall_time_s": r["wall_time_s"],
                "first_step_above_bound": first_above(r["q"], scales["q_bound"]),
                "q_mean_last": r["q"][-1][1] if r["q"] else None,
                "q_max_largest": max((x[2] for x in r["q"] if x[2] is not None), default=None),
                "truth": t}
    return out


def p_below(a: list[float], b: list[float]) -> float:
    """P(X < Y) for X drawn from ``a`` and Y from ``b`` over every pair (ties count half): the probability of
    improvement (lower is better here) of rliable, for one task."""
    pairs = [(x < y) + 0.5 * (x == y) for x in a for y in b]
    return sum(pairs) / len(pairs)


def aggregate(runs: dict) -> dict:
    ratio = {algo: [r["truth"]["ratio_mean"] for r in rs.values() if r["truth"]] for algo, rs in runs.items()}
    qlast = {algo: [r["q_mean_last"] for r in rs.values() if r["q_mean_last"] is not None]
             for algo, rs in runs.items()}
    ret = {algo: [r["eval"][-1][1] for r in rs.values() if r["eval"]] for algo, rs in runs.items()}
    agg: dict = {"q_over_g": iqm_ci(ratio), "q_mean_last": iqm_ci(qlast), "eval_return_last": iqm_ci(ret)}
    if ratio.get("ravl") and ratio.get("mbpo"):
        agg["p_ravl_ratio_below_mbpo"] = p_below(ratio["ravl"], ratio["mbpo"])
    return agg


def reading(runs: dict, agg: dict, scales: dict) -> str:
    """What the numbers say, by the rules in the text."""
    b = scales["q_bound"]
    parts = []
    for algo, rs in runs.items():
        above = {s: r["first_step_above_bound"] for s, r in rs.items() if r["first_step_above_bound"] is not None}
        steps = ", ".join(f"{r['steps_done']:,}" for r in rs.values())
        if above:
            where = "; ".join(f"seed {s} at step {st:,}" for s, st in above.items())
            parts.append(f"{algo}: q_mean passes r_max/(1-gamma) = {b:.0f} in {len(above)} of {len(rs)} seeds "
                         f"({where}): a blow-up, a value no policy of this task can have")
        else:
            top = max((r["q_mean_last"] or 0.0) for r in rs.values())
            parts.append(f"{algo}: q_mean stays below r_max/(1-gamma) = {b:.0f} in all {len(rs)} seeds (largest last "
                         f"q_mean {top:.0f}; steps {steps}): no blow-up at this budget")
        g = agg["q_over_g"].get(algo)
        if g:
            parts[-1] += (f"; its critics' Q is {g['iqm']:.2f}x the policy's true value G (IQM over seeds, 95% CI "
                          f"{g['ci95'][0]:.2f}-{g['ci95'][1]:.2f})")
    text = ". ".join(parts) + "."
    if "p_ravl_ratio_below_mbpo" in agg:
        text += (f" P(RAVL's Q/G < MBPO's) over seed pairs: {agg['p_ravl_ratio_below_mbpo']:.2f} "
                 "(1.0: every RAVL seed overestimates less than every MBPO seed).")
    return text


def markdown(p: dict) -> str:
    s, b = p["value_scales"], p["budget"]
    lines = ["# Edge-of-reach with the true dynamics over seeds: MBPO against RAVL", "",
             f"- Command: `{p['command']}` ({p['date']}); runs recorded commits {p['commits']}",
             f"- Data `{p['dataset']}`; seeds {p['seeds']}; k = 5 rollouts from dataset states, no penalty, real ratio "
             f"0.05 (edge_of_reach.py's settings); budget {b['steps']} gradient steps per run "
             f"(the paper: {PAPER_STEPS:,})",
             f"- Value scales (gamma {s['gamma']}): r_max/(1-gamma) = **{s['q_bound']:.0f}**; the data's mean "
             f"discounted return-to-go {s['mc_return_mean']:.0f}",
             f"- Q against the truth: {p['truth_settings']['states']} dataset states per run, G over at most "
             f"{p['truth_settings']['horizon']} simulator steps (q_truth.py), at each run's latest checkpoint", "",
             "| algo | seed | steps | first step q_mean > bound | last q_mean | largest q_max | Q / G | corr(Q, G) | "
             "last eval return | updates/s |", "|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt=".3g"):
        return "—" if v is None else format(v, fmt)

    for algo, rs in p["runs"].items():
        for seed, r in rs.items():
            t = r["truth"] or {}
            lines.append(f"| {algo} | {seed} | {r['steps_done']:,} | {f(r['first_step_above_bound'], ',')} | "
                         f"{f(r['q_mean_last'])} | {f(r['q_max_largest'])} | {f(t.get('ratio_mean'), '.2f')} | "
                         f"{f(t.get('corr_q_mc'), '.2f')} | {f(r['eval'][-1][1] if r['eval'] else None, '.0f')} | "
                         f"{f(r['updates_per_s_median'])} |")
    lines += ["", "| aggregate (IQM [95% CI]) | " + " | ".join(p["runs"]) + " |",
              "|---|" + "---|" * len(p["runs"])]
    for key, name in (("q_over_g", "Q / G"), ("q_mean_last", "last q_mean"), ("eval_return_last", "last return")):
        row = [f"{a['iqm']:.3g} [{a['ci95'][0]:.3g}, {a['ci95'][1]:.3g}]" if (a := p["aggregate"][key].get(algo))
               else "—" for algo in p["runs"]]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    kept = [f"{algo} seed {seed} ({r['carried_from']})" for algo, rs in p["runs"].items() for seed, r in rs.items()
            if r.get("carried_from")]
    if kept:
        lines += ["", "Records kept from an earlier summary (their run directories were not on this machine): "
                  + "; ".join(kept) + "."]
    lines += ["", "## Reading", "", p["reading"], "", "Plot: `seeds.png`.", ""]
    return "\n".join(lines)


def plot(p: dict, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = p["value_scales"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for k, (algo, rs) in enumerate(p["runs"].items()):
        c = f"C{k}"
        for i, r in enumerate(rs.values()):
            lab = algo if i == 0 else None
            axes[0].plot([x[0] for x in r["q"]], [x[1] for x in r["q"]], color=c, lw=1, alpha=0.8, label=lab)
            if r["eval"]:
                axes[2].plot([x[0] for x in r["eval"]], [x[1] for x in r["eval"]], "o-", ms=3, color=c, lw=1,
                             alpha=0.8, label=lab)
            if r["truth"]:
                axes[1].scatter([k + 0.08 * (i - 1)], [r["truth"]["ratio_mean"]], color=c, s=25,
                                label=f"{algo} seeds" if i == 0 else None)
        a = p["aggregate"]["q_over_g"].get(algo)
        if a:
            axes[1].errorbar([k + 0.3], [a["iqm"]], yerr=[[a["iqm"] - a["ci95"][0]], [a["ci95"][1] - a["iqm"]]],
                             fmt="s", color=c, capsize=4, label=f"{algo} IQM, 95% CI")
    axes[0].axhline(s["q_bound"], ls="--", color="gray", lw=0.9, label="r_max/(1-γ)")
    axes[0].axhline(s["mc_return_mean"], ls=":", color="gray", lw=0.9, label="data return-to-go (mean)")
    axes[0].set_yscale("log")
    axes[0].set_title("critics' batch q_mean (each seed)")
    axes[1].axhline(1.0, ls="--", color="gray", lw=0.9)
    axes[1].set_xticks(range(len(p["runs"])), list(p["runs"]))
    axes[1].set_title("Q / true value G at the last checkpoint")
    axes[2].axhline(s["episode_return_mean"], ls=":", color="gray", lw=0.9, label="dataset mean return")
    axes[2].set_title("evaluation return (deterministic)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in (axes[0], axes[2]):
        ax.set_xlabel("gradient steps")
    fig.suptitle(f"edge-of-reach with the true simulator, {p['dataset']}, seeds {p['seeds']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--runs-dir", type=Path, required=True, help="edge_of_reach.py's --runs-dir")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--dataset", default="hopper-medium-v5")
    ap.add_argument("--states", type=int, default=200, help="dataset states per Q-against-truth measurement")
    ap.add_argument("--horizon", type=int, default=500, help="simulator steps of each true-value rollout")
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--carry", type=Path, default=None,
                    help="an earlier seeds.json whose records stand in for runs missing from --runs-dir (default: "
                         "seeds.json in --out-dir; 'none' to use none)")
    a = ap.parse_args(argv)
    import torch

    from ctrl_rl.storage.datasets import load_dataset
    from ctrl_rl.storage.datasets.cache import resolve_dataset_id

    torch.set_num_threads(1)
    path = resolve_dataset_id(a.dataset)
    if path is None:
        raise SystemExit(f"--dataset {a.dataset!r}: expected a generated dataset id such as hopper-medium-v5")
    ds = load_dataset(path)
    scales = value_scales(path, 0.99)
    carry = None if str(a.carry) == "none" else (a.carry or a.out_dir / "seeds.json")
    runs = collect(a.runs_dir.resolve(), a.seeds, ds, scales, a.states, a.horizon,
                   carried(carry, a.states, a.horizon))
    if not runs:
        raise SystemExit(f"no edge_of_reach.py runs for seeds {a.seeds} in {a.runs_dir}")
    agg = aggregate(runs)
    steps = sorted({r["steps_done"] for rs in runs.values() for r in rs.values()})
    payload = {"experiment": "edge-of-reach with the true dynamics, over seeds (issue 28, section 4)",
               "command": "python experiments/edge_of_reach/seeds.py " + " ".join(argv or sys.argv[1:]),
               "date": datetime.date.today().isoformat(),
               "commits": ", ".join(dict.fromkeys(
                   c.strip() for rs in runs.values() for r in rs.values()
                   for c in (r.get("commit") or runs_commit([r["run_dir"]])).split(","))),
               "dataset": a.dataset, "seeds": a.seeds, "budget": {"steps": steps, "paper_steps": PAPER_STEPS},
               "truth_settings": {"states": a.states, "horizon": a.horizon}, "value_scales": scales,
               "runs": runs, "aggregate": agg, "reading": reading(runs, agg, scales)}
    write_result("seeds", payload, markdown(payload), folder=a.out_dir)
    plot(payload, a.out_dir / "seeds.png")
    return payload


if __name__ == "__main__":
    main()
