"""Benchmark 3: massively parallel PPO on the torch-native Pendulum.

For 2^10, 2^14, 2^17 and 2^20 environments (64x64 tanh networks, T=16, 2 epochs) it measures, each in
a fresh process and as the median of --repeats runs:
  - env-steps/s including learning (whole iterations after a warm-up iteration),
  - peak resident memory of the process (ru_maxrss),
  - achieved GFLOP/s of the loop, counting the dense-layer FLOPs of every forward and backward pass
    (policy forward during collection, two value passes for GAE, forward+backward of actor and critic
    per epoch), against a large matmul measured in the same run,
and then the wall time to solve Pendulum (mean training return >= -200) with the embedded default preset
over several seeds.

    python experiments/massive_parallel/massive_parallel.py [--repeats 3] [--sizes 10 14 17 20] [--solve-seeds 3]

Writes experiments/massive_parallel/massive_parallel.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

HIDDEN = (64, 64)
T, EPOCHS = 16, 2


def mlp_flops(in_dim: int, out_dim: int) -> int:
    dims = (in_dim, *HIDDEN, out_dim)
    return sum(2 * a * b for a, b in zip(dims[:-1], dims[1:]))  # multiply-adds of one forward pass


def loop_flops_per_sample(obs_dim: int = 3, act_dim: int = 1) -> int:
    actor, critic = mlp_flops(obs_dim, act_dim), mlp_flops(obs_dim, 1)
    collect = actor
    gae_values = 2 * critic  # V(obs) and V(final_obs)
    update = EPOCHS * 3 * (actor + critic)  # backward ~ 2x forward
    return collect + gae_values + update


def child(log2n: int, iters: int) -> None:
    """Run in a fresh process: train for warm-up + iters updates and print one JSON line."""
    import torch

    from ctrl_rl.algos.ppo import PPOConfig
    from ctrl_rl.learn.config import RunConfig
    from ctrl_rl.learn.onpolicy import train_onpolicy

    n = 2 ** log2n
    mb = min(65536, T * n)
    cfg = PPOConfig(rollout_steps=T, epochs=EPOCHS, minibatch_size=mb, lr=1e-3, gamma=0.98,
                    actor_hidden=HIDDEN, critic_hidden=HIDDEN)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        run = RunConfig(env="torch:Pendulum", num_envs=n, total_steps=T * n * (iters + 1), progress=False,
                        checkpoint_every=10**9, seed=0)
        train_onpolicy(run, "ppo", cfg, Path(d) / "r")
        rows = [json.loads(x) for x in (Path(d) / "r" / "metrics.jsonl").read_text().splitlines()]
    timed = rows[1:]  # the first update includes warm-up
    seconds = timed[-1]["wall_time"] - rows[0]["wall_time"]
    sps = (timed[-1]["step"] - rows[0]["step"]) / seconds
    print(json.dumps({"log2n": log2n, "sps": sps,
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "grad_steps_per_update": rows[-1]["stats/grad_steps"], "threads": torch.get_num_threads()}))


def matmul_gflops() -> float:
    import torch

    from ctrl_rl.core.perf import tune_allocator

    tune_allocator()
    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    a @ b
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t)
    return 2 * 4096**3 / statistics.median(ts) / 1e9


def solve_time(seed: int, tmp: Path) -> dict:
    d = tmp / f"solve{seed}"
    cmd = [sys.executable, "-m", "ctrl_rl", "train", "ppo", "--seed", str(seed), "--run-dir", str(d), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    hit = [r for r in rows if r["episode_return"] is not None and r["episode_return"] >= -200]
    return {"seed": seed, "solved_at_s": hit[0]["wall_time"] if hit else None,
            "solved_at_step": hit[0]["step"] if hit else None,
            "final_return": [r["episode_return"] for r in rows if r["episode_return"] is not None][-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 14, 17, 20], help="log2 of the env counts")
    ap.add_argument("--solve-seeds", type=int, default=3)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.iters)
        return
    peak = matmul_gflops()
    fps = loop_flops_per_sample()
    print(f"large matmul: {peak:.0f} GFLOP/s; loop FLOPs per env-step: {fps:,}", flush=True)
    results = []
    for log2n in args.sizes:
        iters = args.iters if log2n < 20 else max(2, args.iters - 1)
        runs = []
        for _ in range(args.repeats):
            p = subprocess.run([sys.executable, __file__, "--child", str(log2n), "--iters", str(iters)], check=True,
                               capture_output=True, text=True, cwd=ROOT)
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        sps = statistics.median(r["sps"] for r in runs)
        row = {"envs": 2**log2n, "log2n": log2n, "sps_median": sps, "sps_runs": [r["sps"] for r in runs],
               "peak_rss_gb": max(r["peak_rss_gb"] for r in runs), "gflops": sps * fps / 1e9,
               "fraction_of_matmul": sps * fps / 1e9 / peak, "grad_steps_per_update": runs[0]["grad_steps_per_update"]}
        results.append(row)
        print(f"2^{log2n:<2d} envs: {sps:>10,.0f} env-steps/s  peak {row['peak_rss_gb']:.2f} GB  "
              f"{row['gflops']:.1f} GFLOP/s ({100 * row['fraction_of_matmul']:.0f}% of matmul)", flush=True)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        solves = [solve_time(s, Path(d)) for s in range(args.solve_seeds)]
    for s in solves:
        print(f"solve seed {s['seed']}: return >= -200 after {s['solved_at_s']} s ({s['solved_at_step']} steps); "
              f"final {s['final_return']:.1f}")
    times = [s["solved_at_s"] for s in solves if s["solved_at_s"] is not None]
    out = {"matmul_gflops": peak, "flops_per_env_step": fps, "T": T, "epochs": EPOCHS, "hidden": HIDDEN,
           "sizes": results,
           "solve": solves, "solve_median_s": statistics.median(times) if len(times) == len(solves) else None,
           "cpus": os.cpu_count()}
    md = ["| envs | env-steps/s (median) | peak RSS | GFLOP/s | % of matmul | grad steps/update |",
          "|---|---|---|---|---|---|"]
    for r in results:
        md.append(f"| 2^{r['log2n']} | {r['sps_median']:,.0f} | {r['peak_rss_gb']:.2f} GB | {r['gflops']:.1f} | "
                  f"{100 * r['fraction_of_matmul']:.0f}% | {r['grad_steps_per_update']:.0f} |")
    md.append("")
    md.append(f"Large matmul in the same run: {peak:.0f} GFLOP/s. Solve times (default preset, return >= -200): "
              + ", ".join(f"seed {s['seed']}: {s['solved_at_s']} s" for s in solves))
    write_result("massive_parallel", out, "\n".join(md) + "\n", folder=RESULTS)


if __name__ == "__main__":
    main()
