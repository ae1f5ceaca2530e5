"""RAVL gradient steps/s: ctrl_rl against the official code, in one invocation (issue 28, section 3: "gradient
steps/s of both in the same run (target: ctrl_rl >= 2x)").

Each repeat runs, one after the other on the otherwise idle machine, with each code's default thread use (the
official code never sets torch's thread count, so torch takes every core; ctrl_rl's governor does the same alone):

- the official agent (``experiments/peers/ravl_official/run.py --stage agent``): one epoch of ``--steps`` updates
  after its rollout round, on the official fit; its rate is taken between the official code's own update logs
  (every 100 updates, inside the epoch: the update and its batch sampling, no rollouts or evaluations);
- ``ctrl-rl train ravl`` on the same dataset with ctrl_rl's fit, ``--steps`` gradient steps, logging every 100; its
  rate from the first to the last log row (the rollout round at step 0 is before the first row: updates and batch
  sampling only, as on the other side);
- unless ``--no-bf16``, the same ``ctrl-rl train ravl`` with ``--matmul-precision medium`` (bfloat16 products; not
  the default), reported beside.

Both at the paper's settings for halfcheetah-medium (10 critics, eta 1, batch 256, k = 5, real ratio 0.05); the
two models differ (each code's own fit of the same dataset), which does not change the work of an update.
Medians of ``--repeats``, alternating which goes first.

    python experiments/ravl_parity/speed.py --official-model /work/peers/runs/hc-dyn-full \\
        --ctrl-rl-model runs/d4rl/halfcheetah-medium-v5/dynamics [--steps 1000] [--repeats 3]

Writes ravl_speed.{json,md} beside this script.
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
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py
from common import ROOT, git_commit, write_result  # noqa: E402

RUN_PY = HERE.parent / "peers" / "ravl_official" / "run.py"


def official(a, seed: int, out: Path) -> dict:
    cmd = [sys.executable, str(RUN_PY), "--stage", "agent", "--dataset", a.dataset, "--seed", str(seed), "--model",
           str(a.official_model), "--steps", str(a.steps), "--eval-episodes", "1", "--checkout", str(a.checkout),
           "--venv", str(a.venv), "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = json.loads((out / "results.json").read_text())
    return {"grad_steps_per_s": res["grad_steps_per_s"], "timed_steps": res["grad_steps_timed"],
            "torch_threads": res.get("torch_threads"), "process_s": time.perf_counter() - t0}


def ctrl_rl(a, seed: int, out: Path, extra: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, "-m", "ctrl_rl", "train", "ravl", "--env", a.env, "--dataset", a.dataset, "--model",
           str(a.ctrl_rl_model), "--total-steps", str(a.steps), "--eval-every", "0", "--eval-episodes", "1",
           "--log-every", "100", "--seed", str(seed), "--run-dir", str(out), "--no-progress", "--checkpoint-every",
           str(10**9), *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "MPLBACKEND": "Agg"})
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "wall_time" in r and "step" in r]
    first, last = rows[0], rows[-1]
    return {"grad_steps_per_s": (last["step"] - first["step"]) / (last["wall_time"] - first["wall_time"]),
            "timed_steps": last["step"] - first["step"], "process_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--official-model", type=Path, required=True, help="the official dynamics run (run.py --out)")
    ap.add_argument("--ctrl-rl-model", type=Path, required=True, help="a `ctrl-rl train dynamics` run")
    ap.add_argument("--dataset", default="halfcheetah-medium-v5")
    ap.add_argument("--env", default="HalfCheetah-v5")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkout", type=Path, default=Path("/work/peers/edge-of-reach"))
    ap.add_argument("--venv", type=Path, default=Path("/work/peers/ravl-venv"))
    ap.add_argument("--no-bf16", action="store_true",
                    help="skip the third side, ctrl_rl with --matmul-precision medium (bfloat16 matmuls)")
    a = ap.parse_args(argv)
    load = os.getloadavg()[0]
    sides = ("official", "ctrl_rl") + (() if a.no_bf16 else ("ctrl_rl_bf16",))
    got: dict[str, list[dict]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory(prefix="ravl_speed_") as tmp:
        for r in range(a.repeats):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                out = Path(tmp) / f"{side}-{r}"
                if side == "official":
                    got[side].append(official(a, r, out))
                else:
                    extra = ("--matmul-precision", "medium") if side == "ctrl_rl_bf16" else ()
                    got[side].append(ctrl_rl(a, r, out, extra))
                print(f"repeat {r} {side}: {got[side][-1]['grad_steps_per_s']:.2f} gradient steps/s", flush=True)
    med = {k: statistics.median(x["grad_steps_per_s"] for x in v) for k, v in got.items()}
    ratio = med["ctrl_rl"] / med["official"]
    ratio_bf16 = med["ctrl_rl_bf16"] / med["official"] if "ctrl_rl_bf16" in med else None
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(),
               "command": "python experiments/ravl_parity/speed.py " + " ".join(argv or sys.argv[1:]),
               "load_average_before": load, "steps": a.steps, "repeats": got, "median_grad_steps_per_s": med,
               "ratio_ctrl_rl_over_official": ratio, "target": 2.0,
               "ratio_ctrl_rl_bf16_over_official": ratio_bf16}
    md = ["# RAVL gradient steps/s: ctrl_rl against the official code, same invocation", "",
          f"`{payload['command']}` ({payload['date']}, commit {payload['commit']}, load average {load:.2f} before)",
          "", f"| code | gradient steps/s (median of {a.repeats}) | repeats |", "|---|---|---|"]
    for k, v in got.items():
        md.append(f"| {k} | {med[k]:.2f} | " + ", ".join(f"{x['grad_steps_per_s']:.2f}" for x in v) + " |")
    md += ["", f"ctrl_rl / official: **{ratio:.2f}x** (target 2x: {'met' if ratio >= 2 else 'not met'})"]
    if ratio_bf16 is not None:
        md.append(f"ctrl_rl with `--matmul-precision medium` / official: **{ratio_bf16:.2f}x** (not the default)")
    md.append("")
    write_result("ravl_speed", payload, "\n".join(md) + "\n", folder=HERE)


if __name__ == "__main__":
    main()
