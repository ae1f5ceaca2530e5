"""SAC with default flags against SB3 SAC with its defaults: whole-process wall time, and SAC.update's matmul rate.

Issue 30 section 1 asks that a user's first SAC run be faster than SB3's: the run below >= 1.5x SB3 with default
flags (same run, medians of 3), and ``SAC.update`` alone at >= 80% of the machine's matmul rate for its FLOPs, or
the profile that says what stops it.

**Whole process** (``--variants``), each a fresh process, timed from launch to exit (interpreter start-up, imports,
env creation, the final checkpoint included), HalfCheetah-v5, one env, ``--warmup`` random steps then
``--learning`` steps with one update each (UTD 1), batch 256, 256x256 networks, replay 1M -- what both libraries
do by default once the warm-up length is set:

  default   ``python -m ctrl_rl train sac --env HalfCheetah-v5 --total-steps W+L --learning-starts W --seed S``
            and nothing else (envpool env; ``--threads 0``: the ThreadGovernor; its decisions are recorded)
  threads1  the same with ``--threads 1`` (the off-policy default before every loop was governed)
  threads2  the same with ``--threads 2``
  sb3       ``SAC("MlpPolicy", "HalfCheetah-v5", learning_starts=W, seed=S).learn(W + L)``: SB3's defaults
            (gymnasium env, torch's default thread count), ``experiments/peers/sb3_runs.py``

Variants run in turns, the order rotated between repeats, so a drift of the machine's speed hits every variant
alike; a repeat's ratio is SB3's time over the variant's, and the report gives medians over ``--repeats``.

**Update alone** (``--update-threads``): a worker process per thread count builds SAC with the CLI's default
config at HalfCheetah sizes (obs 17, action 6) on a synthetic replay, counts the matmul FLOPs of one update
(FlopCounterMode; the products and their shapes from torch.profiler, checked to sum to the same FLOPs), times
``--turns`` blocks of ``--updates`` updates, and in the same process times plain ``torch.mm`` / ``torch.bmm`` at
the update's shapes and a large (2048^2) product. Efficiency = the update's matmul FLOPs / its time, over each of
those rates; torch.profiler's top ops of ``--profile-updates`` updates go to ``profile_update_t<threads>.txt``.

    python experiments/sac_default_speed/sac_default_speed.py                     # full: ~10 min on 2 idle cores
    python experiments/sac_default_speed/sac_default_speed.py --warmup 100 --learning 200 --repeats 1 \\
        --updates 5 --turns 1 --profile-updates 3 --name smoke                    # a check of the script

Writes ``<--name>.{json,md}`` (default sac_default_speed) and the profiles beside this script.

**Same-run A/B of the update alone** (``--ab-before REV``): ms per ``update(batch)`` of the code at ``REV`` (a
detached worktree, ``common.worktree``) against this checkout or ``--ab-after REV`` (and any ``--tree NAME=PATH``
between), for each of
``--ab-algos`` (``sac``: the CLI's default SAC; ``ravl``: RAVL's 10 EDAC critics of 3x256) at each of
``--update-threads``; one worker process per tree, algorithm and repeat, trees alternated (reversed on odd repeats),
each worker's figure the median of its ``--turns`` blocks; the report gives medians over ``--repeats`` workers and
the load average around each worker::

    python experiments/sac_default_speed/sac_default_speed.py --ab-before 789e046 --update-threads 1 --name ab_t1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py, peers/
from common import ROOT, git_commit, git_head, write_result  # noqa: E402

RESULTS = HERE  # this study's folder: its results live beside the script
OBS, ACT, BATCH, ROWS = 17, 6, 256, 100_000  # HalfCheetah-v5 sizes
VARIANTS = ("default", "threads1", "threads2", "sb3")
CTRL_RL_FLAGS = {"default": (), "threads1": ("--threads", "1"), "threads2": ("--threads", "2")}


# ----- workers: a fresh process each -----

def sb3_worker(a: argparse.Namespace) -> None:
    from peers.sb3_runs import sac_default_run

    print(json.dumps(sac_default_run(a.warmup, a.learning, a.seed)))


def update_worker(a: argparse.Namespace) -> None:
    import torch
    from common import (
        call_flops,
        large_matmul_gflops,
        matmul_calls,
        matmul_flops,
        matmul_replay_gflops,
        profile_table,
        synthetic_replay,
    )

    from ctrl_rl.algos import registry
    from ctrl_rl.core.perf import tune_allocator
    from ctrl_rl.core.protocols import Algorithm
    from ctrl_rl.envs.protocol import EnvSpec

    torch.set_num_threads(a.threads)
    tune_allocator()  # as the training loop does
    entry = registry.get(a.algo)
    cfg = entry.default_config()  # what `ctrl-rl train sac` (or `ravl`) builds without flags
    spec = EnvSpec("synthetic:halfcheetah", (OBS,), False, ACT, (-1.0,) * ACT, (1.0,) * ACT)
    torch.manual_seed(a.seed)
    algo = entry.make(cfg, spec, torch.device("cpu"), torch.Generator().manual_seed(a.seed))
    assert isinstance(algo, Algorithm)
    sample = synthetic_replay(OBS, ACT, BATCH, ROWS, a.seed)
    batches = [sample() for _ in range(a.updates)]  # the same batches in every block
    for _ in range(a.warmup_updates):  # allocator, first-call costs, optimizer state
        algo.update(sample())
    if a.time_only:  # the A/B: time only, nothing else in the process
        cpu: list[float] = []
        print(json.dumps({"threads": a.threads, "algo": a.algo,
                          "s_per_update_blocks": time_blocks(algo, batches, a, cpu), "cpu_s_per_update_blocks": cpu,
                          "ctrl_rl": sys.modules["ctrl_rl"].__file__}))
        return
    flops = matmul_flops(lambda: algo.update(batches[0]))
    calls = matmul_calls(lambda: algo.update(batches[0]))
    assert call_flops(calls) == flops, f"profiled products {call_flops(calls)} FLOPs, FlopCounterMode {flops}"
    blocks = time_blocks(algo, batches, a)
    same_shapes = matmul_replay_gflops(calls)
    large = large_matmul_gflops()
    profile = profile_table(lambda: algo.update(sample()), a.profile_updates)
    (HERE / f"profile_update_t{a.threads}{a.profile_suffix}.txt").write_text(
        f"# torch.profiler, {a.profile_updates} SAC updates (default config, obs {OBS}, action {ACT}, batch {BATCH}),"
        f" {a.threads} thread(s), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"load average {os.getloadavg()[0]:.2f}\n{profile}\n")
    s = statistics.median(blocks)
    print(json.dumps({"threads": a.threads, "s_per_update_blocks": blocks, "s_per_update": s,
                      "matmul_flops_per_update": flops, "matmul_calls_per_update": len(calls),
                      "update_matmul_gflops": flops / s / 1e9, "same_shapes_mm_gflops": same_shapes,
                      "large_mm_gflops": large, "efficiency_vs_same_shapes": flops / s / 1e9 / same_shapes,
                      "efficiency_vs_large_mm": flops / s / 1e9 / large,
                      "hidden": {"actor": list(cfg.actor_hidden), "critic": list(cfg.critic_hidden)}}))


def time_blocks(algo, batches: list, a: argparse.Namespace, cpu: list[float] | None = None) -> list[float]:
    """Seconds per update of each of ``a.turns`` blocks over ``batches`` (wall clock); the process's CPU seconds per
    update of each block are appended to ``cpu`` when given."""
    blocks = []
    for _ in range(a.turns):
        t0, c0 = time.perf_counter(), time.process_time()
        for b in batches:
            info = algo.update(b)
        float(next(iter(info.values())))  # one host sync at the end of the block
        blocks.append((time.perf_counter() - t0) / len(batches))
        if cpu is not None:
            cpu.append((time.process_time() - c0) / len(batches))
    return blocks


# ----- driver -----

def launch(cmd: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return seconds, r


def thread_decisions(stderr: str) -> dict:
    """The governor's decisions as CTRL_RL_THREAD_LOG=1 prints them: the count at start, every change, the last."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("[threads]")]
    start = next((int(ln.split()[3]) for ln in lines if ln.startswith("[threads] start at")), None)
    changes = [ln[len("[threads] "):] for ln in lines if "->" in ln]
    last = int(changes[-1].split("->")[1].split(":")[0]) if changes else start
    return {"start": start, "changes": len(changes), "last": last, "log": changes[:20]}


def run_variant(v: str, a: argparse.Namespace, seed: int, tmp: Path) -> dict:
    load = os.getloadavg()[0]
    if v == "sb3":
        seconds, r = launch([sys.executable, str(Path(__file__).resolve()), "--sb3-worker", "--seed", str(seed),
                             "--warmup", str(a.warmup), "--learning", str(a.learning)])
        out = json.loads(r.stdout.strip().splitlines()[-1])
        return {"wall_s": seconds, "updates": out["updates"], "torch_threads": out["torch_threads"],
                "load1_at_start": load}
    run_dir = tmp / f"{v}-s{seed}"
    cmd = [sys.executable, "-m", "ctrl_rl", "train", "sac", "--env", "HalfCheetah-v5",
           "--total-steps", str(a.warmup + a.learning), "--learning-starts", str(a.warmup), "--seed", str(seed),
           "--run-dir", str(run_dir), *CTRL_RL_FLAGS[v]]
    seconds, r = launch(cmd, {"CTRL_RL_THREAD_LOG": "1"})
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": seconds, "train_s": rows[-1]["wall_time"], "updates": rows[-1]["updates"],
            "threads": thread_decisions(r.stderr) if v == "default" else None, "load1_at_start": load}


def update_run(threads: int, a: argparse.Namespace, seed: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--update-worker", "--threads", str(threads),
           "--seed", str(seed), "--updates", str(a.updates), "--turns", str(a.turns),
           "--warmup-updates", str(a.warmup_updates), "--profile-updates", str(a.profile_updates),
           "--profile-suffix", a.profile_suffix]
    _, r = launch(cmd)
    return json.loads(r.stdout.strip().splitlines()[-1])


def ab_main(a: argparse.Namespace) -> None:
    """The same-run A/B of the update alone: ``--ab-before REV`` (worktree), ``--tree``s, this checkout."""
    from common import worktree

    before = worktree(a.ab_before)
    after = Path(worktree(a.ab_after)["path"]) if a.ab_after else ROOT
    trees = {"before": Path(before["path"]), **{n: Path(p).resolve() for n, p in (t.split("=", 1) for t in a.tree)},
             "after": after}
    heads = {n: git_head(p) for n, p in trees.items()}
    threads = a.update_threads or [1]
    t_start, load_before = time.perf_counter(), os.getloadavg()
    runs: dict[str, list[float]] = {}
    cpu_runs: dict[str, list[float]] = {}  # the worker's CPU seconds per update: less moved by other jobs' load
    loads: list[float] = []
    for rep in range(a.repeats):
        for th in threads:
            for algo in a.ab_algos:
                for name in (list(trees) if rep % 2 == 0 else list(reversed(trees))):
                    cmd = [sys.executable, str(Path(__file__).resolve()), "--update-worker", "--time-only",
                           "--algo", algo, "--threads", str(th), "--seed", str(a.seed + rep),
                           "--updates", str(a.updates if algo == "sac" else a.ravl_updates), "--turns", str(a.turns),
                           "--warmup-updates", str(a.warmup_updates)]
                    loads.append(os.getloadavg()[0])
                    r = subprocess.run(cmd, cwd=trees[name], env={**os.environ, "PYTHONPATH": str(trees[name])},
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        raise RuntimeError(f"worker in {trees[name]} failed:\n{r.stderr[-3000:]}")
                    res = json.loads(r.stdout.strip().splitlines()[-1])
                    assert Path(res["ctrl_rl"]).resolve().is_relative_to(trees[name].resolve()), res["ctrl_rl"]
                    s = statistics.median(res["s_per_update_blocks"])
                    runs.setdefault(f"{algo}@{th}/{name}", []).append(s)
                    cpu = statistics.median(res["cpu_s_per_update_blocks"])
                    cpu_runs.setdefault(f"{algo}@{th}/{name}", []).append(cpu)
                    print(f"repeat {rep} {algo} t{th} {name:8s} {s * 1e3:7.2f} ms/update (CPU "
                          f"{cpu_runs[f'{algo}@{th}/{name}'][-1] * 1e3:7.2f} ms)  load {loads[-1]:.2f}", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    # after / before within each repeat (the two workers ran back to back): steadier than the ratio of medians when
    # the machine's load moves between repeats
    paired = {f"{algo}@{th}": [x / y for x, y in zip(runs[f"{algo}@{th}/after"], runs[f"{algo}@{th}/before"])]
              for algo in a.ab_algos for th in threads}
    p = {"what": "ms per SAC.update of two trees, same run (experiments/sac_default_speed --ab-before)",
         "command": "python experiments/sac_default_speed/sac_default_speed.py " + " ".join(sys.argv[1:]),
         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "trees": {n: {"path": str(t), "head": heads[n]} for n, t in trees.items()},
         "setting": {"algos": a.ab_algos, "threads": threads, "repeats": a.repeats, "turns": a.turns,
                     "updates": {"sac": a.updates, "ravl": a.ravl_updates}, "warmup_updates": a.warmup_updates,
                     "obs": OBS, "action": ACT, "batch": BATCH},
         "machine": {"cpus": os.cpu_count()}, "load_before": [round(x, 2) for x in load_before],
         "load_at_workers": [round(x, 2) for x in loads], "load_after": [round(x, 2) for x in os.getloadavg()],
         "runs_s": runs, "median_s": med,
         "after_over_before": {f"{algo}@{th}": med[f"{algo}@{th}/after"] / med[f"{algo}@{th}/before"]
                               for algo in a.ab_algos for th in threads},
         "after_over_before_per_repeat": paired, "cpu_runs_s": cpu_runs,
         "cpu_after_over_before": {f"{algo}@{th}": statistics.median(cpu_runs[f"{algo}@{th}/after"])
                                   / statistics.median(cpu_runs[f"{algo}@{th}/before"])
                                   for algo in a.ab_algos for th in threads},
         "wall_s": time.perf_counter() - t_start}
    lines = [f"# SAC.update, same-run A/B ({p['date']})", ""]
    lines += [f"- {n}: `{t['path']}` at {t['head']}" for n, t in p["trees"].items()]
    lines += ["", f"{a.repeats} workers per tree and algorithm (trees alternated), each the median of {a.turns} "
              f"blocks; obs {OBS}, action {ACT}, batch {BATCH}, CLI defaults of each algorithm; {os.cpu_count()} "
              f"CPUs, load average (1 min) at the workers {min(loads):.2f}-{max(loads):.2f}; script wall time "
              f"{p['wall_s'] / 60:.1f} min.", "",
              "| algorithm | threads | tree | ms / update (median) | per worker "
              "| CPU ms / update (median; per worker) |",
              "|---|---|---|---|---|---|"]
    for algo in a.ab_algos:
        for th in threads:
            for n in trees:
                v, cv = runs[f"{algo}@{th}/{n}"], cpu_runs[f"{algo}@{th}/{n}"]
                lines.append(f"| {algo} | {th} | {n} | {statistics.median(v) * 1e3:.2f} | "
                             + ", ".join(f"{x * 1e3:.2f}" for x in v) + f" | {statistics.median(cv) * 1e3:.2f}; "
                             + ", ".join(f"{x * 1e3:.2f}" for x in cv) + " |")
            pr = paired[f"{algo}@{th}"]
            lines.append(f"| {algo} | {th} | after / before | **{p['after_over_before'][f'{algo}@{th}']:.3f}** "
                         f"(per repeat {', '.join(f'{x:.3f}' for x in pr)}; their median {statistics.median(pr):.3f}) "
                         f"| | **{p['cpu_after_over_before'][f'{algo}@{th}']:.3f}** |")
    lines += ["", f"`{p['command']}`", ""]
    write_result(a.name, p, "\n".join(lines), folder=RESULTS)
    print("\n".join(lines))


def markdown(p: dict) -> str:
    s, w = p["setting"], p["whole_process"]
    lines = [f"# SAC with default flags against SB3 SAC ({p['date']}, commit {p['commit']})", "",
             f"HalfCheetah-v5, 1 env, {s['warmup']} random then {s['learning']} learning steps (UTD 1, batch 256, "
             f"256x256), whole process; {s['repeats']} repeats, variants in rotated order; {p['machine']['cpus']} "
             f"CPUs, load average before / after {p['load_before']} / {p['load_after']}; script wall time "
             f"{p['wall_s'] / 60:.1f} min.", "",
             "| variant | wall s, median (repeats) | train s (ctrl_rl's clock) | updates | SB3 s / variant s "
             "(median of repeats) |", "|---|---|---|---|---|"]
    for v, r in w.items():
        walls = ", ".join(f"{x['wall_s']:.1f}" for x in r["runs"])
        train = statistics.median(x["train_s"] for x in r["runs"]) if "train_s" in r["runs"][0] else None
        ratio = f"**{r['sb3_over_variant']:.2f}x**" if r.get("sb3_over_variant") is not None else ""
        lines.append(f"| {v} | {r['median_wall_s']:.1f} ({walls}) | {'' if train is None else f'{train:.1f}'} | "
                     f"{r['runs'][0]['updates']} | {ratio} |")
    if "default" in w:
        lines += ["", "Governor (`default`, CTRL_RL_THREAD_LOG=1) per repeat: " + "; ".join(
            f"start {x['threads']['start']}, {x['threads']['changes']} changes, last {x['threads']['last']}"
            for x in w["default"]["runs"])]
    if p["update"]:
        lines += ["", "`SAC.update` alone (default config, obs 17, action 6, batch 256, synthetic replay):", "",
                  "| threads | ms / update | matmul MFLOP / update (products) | update GFLOP/s | torch.mm at its "
                  "shapes GFLOP/s | 2048^2 mm GFLOP/s | **efficiency vs same shapes** | vs 2048^2 |",
                  "|---|---|---|---|---|---|---|---|"]
        for th, r in p["update"].items():
            lines.append(f"| {th} | {r['s_per_update'] * 1e3:.2f} | {r['matmul_flops_per_update'] / 1e6:.0f} "
                         f"({r['matmul_calls_per_update']}) | {r['update_matmul_gflops']:.1f} | "
                         f"{r['same_shapes_mm_gflops']:.1f} | {r['large_mm_gflops']:.1f} | "
                         f"**{r['efficiency_vs_same_shapes']:.0%}** | {r['efficiency_vs_large_mm']:.0%} |")
    lines += ["", f"`{p['command']}`", ""]
    return "\n".join(lines)


def median_of(runs: list[dict], key: str) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in key.split()}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1000, help="random env steps before learning")
    ap.add_argument("--learning", type=int, default=5000, help="env steps with one update each")
    ap.add_argument("--update-threads", type=int, nargs="*", default=None,
                    help="thread counts of the update-alone workers (default: 1 and every core); none: skip")
    ap.add_argument("--updates", type=int, default=50, help="updates per timed block (update alone)")
    ap.add_argument("--turns", type=int, default=5, help="timed blocks per update worker")
    ap.add_argument("--warmup-updates", type=int, default=20, help="untimed updates before the blocks")
    ap.add_argument("--profile-updates", type=int, default=30, help="updates in the torch.profiler table")
    ap.add_argument("--profile-suffix", default="", help="appended to the profile files' stem")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="sac_default_speed", help="stem of the result files")
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--update-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--algo", default="sac", choices=("sac", "ravl"), help=argparse.SUPPRESS)
    ap.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ab-before", metavar="REV", help="same-run A/B of the update alone: the code at REV against "
                    "this checkout (no whole-process runs)")
    ap.add_argument("--ab-after", metavar="REV", help="a worktree of REV as the after side (default: this checkout)")
    ap.add_argument("--tree", nargs="+", default=[], metavar="NAME=PATH", help="more trees for --ab-before")
    ap.add_argument("--ab-algos", nargs="+", default=["sac", "ravl"], choices=("sac", "ravl"))
    ap.add_argument("--ravl-updates", type=int, default=10, help="RAVL updates per timed block (--ab-before)")
    a = ap.parse_args()
    if a.sb3_worker:
        return sb3_worker(a)
    if a.update_worker:
        return update_worker(a)
    if a.ab_before:
        return ab_main(a)
    from ctrl_rl.core.perf import usable_cores

    update_threads = a.update_threads if a.update_threads is not None else sorted({1, usable_cores()})
    t_start, load_before = time.perf_counter(), os.getloadavg()
    whole: dict[str, list[dict]] = {v: [] for v in a.variants}
    update: dict[int, list[dict]] = {t: [] for t in update_threads}
    with tempfile.TemporaryDirectory(prefix="sac_default_speed-") as d:
        for rep in range(a.repeats):
            k = rep % len(a.variants)
            for v in a.variants[k:] + a.variants[:k]:  # rotated: no variant always first or after the same one
                r = run_variant(v, a, a.seed + rep, Path(d))
                whole[v].append(r)
                print(f"repeat {rep} {v:9s} {r['wall_s']:6.1f} s  updates {r['updates']}  "
                      f"load {r['load1_at_start']:.2f}" + (f"  threads {r['threads']}" if r.get("threads") else ""),
                      flush=True)
            for th in update_threads:
                u = update_run(th, a, a.seed + rep)
                update[th].append(u)
                print(f"repeat {rep} update t{th}: {u['s_per_update'] * 1e3:.2f} ms, "
                      f"{u['update_matmul_gflops']:.1f} GFLOP/s = {u['efficiency_vs_same_shapes']:.0%} of torch.mm "
                      f"at its shapes ({u['same_shapes_mm_gflops']:.1f}), {u['efficiency_vs_large_mm']:.0%} of a "
                      f"2048^2 mm ({u['large_mm_gflops']:.1f})", flush=True)
    whole_out: dict[str, dict] = {}
    for v, runs in whole.items():
        ratios = ([sb["wall_s"] / r["wall_s"] for sb, r in zip(whole["sb3"], runs)]
                  if "sb3" in whole and v != "sb3" else None)
        whole_out[v] = {"runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in runs),
                        "sb3_over_variant_per_repeat": ratios,
                        "sb3_over_variant": statistics.median(ratios) if ratios else None}
    keys = ("s_per_update update_matmul_gflops same_shapes_mm_gflops large_mm_gflops efficiency_vs_same_shapes "
            "efficiency_vs_large_mm")
    update_out = {str(t): {**median_of(runs, keys), "matmul_flops_per_update": runs[0]["matmul_flops_per_update"],
                           "matmul_calls_per_update": runs[0]["matmul_calls_per_update"], "runs": runs}
                  for t, runs in update.items()}
    payload = {
        "what": "SAC with default flags vs SB3 SAC, whole process; SAC.update's matmul rate "
                "(experiments/sac_default_speed)",
        "command": "python experiments/sac_default_speed/sac_default_speed.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "setting": {"env": "HalfCheetah-v5", "num_envs": 1, "warmup": a.warmup, "learning": a.learning,
                    "batch": BATCH, "hidden": [256, 256], "utd": 1, "repeats": a.repeats, "variants": a.variants,
                    "update": {"threads": update_threads, "updates": a.updates, "turns": a.turns,
                               "warmup_updates": a.warmup_updates, "obs": OBS, "action": ACT}},
        "targets": {"sb3_over_default": 1.5, "update_efficiency": 0.8},
        "machine": {"cpus": os.cpu_count()},
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "whole_process": whole_out, "update": update_out, "wall_s": time.perf_counter() - t_start}
    md = markdown(payload)
    write_result(a.name, payload, md, folder=RESULTS)
    print(md)


if __name__ == "__main__":
    main()
