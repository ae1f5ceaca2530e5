"""Several seeds in one process against one process per seed: gradient steps/s per seed (issue 30, part 4).

Both variants are the same ``ctrl-rl train ALGO --dataset D`` run (offline: IQL, CQL; no evaluation until the last
step) or ``ctrl-rl train sac --env E`` run (online SAC, one env, UTD 1: ``--learning-starts`` random steps, then one
update per env step, no evaluation), no checkpoint until the end, N seeds each:

  one process   ``--seeds K1 .. KN``: the seeds' networks batched (``ctrl_rl.core.seeds``)
  separate      N processes ``--seed K`` started together, side by side on this machine

The headline, gradient steps/s per seed, is the gradient steps of each seed (``--steps``) over the seconds from the
start until the last process ends (imports, dataset loading, SAC's env start and random warm-up steps and the offline
final one-episode evaluation included: N processes load and hold N copies of the dataset, one process one). Each
run's loop rate (metrics.jsonl, first logged row with an update to the last) is reported beside; for separate
processes it flatters them, as one process's loop partly runs while the others still load.
The variants alternate in every repeat (which goes first alternates too); the figures are medians over repeats.
Target (issue 30): one process >= 1.5x separate with 3 seeds (IQL; CQL with ``--algo cql``; SAC with ``--algo sac``).

    python experiments/seed_batching/seed_batching.py                       # IQL, seeds 0 1 2, 3 x 2000 steps
    python experiments/seed_batching/seed_batching.py --algo cql --out experiments/seed_batching/cql   # CQL
    python experiments/seed_batching/seed_batching.py --algo sac --out experiments/seed_batching/sac   # SAC online
    python experiments/seed_batching/seed_batching.py --steps 200 --repeats 1 --out /tmp/sb   # a quick check
    python experiments/seed_batching/seed_batching.py --device cuda          # on a GPU

Writes ``seed_batching.{json,md}`` to ``--out`` (default: this folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import ROOT, git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent


def online(args: argparse.Namespace) -> bool:
    """Whether ``--algo`` trains on envs (the off-policy loop: SAC) rather than on ``--dataset``."""
    from ctrl_rl.algos import registry

    return registry.get(args.algo).regime == "off-policy"


def train_cmd(args: argparse.Namespace, run_dir: Path, seeds: list[int]) -> list[str]:
    which = ["--seeds", *map(str, seeds)] if len(seeds) > 1 else ["--seed", str(seeds[0])]
    if online(args):  # one env, UTD 1: --learning-starts random steps, then one update per env step (--steps)
        total = args.steps + args.learning_starts
        data = ["--env", args.env, "--num-envs", "1", "--utd-ratio", "1",
                "--learning-starts", str(args.learning_starts)]
    else:
        total = args.steps
        data = ["--dataset", args.dataset, "--eval-episodes", "1"]
    return [sys.executable, "-m", "ctrl_rl", "train", args.algo, *data, *which, "--total-steps", str(total),
            "--log-every", str(args.log_every), "--eval-every", "0", "--checkpoint-every", str(total),
            "--threads", str(args.threads), "--device", args.device, "--no-progress", "--run-dir", str(run_dir),
            *args.extra]


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "wall_time" in r]


def _done(row: dict) -> int:
    """Gradient steps made by a metrics row: the off-policy loop's ``updates`` counter, the offline loop's ``step``."""
    return int(row.get("updates", row["step"]))


def updates(run_dir: Path) -> int:
    """Gradient steps the run made (none is refused: SAC updates once its replay holds a batch)."""
    done = _done(_rows(run_dir)[-1])
    if done == 0:
        raise SystemExit(f"{run_dir} made no gradient step: expected --learning-starts at least the batch size")
    return done


def loop_rate(run_dir: Path) -> float:
    """Gradient steps/s of one run's training loop, between its first metrics row with an update and its last (SAC's
    warm-up without updates left out)."""
    rows = _rows(run_dir)
    rows = [r for r in rows if _done(r) > 0] or rows
    first, last = rows[0], rows[-1]
    return (_done(last) - _done(first)) / (last["wall_time"] - first["wall_time"])


def run_together(cmds: list[list[str]]) -> float:
    """Start every command at once, wait for all; the seconds until the last one ends."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    for p, c in zip(procs, cmds):
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(c)} failed ({p.returncode}): {err.decode()[-2000:]}")
    return time.perf_counter() - t0


def one_process(args: argparse.Namespace, work: Path) -> dict:
    parent = work / "one_process"
    seconds = run_together([train_cmd(args, parent, args.seeds)])
    rates = [loop_rate(parent / f"seed_{s}") for s in args.seeds]
    steps = min(updates(parent / f"seed_{s}") for s in args.seeds)
    return {"steps_per_s_per_seed": steps / seconds, "process_s": seconds, "updates_per_seed": steps,
            "loop_steps_per_s_per_seed": statistics.median(rates)}


def separate(args: argparse.Namespace, work: Path) -> dict:
    dirs = [work / f"separate_{s}" for s in args.seeds]
    seconds = run_together([train_cmd(args, d, [s]) for d, s in zip(dirs, args.seeds)])
    rates = [loop_rate(d) for d in dirs]
    steps = min(updates(d) for d in dirs)
    return {"steps_per_s_per_seed": steps / seconds, "process_s": seconds, "updates_per_seed": steps,
            "loop_steps_per_s_per_seed": statistics.mean(rates), "loop_each": rates}


def markdown(result: dict) -> str:
    a = result["args"]
    m = result["median"]
    where = a["env"] if a.get("online") else a["dataset"]
    lines = [f"# seed_batching: {a['algo']} on {where}, {len(a['seeds'])} seeds, {a['steps']} gradient steps, "
             f"{a['device']}, --threads {a['threads']}", "",
             f"commit {result['commit']}, {result['repeats_done']} repeat(s), load before {result['load_before']}", "",
             "| variant | gradient steps/s per seed | seconds to the last process's end | loop steps/s per seed |",
             "|---|---|---|---|"]
    for name in ("one_process", "separate"):
        lines.append(f"| {name} | {m[name]['steps_per_s_per_seed']:.1f} | {m[name]['process_s']:.1f} | "
                     f"{m[name]['loop_steps_per_s_per_seed']:.1f} |")
    lines += ["", f"one process / separate: **{m['ratio']:.2f}x** (target >= 1.5x with 3 seeds)", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="iql")
    p.add_argument("--dataset", default="halfcheetah-medium-v5",
                   help="a dataset id or file (generated ids: `ctrl-rl data generate --env HalfCheetah-v5 --level "
                        "medium` writes halfcheetah-medium-v5)")
    p.add_argument("--env", default="HalfCheetah-v5", help="the env of an online algorithm (--algo sac)")
    p.add_argument("--learning-starts", type=int, default=1000,
                   help="an online algorithm's random warm-up steps before its --steps updates (--algo sac)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--log-every", type=int, default=250)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="--threads of every run (0: the governed default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("extra", nargs="*", help="further flags for every run, after --")
    args = p.parse_args()
    if args.steps < 2 * args.log_every:
        raise SystemExit(f"--steps {args.steps} gives fewer than two metrics rows: expected >= 2 x --log-every")
    if online(args) and args.learning_starts % args.log_every:
        raise SystemExit(f"--learning-starts {args.learning_starts} is not a multiple of --log-every "
                         f"{args.log_every}: expected the warm-up to end on a metrics row (the loop rate starts there)")
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"one_process": [], "separate": []}
    for rep in range(args.repeats):
        order = [one_process, separate] if rep % 2 == 0 else [separate, one_process]
        for fn in order:
            with tempfile.TemporaryDirectory() as d:
                r = fn(args, Path(d))
            runs[fn.__name__].append(r)
            print(f"repeat {rep + 1}/{args.repeats} {fn.__name__}: {r['steps_per_s_per_seed']:.1f} steps/s per seed, "
                  f"{r['process_s']:.1f} s (loop {r['loop_steps_per_s_per_seed']:.1f} steps/s per seed)", flush=True)
        # written after every repeat: a run cut short (a device's time limit) keeps the repeats it finished
        result = summarize(args, runs, rep + 1, load_before)
        write_result("seed_batching", result, markdown(result), folder=args.out)
    print(markdown(result))


def summarize(args: argparse.Namespace, runs: dict[str, list[dict]], repeats_done: int, load_before: float) -> dict:
    """The result record of the repeats finished so far: every run, and the medians of each variant."""
    fields = ("steps_per_s_per_seed", "process_s", "loop_steps_per_s_per_seed")
    median = {k: {f: statistics.median(r[f] for r in v) for f in fields} for k, v in runs.items()}
    median["ratio"] = median["one_process"]["steps_per_s_per_seed"] / median["separate"]["steps_per_s_per_seed"]
    return {"args": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                     "online": online(args)},
            "commit": git_commit(), "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(), "repeats_done": repeats_done, "runs": runs, "median": median}


if __name__ == "__main__":
    main()
