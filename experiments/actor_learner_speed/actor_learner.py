"""Actor-learner throughput: env-steps/s the learner consumes, per backend and actor count, against PPO's in-process
loop on the same env and network (issue: DoMo-AC and the actor-learner architecture, benchmark 1).

Each configuration is one ``ctrl-rl train`` process (interpreter start-up excluded: the rate is the run's own
``sps`` over its logged intervals after the first, so Ray's and the workers' start-up are excluded too):

- ``impala`` with ``--backend inprocess|process|ray`` and ``--actors 1|2``; every actor steps ``--num-envs`` envs
  and sends segments of ``--unroll`` steps, the learner takes ``--segments-per-update`` segments per update;
- ``ppo`` with ``--num-envs = actors x num-envs`` and ``--rollout-steps = unroll``, one epoch of one minibatch
  (the same data per update as IMPALA's one gradient step on ``segments_per_update`` segments).

The table gives the median over ``--repeats`` runs of each and the ratio to PPO measured in the same repeat.
On 2 cores, actors in other processes compete with the learner for the same cores: more actors only pay where
there are more cores than processes.

    python experiments/actor_learner_speed/actor_learner.py [--env torch:CartPole] [--steps 60000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script


def run(args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "ctrl_rl", "train", *args, "--run-dir", f"{d}/r", "--no-progress",
               "--threads", "1"]
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        rows = [json.loads(x) for x in Path(f"{d}/r/metrics.jsonl").read_text().splitlines()]
    sps = [r["sps"] for r in rows[1:]] or [rows[-1]["sps"]]
    return statistics.median(sps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="torch:CartPole")
    ap.add_argument("--steps", type=int, default=60_000)
    ap.add_argument("--num-envs", type=int, default=16, help="envs per actor")
    ap.add_argument("--unroll", type=int, default=20)
    ap.add_argument("--segments-per-update", type=int, default=2)
    ap.add_argument("--backends", nargs="+", default=["inprocess", "process", "ray"])
    ap.add_argument("--actors", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    net = ["--actor-hidden", "64", "64", "--critic-hidden", "64", "64"]
    per_update = a.segments_per_update * a.unroll * a.num_envs
    results: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for rep in range(a.repeats):
        for K in a.actors:
            ppo_envs = K * a.num_envs
            ppo = run(["ppo", "--env", a.env, "--num-envs", str(ppo_envs), "--rollout-steps", str(a.unroll),
                       "--epochs", "1", "--minibatch-size", str(a.unroll * ppo_envs), "--total-steps", str(a.steps),
                       "--log-every", str(max(1, a.steps // (a.unroll * ppo_envs) // 10)), *net])
            results.setdefault(f"ppo K={K}", []).append(ppo)
            for b in a.backends:
                sps = run(["impala", "--env", a.env, "--backend", b, "--actors", str(K), "--num-envs", str(a.num_envs),
                           "--unroll", str(a.unroll), "--segments-per-update", str(a.segments_per_update),
                           "--total-steps", str(a.steps), "--log-every", str(max(1, a.steps // per_update // 10)),
                           *net])
                results.setdefault(f"impala {b} K={K}", []).append(sps)
                ratios.setdefault(f"impala {b} K={K}", []).append(sps / ppo)
                print(f"repeat {rep} K={K} {b:9s} {sps:9.0f} env-steps/s  (ppo {ppo:9.0f}; ratio {sps / ppo:.2f})",
                      flush=True)
    lines = ["# Actor-learner learner throughput", "",
             f"`python experiments/actor_learner_speed/actor_learner.py --env {a.env} --steps {a.steps} "
             f"--num-envs {a.num_envs} --unroll {a.unroll} --repeats {a.repeats}` (commit {git_commit()}): "
             "medians over "
             f"{a.repeats} repeats of the run's median logged env-steps/s (first interval excluded).", "",
             "| configuration | env-steps/s | vs PPO (same repeat, same total envs) |", "|---|---|---|"]
    for k, v in results.items():
        r = ratios.get(k)
        lines.append(f"| {k} | {statistics.median(v):,.0f} | {statistics.median(r):.2f}x |" if r else
                     f"| {k} | {statistics.median(v):,.0f} | 1.00x |")
    write_result("actor_learner", {"args": vars(a), "sps": results, "ratio_to_ppo": ratios, "commit": git_commit()},
                 "\n".join(lines) + "\n", folder=RESULTS)


if __name__ == "__main__":
    main()
