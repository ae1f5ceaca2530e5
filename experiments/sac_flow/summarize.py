"""Issue 29, section 3: the SAC Flow study's summary: per-seed evaluation curves, rliable aggregates, a plot, and the
paper's claim judged as held / not held / not separated (not answerable before 3 complete seeds).

Reads ``<runs-dir>/study.json`` (the settings ``sac_flow_study.py`` ran with) and its runs ``<task>-<variant>-sK``
(metrics.jsonl: the deterministic evaluations, ``eval_return``, and the training episodes' returns; config.json: the
commits the run recorded). Per run, on the evaluations up to the study's budget:

- **final return**: the mean of the evaluations in the last 10% of the budget (steps >= 0.9 x budget: at 100k steps
  with an evaluation every 5k, those at 90k, 95k and 100k);
- **AUC**: the mean evaluation return over the run (trapezoids over steps 0 to the budget, divided by the budget).

Every complete run's ``config.json`` and ``metrics.jsonl`` are kept in ``<out-dir>/kept/<run>/`` (gzip, committed with
the results: ``common.keep_run``); a run whose directory is gone (another machine) is read from there.

Aggregates over the complete runs: rliable's IQM with its 95% stratified-bootstrap CI per variant, and the
probability of improvement P(X > Y) (Mann-Whitney over the seeds' runs) with its CI for every flow against every
Gaussian variant (SAC; CrossQ when it ran), on both measures.

**The claim** "the flow policies beat their Gaussian counterpart" (SAC Flow, ICLR 2026; the counterpart here is SAC,
the backbone both flows use in this study), on the final return, per flow F in {Flow-G, Flow-T}:
held when the 95% CI of P(F > SAC) lies above 0.5, not held when it lies below 0.5, not separated when it contains 0.5,
not answerable with fewer than 3 seeds where both runs are complete. The claim as a whole is held when it holds for
both flows, not held when it fails for either, not answerable when a flow is not answerable, else not separated.

    python experiments/sac_flow/summarize.py --runs-dir runs/sac_flow_study     # or sac_flow_study.py --summarize

Writes sac_flow_study.{json,md,png} beside this script (``--out-dir`` moves them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import (  # noqa: E402
    ROOT,
    git_commit,
    improvement_ci,
    improvement_seeds,
    iqm_ci,
    iqm_seeds,
    read_kept_run,
    write_result,
)

RESULTS = Path(__file__).resolve().parent
FLOWS = ("flow-g", "flow-t")
GAUSSIAN = ("sac", "crossq")
LABELS = {"sac": "SAC", "flow-g": "Flow-G", "flow-t": "Flow-T", "crossq": "CrossQ"}
FINAL_FRACTION = 0.1  # final return: the evaluations in the last 10% of the budget
MIN_SEEDS = 3  # fewer complete seed pairs than this are reported, not judged (issue 29: three seeds minimum)
# SAC Flow's released from-scratch code (docs/algorithms/sac_flow.md; ALGORITHMS.md §2.5, [CODE]): 1M env steps
PAPER = {"steps": 1_000_000}


def read_run(d: Path, budget: int) -> dict | None:
    """One run's evaluation curve (up to ``budget``), its training-episode returns, final return, AUC and the
    commits it recorded; None before its first evaluation."""
    from ctrl_rl.learn.logging import read_metrics

    if not (d / "metrics.jsonl").is_file():
        return None
    rows = read_metrics(d)
    evals: dict[int, float] = {}
    for r in rows:  # a step evaluated twice (rows of a killed leg after its checkpoint): the later one
        if isinstance(r.get("eval_return"), (int, float)) and math.isfinite(r["eval_return"]) and r["step"] <= budget:
            evals[int(r["step"])] = float(r["eval_return"])
    if not evals:
        return None
    steps = sorted(evals)
    returns = [evals[t] for t in steps]
    train = [(int(r["step"]), float(r["episode_return"])) for r in rows
             if isinstance(r.get("episode_return"), (int, float)) and "iteration" in r and r["step"] <= budget]
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    code = cfg.get("code") or {}
    complete = steps[-1] >= budget
    last = [y for t, y in zip(steps, returns) if t >= (1 - FINAL_FRACTION) * budget]
    return {"steps": steps, "returns": returns, "train_steps": [t for t, _ in train],
            "train_returns": [y for _, y in train], "complete": complete, "last_step": int(rows[-1]["step"]),
            "final_return": sum(last) / len(last) if complete and last else None,
            "auc": auc(steps, returns, budget) if complete else None,
            "wall_time_s": rows[-1].get("wall_time"), "compile": (cfg.get("config") or {}).get("compile"),
            "commit": (code.get("started") or {}).get("git"), "resumed_commit": (code.get("resumed") or {}).get("git")}


def auc(steps: list[int], returns: list[float], budget: int) -> float | None:
    """The mean return over steps 0..budget: trapezoids between the evaluations (the curve held flat before the
    first and after the last one), divided by the budget."""
    if not steps or budget <= 0:
        return None
    xs, ys = [0, *steps, budget], [returns[0], *returns, returns[-1]]
    area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))
    return area / budget


def verdict_of(poi: dict | None, seeds: int, min_seeds: int = MIN_SEEDS) -> str:
    """held / not held / not separated from P(F > G)'s CI; not answerable before ``min_seeds`` seed pairs."""
    if poi is None or seeds < min_seeds:
        return "not answerable"
    lo, hi = poi["ci95"]
    return "held" if lo > 0.5 else "not held" if hi < 0.5 else "not separated"


def comparisons(runs: dict[str, dict[int, dict]], measure: str) -> dict[str, dict]:
    """P(F > G) with its CI for every flow F and Gaussian variant G that both have complete runs, on ``measure``
    (final_return or auc), over the seeds where both are complete."""
    out = {}
    for f in FLOWS:
        for g in GAUSSIAN:
            seeds = sorted(s for s in runs.get(f, {}) if s in runs.get(g, {})
                           and runs[f][s][measure] is not None and runs[g][s][measure] is not None)
            if seeds:
                x, y = [runs[f][s][measure] for s in seeds], [runs[g][s][measure] for s in seeds]
                out[f"{f}>{g}"] = {**improvement_seeds(x, y, improvement_ci), "seeds": seeds}
    return out


def check_claim(runs: dict[str, dict[int, dict]], min_seeds: int = MIN_SEEDS) -> dict:
    """The claim, on the final return: per flow against SAC, then the whole (module docstring)."""
    poi = comparisons(runs, "final_return")
    per = {}
    for f in FLOWS:
        p = poi.get(f"{f}>sac")
        n = len(p["seeds"]) if p else 0
        per[f] = {"verdict": verdict_of(p, n, min_seeds), "p": p["p"] if p else None,
                  "ci95": p["ci95"] if p else None, "seeds": n}
    vs = [v["verdict"] for v in per.values()]
    whole = ("held" if all(v == "held" for v in vs) else "not held" if "not held" in vs else
             "not answerable" if "not answerable" in vs else "not separated")
    detail = "; ".join(f"P({LABELS[f]} > SAC) = {v['p']:.2f} [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}] over "
                       f"{v['seeds']} seed(s): {v['verdict']}" if v["p"] is not None else
                       f"{LABELS[f]}: no complete seed pair with SAC" for f, v in per.items())
    return {"claim": "the flow policies beat their Gaussian counterpart (Flow-G and Flow-T above SAC)",
            "verdict": whole, "per_flow": per, "detail": detail,
            "how": "final return (mean of the evaluations in the last 10% of the budget) per seed; rliable's "
                   "probability of improvement P(flow > SAC) with its 95% stratified-bootstrap CI: held above 0.5, "
                   "not held below, not separated when the CI contains 0.5, not answerable before "
                   f"{min_seeds} complete seeds; the whole claim held when both flows hold, not held when either "
                   "fails"}


def curve_band(rs: dict[int, dict]) -> dict:
    """IQM over the seeds at each step every one of them evaluated, with rliable's per-step 95% CI."""
    import numpy as np

    common = sorted(set.intersection(*(set(r["steps"]) for r in rs.values())))
    if not common:
        return {"steps": [], "iqm": [], "lo": [], "hi": [], "seeds": len(rs)}
    table = np.array([[dict(zip(r["steps"], r["returns"]))[t] for t in common] for r in rs.values()])  # [seeds, T]
    if len(rs) == 1:
        return {"steps": common, "iqm": table[0].tolist(), "lo": table[0].tolist(), "hi": table[0].tolist(),
                "seeds": 1}
    from rliable import library as rly
    from rliable import metrics

    def per_step(x):  # x: [seeds, T] resampled within each step's column
        return np.array([metrics.aggregate_iqm(x[:, t]) for t in range(x.shape[1])])

    point, ci = rly.get_interval_estimates({"x": table}, per_step, reps=2000)
    return {"steps": common, "iqm": point["x"].tolist(), "lo": ci["x"][0].tolist(), "hi": ci["x"][1].tolist(),
            "seeds": len(rs)}


def summarize(runs_dir: Path, out_dir: Path = RESULTS, name: str = "sac_flow_study") -> dict:
    """Read the runs, judge the claim, write ``<name>.{json,md,png}`` into ``out_dir``; returns the payload."""
    study_file = runs_dir / "study.json"
    if not study_file.is_file():
        raise SystemExit(f"{study_file} does not exist: expected the runs dir of "
                         "experiments/sac_flow/sac_flow_study.py")
    study = json.loads(study_file.read_text())
    runs: dict[str, dict[int, dict]] = {}
    for v in study["variants"]:
        for s in study["seeds"]:
            run = f"{study['task']}-{v}-s{s}"
            r = read_kept_run(runs_dir / run, out_dir / "kept" / run, lambda d: read_run(d, study["steps"]))
            if r is not None:
                runs.setdefault(v, {})[s] = r
    aggregate = {}
    for v, rs in runs.items():
        done = [r for r in rs.values() if r["complete"]]
        if done:
            aggregate[v] = {"final_return": iqm_seeds([r["final_return"] for r in done], iqm_ci),
                            "auc": iqm_seeds([r["auc"] for r in done], iqm_ci), "complete_seeds": len(done)}
    commits = sorted({c for rs in runs.values() for r in rs.values() for c in (r["commit"], r["resumed_commit"]) if c})
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "summarized_at": git_commit(),
               "study": study, "paper": PAPER, "run_commits": commits,
               "runs": {v: {str(s): r for s, r in rs.items()} for v, rs in runs.items()}, "aggregate": aggregate,
               "probability_of_improvement": {"final_return": comparisons(runs, "final_return"),
                                              "auc": comparisons(runs, "auc")},
               "curves": {v: curve_band(rs) for v, rs in runs.items()}, "claim": check_claim(runs),
               "command": f"python experiments/sac_flow/summarize.py --runs-dir {runs_dir}"}
    write_result(name, payload, markdown(payload), folder=out_dir)
    plot(payload, out_dir / f"{name}.png")
    c = payload["claim"]
    print(f"[claim] {c['claim']}: {c['verdict'].upper()} ({c['detail']})", flush=True)
    return payload


def _ci(a: dict | None, digits: int = 0) -> str:
    return "-" if not a else f"{a['iqm']:.{digits}f} [{a['ci95'][0]:.{digits}f}, {a['ci95'][1]:.{digits}f}]"


def markdown(p: dict) -> str:
    st = p["study"]
    lines = [f"# SAC Flow study: Flow-G and Flow-T against SAC on {st['task']} (issue 29, section 3)", "",
             f"{p['date']}; summarized at commit {p['summarized_at']}; the runs recorded commits "
             f"{', '.join(p['run_commits']) or '-'}. Deterministic evaluations of {st['eval_episodes']} episodes every "
             f"{st['eval_every']:,} env steps; budget {st['steps']:,} env steps per run (the paper: "
             f"{p['paper']['steps']:,}: {st['steps'] / p['paper']['steps']:.1%}); seeds "
             f"{' '.join(map(str, st['seeds']))}. IQM over the complete runs with 95% stratified-bootstrap CIs "
             "(rliable, 2,000 resamples).", "",
             "| variant | runs (complete / started) | final return, IQM [95% CI] | AUC, IQM [95% CI] | "
             "final return per seed | wall time per run |", "|---|---|---|---|---|---|"]
    for v, rs in p["runs"].items():
        a = p["aggregate"].get(v, {})
        per = ", ".join(f"s{s}: {r['final_return']:.0f}" if r["final_return"] is not None else
                        f"s{s}: at {r['last_step']:,}" for s, r in rs.items())
        wall = [r["wall_time_s"] / 60 for r in rs.values() if r["complete"] and r["wall_time_s"]]
        lines.append(f"| {LABELS[v]} | {sum(r['complete'] for r in rs.values())} / {len(rs)} | "
                     f"{_ci(a.get('final_return'))} | {_ci(a.get('auc'))} | {per} | "
                     f"{'-' if not wall else f'{min(wall):.0f}-{max(wall):.0f} min'} |")
    lines += ["", "| comparison | P(X > Y), final return [95% CI] | P(X > Y), AUC [95% CI] | seeds |",
              "|---|---|---|---|"]
    fin, area = p["probability_of_improvement"]["final_return"], p["probability_of_improvement"]["auc"]
    for k, f in fin.items():
        x, y = k.split(">")
        a = area.get(k)
        lines.append(f"| {LABELS[x]} > {LABELS[y]} | {f['p']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}] | "
                     + (f"{a['p']:.2f} [{a['ci95'][0]:.2f}, {a['ci95'][1]:.2f}]" if a else "-")
                     + f" | {len(f['seeds'])} ({' '.join(map(str, f['seeds']))}) |")
    c = p["claim"]
    lines += ["", "## Claim", "", f"**{c['claim']}: {c['verdict'].upper()}**. {c['detail']}. Judged: {c['how']}.", "",
              "## Per-seed evaluation curves (return at each evaluation)", ""]
    for v, rs in p["runs"].items():
        for s, r in rs.items():
            pts = ", ".join(f"{t // 1000 if t >= 1000 else t}{'k' if t >= 1000 else ''}: {y:.0f}"
                            for t, y in zip(r["steps"], r["returns"]))
            lines.append(f"- {LABELS[v]} seed {s} ({r['commit']}): {pts}")
    lines += ["", f"`{st['command']}`", ""]
    return "\n".join(lines)


def plot(p: dict, path: Path) -> None:
    """Left: deterministic evaluations (thin: seeds; thick: IQM with its 95% CI); right: training episodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (v, rs) in enumerate(p["runs"].items()):
        color = f"C{i}"
        for r in rs.values():
            left.plot(r["steps"], r["returns"], color=color, alpha=0.3, lw=0.8)
            right.plot(r["train_steps"], r["train_returns"], color=color, alpha=0.5, lw=0.8)
        c = p["curves"][v]
        left.plot(c["steps"], c["iqm"], color=color, lw=2, label=f"{LABELS[v]} (IQM, {c['seeds']} seeds)")
        left.fill_between(c["steps"], c["lo"], c["hi"], color=color, alpha=0.15)
        right.plot([], [], color=color, label=LABELS[v])
    st = p["study"]
    left.set_title(f"{st['task']}: deterministic evaluation ({st['eval_episodes']} episodes)")
    right.set_title("training episodes (stochastic policy), per seed")
    for ax in (left, right):
        ax.set_xlabel("env steps")
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "sac_flow_study")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--name", default="sac_flow_study")
    a = ap.parse_args()
    summarize(a.runs_dir.resolve(), a.out_dir.resolve(), a.name)


if __name__ == "__main__":
    main()
