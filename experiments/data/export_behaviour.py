"""Pick and export the medium and expert behaviour policies of one SAC training run (ALGORITHMS.md §9.2, §9.6).

    python experiments/data/export_behaviour.py --run /work/behaviour_runs/hopper-v5-sac-s0 --env Hopper-v5 [--episodes 10]

The run must be a `ctrl-rl train sac ... --keep-every N --save-replay` run. The script

1. evaluates every snapshot ``checkpoints/step_*.pt`` with actions sampled from the stochastic policy (as the
   data will be collected), ``--episodes`` episodes each on Gymnasium's env (env i reset with seed 10000 + i);
2. measures the uniform-random return over ``--ref-episodes`` episodes (seed 20000 + i);
3. picks expert = the best mean return (the later snapshot on ties) and medium = the snapshot, at or before the
   expert, whose normalized score ``100 (R - R_random) / (R_expert - R_random)`` is closest to one third of the
   expert's (D4RL's "early-stopped at about a third of expert performance"); with R_random measured, this is the
   same choice for any expert constant (D4RL's or local), since the normalization is linear;
4. measures the local references: the random and the expert policy, ``--ref-episodes`` episodes each (seed 30000 + i
   for the expert);
5. writes ``<task>-v5-medium.pt`` and ``<task>-v5-expert.pt`` into ``--out-dir`` (default: the package's
   ``ctrl_rl/data/behaviour``), updates ``manifest.json`` there and prints the table.

`ctrl-rl data generate --env <Env> --level all` then makes the datasets; ``--level medium-replay --from-run RUN``
reads the medium-replay rows from this run's replay buffer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ctrl_rl.core.provenance import file_sha256  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.learn.checkpoint import load_checkpoint  # noqa: E402
from ctrl_rl.datagen import behaviour as B  # noqa: E402
from ctrl_rl.datagen.generate import episode_returns  # noqa: E402
from ctrl_rl.storage.datasets.scores import D4RL_REFERENCES  # noqa: E402

EVAL_SEED, RANDOM_SEED, EXPERT_SEED = 10_000, 20_000, 30_000


def snapshots(run: Path) -> list[tuple[int, Path]]:
    found = sorted((int(p.stem.split("_")[1]), p) for p in (run / "checkpoints").glob("step_*.pt"))
    if not found:
        raise UserInputError(f"run {str(run)!r} has no checkpoints/step_*.pt snapshots: expected a SAC run trained "
                             f"with --keep-every N")
    return found


def pick(steps: list[int], means: list[float], random_return: float) -> tuple[int, int]:
    """Indices of (medium, expert): expert = best mean (later on ties); medium = at or before the expert, the
    normalized score closest to a third of the expert's (earlier on ties)."""
    best = max(means)
    expert = max(i for i, m in enumerate(means) if m == best)
    target = (best - random_return) / 3.0
    medium = min(range(expert + 1), key=lambda i: (abs((means[i] - random_return) - target), i))
    return medium, expert


def stats(returns: np.ndarray) -> dict:
    return {"mean": float(returns.mean()), "std": float(returns.std()), "episodes": int(returns.size)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="SAC run directory with checkpoints/step_*.pt snapshots")
    ap.add_argument("--env", required=True, help="Hopper-v5, HalfCheetah-v5 or Walker2d-v5")
    ap.add_argument("--episodes", type=int, default=10, help="evaluation episodes per snapshot")
    ap.add_argument("--ref-episodes", type=int, default=100, help="episodes of the random and expert references")
    ap.add_argument("--out-dir", default=None, help="where the behaviour files and manifest go (default: the package's)")
    ap.add_argument("--workers", type=int, default=None, help="env worker processes (default: one per core)")
    a = ap.parse_args(argv)
    try:
        return export(a)
    except UserInputError as e:
        print(f"export_behaviour: error: {e}", file=sys.stderr)
        return 2


def export(a) -> int:
    run = Path(a.run)
    task = B.task_of(a.env)
    env_id = B.TASK_ENVS[task]
    out_dir = Path(a.out_dir) if a.out_dir else B.behaviour_dir()
    if not (run / "config.json").is_file():
        raise UserInputError(f"run {str(run)!r} has no config.json: expected a run directory written by `ctrl-rl train`")
    config = json.loads((run / "config.json").read_text())
    if config.get("algo") != "sac" or B.task_of(str(config["run"]["env"])) != task:
        raise UserInputError(f"run {str(run)!r} is a {config.get('algo')!r} run on {config['run']['env']!r}: expected "
                             f"a sac run on {env_id}")
    O, A = B.env_dims(env_id)
    t0 = time.time()
    found = snapshots(run)
    results = []
    for step, path in found:
        actor = B.actor_from_checkpoint(load_checkpoint(path, expect_algo="sac"), O, A, str(path))
        results.append(stats(episode_returns(env_id, actor, a.episodes, EVAL_SEED, workers=a.workers)))
        print(f"  step {step:>9d}: return {results[-1]['mean']:9.1f} +- {results[-1]['std']:7.1f}", flush=True)
    random_ref = stats(episode_returns(env_id, None, a.ref_episodes, RANDOM_SEED, workers=a.workers))
    steps, means = [s for s, _ in found], [r["mean"] for r in results]
    i_med, i_exp = pick(steps, means, random_ref["mean"])
    expert_actor = B.actor_from_checkpoint(load_checkpoint(found[i_exp][1], expect_algo="sac"), O, A)
    expert_ref = stats(episode_returns(env_id, expert_actor, a.ref_episodes, EXPERT_SEED, workers=a.workers))

    records = {}
    for level, i in (("medium", i_med), ("expert", i_exp)):
        out = out_dir / f"{task}-v5-{level}.pt"
        records[level] = B.export_behaviour(found[i][1], level, out, results[i])
        records[level]["file"] = out
    run_cfg, algo_cfg = config["run"], config["config"]
    medium_step = steps[i_med]
    replay_run = {**run_cfg, "total_steps": medium_step,
                  "loop": {**(run_cfg.get("loop") or {}), "keep_every": 0, "save_replay": True}}
    manifest = B.load_manifest(out_dir)
    manifest["tasks"][task] = {
        "env_id": env_id,
        "training": {"command": B.training_command(run_cfg, algo_cfg), "preset": run_cfg.get("preset"),
                     "seed": run_cfg["seed"], "total_steps": run_cfg["total_steps"], "run_dir": str(run),
                     "run": run_cfg, "algo": algo_cfg},
        **{level: {"file": records[level]["file"].name, "checkpoint_step": steps[i],
                   "eval_return_mean": results[i]["mean"], "eval_return_std": results[i]["std"],
                   "eval_episodes": results[i]["episodes"], "sha256": file_sha256(records[level]["file"])}
           for level, i in (("medium", i_med), ("expert", i_exp))},
        "references": {"random": random_ref, "expert": {**expert_ref, "checkpoint_step": steps[i_exp]},
                       "actions": "sampled", "seeds": {"random": RANDOM_SEED, "expert": EXPERT_SEED}},
        "medium_replay": {"preset": run_cfg.get("preset"), "seed": run_cfg["seed"], "env_steps": medium_step,
                          "command": B.training_command(replay_run, algo_cfg),
                          "from_run": f"ctrl-rl data generate --env {env_id} --level medium-replay --from-run {run}"},
        "selection": {"rule": "expert = best mean return (later on ties); medium = at or before the expert, normalized "
                              "score closest to 1/3 of the expert's (random reference measured)",
                      "episodes": a.episodes, "seed": EVAL_SEED, "actions": "sampled",
                      "snapshots": [[s, r["mean"], r["std"]] for s, r in zip(steps, results)]},
    }
    path = B.save_manifest(manifest, out_dir)

    d4rl = D4RL_REFERENCES[task]
    lo, hi = random_ref["mean"], expert_ref["mean"]
    print(f"\n{env_id}: {len(found)} snapshots of {run}, {a.episodes} sampled-action episodes each "
          f"({time.time() - t0:.0f} s)")
    print(f"{'step':>9}  {'return':>17}  {'local score':>11}  {'D4RL score':>10}")
    for i, (s, r) in enumerate(zip(steps, results)):
        mark = " expert" if i == i_exp else " medium" if i == i_med else ""
        print(f"{s:>9d}  {r['mean']:>8.1f} +- {r['std']:>6.1f}  {100 * (r['mean'] - lo) / (hi - lo):>11.1f}  "
              f"{100 * (r['mean'] - d4rl.random) / (d4rl.expert - d4rl.random):>10.1f}{mark}")
    print(f"references ({a.ref_episodes} episodes): random {lo:.1f} +- {random_ref['std']:.1f}, expert "
          f"{hi:.1f} +- {expert_ref['std']:.1f}")
    for level in ("medium", "expert"):
        print(f"wrote {records[level]['file']}")
    print(f"updated {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
