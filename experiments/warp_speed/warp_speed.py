"""MuJoCo Warp env-steps/s against the number of worlds: stepping alone and PPO end to end, on the device it runs on,
beside envpool on the same task in the same run (issue 32, part 2).

For N = 2^6 .. 2^14 worlds (``--max-worlds``), each the median of ``--repeats`` measurements:

- ``warp step``: ``make_env("warp:<Task>", N, device)`` (the BatchedEnv, graph replay on), uniform random actions
  in [-1, 1] drawn on the device, N x batched steps / seconds. Two warm-up steps first (the first one captures the
  Warp graph); each measurement is at least ``STEP_SAMPLES`` env steps and at least 3 batched steps (3 at 2^14).
- ``warp ppo``: ``ctrl-rl train ppo --preset warp-<task> --num-envs N`` in this process (``ctrl_rl.cli.main``, so
  that the interpreter and the kernel cache are paid once), for two iterations; env steps / seconds of the second
  iteration from the run's ``metrics.jsonl``, so start-up, env creation, graph capture and the first update are
  excluded. The rollout is shortened to T = max(1, ``PPO_SAMPLES`` / N) steps so that every world count costs a
  few seconds; the rest is the preset's (networks, epochs, minibatch size), so each sample goes through the same
  number of forward and backward passes as in the preset's update.
- ``envpool step`` / ``envpool ppo`` (CPU only): the same on ``envpool:<Task>`` (envpool's C++ MuJoCo, its own
  thread pool) with the same flags, up to ``--envpool-max-worlds``: building envpool's pool costs about 7 s at 4096
  envs and 48 s at 16384 on this machine, so by default it stops at 4096.

The device is named (the CPU model from /proc/cpuinfo, or the GPU's name); the load average (``uptime``) before and
after is recorded, since the figures of a shared machine are only comparable within one run.

On a GPU (``--device cuda``; refused where CUDA is missing), ``--time-to 3000`` also trains ``--preset warp-<task>``
with 4096 worlds for ``--time-to-steps`` env steps per seed and records the wall time of every logged iteration,
with the mean return of the training episodes that ended in it (stochastic policy; with 4096 worlds on HalfCheetah
all 4096 episodes end together every 1000 steps), and the first wall time at which it reaches the target.

    python experiments/warp_speed/warp_speed.py                      # CPU, about 7 minutes on 2 shared cores
    python experiments/warp_speed/warp_speed.py --max-worlds 1024 --repeats 1
    python experiments/warp_speed/warp_speed.py --device cuda --time-to 3000

Writes warp_speed.{json,md,png} beside this script (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import git_commit, write_result  # noqa: E402

from ctrl_rl.envs.registry import make_env  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this benchmark's folder: its results live beside the script
TASKS = {"HalfCheetah-v5": "warp-halfcheetah", "Hopper-v5": "warp-hopper", "Walker2d-v5": "warp-walker2d",
         "Ant-v5": "warp-ant", "Humanoid-v5": "warp-humanoid"}
STEP_SAMPLES = 16384  # env steps per stepping measurement (at least 3 batched steps)
PPO_SAMPLES = 4096  # env steps per PPO iteration (at least one step of every world)
TIME_TO_WORLDS = 4096


def device_name(device: str) -> str:
    """The GPU's name, or the CPU model (/proc/cpuinfo's ``model name``) and its logical cores."""
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} logical cores"


def uptime() -> str:
    """``uptime``'s line (the load averages over 1, 5 and 15 minutes), or os.getloadavg() where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def versions() -> dict:
    """The versions of the packages the figures depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "warp-lang", "mujoco-warp", "mujoco", "envpool"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_sps(env_id: str, n: int, device: str, repeats: int) -> list[float]:
    """Env-steps/s of ``repeats`` measurements of one env of ``n`` worlds stepped with uniform random actions."""
    env = make_env(env_id, num_envs=n, device=device, seed=0)
    gen = torch.Generator(device=device).manual_seed(0)
    a_dim = env.spec.action_dim
    steps = max(3, math.ceil(STEP_SAMPLES / n))
    env.reset()
    for _ in range(2):  # warm-up: the first step captures the Warp graph
        env.step(2 * torch.rand(n, a_dim, generator=gen, device=device) - 1)
    out = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(2 * torch.rand(n, a_dim, generator=gen, device=device) - 1)  # [N,A]
        _sync(device)
        out.append(n * steps / (time.perf_counter() - t0))
    env.close()
    return out


def train_cli(args: list[str]) -> tuple[int, str]:
    """``ctrl-rl ARGS`` in this process; returns (exit code, what it wrote to stderr)."""
    from ctrl_rl.cli import main as cli_main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(args)
    return code, err.getvalue()


def ppo_sps(env_id: str, preset: str, n: int, device: str, repeats: int, threads: int = 0) -> list[float]:
    """Env-steps/s of the second iteration of ``repeats`` fresh two-iteration PPO runs of the preset with ``n``
    worlds and T = max(1, PPO_SAMPLES / n) (start-up and the first iteration excluded)."""
    t = max(1, PPO_SAMPLES // n)
    out = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            code, err = train_cli(["train", "ppo", "--preset", preset, "--env", env_id, "--num-envs", str(n),
                                   "--rollout-steps", str(t), "--total-steps", str(2 * t * n), "--device", device,
                                   "--seed", str(r), "--threads", str(threads), "--run-dir", f"{d}/run",
                                   "--no-progress", "--checkpoint-every", str(10**9)])
            if code != 0:
                raise RuntimeError(f"train ppo on {env_id} with {n} worlds failed ({code}): {err[-2000:]}")
            rows = [json.loads(x) for x in Path(f"{d}/run/metrics.jsonl").read_text().splitlines()]
        first, last = rows[0], rows[-1]
        out.append((last["step"] - first["step"]) / (last["wall_time"] - first["wall_time"]))
    return out


def time_to(task: str, target: float, seeds: list[int], budget: int) -> dict:
    """Wall time to a mean training return of ``target`` with the preset's 4096 worlds on the GPU, per seed: every
    logged iteration's (step, wall time, return), and the first wall time at or above the target (None: not within
    ``budget`` env steps)."""
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            code, err = train_cli(["train", "ppo", "--preset", TASKS[task], "--num-envs", str(TIME_TO_WORLDS),
                                   "--device", "cuda", "--seed", str(seed), "--total-steps", str(budget),
                                   "--run-dir", f"{d}/run", "--no-progress", "--checkpoint-every", str(10**9)])
            process_s = time.perf_counter() - t0
            if code != 0:
                raise RuntimeError(f"time-to run (seed {seed}) failed ({code}): {err[-2000:]}")
            rows = [json.loads(x) for x in Path(f"{d}/run/metrics.jsonl").read_text().splitlines()]
        evals = [{"step": r["step"], "wall_time": r["wall_time"], "return": r["episode_return"]}
                 for r in rows if r["episode_return"] is not None]
        hit = next((e for e in evals if e["return"] >= target), None)
        runs.append({"seed": seed, "time_s": hit["wall_time"] if hit else None, "step": hit["step"] if hit else None,
                     "final_return": evals[-1]["return"] if evals else None, "evaluations": evals,
                     "startup_s": process_s - rows[-1]["wall_time"]})
        print(f"time to {target:g}, seed {seed}: {runs[-1]['time_s']} s at step {runs[-1]['step']}", flush=True)
    times = [r["time_s"] for r in runs if r["time_s"] is not None]
    return {"target": target, "worlds": TIME_TO_WORLDS, "budget_steps": budget, "runs": runs,
            "median_s": statistics.median(times) if len(times) == len(runs) else None,
            "reached": f"{len(times)} of {len(runs)} seeds"}


def markdown(p: dict) -> str:
    s = p["setting"]
    lines = [f"# MuJoCo Warp env-steps/s against worlds: warp:{s['task']} on {p['device_name']}", "",
             f"{p['date']}, commit {p['commit']}, device `{s['device']}`; medians of {s['repeats']}; "
             f"script wall time {p['wall_s'] / 60:.1f} min. Load before: `{p['load_before']}`; after: "
             f"`{p['load_after']}`. Ratios are same-run; absolute figures are under that load.", "",
             "| worlds | warp step | warp ppo | envpool step | envpool ppo | warp/envpool step | warp/envpool ppo |",
             "|---:|---:|---:|---:|---:|---:|---:|"]

    def fmt(x):
        return f"{x:,.0f}" if x is not None else "-"

    def ratio(a, b):
        return f"{a / b:.2f}" if a is not None and b is not None else "-"

    for row in p["rows"]:
        m = {k: row[k]["median"] if row.get(k) else None for k in ("warp_step", "warp_ppo", "envpool_step",
                                                                  "envpool_ppo")}
        lines.append(f"| {row['worlds']:,} | {fmt(m['warp_step'])} | {fmt(m['warp_ppo'])} | {fmt(m['envpool_step'])} "
                     f"| {fmt(m['envpool_ppo'])} | {ratio(m['warp_step'], m['envpool_step'])} "
                     f"| {ratio(m['warp_ppo'], m['envpool_ppo'])} |")
    lines += ["", f"PPO: `--preset {s['preset']}` with T = max(1, {PPO_SAMPLES} / worlds), two iterations, the "
              "second one timed. Stepping: uniform random actions, at least "
              f"{STEP_SAMPLES} env steps and 3 batched steps per measurement."]
    if s["device"] == "cpu":
        lines.append(f"envpool measured up to {s['envpool_max_worlds']:,} envs (building its pool: about 7 s at "
                     "4096 and 48 s at 16384 here).")
    if p.get("time_to"):
        t = p["time_to"]
        lines += ["", f"Time to return {t['target']:g} with {t['worlds']} worlds: median {t['median_s']} s "
                  f"({t['reached']} reached it within {t['budget_steps']:,} env steps); per seed: "
                  + ", ".join(f"{r['seed']}: {r['time_s']} s" for r in t["runs"]) + "."]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    styles = {"warp_step": ("warp step", "C0", "-"), "warp_ppo": ("warp PPO", "C0", "--"),
              "envpool_step": ("envpool step", "C1", "-"), "envpool_ppo": ("envpool PPO", "C1", "--")}
    for key, (label, color, ls) in styles.items():
        pts = [(r["worlds"], r[key]["median"]) for r in p["rows"] if r.get(key)]
        if pts:
            ax.loglog(*zip(*pts), ls, color=color, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("worlds (parallel envs)")
    ax.set_ylabel("env-steps/s")
    ax.set_title(f"{p['setting']['task']} on {p['device_name']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="MuJoCo Warp env-steps/s against the number of worlds (stepping, "
                                 "PPO end to end), beside envpool on CPU.")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--task", default="HalfCheetah-v5", choices=sorted(TASKS))
    ap.add_argument("--min-worlds", type=int, default=64)
    ap.add_argument("--max-worlds", type=int, default=16384)
    ap.add_argument("--envpool-max-worlds", type=int, default=4096, help="CPU only; 0 skips envpool")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="--threads of the PPO runs (0: ctrl_rl's adaptive count)")
    ap.add_argument("--skip-ppo", action="store_true", help="stepping alone")
    ap.add_argument("--time-to", type=float, default=None, metavar="RETURN",
                    help="GPU only: wall time to this training return with the preset's 4096 worlds")
    ap.add_argument("--time-to-steps", type=int, default=50_000_000, help="env-step budget per seed of --time-to")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of --time-to")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of warp_speed.{json,md,png}")
    a = ap.parse_args(argv)
    for flag, v in (("--min-worlds", a.min_worlds), ("--max-worlds", a.max_worlds)):
        if v < 1 or v & (v - 1):
            ap.error(f"{flag} {v} is not a power of two: expected one, such as 64 or 16384.")
    if a.min_worlds > a.max_worlds:
        ap.error(f"--min-worlds {a.min_worlds} is above --max-worlds {a.max_worlds}: expected min <= max.")
    if a.repeats < 1 or a.envpool_max_worlds < 0 or a.time_to_steps < 1 or a.threads < 0:
        ap.error(f"--repeats {a.repeats}, --envpool-max-worlds {a.envpool_max_worlds}, --time-to-steps "
                 f"{a.time_to_steps} or --threads {a.threads} is out of range: expected repeats >= 1, envpool worlds "
                 ">= 0, steps >= 1 and threads >= 0.")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA GPU and torch finds none on this machine: expected --device cpu here, "
                 "or a machine with a GPU.")
    if a.time_to is not None and a.device != "cuda":
        ap.error(f"--time-to {a.time_to:g} trains {TIME_TO_WORLDS} worlds to a return and is meant for a GPU: "
                 "expected --device cuda with it.")
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse(argv)
    from ctrl_rl.envs.gymnasium import filter_mujoco_warnings

    filter_mujoco_warnings()
    t_start = time.perf_counter()
    load_before = uptime()
    preset = TASKS[a.task]
    envpool_max = a.envpool_max_worlds if a.device == "cpu" else 0
    worlds = [2**k for k in range(a.min_worlds.bit_length() - 1, a.max_worlds.bit_length())]
    print(f"warp:{a.task} on {device_name(a.device)}; {load_before}", flush=True)
    rows = []
    for n in worlds:
        row: dict = {"worlds": n}
        jobs = [("warp_step", partial(step_sps, f"warp:{a.task}", n, a.device, a.repeats))]
        if not a.skip_ppo:
            jobs.append(("warp_ppo", partial(ppo_sps, f"warp:{a.task}", preset, n, a.device, a.repeats, a.threads)))
        if n <= envpool_max:
            jobs.append(("envpool_step", partial(step_sps, f"envpool:{a.task}", n, "cpu", a.repeats)))
            if not a.skip_ppo:
                jobs.append(("envpool_ppo", partial(ppo_sps, f"envpool:{a.task}", preset, n, "cpu", a.repeats,
                                                     a.threads)))
        for key, job in jobs:
            values = job()
            row[key] = {"median": statistics.median(values), "values": values}
            print(f"{n:>6} worlds  {key:<13} {row[key]['median']:>10,.0f} env-steps/s", flush=True)
        rows.append(row)
    p = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git_commit(),
         "device_name": device_name(a.device), "versions": versions(),
         "setting": {"task": a.task, "device": a.device, "preset": preset, "repeats": a.repeats,
                     "envpool_max_worlds": envpool_max, "threads": a.threads,
                     "step_samples": STEP_SAMPLES, "ppo_samples": PPO_SAMPLES},
         "load_before": load_before, "rows": rows}
    if a.time_to is not None:
        p["time_to"] = time_to(a.task, a.time_to, a.seeds, a.time_to_steps)
    p["load_after"] = uptime()
    p["wall_s"] = time.perf_counter() - t_start
    md = markdown(p)
    print(md)
    write_result("warp_speed", p, md, folder=a.out)
    plot(p, a.out / "warp_speed.png")
    return p


if __name__ == "__main__":
    main()
