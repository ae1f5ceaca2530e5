"""Issue 29, section 3: do SAC Flow's flow policies (Flow-G, Flow-T) beat their Gaussian counterpart (SAC) on
Hopper-v5? Every run a resumable `python -m ctrl_rl train ...` subprocess; the summary (summarize.py) judges the claim.

Per seed K and variant V, in ``--runs-dir`` (default runs/sac_flow_study), run ``<task>-<V>-sK``:

    sac      ctrl-rl train sac --preset sac-hopper
    flow-g   ctrl-rl train sac_flow --preset sac_flow-hopper --velocity gated --compile
    flow-t   ctrl-rl train sac_flow --preset sac_flow-hopper --velocity decoded --compile
    crossq   ctrl-rl train sac --preset sac-hopper --crossq --actor-batch-renorm --adam-beta1 0.5 --policy-delay 3
             --critic-lr 1e-3 --alpha-lr 1e-3                                   (only when --variants names it)

each with --steps env steps, a deterministic evaluation (--eval-episodes episodes) at step 0 and every --eval-every
env steps, a checkpoint with its replay buffer (--save-replay) at every evaluation, and one torch thread.

Calling the script again skips complete runs (a checkpoint at the budget, or where the run directory is gone, the
copy of its records the summary kept in ``<out-dir>/kept/``: a study can continue on another machine) and resumes
the others from their last checkpoint (`--resume`; a larger --steps extends finished runs).
Ctrl-C or SIGTERM stops the running runs (they resume from their last checkpoint: at most --eval-every steps are
lost). With ``--deadline`` a run starts only when its
estimated time ends before the deadline: steps left / the run's own rate after its warm-up, else the median rate of
the variant's other runs here, else the variant's rate from the 50k-step reading (README, "Cost"), stretched by
MARGIN, plus the compile time of a flow. Runs go seed by seed, the longest (Flow-T) first, so that whatever has
finished is a set of complete seeds. When nothing is left to launch the summary is written.

    python experiments/sac_flow/sac_flow_study.py --jobs 2 --deadline +8h      # seeds 0 1 2, 100k steps
    python experiments/sac_flow/sac_flow_study.py --dry-run                    # the commands
    python experiments/sac_flow/sac_flow_study.py --summarize                  # sac_flow_study.{json,md,png}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, kept_step, load_module, merged_study_record, parse_deadline  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script
MARGIN = 1.15  # estimates are stretched by this much before they are compared with the deadline
COMPILE_S = 120.0  # the deadline's allowance for a flow run's torch.compile (~40-90 s measured: sac_flow_speed)
START_S = 20.0  # interpreter, imports, envpool, the replay buffer read back on resume


@dataclass(frozen=True)
class Variant:
    algo: str
    preset: str  # preset name without the task: <preset>-<task>
    flags: tuple[str, ...]
    flow: bool  # gets --compile (unless --no-compile) and --flow-args
    rate: float  # env steps/s after the warm-up that the deadline assumes before a run here has measured its own


# rates: the 50k-step reading's whole runs (README, "History"): 45k updates after the 5k random steps in 1,403 s (SAC),
# 1,824 s (Flow-G) and 4,073 s (Flow-T, both compiled, the compile's ~90 s taken off), rounded down for load: 32, 26
# and 11 measured. CrossQ was not measured here: SAC's rate less a guessed 20% for its joint 512-row critic batch.
VARIANTS = {
    "sac": Variant("sac", "sac", (), False, 30.0),
    "flow-g": Variant("sac_flow", "sac_flow", ("--velocity", "gated"), True, 24.0),
    "flow-t": Variant("sac_flow", "sac_flow", ("--velocity", "decoded"), True, 10.0),
    "crossq": Variant("sac", "sac", ("--crossq", "--actor-batch-renorm", "--adam-beta1", "0.5", "--policy-delay", "3",
                                     "--critic-lr", "0.001", "--alpha-lr", "0.001"), False, 24.0),
}
ORDER = ("flow-t", "flow-g", "crossq", "sac")  # within a seed: the longest first


@dataclass(frozen=True)
class Job:
    variant: str
    seed: int
    path: Path  # the run directory

    @property
    def name(self) -> str:
        return self.path.name


def study_jobs(task: str, variants: list[str], seeds: list[int], runs: Path) -> list[Job]:
    """Seed by seed; within a seed the variants in ORDER (the longest first)."""
    return [Job(v, s, runs / f"{task}-{v}-s{s}") for s in seeds for v in ORDER if v in variants]


def checkpoint_step(d: Path) -> int | None:
    """The step counter of ``d``'s latest checkpoint (None: no checkpoint)."""
    p = d / "checkpoints" / "latest.pt"
    if not p.is_file():
        return None
    from ctrl_rl.learn.checkpoint import load_checkpoint

    return int(load_checkpoint(p)["counters"]["step"])


def complete_at(job: Job, a: argparse.Namespace) -> str | None:
    """How ``job`` is complete, None while it is not: its checkpoint reached the budget, or (no checkpoint: its run
    directory was on another machine) the copy the summary kept in ``<out-dir>/kept/`` did."""
    step = checkpoint_step(job.path)
    if step is not None:
        return f"at step {step:,}" if step >= a.steps else None
    kept = kept_step(a.out_dir.resolve() / "kept" / job.name)
    return f"at step {kept:,} (kept copy)" if kept >= a.steps else None


def command(job: Job, a: argparse.Namespace) -> list[str]:
    """The `python -m ctrl_rl train ...` command of ``job``: a resume when it has a checkpoint."""
    v = VARIANTS[job.variant]
    py = [sys.executable, "-m", "ctrl_rl", "train", v.algo]
    common = ["--total-steps", str(a.steps), "--threads", str(a.threads), "--checkpoint-every", str(a.eval_every),
              "--no-progress"]
    if checkpoint_step(job.path) is not None:  # the run's own settings; a larger --steps extends it
        return [*py, "--resume", str(job.path), *common]
    flow = [*(["--compile"] if a.compile else []), *shlex.split(a.flow_args)] if v.flow else []
    return [*py, "--preset", f"{v.preset}-{a.task}", *v.flags, "--seed", str(job.seed), "--eval-every",
            str(a.eval_every), "--eval-episodes", str(a.eval_episodes), "--save-replay", "--run-dir", str(job.path),
            *common, *shlex.split(a.run_args), *flow]


# ----------------------------------------------------------------------- the deadline (parse_deadline: common.py)
def run_rate(d: Path) -> float | None:
    """Env steps per second of the run in ``d`` after its warm-up (``learning_starts``): the slope of step against the
    run's clock over its logged rows after the warm-up (a resumed run's clock continues from its checkpoint), None
    before two such rows."""
    from ctrl_rl.learn.logging import read_metrics

    if not (d / "metrics.jsonl").is_file():
        return None
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    warm = ((cfg.get("run") or {}).get("loop") or {}).get("learning_starts") or 0
    pts = [(r["step"], r["wall_time"]) for r in read_metrics(d)
           if r.get("step", 0) > warm and r.get("wall_time") is not None and "episode_return" in r]
    if len(pts) < 2 or pts[-1][1] <= pts[0][1] or pts[-1][0] <= pts[0][0]:
        return None
    return (pts[-1][0] - pts[0][0]) / (pts[-1][1] - pts[0][1])


def estimate_s(job: Job, runs: Path, a: argparse.Namespace) -> float:
    """Seconds ``job`` still needs: its steps left at its own rate, else the median rate of the variant's other runs
    here, else the variant's default; plus start-up and (flows, compiled) the compile."""
    rate = run_rate(job.path)
    if rate is None:
        seen = [r for d in runs.glob(f"{a.task}-{job.variant}-s*") if (r := run_rate(d)) is not None]
        rate = statistics.median(seen) if seen else VARIANTS[job.variant].rate * a.rate_scale
    left = max(a.steps - (checkpoint_step(job.path) or 0), 0)
    return left / rate + START_S + (COMPILE_S if VARIANTS[job.variant].flow and a.compile else 0.0)


# ------------------------------------------------------------------------------------------- launching
class Stop(Exception):
    """SIGTERM (or Ctrl-C) arrived and the running runs were stopped."""


_STOP: dict[str, int | None] = {"signal": None}  # set by the SIGTERM handler; the launch loop checks it between polls


def _on_sigterm(signum, _frame) -> None:
    _STOP["signal"] = signum


def launch(jobs: list[Job], a: argparse.Namespace, runs: Path, deadline: datetime.datetime | None) -> dict[str, str]:
    """Run every job not yet complete, at most ``a.jobs`` at a time, each only when (with a deadline) its estimate
    fits. Returns job name -> done | failed | deadline. On SIGTERM or Ctrl-C the running runs get SIGTERM (SIGKILL
    after 30 s), are waited for, and ``Stop`` is raised."""
    state: dict[str, str] = {}
    pending = list(jobs)
    running: dict[str, tuple[Job, subprocess.Popen, float]] = {}
    logs = runs / "logs"
    try:
        while (pending or running) and _STOP["signal"] is None:
            while pending and len(running) < a.jobs and _STOP["signal"] is None:
                job = pending.pop(0)
                how = complete_at(job, a)
                if how is not None:
                    print(f"[done] {job.name}: complete {how}", flush=True)
                    state[job.name] = "done"
                    continue
                if deadline is not None:
                    need = estimate_s(job, runs, a) * MARGIN
                    left = (deadline - datetime.datetime.now().astimezone()).total_seconds()
                    if need > left:
                        print(f"[deadline] {job.name}: not started (needs ~{need / 3600:.2f} h, "
                              f"{max(left, 0) / 3600:.2f} h left)", flush=True)
                        state[job.name] = "deadline"
                        continue
                cmd = command(job, a)
                logs.mkdir(parents=True, exist_ok=True)
                with open(runs / "commands.txt", "a") as f:
                    f.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {job.name}\n"
                            f"{shlex.join(cmd)}\n")
                print(f"[start] {job.name}: {shlex.join(cmd)}", flush=True)
                with open(logs / f"{job.name}.log", "a") as log:
                    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "MPLBACKEND": "Agg"})
                running[job.name] = (job, p, time.time())
            for name, (job, p, t0) in list(running.items()):
                if p.poll() is None:
                    continue
                del running[name]
                step = checkpoint_step(job.path)
                ok = p.returncode == 0 and step is not None and step >= a.steps
                state[name] = "done" if ok else "failed"
                print(f"[{'done' if ok else 'fail'}] {name}: exit {p.returncode} after {time.time() - t0:.0f} s, "
                      f"checkpoint at step {step}" + ("" if ok else f" (log: {logs / f'{name}.log'})"), flush=True)
            if running:
                time.sleep(a.poll)
    except KeyboardInterrupt:
        _STOP["signal"] = int(signal.SIGINT)
    if _STOP["signal"] is None:
        return state
    for _, p, _ in running.values():  # SIGTERM, not SIGINT: a child of a background shell ignores SIGINT
        p.terminate()
    for name, (_, p, _) in running.items():
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        print(f"[stopped] {name}: exit {p.returncode}; resumes from its last checkpoint", flush=True)
    raise Stop


def study_record(a: argparse.Namespace, command_line: str) -> dict:
    """What summarize.py needs besides the runs: the settings the study ran with."""
    return {"command": command_line, "task": a.task, "variants": [v for v in VARIANTS if v in a.variants],
            "seeds": a.seeds, "steps": a.steps, "eval_every": a.eval_every, "eval_episodes": a.eval_episodes,
            "compile": a.compile, "threads": a.threads, "run_args": a.run_args, "flow_args": a.flow_args,
            "commands": {v: shlex.join(command(Job(v, 0, Path("RUN_DIR")), a)[1:]) for v in a.variants}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--task", choices=("hopper", "halfcheetah"), default="hopper", help="presets <algo>-<task>")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["sac", "flow-g", "flow-t"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=100_000, help="env steps per run (the paper: 1M)")
    ap.add_argument("--eval-every", type=int, default=5_000, help="evaluate and checkpoint every this many env steps")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=2, help="training processes at a time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (fixed: resumes repeat the rounding)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="torch.compile the flows' updates (25-35%% faster after a ~1 min compile)")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "sac_flow_study")
    ap.add_argument("--deadline", default=None, help="+<h>h, +<m>m or an ISO time: start no run whose estimate ends "
                    "after it")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="multiplies the default rates the deadline assumes "
                    "before a variant has measured its own here (e.g. 2 on a quiet machine)")
    ap.add_argument("--run-args", default="", help='extra `ctrl-rl train` flags of every new run, e.g. '
                    '"--critic-hidden 64 64"')
    ap.add_argument("--flow-args", default="", help="extra flags of the flow runs only (e.g. --flow-hidden 512)")
    ap.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    ap.add_argument("--name", default="sac_flow_study", help="the summary's file names: <name>.{json,md,png}")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where the summary goes (default: this folder)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--summarize", action="store_true", help="launch nothing; write the summary from what exists")
    a = ap.parse_args(argv)
    for flag in ("steps", "eval_every", "eval_episodes", "threads"):
        if getattr(a, flag) <= 0:
            raise SystemExit(f"--{flag.replace('_', '-')} {getattr(a, flag)}: expected a positive number")
    return a


def summarizer():
    """This folder's summarize.py as a module (under its own name: other studies have a summarize.py too)."""
    return load_module(RESULTS / "summarize.py", "sac_flow_study_summarize")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    runs = a.runs_dir.resolve()
    summarize = summarizer()
    if a.summarize:
        summarize.summarize(runs, a.out_dir.resolve(), name=a.name)
        return
    jobs = study_jobs(a.task, a.variants, a.seeds, runs)
    if a.dry_run:
        for job in jobs:
            print(f"# complete: {job.name}" if complete_at(job, a) is not None else shlex.join(command(job, a)))
        return
    deadline = parse_deadline(a.deadline, datetime.datetime.now().astimezone())
    runs.mkdir(parents=True, exist_ok=True)
    this = shlex.join(["python", "experiments/sac_flow/sac_flow_study.py", *argv])
    record = merged_study_record(runs / "study.json", study_record(a, this), same=("task",),
                                 union=("variants", "seeds", "commands"),
                                 order={"variants": list(VARIANTS).index, "seeds": int})  # the tables' order
    (runs / "study.json").write_text(json.dumps(record, indent=2) + "\n")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        state = launch(jobs, a, runs, deadline)
    except Stop:
        print("stopped: the runs resume from their last checkpoint; run the same command to continue", flush=True)
        sys.exit(130)
    left = sorted(k for k, v in state.items() if v != "done")
    print(f"[study] {len(state) - len(left)} of {len(state)} runs done" + (f"; not done: {left}" if left else ""),
          flush=True)
    summarize.summarize(runs, a.out_dir.resolve(), name=a.name)


if __name__ == "__main__":
    main()
