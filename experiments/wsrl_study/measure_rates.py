"""Issue 29, section 2: what one seed of the WSRL study costs here: CQL pre-training gradient steps/s and the online
loop's env steps/s after the warm-up, both at WSRL's settings (the cql and wsrl entries' defaults: 10 critics of
2x256 with LayerNorm, target subset 2; CQL batch 256 with 10 samples per kind and the max backup; online batch
1024 in 4 critic minibatches, UTD 1), from short `ctrl-rl train` runs with ``--threads 1`` (what each of two study
jobs gets on two cores: the automatic thread count drops to one while another process competes).

Each rate comes from two runs that differ only in length, so that start-up, imports and the final evaluation cancel:
per step, (CPU seconds of the long run - of the short run) / (steps between them). The CPU seconds are the
process's user + system time (os.wait4), what a step costs on a core of its own; the wall-clock rates the runs
logged are printed beside them and depend on whatever else the machine ran.

    nice -n 10 python experiments/wsrl_study/measure_rates.py --dataset hopper-medium-replay-v5   # or any Hopper .hdf5

Writes rates.json beside this script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent
LOGS: dict[int, Path] = {}  # pid -> the stderr log of a launched run


def launch(args: list[str], log: Path) -> subprocess.Popen:
    """`ctrl-rl train ARGS --threads 1`, its stderr to ``log``."""
    p = subprocess.Popen([sys.executable, "-m", "ctrl_rl", "train", *args, "--threads", "1", "--no-progress",
                          "--checkpoint-every", str(10**9)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"), env={**os.environ, "MPLBACKEND": "Agg"})
    LOGS[p.pid] = log
    return p


def finish(p: subprocess.Popen) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``p`` once it has exited."""
    t0 = time.perf_counter()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{p.args} failed (exit {p.returncode}):\n{LOGS[p.pid].read_text()[-3000:]}")
    return ru.ru_utime + ru.ru_stime, time.perf_counter() - t0


def logged(run_dir: Path, key: str, after: int) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r[key] for r in rows if key in r and r["step"] > after]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--cql-steps", type=int, default=100, help="gradient steps of the long CQL run (short: 1)")
    ap.add_argument("--warmup", type=int, default=1000, help="online: env steps before updates (WSRL: 5,000)")
    ap.add_argument("--online-steps", type=int, default=100, help="online env steps with updates after the warm-up")
    a = ap.parse_args()
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="wsrl-rates-") as tmp:
        d = Path(tmp)
        cql = ["cql", "--env", a.env, "--dataset", a.dataset, "--eval-every", "0", "--eval-episodes", "2",
               "--log-every", "25"]
        short = launch([*cql, "--total-steps", "1", "--run-dir", str(d / "cql1")], d / "cql1.log")
        cql_short = finish(short)  # its checkpoint is the --init of the online runs
        online = ["wsrl", "--env", a.env, "--init", str(d / "cql1"), "--learning-starts", str(a.warmup),
                  "--eval-every", "0", "--log-every", "25"]
        procs = {"cql_long": launch([*cql, "--total-steps", str(a.cql_steps), "--run-dir", str(d / "cqlN")],
                                   d / "cqlN.log"),
                 "online_short": launch([*online, "--total-steps", str(a.warmup), "--run-dir", str(d / "w0")],
                                       d / "w0.log"),
                 "online_long": launch([*online, "--total-steps", str(a.warmup + a.online_steps),
                                        "--run-dir", str(d / "wN")], d / "wN.log")}
        got = {k: finish(p) for k, p in procs.items()}
        cql_wall = logged(d / "cqlN", "updates_per_s", 25)
        online_wall = logged(d / "wN", "sps", a.warmup + 25)
    cql_cpu = (got["cql_long"][0] - cql_short[0]) / (a.cql_steps - 1)
    online_cpu = (got["online_long"][0] - got["online_short"][0]) / a.online_steps
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(), "env": a.env,
               "dataset": a.dataset, "threads": 1, "load_avg_1min_at_end": os.getloadavg()[0],
               "script_wall_s": round(time.time() - t_start, 1),
               "cql": {"steps": a.cql_steps, "cpu_s_per_step": cql_cpu, "steps_per_cpu_s": 1 / cql_cpu,
                       "logged_wall_updates_per_s": cql_wall},
               "online": {"warmup": a.warmup, "steps_after_warmup": a.online_steps, "cpu_s_per_step": online_cpu,
                          "steps_per_cpu_s": 1 / online_cpu, "logged_wall_sps": online_wall},
               "cpu_s": {"cql_short": cql_short[0], **{k: v[0] for k, v in got.items()}}}
    write_result("rates", payload, folder=RESULTS)
    print(json.dumps({k: payload[k] for k in ("cql", "online", "load_avg_1min_at_end", "script_wall_s")}, indent=1))


if __name__ == "__main__":
    main()
