"""NeuBay's `--total-steps 300` bar on another device: the same workload as ``model_based_speed.py``'s ``neubay``
(``train neubay --env Hopper-v5 --dataset <10k rows of hopper-medium-v5> --model <a 7-member fit> --total-steps
300``), run by the checkout it lives in on each ``--variants`` entry, repeats alternating, the JSON rewritten after
every run (a device call can be cut off at its time limit).

    python experiments/model_based_speed/neubay_device.py --dataset .devdata/hopper-medium-10k.hdf5 \\
        --model .devdata/hopper-7member --variants cuda cuda_bf16 cpu --repeats 2 --out $OUT/neubay_device

Variants: ``cuda`` (``--device cuda``), ``cuda_bf16`` (with ``--bf16``), ``cpu`` (``--device cpu --threads 0``: every
core of that machine). Each run reports the gradient steps/s between its first and last metrics row (set-up, the
first rollouts and the final one-episode evaluation are outside it) and the process's wall seconds (the issue's bar:
well inside 2 minutes). Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import metrics_rate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"cuda": ["--device", "cuda"], "cuda_bf16": ["--device", "cuda", "--bf16"],
            "cpu": ["--device", "cpu", "--threads", "0"]}


def run(args: argparse.Namespace, variant: str, seed: int, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "ctrl_rl", "train", "neubay", "--env", "Hopper-v5", "--dataset", str(args.dataset),
           "--model", str(args.model), "--total-steps", str(args.steps), "--eval-every", "0", "--eval-episodes", "1",
           "--log-every", str(args.log_every), "--seed", str(seed), "--run-dir", str(run_dir), "--no-progress",
           "--checkpoint-every", str(10**9), *VARIANTS[variant]]
    shutil.rmtree(run_dir, ignore_errors=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    return {"variant": variant, "seed": seed, "steps_per_s": metrics_rate(rows), "wall_s": wall,
            "last_step": last["step"], "losses": {k: last.get(k) for k in ("loss/critic", "loss/actor") if k in last}}


def markdown(p: dict) -> str:
    lines = [f"# NeuBay `--total-steps {p['steps']}` on {p['machine']['device_name']}",
             "", f"{p['date']}, commit {p['commit']}, torch {p['machine']['torch']}, {p['machine']['cpus']} CPUs",
             "", "| variant | runs | gradient steps/s (median) | process wall s (median) |", "|---|---|---|---|"]
    for v in p["variants"]:
        rs = [r for r in p["runs"] if r["variant"] == v]
        if rs:
            lines.append(f"| {v} | {len(rs)} | {statistics.median(r['steps_per_s'] for r in rs):.2f} | "
                         f"{statistics.median(r['wall_s'] for r in rs):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--variants", nargs="+", default=["cuda", "cuda_bf16", "cpu"], choices=sorted(VARIANTS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--commit", default="", help="the commit of the tree sent (default: git rev-parse HEAD there)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "CPU"
    # a device's copy of .git can be older than the tree it receives: --commit names the tree sent
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip() or "unknown"
    p = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
         "steps": args.steps, "variants": args.variants, "dataset": str(args.dataset), "model": str(args.model),
         "machine": {"device_name": name, "torch": torch.__version__, "cpus": os.cpu_count()}, "runs": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i in range(args.repeats):
        order = args.variants if i % 2 == 0 else args.variants[::-1]
        for v in order:
            r = run(args, v, i, args.out.parent / f"run_{v}_{i}")
            p["runs"].append(r)
            print(json.dumps(r), flush=True)
            args.out.with_suffix(".json").write_text(json.dumps(p, indent=2) + "\n")
            args.out.with_suffix(".md").write_text(markdown(p))
    print(markdown(p))


if __name__ == "__main__":
    main()
