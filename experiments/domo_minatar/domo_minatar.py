"""DoMo-AC against IMPALA on MinAtar at equal frames (issue 29, section 4): the resumable runner and its summary.

Each run is one ``python -m ctrl_rl train impala|domo_ac`` process on ``minatar:<Game>`` in its own directory
``<runs-dir>/<Game>/<variant>-s<seed>``. Calling the script again continues every unfinished run with ``--resume``
from its last checkpoint and skips the finished ones; ``--jobs 2`` runs two at a time; ``--time-limit`` stops the runs
it started after that many seconds (the next call resumes them). ``--dry-run`` prints the commands.

The variants (``VARIANTS``) share every setting but the ones their names give:

- ``impala``: IMPALA at its defaults (V-trace lambda 1, kappa 0);
- ``impala-lam0.95``: IMPALA with DoMo-AC's lambda, the control that separates kappa's effect from lambda's;
- ``domo-k0.5``, ``domo-k0.9``: DoMo-AC at its defaults (lambda 0.95) with kappa 0.5 and 0.9.

The shared settings (``SHARED``; where each comes from: this folder's README): 2 actors in worker processes (the
process backend, so that the actors really lag the learner), 16 envs per actor, unroll 20, 2 segments per update
(IMPALA's batch of 32 trajectories of 20 steps), MinAtar's reference network (one 3x3 conv of 16 channels at stride
1, then 128 units; linear policy and value heads), IMPALA's defaults for everything else.

The summary (``--summarize-only``, and after every run) reads each run's ``metrics.jsonl``: per-seed curves of the
training episode return against frames (one MinAtar step is one frame); the final score of a run is the mean return of
the episodes that ended in the last 10% of the frames that every run has reached (equal frames, also when the study
is only partly done). Scores are normalized per game by random play (measured here, ``random_scores``) and by the
best run: ``(score - random) / (best - random)``, so the best final score on a game is 1. rliable's IQM with 95%
stratified-bootstrap CIs over games x seeds, and its probability of improvement of each variant over IMPALA, over the
games where some variant learned (``LEARNED_D``; the others are listed, not aggregated).

    python experiments/domo_minatar/domo_minatar.py --jobs 2                   # the study (resumable)
    python experiments/domo_minatar/domo_minatar.py --dry-run                  # the commands
    python experiments/domo_minatar/domo_minatar.py --summarize-only           # results from whatever has run

Writes ``domo_minatar.{json,md,png}`` beside this script (``--results-dir`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, improvement_ci, iqm_ci, runs_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

PAPER_FRAMES = 5_000_000  # MinAtar (Young & Tian 2019): 5M frames per game for every agent
GAMES = ("Breakout", "Asterix", "SpaceInvaders")  # the three; --games all adds Freeway and Seaquest
ALL_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
TAIL = 0.1  # the final score: the episodes that ended in the last 10% of the frames
# A game enters the aggregate only where some variant learned: its mean final score over seeds lies at least this many
# standard deviations of random play's episode returns above random play's mean (Cohen's d 0.5). Where every run is
# at random play's level, (score - random) / (best - random) divides noise by noise and would swamp the IQM.
LEARNED_D = 0.5

# Every variant: (algorithm, its own flags). Everything else is SHARED.
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "impala": ("impala", ()),  # lambda 1, kappa 0: IMPALA's defaults
    "impala-lam0.95": ("impala", ("--lambda", "0.95")),  # the control: DoMo-AC's lambda without kappa
    "domo-k0.5": ("domo_ac", ("--kappa", "0.5")),  # DoMo-AC's defaults (kappa 0.5, lambda 0.95)
    "domo-k0.9": ("domo_ac", ("--kappa", "0.9")),  # lambda 0.95 (DoMo-AC's default)
}
BASELINE = "impala"
COLORS = {"impala": "tab:blue", "impala-lam0.95": "tab:cyan", "domo-k0.5": "tab:orange", "domo-k0.9": "tab:red"}

SHARED = (
    "--actors", "2", "--backend", "process",  # the setting: actors in worker processes lag the learner
    "--num-envs", "16", "--unroll", "20", "--segments-per-update", "2",  # 2 x 16 x 20 = IMPALA's 32 x 20 batch
    "--cnn-channels", "16", "--cnn-layers", "1", "--cnn-stride", "1", "--image-features", "128",  # MinAtar's network
    "--actor-hidden", "--critic-hidden",  # linear policy and value heads on the 128 features, as MinAtar's AC
    "--threads", "1", "--log-every", "10", "--checkpoint-every", "200",  # a row per 6,400 frames, a checkpoint per 128k
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--games", nargs="+", default=list(GAMES), help=f"MinAtar games, or `all` ({', '.join(ALL_GAMES)})")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--frames", type=int, default=2_000_000, help="frames (env steps) per run: 40%% of MinAtar's 5M "
                    "(the README's budget); a larger value later continues the finished runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--time-limit", type=float, default=0.0, help="stop the runs after this many seconds of this "
                    "invocation (0: none); the next call resumes them")
    ap.add_argument("--random-steps", type=int, default=16_000, help="env steps of the random-play measurement")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "domo_minatar")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--summarize-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    a = ap.parse_args(argv)
    if a.games == ["all"]:
        a.games = list(ALL_GAMES)
    unknown = sorted(set(a.games) - set(ALL_GAMES))
    if unknown:
        ap.error(f"unknown game {unknown[0]!r}: expected some of {', '.join(ALL_GAMES)} or `all`")
    return a


# ---- running -----------------------------------------------------------------------------------------------------

def run_dir(runs: Path, game: str, variant: str, seed: int) -> Path:
    return runs / game / f"{variant}-s{seed}"


def checkpoint_step(d: Path) -> int:
    """Frames the run's last checkpoint holds (0 without one)."""
    ck = d / "checkpoints" / "latest.pt"
    if not ck.is_file():
        return 0
    from ctrl_rl.learn.checkpoint import load_checkpoint

    return int(load_checkpoint(ck)["counters"]["step"])


def train_command(d: Path, game: str, variant: str, seed: int, frames: int) -> list[str]:
    """The run's command: ``--resume`` once it has a checkpoint, else a fresh run."""
    algo, own = VARIANTS[variant]
    cmd = [sys.executable, "-m", "ctrl_rl", "train", algo, "--total-steps", str(frames), "--no-progress"]
    if (d / "checkpoints" / "latest.pt").is_file():
        return cmd + ["--resume", str(d)]
    return cmd + ["--env", f"minatar:{game}", "--seed", str(seed), "--run-dir", str(d), *SHARED, *own]


def run(a: argparse.Namespace) -> None:
    """Every (seed, game, variant) to ``--frames``, seed by seed so that a partial study has whole seeds."""
    jobs = [(g, v, s) for s in a.seeds for g in a.games for v in a.variants]
    deadline = time.time() + a.time_limit if a.time_limit else None
    logs = a.runs_dir / "logs"  # outside the run directories: a file there would stop a restart of an unstarted run

    def one(job: tuple[str, str, int]) -> None:
        game, variant, seed = job
        d = run_dir(a.runs_dir, game, variant, seed)
        if not a.dry_run and checkpoint_step(d) >= a.frames:
            return
        cmd = train_command(d, game, variant, seed, a.frames)
        print("$", shlex.join(cmd), flush=True)
        if a.dry_run or (deadline is not None and time.time() > deadline):
            return
        logs.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(logs / f"{game}-{variant}-s{seed}.log", "a") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            while proc.poll() is None:
                time.sleep(2)
                if deadline is not None and time.time() > deadline:  # the run and its actor processes, no others
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait()
                    print(f"{game} {variant} s{seed}: stopped at the time limit (resumes from its checkpoint)",
                          flush=True)
                    return
        if proc.returncode != 0:
            print(f"{game} {variant} s{seed}: exited with {proc.returncode} (log: {log.name})", flush=True)
            return
        print(f"{game} {variant} s{seed}: done in {time.perf_counter() - t0:.0f} s", flush=True)

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        list(pool.map(one, jobs))


# ---- random play -------------------------------------------------------------------------------------------------

def random_score(game: str, steps: int, num_envs: int = 16, seed: int = 12345) -> dict:
    """Mean return of the episodes uniform random actions finish in ``steps`` env steps of ``minatar:<game>``, with
    the settings the runs train on (the minimal action set, sticky actions 0.1, difficulty ramping)."""
    import torch

    from ctrl_rl.envs import make_env

    env = make_env(f"minatar:{game}", num_envs=num_envs, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    env.reset(seed=seed)
    ret = torch.zeros(num_envs)  # [N]
    finished: list[float] = []
    for _ in range(max(1, steps // num_envs)):
        action = torch.randint(0, env.spec.action_dim, (num_envs,), generator=gen)  # [N]
        out = env.step(action)
        ret += out.reward
        done = out.done  # [N]
        finished += ret[done].tolist()
        ret[done] = 0.0
    env.close()
    mean = sum(finished) / len(finished) if finished else float("nan")
    std = (sum((x - mean) ** 2 for x in finished) / len(finished)) ** 0.5 if finished else float("nan")
    return {"return": mean, "std": std, "episodes": len(finished), "steps": max(1, steps // num_envs) * num_envs}


def random_scores(games: list[str], steps: int, cache: Path) -> dict[str, dict]:
    """Random play per game, measured once and kept in ``cache`` (so that every summary normalizes alike)."""
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    missing = [g for g in games if "std" not in known.get(g, {})]  # the spread is measured since 2026-11-27
    for g in missing:
        known[g] = random_score(g, steps)
        print(f"random play, {g}: {known[g]['return']:.3f} over {known[g]['episodes']} episodes", flush=True)
    if missing:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=2) + "\n")
    return {g: known[g] for g in games}


# ---- summary -----------------------------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def final_score(rows: list[dict], frames: int) -> float | None:
    """Mean return of the episodes that ended in the last ``TAIL`` of the first ``frames`` frames: the logged rows past
    ``(1 - TAIL) * frames`` up to the first one at or past ``frames`` (a run ends on a whole update, a little past its
    budget). Each row holds the mean of the episodes that ended in its window, weighted here by their count."""
    tail = []
    for r in rows:
        if r["step"] > frames * (1 - TAIL) and r.get("episode_return") is not None:
            tail.append(r)
        if r["step"] >= frames:
            break
    n = sum(r.get("episodes", 1) for r in tail)
    return sum(r["episode_return"] * r.get("episodes", 1) for r in tail) / n if n else None


def median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def collect(a: argparse.Namespace) -> dict:
    """Every run with a metrics file: ``{(game, variant, seed): {...}}``, its curve and statistics."""
    out = {}
    for game in a.games:
        for variant in a.variants:
            for seed in a.seeds:
                d = run_dir(a.runs_dir, game, variant, seed)
                rows = read_jsonl(d / "metrics.jsonl")
                ends = next((i for i, r in enumerate(rows) if r["step"] >= a.frames), len(rows) - 1)
                rows = rows[: ends + 1]  # up to the budget (a run continued past it: the study at fewer frames)
                if not rows:
                    continue
                late = rows[len(rows) // 10:]  # past the first tenth (start-up)
                out[game, variant, seed] = {
                    "dir": str(d), "frames": int(rows[-1]["step"]), "wall_time": rows[-1]["wall_time"],
                    "curve": [[r["step"], r["episode_return"]] for r in rows if r.get("episode_return") is not None],
                    "sps_median": median([r["sps"] for r in late if "sps" in r]),
                    "lag_mean": median([r["actors/lag_mean"] for r in late if "actors/lag_mean" in r]),
                    "rho_clipped": median([r["stats/rho_clipped"] for r in late if "stats/rho_clipped" in r]),
                    "final": final_score(rows, a.frames),
                }
    return out


def complete_cells(games: list[str], seeds: list[int], done) -> tuple[list[str], list[int]]:
    """The largest block of games x seeds in which ``done(game, seed)`` holds for every cell (more seeds on a tie):
    the comparison needs every variant on the same games and seeds."""
    from itertools import combinations

    best: tuple[list[str], list[int]] = ([], [])
    for k in range(len(seeds), 0, -1):
        for ss in combinations(seeds, k):
            gs = [g for g in games if all(done(g, s) for s in ss)]
            if len(gs) * k > len(best[0]) * len(best[1]):
                best = (gs, list(ss))
    return best


def summarize(a: argparse.Namespace) -> dict:
    runs = collect(a)
    finished = lambda g, v, s: (g, v, s) in runs and runs[g, v, s]["frames"] >= a.frames  # noqa: E731
    games, seeds = complete_cells(a.games, a.seeds, lambda g, s: all(finished(g, v, s) for v in a.variants))
    rand = random_scores(games, a.random_steps, a.runs_dir / "random_scores.json") if games else {}
    dirs = [runs[g, v, s]["dir"] for g in games for v in a.variants for s in seeds]
    payload: dict = {
        "claim": "DoMo-AC improves on IMPALA (Tang et al. 2023, on Atari-57)",
        "frames": a.frames, "paper_frames": PAPER_FRAMES, "games": games, "seeds": seeds,
        "variants": {v: [VARIANTS[v][0], *VARIANTS[v][1]] for v in a.variants}, "shared_flags": list(SHARED),
        "random": rand, "per_game": {}, "aggregate": {}, "probability_of_improvement": {},
        "not_compared": {f"{g}/{v}-s{s}": r["frames"] for (g, v, s), r in runs.items()
                         if g not in games or s not in seeds},
        "commit": runs_commit(dirs) if dirs else None,
    }
    for game in games:
        scored = [runs[game, v, s]["final"] for v in a.variants for s in seeds]
        best = max((x for x in scored if x is not None), default=float("nan"))
        low, spread = rand[game]["return"], rand[game]["std"]
        finals = {v: [x for s in seeds if (x := runs[game, v, s]["final"]) is not None] for v in a.variants}
        best_mean = max((sum(xs) / len(xs) for xs in finals.values() if xs), default=float("nan"))
        span = max(best - low, 1e-8)  # the best run at random play's level: every score normalizes to 0
        g: dict = {"random": low, "random_std": spread, "best": best, "best_variant_mean": best_mean,
                   "learned": bool(best_mean - low > LEARNED_D * spread), "variants": {}}
        for v in a.variants:
            g["variants"][v] = {}
            for s in seeds:
                r = runs[game, v, s]
                norm = (r["final"] - low) / span if r["final"] is not None else 0.0
                g["variants"][v][str(s)] = r | {"normalized": norm}
        payload["per_game"][game] = g
    learned = [g for g in games if payload["per_game"][g]["learned"]]
    payload["aggregated_games"] = learned
    payload["not_learned"] = [g for g in games if g not in learned]
    normalized = {v: [[payload["per_game"][g]["variants"][v][str(s)]["normalized"] for g in learned] for s in seeds]
                  for v in a.variants}  # [seeds][games that some variant learned]
    if learned:
        payload["normalized"] = normalized
        payload["aggregate"] = iqm_ci(normalized)
        pairs = {f"{v} > {BASELINE}": (normalized[v], normalized[BASELINE])
                 for v in a.variants if v != BASELINE and BASELINE in a.variants}
        if "impala-lam0.95" in a.variants:  # kappa's effect at equal lambda
            pairs |= {f"{v} > impala-lam0.95": (normalized[v], normalized["impala-lam0.95"])
                      for v in a.variants if v.startswith("domo")}
        payload["probability_of_improvement"] = improvement_ci(pairs) if pairs else {}
    write_result("domo_minatar", payload, markdown(payload), folder=a.results_dir)
    plot(payload, a.results_dir / "domo_minatar.png")
    return payload


def markdown(p: dict) -> str:
    md = ["# DoMo-AC against IMPALA on MinAtar (issue 29, section 4)", "",
          f"Frames per run: **{p['frames']:,}** (MinAtar's paper: {p['paper_frames']:,}, so "
          f"{p['frames'] / p['paper_frames']:.1%} of it). Games {', '.join(p['games']) or 'none yet'}, seeds "
          f"{p['seeds']}; runs not finished on every variant are left out ({len(p['not_compared'])}). "
          f"Final score: mean return of the episodes ending in the last {TAIL:.0%} of those frames; normalized "
          "per game as (score - random) / (best run - random).", "",
          "| game | random | variant | final return per seed | mean | normalized per seed | env-steps/s | lag |",
          "|---|---|---|---|---|---|---|---|"]
    for game, g in p["per_game"].items():
        for v, seeds in g["variants"].items():
            finals = [s["final"] for s in seeds.values()]
            ok = [x for x in finals if x is not None]
            fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            norms = ", ".join(f"{s['normalized']:.2f}" for s in seeds.values())
            md.append(f"| {game} | {g['random']:.2f} | {v} | {', '.join(fmt(x) for x in finals)} | "
                      f"{fmt(sum(ok) / len(ok) if ok else None)} | {norms} | "
                      f"{median([s['sps_median'] for s in seeds.values() if s['sps_median']]) or 0:,.0f} | "
                      f"{fmt(median([s['lag_mean'] for s in seeds.values() if s['lag_mean'] is not None]))} |")
    if p.get("not_learned"):
        left = "; ".join(f"{g}: best variant's mean {p['per_game'][g]['best_variant_mean']:.2f}, random play "
                         f"{p['per_game'][g]['random']:.2f} (std {p['per_game'][g]['random_std']:.2f})"
                         for g in p["not_learned"])
        md += ["", f"Left out of the aggregate: {', '.join(p['not_learned'])}. No variant's mean final score lies "
               f"{LEARNED_D} standard deviations of random play's episode returns above random play ({left}), so "
               "its normalized scores would divide noise by noise."]
    if p["aggregate"]:
        md += ["", f"IQM of the normalized scores over games ({', '.join(p['aggregated_games'])}) x seeds "
               "(rliable, 95% stratified-bootstrap CI):", "",
               "| variant | IQM | 95% CI |", "|---|---|---|"]
        md += [f"| {v} | {x['iqm']:.3f} | [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}] |"
               for v, x in p["aggregate"].items()]
        md += ["", "Probability of improvement (rliable; 0.5: no difference):", "", "| X > Y | P | 95% CI |",
               "|---|---|---|"]
        md += [f"| {k} | {x['p']:.3f} | [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}] |"
               for k, x in p["probability_of_improvement"].items()]
    md += ["", f"Code: {p['commit']}.", ""]
    return "\n".join(md)


def plot(p: dict, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    games = list(p["per_game"])
    if not games:
        return
    fig, axes = plt.subplots(1, len(games) + 1, figsize=(4.5 * (len(games) + 1), 3.8), squeeze=False)
    for ax, game in zip(axes[0], games, strict=False):
        for v, seeds in p["per_game"][game]["variants"].items():
            curves = [s["curve"] for s in seeds.values()]
            for c in curves:  # per seed, faint
                ax.plot([x for x, _ in c], [y for _, y in c], color=COLORS.get(v), alpha=0.25, lw=0.7)
            steps = sorted(set.intersection(*[{x for x, _ in c} for c in curves])) if curves else []
            means = [sum(dict(c)[x] for c in curves) / len(curves) for x in steps]
            ax.plot(steps, means, color=COLORS.get(v), lw=1.6, label=v)
        ax.axhline(p["per_game"][game]["random"], color="gray", ls=":", lw=1, label="random")
        ax.axvline(p["frames"] * (1 - TAIL), color="k", ls="--", lw=0.6)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:g}M"))
        ax.set(title=f"minatar:{game}", xlabel="frames", ylabel="training episode return")
    axes[0][0].legend(fontsize=7)
    ax = axes[0][-1]
    agg = p["aggregate"]
    for i, (v, x) in enumerate(agg.items()):
        ax.errorbar(x["iqm"], i, xerr=[[x["iqm"] - x["ci95"][0]], [x["ci95"][1] - x["iqm"]]], fmt="o",
                    color=COLORS.get(v), capsize=4)
    ax.set_yticks(range(len(agg)), list(agg))
    ax.set(title="IQM of normalized final score\n(95% CI over games x seeds)",
           xlabel="(score - random) / (best - random)")
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    print(f"wrote {dest}")


def main(argv: list[str] | None = None) -> None:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not a.summarize_only:
        run(a)
    if not a.dry_run:
        summarize(a)


if __name__ == "__main__":
    main()
