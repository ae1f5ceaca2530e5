"""Issue 29, section 2: the WSRL study's summary: per-seed curves, rliable aggregates, a plot, and the paper's claims
tested one by one (held / not held / not separated / not answerable).

Reads ``<runs-dir>/study.json`` (the settings ``wsrl_study.py`` ran with) and its runs ``cql-sK``, ``wsrl-sK``,
``rlpd-sK``, ``retained-sK`` (metrics.jsonl: every evaluation; config.json: the commit the run recorded, its dataset,
offline ratio and warm-up) and ``evalnoise-sK.json``; complete runs and the evalnoise files are kept in
``<out-dir>/kept/<name>/`` (gzip, committed) and read from there where the runs dir no longer has them. Scores are
normalized with D4RL's reference returns (the scale WSRL reports; ``--refs local`` for the local v5 references),
recomputed from the logged returns.

The claims (WSRL, ICLR 2025; ALGORITHMS.md §1.5) and how each is judged:

1. **The score at online step 0 equals the pre-trained score**: WSRL's step-0 evaluation against the CQL run's last
   one, per seed. Both evaluate the same deterministic policy on the same env seeds, so they differ only through
   float rounding (a changed thread count) amplified by the simulator. Held when every seed's difference is within
   2 standard errors of an evaluation's mean (the std of the pre-trained policy's episode returns at other env
   seeds, ``evalnoise-sK.json``, over sqrt(evaluation episodes); at least 0.1 points); 0.5 points where that file
   is missing.
2. **No drop of more than 10 points after the warm-up**: the step-0 score minus the lowest evaluation after the
   run's warm-up (its ``learning_starts``), per seed; held when no seed drops by more than 10.
3. **WSRL at or above RLPD over the online phase**: each run's mean score over the online phase (the area under
   its evaluation curve over the steps it spans), on the seeds where both runs reached the budget; rliable's
   probability of improvement P(WSRL > RLPD) with its 95% stratified-bootstrap CI: held when the CI lies above
   0.5, not held when it lies below, not separated otherwise (the IQMs then give only the direction); with fewer
   than 3 seeds it is reported, not judged.
4. **No offline data retained**: every WSRL run's config has no ``--dataset`` and offline ratio 0, and its replay
   never held more transitions than it had taken env steps.

    python experiments/wsrl_study/summarize.py --runs-dir runs/wsrl_study      # or wsrl_study.py --summarize

Writes wsrl_study.{json,md,png} beside this script (``--out-dir`` moves them).
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
    kept_rows,
    read_kept_run,
    write_gz,
    write_result,
)

RESULTS = Path(__file__).resolve().parent
METHODS = ("cql", "wsrl", "rlpd", "retained")
ONLINE = ("wsrl", "rlpd", "retained")
# WSRL's code (ALGORITHMS.md §1.3-1.4, [CODE]): locomotion CQL pre-training 250k gradient steps; online 500k env
# steps (its default flag), 5,000-step warm-up, evaluation every 20k env steps with 20 episodes
PAPER = {"pretrain_steps": 250_000, "online_steps": 500_000, "warmup": 5_000, "eval_every": 20_000,
         "eval_episodes": 20}
DROP_LIMIT = 10.0  # claim 2: normalized points
NOISE_K = 2.0  # claim 1: standard errors
FALLBACK_TOL = 0.5  # claim 1: points, where no evaluation-noise estimate exists
TOL_FLOOR = 0.1  # claim 1: points, the least tolerance (a policy whose episodes all return the same has se 0)
MIN_SEEDS = 3  # claim 3: fewer seeds than this are reported, not judged (issue 29: three seeds minimum)


def scorer(env: str, refs: str):
    """``return -> normalized score`` with the ``refs`` table (None where it has no entry for ``env``)."""
    from ctrl_rl.errors import UserInputError
    from ctrl_rl.storage.datasets.scores import normalized_score, resolve_references

    try:
        normalized_score(env, 0.0, refs)
    except UserInputError:
        return None, None
    return (lambda r: float(normalized_score(env, r, refs)[0])), resolve_references(refs).source


def mean_over_run(steps: list[int], scores: list[float]) -> float | None:
    """The area under the evaluation curve (trapezoids) over the steps it spans, divided by that span."""
    if len(steps) < 2 or steps[-1] == steps[0]:
        return None
    area = sum((s1 - s0) * (y0 + y1) / 2 for s0, s1, y0, y1 in zip(steps, steps[1:], scores, scores[1:]))
    return area / (steps[-1] - steps[0])


def read_run(d: Path, method: str, budget: int, score) -> dict | None:
    """One run's evaluation curve, settings and provenance, or None before its first evaluation."""
    m = d / "metrics.jsonl"
    if not m.is_file():
        return None
    rows = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    key = "episode_return" if method == "cql" else "eval_return"
    evals = [r for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not evals:
        return None
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    run, loop, code = cfg.get("run") or {}, (cfg.get("run") or {}).get("loop") or {}, cfg.get("code") or {}
    steps, returns = [int(r["step"]) for r in evals], [float(r[key]) for r in evals]
    replay = [(int(r["step"]), int(r["replay_size"])) for r in rows if "replay_size" in r]
    return {"steps": steps, "returns": returns, "scores": [score(x) for x in returns] if score else None,
            "budget": budget, "complete": steps[-1] >= budget, "last_step": int(rows[-1]["step"]),
            "wall_time_s": rows[-1].get("wall_time"), "warmup": loop.get("learning_starts"),
            "dataset": run.get("dataset"), "offline_ratio": loop.get("offline_ratio"), "init": loop.get("init"),
            "replay_excess": max((size - step for step, size in replay), default=None),
            "commit": (code.get("started") or {}).get("git"), "resumed_commit": (code.get("resumed") or {}).get("git"),
            "data_sha256": (cfg.get("data") or {}).get("sha256")}


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def check_claims(runs: dict[str, dict[int, dict]], noise_se: dict[int, float | None],
                 drop_limit: float = DROP_LIMIT, min_seeds: int = MIN_SEEDS) -> list[dict]:
    """The four claims, each ``{"claim", "verdict", "how", "per_seed", ...}``. ``runs``: method -> seed -> run
    (read_run's ``steps``, ``scores``, ``complete``, ``warmup``, ``dataset``, ``offline_ratio``, ``replay_excess``);
    ``noise_se``: seed -> the standard error of an evaluation's mean score (points), None where unknown; claim 3 is
    judged from ``min_seeds`` seeds on."""
    cql, wsrl, rlpd = runs.get("cql", {}), runs.get("wsrl", {}), runs.get("rlpd", {})
    out = []

    # 1. step 0 = the pre-trained score
    per = {}
    for s, w in sorted(wsrl.items()):
        c = cql.get(s)
        if c is None or not c["complete"] or w["steps"][0] != 0:
            continue
        se = noise_se.get(s)
        tol = max(NOISE_K * se, TOL_FLOOR) if se is not None else FALLBACK_TOL
        diff = w["scores"][0] - c["scores"][-1]
        per[s] = {"pretrained": c["scores"][-1], "step0": w["scores"][0], "diff": diff, "tolerance": tol,
                  "tolerance_from": "evaluation noise" if se is not None else "fixed 0.5 points",
                  "within": abs(diff) <= tol}
    verdict = "not answerable" if not per else "held" if all(p["within"] for p in per.values()) else "not held"
    out.append({"claim": "score at online step 0 equals the pre-trained score", "verdict": verdict, "per_seed": per,
                "how": f"|WSRL step 0 - CQL's last evaluation| within {NOISE_K:g} standard errors of an "
                       "evaluation's mean (evalnoise-sK.json), every seed",
                "detail": "; ".join(f"seed {s}: {_fmt(p['step0'], 2)} vs {_fmt(p['pretrained'], 2)} (diff "
                                    f"{p['diff']:+.2f}, tolerance {p['tolerance']:.2f})" for s, p in per.items())})

    # 2. no drop of more than drop_limit points after the warm-up
    per = {}
    for s, w in sorted(wsrl.items()):
        warm = w.get("warmup") or 0
        after = [(y, t) for t, y in zip(w["steps"], w["scores"]) if t > warm]
        if w["steps"][0] != 0 or not after:
            continue
        low, at = min(after)
        per[s] = {"step0": w["scores"][0], "min_after_warmup": low, "at_step": at, "drop": w["scores"][0] - low,
                  "warmup": warm, "complete": w["complete"]}
    verdict = ("not answerable" if not per else
               "held" if all(p["drop"] <= drop_limit for p in per.values()) else "not held")
    out.append({"claim": f"no drop of more than {drop_limit:g} points after the warm-up", "verdict": verdict,
                "per_seed": per, "how": f"step-0 score minus the lowest evaluation after learning_starts, every seed "
                                        f"at most {drop_limit:g}",
                "detail": "; ".join(f"seed {s}: drop {p['drop']:+.1f} (lowest {p['min_after_warmup']:.1f} at step "
                                    f"{p['at_step']:,}{'' if p['complete'] else ', run incomplete'})"
                                    for s, p in per.items())})

    # 3. WSRL at or above RLPD over the online phase
    seeds = sorted(s for s in wsrl if s in rlpd and wsrl[s]["complete"] and rlpd[s]["complete"])
    means: dict[int, dict[str, float]] = {}
    for s in seeds:
        mw, mr = (mean_over_run(x[s]["steps"], x[s]["scores"]) for x in (wsrl, rlpd))
        if mw is not None and mr is not None:
            means[s] = {"wsrl": mw, "rlpd": mr}
    c3: dict = {"claim": "WSRL at or above RLPD over the online phase", "per_seed": means,
                "how": "mean score over the online phase per seed; rliable P(WSRL > RLPD) with its 95% stratified "
                       "bootstrap CI: held above 0.5, not held below, not separated when the CI contains 0.5; "
                       f"judged from {min_seeds} seeds on"}
    if not means:
        c3.update(verdict="not answerable", detail="no seed with complete WSRL and RLPD runs")
    else:
        w, r = [p["wsrl"] for p in means.values()], [p["rlpd"] for p in means.values()]
        agg = {"wsrl": iqm_seeds(w, iqm_ci), "rlpd": iqm_seeds(r, iqm_ci)}
        poi = improvement_seeds(w, r, improvement_ci)
        lo, hi = poi["ci95"]
        verdict = ("not answerable" if len(means) < min_seeds else
                   "held" if lo > 0.5 else "not held" if hi < 0.5 else "not separated")
        c3.update(verdict=verdict, iqm=agg, probability_of_improvement=poi,
                  detail=f"IQM WSRL {_ci(agg['wsrl'])} vs RLPD {_ci(agg['rlpd'])}; P(WSRL > RLPD) {poi['p']:.2f} "
                         f"[{lo:.2f}, {hi:.2f}] over "
                         f"{len(means)} seed(s)" + (f", fewer than {min_seeds}: not judged" if len(means) < min_seeds
                                                  else ""))
    out.append(c3)

    # 4. no offline data retained
    per = {s: {"dataset": w.get("dataset"), "offline_ratio": w.get("offline_ratio"),
               "replay_excess": w.get("replay_excess"),
               "ok": w.get("dataset") is None and (w.get("offline_ratio") or 0.0) == 0.0
               and (w.get("replay_excess") is None or w["replay_excess"] <= 0)} for s, w in sorted(wsrl.items())}
    verdict = "not answerable" if not per else "held" if all(p["ok"] for p in per.values()) else "not held"
    out.append({"claim": "no offline data retained", "verdict": verdict, "per_seed": per,
                "how": "each WSRL run's config.json: no --dataset, offline ratio 0; its replay size never above its "
                       "env steps",
                "detail": "; ".join(f"seed {s}: dataset {p['dataset']}, offline ratio {p['offline_ratio']}, replay "
                                    f"size - env steps at most {p['replay_excess']}" for s, p in per.items())})
    return out


def aggregates(runs: dict[str, dict[int, dict]]) -> dict:
    """Per method: rliable IQMs with 95% CIs of the final score, the step-0 score and (online) the mean over the run,
    over the runs that reached the budget."""
    out = {}
    for m, rs in runs.items():
        done = [r for r in rs.values() if r["complete"] and r["scores"]]
        if not done:
            continue
        vals = {"final": [r["scores"][-1] for r in done]}
        if m in ONLINE:
            vals["step0"] = [r["scores"][0] for r in done if r["steps"][0] == 0]
            vals["mean_over_run"] = [v for r in done if (v := mean_over_run(r["steps"], r["scores"])) is not None]
        out[m] = {k: iqm_seeds(v, iqm_ci) for k, v in vals.items() if v}
    return out


def curve_bands(rs: dict[int, dict]) -> dict:
    """IQM over the seeds that evaluated at each step, with rliable's 95% CI."""
    at: dict[int, list[float]] = {}
    for r in rs.values():
        for t, y in zip(r["steps"], r["scores"] or []):
            at.setdefault(t, []).append(y)
    steps = sorted(at)
    band = [iqm_seeds(at[t], iqm_ci) for t in steps]
    return {"steps": steps, "iqm": [b["iqm"] for b in band], "lo": [b["ci95"][0] for b in band],
            "hi": [b["ci95"][1] for b in band], "seeds": [len(at[t]) for t in steps]}


def noise_estimates(runs_dir: Path, seeds: list[int], episodes: int, scale: float | None,
                    kept: Path | None = None) -> dict[int, dict]:
    """Seed -> the pre-trained policy's episode-return std at other env seeds and the standard error (points) of an
    evaluation's mean over ``episodes`` episodes (each ``evalnoise-sK.json`` kept in ``kept`` as one JSON line, and
    read from there where the file is gone)."""
    out = {}
    for s in seeds:
        p = runs_dir / f"evalnoise-s{s}.json"
        rec = json.loads(p.read_text()) if p.is_file() else None
        if rec is not None and kept is not None:
            write_gz(kept / f"{p.name}.gz", (json.dumps(rec) + "\n").encode())
        elif rec is None and kept is not None:
            rec = next(iter(kept_rows(kept, p.name)), None)
        if rec is not None:
            se = rec["return_std"] / math.sqrt(episodes)
            out[s] = {"return_mean": rec["return_mean"], "return_std": rec["return_std"], "episodes": rec["episodes"],
                      "se_return": se, "se_points": se * scale if scale is not None else None}
    return out


def summarize(runs_dir: Path, out_dir: Path = RESULTS, refs: str = "d4rl", name: str = "wsrl_study") -> dict:
    """Read the runs, test the claims, write ``<name>.{json,md,png}`` into ``out_dir``; returns the payload."""
    study_file = runs_dir / "study.json"
    if not study_file.is_file():
        raise SystemExit(f"{study_file} does not exist: expected the runs dir of experiments/wsrl_study/wsrl_study.py")
    study = json.loads(study_file.read_text())
    score, source = scorer(study["env"], refs)
    if score is None:
        raise SystemExit(f"--refs {refs}: no reference returns for {study['env']}: expected a Hopper, HalfCheetah, "
                         "Walker2d or Ant task (or --refs with a JSON file that has one)")
    scale = score(1.0) - score(0.0)
    runs: dict[str, dict[int, dict]] = {}
    for m in METHODS:
        budget = study["pretrain_steps"] if m == "cql" else study["online_steps"]
        for s in study["seeds"]:
            r = read_kept_run(runs_dir / f"{m}-s{s}", out_dir / "kept" / name / f"{m}-s{s}",
                              lambda d, m=m, budget=budget: read_run(d, m, budget, score))
            if r is not None:
                runs.setdefault(m, {})[s] = r
    noise = noise_estimates(runs_dir, study["seeds"], study["eval_episodes"], scale, out_dir / "kept" / name)
    claims = check_claims(runs, {s: n["se_points"] for s, n in noise.items()})
    commits = sorted({c for rs in runs.values() for r in rs.values() for c in (r["commit"], r["resumed_commit"]) if c})
    # the dataset's sha256 each run recorded (config.json "data", since the runs record it): one value, or the
    # runs were trained on different files under the same id (a regenerated medium-replay, another machine)
    with_data = [r for rs in runs.values() for r in rs.values() if r.get("dataset")]
    data = {"sha256": sorted({r["data_sha256"] for r in with_data if r.get("data_sha256")}),
            "runs_recording": sum(bool(r.get("data_sha256")) for r in with_data), "runs_with_dataset": len(with_data)}
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "summarized_at": git_commit(),
               "study": study, "score_reference": source, "paper_budgets": PAPER,
               "run_commits": commits, "data": data,
               "runs": {m: {str(s): r for s, r in rs.items()} for m, rs in runs.items()},
               "eval_noise": {str(s): n for s, n in noise.items()}, "aggregate": aggregates(runs),
               "curves": {m: curve_bands(rs) for m, rs in runs.items()}, "claims": claims,
               "command": f"python experiments/wsrl_study/summarize.py --runs-dir {runs_dir} --refs {refs}"}
    write_result(name, payload, markdown(payload), folder=out_dir)
    plot(payload, out_dir / f"{name}.png")
    for c in claims:
        print(f"[claim] {c['claim']}: {c['verdict'].upper()} ({c.get('detail') or '-'})", flush=True)
    return payload


def _ci(a: dict | None) -> str:
    return "-" if not a else f"{a['iqm']:.1f} [{a['ci95'][0]:.1f}, {a['ci95'][1]:.1f}]"


def _data_line(d: dict | None) -> str:
    if not d or not d["runs_with_dataset"]:
        return "Data: no run with a dataset yet."
    shas = ", ".join(x[:12] for x in d["sha256"]) or "none recorded"
    warn = " **The runs trained on different files under one id.**" if len(d["sha256"]) > 1 else ""
    return (f"Data: sha256 {shas}, recorded by {d['runs_recording']} of the {d['runs_with_dataset']} runs that "
            f"read the dataset (config.json `data`; runs started before it was recorded have none).{warn}")


def markdown(p: dict) -> str:
    st, paper = p["study"], p["paper_budgets"]
    lines = [f"# WSRL's claims on {st['dataset']} ({st['env']})", "",
             f"{p['date']}; summarized at commit {p['summarized_at']}; runs recorded commits "
             f"{', '.join(p['run_commits']) or '-'}. Scores: {p['score_reference']}. IQM over seeds with 95% "
             "stratified-bootstrap CIs (rliable, 2,000 resamples), over the runs that reached the budget.", "",
             _data_line(p.get("data")), "",
             f"Budgets: CQL pre-training {st['pretrain_steps']:,} gradient steps (WSRL's code: "
             f"{paper['pretrain_steps']:,}, {st['pretrain_steps'] / paper['pretrain_steps']:.0%}); online "
             f"{st['online_steps']:,} env steps (WSRL's code: {paper['online_steps']:,}, "
             f"{st['online_steps'] / paper['online_steps']:.0%}); evaluation every {st['eval_every']:,} env steps with "
             f"{st['eval_episodes']} episodes (WSRL's code: every {paper['eval_every']:,}, {paper['eval_episodes']}); "
             f"seeds {' '.join(map(str, st['seeds']))}.", "",
             "| method | runs (complete / started) | last step reached | step 0 | final | mean over the online phase |",
             "|---|---|---|---|---|---|"]
    for m, rs in p["runs"].items():
        a = p["aggregate"].get(m, {})
        done = sum(r["complete"] for r in rs.values())
        last = min(r["last_step"] for r in rs.values())
        lines.append(f"| {m} | {done} / {len(rs)} | {last:,} | {_ci(a.get('step0'))} | {_ci(a.get('final'))} | "
                     f"{_ci(a.get('mean_over_run'))} |")
    lines += ["", "## Claims", ""]
    for c in p["claims"]:
        lines.append(f"- **{c['claim']}: {c['verdict'].upper()}**. {c.get('detail') or 'No run to judge yet'}. "
                     f"Judged: {c['how']}.")
    lines += ["", "## Per-seed curves (normalized score at each evaluation)", ""]
    for m, rs in p["runs"].items():
        for s, r in rs.items():
            pts = ", ".join(f"{t:,}: {y:.1f}" for t, y in zip(r["steps"], r["scores"]))
            lines.append(f"- {m} seed {s} ({r['commit']}): {pts}")
    lines += ["", f"`{p['command']}`", ""]
    return "\n".join(lines)


def plot(p: dict, path: Path) -> None:
    """Left: CQL pre-training; right: the online phase per method. Thin lines: seeds; thick: IQM with its 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, methods in ((left, ("cql",)), (right, ONLINE)):
        for m in methods:
            if m not in p["runs"]:
                continue
            color = f"C{METHODS.index(m)}"
            for r in p["runs"][m].values():
                ax.plot(r["steps"], r["scores"], color=color, alpha=0.3, lw=0.8)
            c = p["curves"][m]
            ax.plot(c["steps"], c["iqm"], color=color, lw=2, label=f"{m} (IQM, {max(c['seeds'])} seeds)")
            ax.fill_between(c["steps"], c["lo"], c["hi"], color=color, alpha=0.15)
        ax.grid(alpha=0.3)
        ax.set_ylabel("normalized score")
    cql = p["aggregate"].get("cql", {}).get("final")
    if cql:
        right.axhline(cql["iqm"], color="k", ls="--", lw=1, label=f"CQL pre-trained (IQM {cql['iqm']:.1f})")
        right.axhline(cql["iqm"] - DROP_LIMIT, color="k", ls=":", lw=1, label=f"pre-trained - {DROP_LIMIT:g}")
    warm = next((r["warmup"] for r in p["runs"].get("wsrl", {}).values() if r.get("warmup")), None)
    if warm:
        right.axvline(warm, color="gray", ls=":", lw=1)
    left.set_title(f"CQL pre-training on {p['study']['dataset']}")
    left.set_xlabel("gradient steps")
    right.set_title(f"online fine-tuning on {p['study']['env']}")
    right.set_xlabel("online env steps (dotted: end of WSRL's warm-up)")
    for ax in (left, right):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "wsrl_study")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--refs", default="d4rl", help="d4rl, local or a reference JSON file")
    ap.add_argument("--name", default="wsrl_study")
    a = ap.parse_args()
    summarize(a.runs_dir.resolve(), a.out_dir.resolve(), a.refs, a.name)


if __name__ == "__main__":
    main()
