"""Threads under contention: one `ctrl-rl train` run alone, then two copies started together (issue 11 §6).

Two default PPO runs side by side on a 2-core machine each took many times their solo time with torch's
default two OpenMP threads per process (the issue saw 15x; 3-4x here on an otherwise idle machine, far
more next to other people's tests): at the end of every small parallel region the thread that got the
core spin-waits at the barrier for its partner, which is descheduled because the other process's threads
spin on the other core. This script measures, per *setting* (CLI flags and/or environment variables of the
child processes), the solo wall time and the wall time of each of two concurrent copies, repeated R times
with the settings' order rotated between repeats, and reports medians of the per-repeat slowdown
(slower copy / solo of the same repeat).

    python experiments/contention/contention.py                      # PPO default preset at 600k steps, PPO settings
    python experiments/contention/contention.py --workload ppo sac offline sac-halfcheetah --repeats 3
    python experiments/contention/contention.py --settings default threads2 --stagger 4   # 2nd copy 4 s after the 1st
    python experiments/contention/contention.py --settings default threads1 threads2 --solo-only --repeats 5
    python experiments/contention/contention.py --setting "mine:OMP_WAIT_POLICY=PASSIVE --threads 2" --append

Settings are named in SETTINGS (default, threads1, threads2, omp_passive, spin10k, mixed); "default" is
what `--threads 0` does today (every loop under ctrl_rl.core.perf.ThreadGovernor), "threads2" what PPO did before
the governor (torch's two threads, fixed), "threads1" what the off-policy and offline loops did before they were
governed (one thread, fixed). Results go to experiments/contention/<--out>.{json,md} (default contention); --append adds
this invocation's run to those already there. Before each measurement the script waits (up to
--quiet-wait s) until other processes use fewer than --quiet-below cores, and marks each repeat clean or not.

Per process it records the wall time from process start to exit (interpreter start-up and imports
included), the training time printed in the run's final JSON line ("wall_time_s"), its CPU time (user +
sys, from wait4: spin-waiting shows up as CPU time well above the work's), the load average at launch,
and the CPU time used by *other* processes during the measurement ("foreign load", in cores, from
/proc/stat minus our children's CPU time), since other people's tests share the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

HZ = os.sysconf("SC_CLK_TCK")
QUIET = {"max_wait": 0.0, "threshold": 0.3}  # set from --quiet-wait / --quiet-below
CLEAN_FOREIGN = 0.25  # a repeat is "clean" when other processes used at most this many cores during it

# The workloads: the flags after `python -m ctrl_rl train`; {steps} and {dataset} are filled in.
WORKLOADS = {
    # the embedded default (PPO, torch:Pendulum, 1024 envs), with a reduced budget
    "ppo": ("ppo --total-steps {steps}", 600_000),
    # off-policy: SAC with small networks on one env
    "sac": ("sac --env torch:Pendulum --total-steps {steps} --learning-starts 500 --actor-hidden 64 64 "
            "--critic-hidden 64 64", 3000),
    # off-policy at its defaults (256x256, batch 256, one envpool env): issue 30's SAC run, shortened; alone the
    # governor keeps two threads here (a second core gains this update ~1.5x), so a pair shows its whole cost
    "sac-halfcheetah": ("sac --env HalfCheetah-v5 --total-steps {steps} --learning-starts 1000", 3000),
    # offline: IQL on a small random torch:Pendulum dataset written by this script
    "offline": ("iql --env torch:Pendulum --dataset {dataset} --total-steps {steps} --eval-every 0 --eval-episodes 2 "
                "--actor-hidden 64 64 --critic-hidden 64 64 --value-hidden 64 64 --log-every 500 "
                "--checkpoint-every 100000", 3000),
}

@dataclass(frozen=True)
class Setting:
    """How the child processes are started: extra CLI flags and environment variables, one pair per copy
    (copy B defaults to copy A's; a different B models a pair where only one process adapted)."""

    name: str
    flags: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    flags_b: tuple[str, ...] | None = None
    env_b: dict | None = None
    note: str = ""

    def copy(self, which: int) -> tuple[tuple[str, ...], dict]:
        if which == 1 and self.flags_b is not None:
            return self.flags_b, self.env_b if self.env_b is not None else self.env
        return self.flags, self.env


SETTINGS = {
    "default": Setting("default", note="the default, --threads 0: every loop under ctrl_rl.core.perf.ThreadGovernor "
                                       "(every core alone, one thread next to other busy processes)"),
    "threads1": Setting("threads1", ("--threads", "1"),
                        note="--threads 1 (the off-policy and offline default before every loop was governed)"),
    "threads2": Setting("threads2", ("--threads", "2"),
                        note="--threads 2: torch's two OpenMP threads, fixed (PPO's default before the governor)"),
    "omp_passive": Setting("omp_passive", ("--threads", "2"), env={"OMP_WAIT_POLICY": "PASSIVE"},
                           note="--threads 2 with OMP_WAIT_POLICY=PASSIVE (libgomp: GOMP_SPINCOUNT 0, sleep at once)"),
    "spin10k": Setting("spin10k", ("--threads", "2"), env={"GOMP_SPINCOUNT": "10000"},
                       note="--threads 2 with GOMP_SPINCOUNT=10000 (libgomp default 300000 spins before sleeping)"),
    "mixed": Setting("mixed", (), flags_b=("--threads", "2"),
                     note="copy A default (governed), copy B --threads 2 (a neighbour that does not adapt)"),
}
DEFAULT_SETTINGS = {"ppo": ["default", "threads2", "threads1"],
                    "sac": ["default", "threads1", "threads2"],
                    "offline": ["default", "threads1", "threads2"],
                    "sac-halfcheetah": ["default", "threads1", "threads2"]}


def parse_setting(spec: str) -> Setting:
    """"name:KEY=VAL ... --flag value ...": tokens KEY=VAL with an upper-case KEY are environment variables."""
    name, _, rest = spec.partition(":")
    env, flags = {}, []
    for tok in rest.split():
        k, eq, v = tok.partition("=")
        if eq and not tok.startswith("-") and k.upper() == k:
            env[k] = v
        else:
            flags.append(tok)
    return Setting(name, tuple(flags), env, note=f"custom: {rest}")


# -- measurement ----------------------------------------------------------------------------------------------
def cpu_busy_s() -> float:
    """Seconds of CPU time used by everything on the machine since boot (user+nice+system+irq+softirq+steal)."""
    f = open("/proc/stat").readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / HZ


def wait_quiet(max_wait: float, threshold: float, window: float = 1.0) -> dict:
    """Wait (at most ``max_wait`` s) until the machine's CPU use over ``window`` s is below ``threshold`` cores.
    Nothing of ours runs between measurements, so that is other people's load."""
    t0 = time.perf_counter()
    while True:
        b0 = cpu_busy_s()
        time.sleep(window)
        busy = (cpu_busy_s() - b0) / window
        if busy < threshold or time.perf_counter() - t0 >= max_wait:
            return {"waited_s": round(time.perf_counter() - t0, 1), "busy_before": round(busy, 2)}


def loadavg() -> dict:
    a = open("/proc/loadavg").read().split()
    return {"load1": float(a[0]), "load5": float(a[1]), "runnable": int(a[3].split("/")[0])}


@dataclass
class Proc:
    """A launched training process and what was measured of it once it was reaped."""

    popen: subprocess.Popen
    out_path: Path
    t0: float
    load_at_start: dict
    wall_s: float | None = None
    cpu_s: float | None = None
    rc: int | None = None
    timed_out: bool = False


def launch(cmd: list[str], env_extra: dict, out_path: Path) -> Proc:
    env = dict(os.environ, **env_extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    load = loadavg()
    out = open(out_path, "w")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    out.close()
    return Proc(p, out_path, t0, load)


def cmd_of(p: Proc) -> list[str]:
    args = p.popen.args
    return [str(x) for x in args] if isinstance(args, (list, tuple)) else [str(args)]


def run_group(starts: list[tuple[float, Callable[[], Proc]]], timeout: float) -> list[Proc]:
    """Launch each ``(delay_s, launch_fn)`` at its delay, reap each process as it exits (wall time and CPU
    time from wait4) and kill what is still running ``timeout`` s after the first launch."""
    t0 = time.perf_counter()
    procs: list[Proc | None] = [None] * len(starts)
    pending: dict[int, Proc] = {}
    while True:
        now = time.perf_counter() - t0
        for i, (delay, fn) in enumerate(starts):
            if procs[i] is None and now >= delay:
                proc = procs[i] = fn()
                pending[proc.popen.pid] = proc
        for pid, p in list(pending.items()):
            got, status, ru = os.wait4(pid, os.WNOHANG)
            if got == pid:
                p.wall_s = time.perf_counter() - p.t0
                p.cpu_s = ru.ru_utime + ru.ru_stime
                p.rc = os.waitstatus_to_exitcode(status)
                p.popen.returncode = p.rc
                del pending[pid]
        done = [p for p in procs if p is not None]
        if not pending and len(done) == len(procs):
            return done
        if pending and now > timeout:
            for pid, p in pending.items():
                p.timed_out = True
                os.killpg(pid, signal.SIGKILL)  # the process group of a child we started (start_new_session)
        time.sleep(0.02)


def train_wall(out_path: Path) -> float | None:
    for line in reversed(out_path.read_text().splitlines()):
        if line.startswith("{") and "wall_time_s" in line:
            return json.loads(line)["wall_time_s"]
    return None


def measure(cmd_for, setting: Setting, copies: int, timeout: float, tmp: Path, tag: str, stagger: float = 0.0) -> dict:
    """Start ``copies`` processes together (or each ``stagger`` s after the previous); per process: wall, train
    wall, CPU seconds, load at launch."""
    quiet = wait_quiet(QUIET["max_wait"], QUIET["threshold"]) if QUIET["max_wait"] > 0 else None
    busy0, t0 = cpu_busy_s(), time.perf_counter()
    starts = []
    for i in range(copies):
        flags, env = setting.copy(i)
        cmd = cmd_for(tmp / f"{tag}-{i}", flags)
        starts.append((i * stagger, lambda cmd=cmd, env=env, i=i: launch(cmd, env, tmp / f"{tag}-{i}.log")))
    procs = run_group(starts, timeout)
    elapsed = time.perf_counter() - t0
    foreign = max(0.0, (cpu_busy_s() - busy0) - sum(p.cpu_s or 0.0 for p in procs)) / elapsed
    rows = []
    for p in procs:
        if p.rc != 0 and not p.timed_out:
            tail = p.out_path.read_text()[-2000:]
            raise RuntimeError(f"run failed (exit {p.rc}): {' '.join(cmd_of(p))}\n{tail}")
        assert p.wall_s is not None and p.cpu_s is not None  # set when reaped (run_group returns after every reap)
        rows.append({"wall_s": round(p.wall_s, 2), "train_s": train_wall(p.out_path), "cpu_s": round(p.cpu_s, 2),
                     "timed_out": p.timed_out,
                     **{f"{k}_at_start": v for k, v in p.load_at_start.items()}})
    return {"procs": rows, "foreign_load": round(foreign, 2), "quiet_gate": quiet}


def write_offline_dataset(path: Path) -> None:
    """Random-action torch:Pendulum transitions (8 envs x 200 steps, each ending in a time limit), D4RL layout."""
    code = f"""
import h5py, numpy as np, torch
from ctrl_rl.envs.registry import make_env
env = make_env("torch:Pendulum", num_envs=8, device="cpu", seed=0)
obs = env.reset(seed=0)
g = torch.Generator().manual_seed(0)
cols = {{k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}}
for _ in range(200):
    a = torch.rand(8, 1, generator=g) * 4 - 2
    out = env.step(a)
    for k, v in zip(cols, (obs, a / 2, out.reward, out.final_obs, out.terminated, out.truncated)):
        cols[k].append(v)
    obs = out.obs
with h5py.File({str(path)!r}, "w") as f:
    for k, v in cols.items():
        arr = torch.stack(v, 1).flatten(0, 1).numpy()
        f[k] = arr if arr.dtype == np.bool_ else arr.astype(np.float32)
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def median(xs: Sequence[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return round(statistics.median(known), 3) if known else None


def summarize(all_reps: list[dict]) -> dict:
    clean = [r for r in all_reps
             if max(r["solo"]["foreign_load"], r["pair"]["foreign_load"] if r["pair"] else 0.0) <= CLEAN_FOREIGN]
    out = {"all": _summary(all_reps), "clean": _summary(clean) if clean else None, "n": len(all_reps),
           "n_clean": len(clean)}
    return out


def _summary(reps: list[dict]) -> dict:
    solo = [r["solo"]["procs"][0] for r in reps]
    if any(r["pair"] is None for r in reps):  # --solo-only
        return {"solo_wall_s": median([s["wall_s"] for s in solo]),
                "solo_train_s": median([s["train_s"] for s in solo]),
                "solo_cpu_s": median([s["cpu_s"] for s in solo]), "solo_train_all": [s["train_s"] for s in solo],
                "solo_wall_all": [s["wall_s"] for s in solo],
                "load1_before": median([s["load1_at_start"] for s in solo]),
                "foreign_load": median([r["solo"]["foreign_load"] for r in reps])}
    pair = [r["pair"]["procs"] for r in reps]
    slow = [max(p["wall_s"] for p in pr) / s["wall_s"] for s, pr in zip(solo, pair)]
    mean_slow = [statistics.mean(p["wall_s"] for p in pr) / s["wall_s"] for s, pr in zip(solo, pair)]
    train_slow = [max(p["train_s"] for p in pr) / s["train_s"]
                  if s["train_s"] and all(p["train_s"] for p in pr) else None
                  for s, pr in zip(solo, pair)]
    return {
        "solo_wall_s": median([s["wall_s"] for s in solo]),
        "solo_train_s": median([s["train_s"] for s in solo]),
        "solo_cpu_s": median([s["cpu_s"] for s in solo]),
        "pair_wall_s": [median([pr[i]["wall_s"] for pr in pair]) for i in range(2)],
        "pair_train_s": [median([pr[i]["train_s"] for pr in pair]) for i in range(2)],
        "pair_cpu_s": [median([pr[i]["cpu_s"] for pr in pair]) for i in range(2)],
        "slowdown": median(slow),  # slower copy / solo, per repeat
        "slowdown_all": [round(x, 2) for x in slow],
        "slowdown_mean_copy": median(mean_slow),
        "slowdown_train": median(train_slow),
        "any_timed_out": any(p["timed_out"] for pr in pair for p in pr),
        "load1_before": median([s["load1_at_start"] for s in solo]),
        "foreign_load": median([r["solo"]["foreign_load"] for r in reps] + [r["pair"]["foreign_load"] for r in reps]),
    }


def markdown(runs: list[dict], reading: str | None = None) -> str:
    lines = ["# Threads under contention: one run alone vs two copies started together",
             "",
             "Written by `experiments/contention/contention.py` (each invocation below is one run of it; `--append` "
             "adds one). Wall time is process start to exit (imports, plot included); *train* is the run's own "
             "`wall_time_s`. Slowdown = slower copy of the pair / solo run of the same repeat, median over repeats "
             "(all repeats in brackets). CPU = user+sys seconds of one process (spin-waiting inflates it). Foreign = "
             "cores used by other processes during the measurements (median; other people's tests share the "
             "machine). Medians are over the *clean* repeats (other processes used <= "
             f"{CLEAN_FOREIGN} cores during both the solo and the pair measurement) when there are any, else over "
             "all; every repeat is in the JSON.",
             ""]
    if reading:  # the hand-written reading kept in the JSON ("reading"), rendered above the tables
        lines += [reading.rstrip(), ""]
    for payload in runs:
        lines += markdown_run(payload)
    return "\n".join(lines) + "\n"


def markdown_run(payload: dict) -> list[str]:
    m = payload["machine"]
    lines = [f"## `contention.py {' '.join(payload['argv'])}`", "",
             f"{payload.get('started', '')} — {m['cores']} cores ({m['cpu']}), torch {m['torch']} "
             f"({m['parallel_backend']}, libgomp), {payload['repeats']} repeats, settings in rotated order. "
             f"Load average at start: {m['load_at_start']}; at end: {m.get('load_at_end')}.", ""]
    if payload.get("note"):
        lines += [payload["note"], ""]
    for wl, res in payload["workloads"].items():
        lines += [f"### {wl}: `{res['command']}`", "",
                  "| setting | solo s (train s) | concurrent s, each copy (train s) | slowdown [repeats] "
                 "| train-time slowdown "
                  "| CPU s solo / concurrent | load1 before | foreign |",
                  "|---|---|---|---|---|---|---|---|"]
        solo_only = any("pair_wall_s" not in (r["summary"]["all"] or {}) for r in res["settings"].values())
        if solo_only:
            lines[-2:] = ["| setting | solo s, median (all repeats) | solo train s, median (all repeats) | CPU s "
                          "| load1 before | foreign |",
                          "|---|---|---|---|---|---|"]
        for name, r in res["settings"].items():
            s = r["summary"]["clean"] or r["summary"]["all"]
            n, n_clean = r["summary"]["n"], r["summary"]["n_clean"]
            which = f"{n_clean}/{n} clean" if r["summary"]["clean"] else f"all {n}, none clean"
            if solo_only:
                lines.append(f"| {name} ({which}) | {s['solo_wall_s']} {s['solo_wall_all']} | **{s['solo_train_s']}** "
                             f"{s['solo_train_all']} | {s['solo_cpu_s']} | {s['load1_before']} | {s['foreign_load']} |")
                continue
            conc = " / ".join(f"{w} ({t})" for w, t in zip(s["pair_wall_s"], s["pair_train_s"]))
            to = " (timed out)" if s["any_timed_out"] else ""
            lines.append(f"| {name} ({which}) | {s['solo_wall_s']} ({s['solo_train_s']}) | {conc}{to} | "
                         f"**{s['slowdown']}x** "
                         f"{s['slowdown_all']} | {s['slowdown_train']}x | {s['solo_cpu_s']} / "
                         f"{' / '.join(str(c) for c in s['pair_cpu_s'])} | {s['load1_before']} | {s['foreign_load']} |")
        lines += [""] + [f"- **{n}**: {r['note']}" for n, r in res["settings"].items()] + [""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--workload", nargs="+", default=["ppo"], choices=sorted(WORKLOADS))
    ap.add_argument("--settings", nargs="+", default=None, help=f"names from {sorted(SETTINGS)} (default per workload)")
    ap.add_argument("--setting", action="append", default=[], help='custom "name:KEY=VAL --flag value" (repeatable)')
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--total-steps", type=int, default=None, help="override the workload's reduced budget")
    ap.add_argument("--extra", default="", help="flags appended to every command")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="kill a measurement's processes after this many seconds")
    ap.add_argument("--out", default="contention", help="experiments/contention/<out>.{json,md}")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="before each measurement wait up to this many s for other processes to go quiet (0: don't)")
    ap.add_argument("--stagger", type=float, default=0.0,
                    help="start the second copy this many s after the first (a run started next to a running one)")
    ap.add_argument("--append", action="store_true", help="add this invocation to the runs already in <out>.json")
    ap.add_argument("--solo-only", action="store_true", help="only the solo runs (an A/B of the settings' solo speed)")
    ap.add_argument("--quiet-below", type=float, default=0.3, help="'quiet': other processes use fewer cores than this")
    args = ap.parse_args()
    QUIET.update(max_wait=args.quiet_wait, threshold=args.quiet_below)

    import platform

    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.machine())
    machine = {"cores": os.cpu_count(), "cpu": cpu,
               "torch": torch.__version__,
               "parallel_backend": torch.__config__.parallel_info().split("ATen parallel backend: ")[1].split("\n")[0],
               "load_at_start": open("/proc/loadavg").read().strip()}
    previous, reading = [], None
    dest = RESULTS / f"{args.out}.json"
    if args.append and dest.exists():
        old = json.loads(dest.read_text())
        previous, reading = old.get("runs", []), old.get("reading")
    payload = {"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%d %H:%M"), "repeats": args.repeats,
               "machine": machine, "quiet_gate": dict(QUIET),
               "clean_foreign_load": CLEAN_FOREIGN, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="contention-") as d:
        tmp = Path(d)
        dataset = tmp / "pendulum-random.hdf5"
        if "offline" in args.workload:
            write_offline_dataset(dataset)
        for wl in args.workload:
            template, steps = WORKLOADS[wl]
            steps = args.total_steps or steps
            train_args = template.format(steps=steps, dataset=dataset).split() + ["--no-progress", *args.extra.split()]

            def cmd_for(run_dir: Path, flags: tuple[str, ...], train_args=train_args) -> list[str]:
                head = [sys.executable, "-m", "ctrl_rl"]
                return [*head, "train", *train_args, "--run-dir", str(run_dir), *flags]

            names = args.settings or DEFAULT_SETTINGS[wl]
            settings = [SETTINGS[n] for n in names] + [parse_setting(s) for s in args.setting]
            res = {"command": "python -m ctrl_rl train " + " ".join(train_args) + " --run-dir TMP",
                   "settings": {s.name: {"note": s.note, "flags": list(s.flags), "env": s.env,
                                         "flags_b": list(s.flags_b) if s.flags_b is not None else None, "repeats": []}
                                for s in settings}}
            payload["workloads"][wl] = res
            for rep in range(args.repeats):
                k = rep % len(settings)
                for s in settings[k:] + settings[:k]:  # rotated: no setting always runs first or after the same one
                    tag = f"{wl}-{s.name}-r{rep}"
                    solo = measure(cmd_for, s, 1, args.timeout, tmp, tag + "-solo")
                    pair = None if args.solo_only else measure(cmd_for, s, 2, args.timeout, tmp, tag + "-pair",
                                                                  args.stagger)
                    res["settings"][s.name]["repeats"].append({"solo": solo, "pair": pair})
                    sp = solo["procs"][0]
                    if pair is None:
                        print(f"[{wl} r{rep} {time.strftime('%H:%M:%S')}] {s.name:15s} solo {sp['wall_s']:7.1f}s "
                              f"(train {sp['train_s']})  cpu {sp['cpu_s']:.0f}  load1 {sp['load1_at_start']:.2f} "
                              f"foreign {solo['foreign_load']:.2f}", flush=True)
                        continue
                    pp = pair["procs"]
                    print(f"[{wl} r{rep} {time.strftime('%H:%M:%S')}] {s.name:15s} "
                          f"solo {sp['wall_s']:7.1f}s (train {sp['train_s']})  "
                          f"pair {pp[0]['wall_s']:7.1f}s / {pp[1]['wall_s']:7.1f}s  "
                          f"slowdown {max(p['wall_s'] for p in pp) / sp['wall_s']:.2f}x  "
                          f"cpu {sp['cpu_s']:.0f} / {pp[0]['cpu_s']:.0f}+{pp[1]['cpu_s']:.0f}  "
                          f"load1 {sp['load1_at_start']:.2f} "
                          f"foreign {solo['foreign_load']:.2f}/{pair['foreign_load']:.2f}",
                          flush=True)
            for _name, r in res["settings"].items():
                r["summary"] = summarize(r["repeats"])
            machine["load_at_end"] = open("/proc/loadavg").read().strip()
            runs = previous + [payload]
            out = {"reading": reading, "runs": runs} if reading else {"runs": runs}
            # after each workload: partial results survive
            write_result(args.out, out, markdown(runs, reading), folder=RESULTS)
    print("\n".join(markdown_run(payload)))


if __name__ == "__main__":
    main()
