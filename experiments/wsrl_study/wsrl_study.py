"""Issue 29, section 2: WSRL's central claims, per seed: CQL pre-training with WSRL's settings, then WSRL, RLPD and
(optionally) retained-data fine-tuning online, every run a resumable `python -m ctrl_rl ...` subprocess.

Per seed K, in ``--runs-dir`` (default runs/wsrl_study):

    cql-sK        ctrl-rl train cql --dataset D           WSRL's locomotion pre-training: the cql entry's defaults are
                                                           WSRL_SAC (10 critics, target subset 2, LayerNorm in actor
                                                           and critics, alpha_cql 5, 10 samples, importance sampling,
                                                           max backup), batch 256, --pretrain-steps gradient steps
    evalnoise-sK  ctrl-rl eval cql-sK --episodes E        the spread of the pre-trained policy's episode returns at
                                                           other env seeds (evalnoise-sK.json): the evaluation noise
                                                           the step-0 claim is judged against
    wsrl-sK       ctrl-rl train wsrl --init cql-sK        no offline data; 5,000-step warm-up by the frozen policy
    rlpd-sK       ctrl-rl train rlpd --dataset D          from scratch, 50/50 offline/online batches
    retained-sK   ctrl-rl train wsrl --init cql-sK --dataset D --offline-ratio 0.5      (--retained only)

The online runs use the wsrl/rlpd entries' defaults (WSRL's: batch 1024 in 4 critic minibatches, UTD 1, 10
critics), --online-steps env steps, an evaluation at online step 0 and every --eval-every env steps, and
--save-replay (a resumed run continues with the same replay). A dataset id that does not resolve is generated once
(`ctrl-rl data generate`; hopper-medium-replay-v5 re-runs the behaviour policy's 210k-step SAC training).

Calling the script again skips complete runs and resumes interrupted ones from their last checkpoint (`--resume`,
every evaluation). The summary keeps the records of every complete run (and the evalnoise files) in
``<out-dir>/kept/<name>/`` (gzip, committed): where a run directory is gone (the study moved to another machine), the
summary reads the kept copy and the runner counts it as done, a cql run only while every run that starts from it is
done too (they need its checkpoint). Ctrl-C or SIGTERM stops the runs at their last checkpoint. With ``--deadline``
a stage starts only when its estimated time (steps left / the rate its method ran at in this runs dir, else
--pretrain-rate or --online-rate) ends before the deadline. When nothing is left to launch the summary is written
(``summarize.py``); ``--summarize`` launches nothing and writes it from whatever has run.

    python experiments/wsrl_study/wsrl_study.py --seeds 0 1 2 --jobs 2 --deadline +10h
    python experiments/wsrl_study/wsrl_study.py --dry-run            # the commands
    python experiments/wsrl_study/wsrl_study.py --summarize           # wsrl_study.{json,md,png} from what exists
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import signal
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, Launcher, kept_rows, kept_step, load_module, merged_study_record, parse_deadline  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script
ONLINE = ("wsrl", "rlpd", "retained")
# what the deadline assumes before a run of the method has measured its own rate here: 85% of the steps per CPU
# second measure_rates.py found at WSRL's settings with one thread (README, "Budget on this machine": 5.4 and 6.5)
PRETRAIN_RATE, ONLINE_RATE = 4.5, 5.5
MARGIN = 1.15  # estimates are stretched by this much before they are compared with the deadline


@dataclass
class Job:
    method: str  # cql, evalnoise, wsrl, rlpd, retained, data
    seed: int
    budget: int  # gradient steps (cql) or env steps (online); 0 for evalnoise and data
    path: Path  # the run directory (evalnoise: its JSON file; data: the dataset file)
    dep: Job | None = None
    kept: Path | None = None  # the copy of its records the summary keeps in the repository (a folder; evalnoise: .gz)
    needed_by: list[Job] = field(default_factory=list)  # the jobs that start from this one's checkpoint (cql)

    @property
    def name(self) -> str:
        return self.path.name if self.method == "data" else f"{self.method}-s{self.seed}"

    @property
    def source(self) -> Path:
        """The run this job starts from (wsrl, retained) or evaluates (evalnoise): its cql run's directory."""
        assert self.dep is not None, f"{self.name} has no cql run"
        return self.dep.path

    @property
    def dep_budget(self) -> int | None:
        return None if self.dep is None else self.dep.budget

    @property
    def trained(self) -> bool:
        return self.method == "cql" or self.method in ONLINE


def study_jobs(seeds: list[int], runs: Path, pretrain: int, online: int, retained: bool,
               kept: Path | None = None) -> list[Job]:
    """Per seed: cql, rlpd, evalnoise, wsrl (and retained), in that order; the scheduler starts the first job whose
    dependency is done, so a whole seed tends to finish before the next seed's online runs. ``kept``: the folder of
    the kept copies (``<out-dir>/kept/<name>``)."""
    def job(method: str, s: int, budget: int, name: str, dep: Job | None = None) -> Job:
        j = Job(method, s, budget, runs / name, dep=dep,
                kept=None if kept is None else kept / (f"{name}.gz" if method == "evalnoise" else name))
        if dep is not None:
            dep.needed_by.append(j)
        return j

    jobs = []
    for s in seeds:
        cql = job("cql", s, pretrain, f"cql-s{s}")
        jobs += [cql, job("rlpd", s, online, f"rlpd-s{s}"), job("evalnoise", s, 0, f"evalnoise-s{s}.json", cql),
                 job("wsrl", s, online, f"wsrl-s{s}", cql)]
        if retained:
            jobs.append(job("retained", s, online, f"retained-s{s}", cql))
    return jobs


def checkpoint_step(d: Path) -> int | None:
    """The step counter of ``d``'s latest checkpoint (None: no checkpoint)."""
    p = d / "checkpoints" / "latest.pt"
    if not p.is_file():
        return None
    from ctrl_rl.learn.checkpoint import load_checkpoint

    return int(load_checkpoint(p)["counters"]["step"])


def complete(job: Job) -> bool:
    """The job has reached its budget: its checkpoint did, or (its run directory gone: the study moved to another
    machine) its kept copy did. A kept cql run counts only while every run that starts from it is complete too: the
    others need its checkpoint, which went with the machine."""
    if job.method == "evalnoise":  # of the cql run at its budget (a longer pre-training makes it stale)
        if job.path.is_file():
            return json.loads(job.path.read_text()).get("step") == job.dep_budget
        kept = kept_rows(job.kept.parent, job.kept.name[: -len(".gz")]) if job.kept is not None else []
        return bool(kept) and kept[-1].get("step") == job.dep_budget
    if job.method == "data":
        return job.path.is_file()
    step = checkpoint_step(job.path)
    if step is not None:
        return step >= job.budget
    if job.kept is None or job.path.exists() or kept_step(job.kept) < job.budget:
        return False
    return all(complete(j) for j in job.needed_by)


def command(job: Job, a: argparse.Namespace, data: str) -> list[str]:
    """The `python -m ctrl_rl ...` command of ``job``: a resume when it has a checkpoint."""
    py = [sys.executable, "-m", "ctrl_rl"]
    if job.method == "evalnoise":
        return [*py, "eval", str(job.source), "--episodes", str(a.eval_episodes), "--seed", str(20_000 + job.seed)]
    if checkpoint_step(job.path) is not None:  # --total-steps: a larger budget than the run's first extends it
        return [*py, "train", "wsrl" if job.method == "retained" else job.method, "--resume", str(job.path),
                "--total-steps", str(job.budget), "--no-progress"]
    every = a.pretrain_eval_every if job.method == "cql" else a.eval_every
    common = ["--env", a.env, "--seed", str(job.seed), "--total-steps", str(job.budget), "--eval-every", str(every),
              "--eval-episodes", str(a.eval_episodes), "--checkpoint-every", str(every), "--run-dir", str(job.path),
              "--no-progress"]
    if job.method == "cql":
        return [*py, "train", "cql", "--dataset", data, *common, *shlex.split(a.cql_args)]
    online = [*common, "--save-replay", *shlex.split(a.online_args)]
    if job.method == "rlpd":
        return [*py, "train", "rlpd", "--dataset", data, *online, *shlex.split(a.rlpd_args)]
    init = ["--init", str(job.source)]
    if job.method == "wsrl":
        return [*py, "train", "wsrl", *init, *online]
    return [*py, "train", "wsrl", *init, "--dataset", data, "--offline-ratio", "0.5", *online]


# ----------------------------------------------------------------------- the deadline (parse_deadline: common.py)
def run_rate(d: Path) -> float | None:
    """Steps per second of the run in ``d`` after its warm-up (``learning_starts``; none offline): the slope of step
    against the run clock over its latest stretch of logged rows (a resume may restart the clock), None before two
    rows after the warm-up."""
    m = d / "metrics.jsonl"
    if not m.is_file():
        return None
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    warm = ((cfg.get("run") or {}).get("loop") or {}).get("learning_starts") or 0
    rows = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    pts = [(r["step"], r["wall_time"]) for r in rows if r.get("step", 0) > warm and r.get("wall_time") is not None]
    start = 0
    for i in range(1, len(pts)):
        if pts[i][1] < pts[i - 1][1]:  # the clock went back: a resumed leg starts here
            start = i
    (s0, t0), (s1, t1) = pts[start] if pts else (0, 0.0), pts[-1] if pts else (0, 0.0)
    return (s1 - s0) / (t1 - t0) if len(pts) - start >= 2 and t1 > t0 and s1 > s0 else None


def estimate_s(job: Job, runs: Path, a: argparse.Namespace) -> float:
    """Seconds ``job`` still needs: its steps left at its own rate, else the median rate of its method's other runs
    here, else --pretrain-rate / --online-rate; a dataset to generate: --generate-minutes."""
    if job.method == "data":
        return a.generate_minutes * 60
    if job.method == "evalnoise":
        return 60.0
    pattern = "cql-s*" if job.method == "cql" else f"{job.method}-s*"
    rate = run_rate(job.path)
    if rate is None:
        seen = [r for d in runs.glob(pattern) if d.is_dir() and (r := run_rate(d)) is not None]
        rate = statistics.median(seen) if seen else (a.pretrain_rate if job.method == "cql" else a.online_rate)
    done = checkpoint_step(job.path) or 0
    return max(job.budget - done, 0) / rate


# ------------------------------------------------------------------------------------------- launching
def resolve_dataset(a: argparse.Namespace, runs: Path, launcher: Launcher, deadline) -> str | None:
    """What to pass as --dataset: a file, an id that resolves (generated before), or the file `ctrl-rl data
    generate` writes for a generated id that does not resolve yet (None when that could not be made)."""
    if Path(a.dataset).is_file():
        return str(Path(a.dataset).resolve())
    from ctrl_rl.errors import UserInputError
    from ctrl_rl.storage.datasets.cache import parse_dataset_id, resolve_dataset_id

    parsed = parse_dataset_id(a.dataset)
    if parsed is None:
        raise SystemExit(f"--dataset {a.dataset!r} is neither a file nor a generated dataset id: expected a "
                         "D4RL-layout .hdf5 path or an id such as hopper-medium-replay-v5")
    try:
        resolve_dataset_id(a.dataset)
        return a.dataset
    except UserInputError:
        pass
    gen = [sys.executable, "-m", "ctrl_rl", "data", "generate", "--env", a.env, "--level", parsed[1], "--no-progress",
           *shlex.split(a.generate_args)]
    if launcher.dry_run:
        launcher.run(gen, Path(), "data")
        return a.dataset
    need = a.generate_minutes * 60 * MARGIN
    if deadline is not None and datetime.datetime.now().astimezone() + datetime.timedelta(seconds=need) > deadline:
        print(f"[deadline] data {a.dataset}: not started (needs ~{need / 3600:.1f} h by --generate-minutes)",
              flush=True)
        return None
    rc, _ = launcher.run(gen, runs / "logs" / f"data-{a.dataset}.log", f"data {a.dataset}")
    return a.dataset if rc == 0 else None


def launch(jobs: list[Job], a: argparse.Namespace, data: str, runs: Path, launcher: Launcher, deadline) -> dict:
    """Run every job not yet complete, at most --jobs at a time, each when its dependency is done and (with a
    deadline) when its estimate fits. Returns job name -> done | failed | deadline."""
    state: dict[str, str] = {}

    def one(job: Job) -> str:
        if complete(job):
            print(f"[done] {job.name}: complete", flush=True)
            return "done"
        if job.trained and checkpoint_step(job.path) is None and job.path.exists():  # no checkpoint: start over
            shutil.rmtree(job.path)
        t0 = time.time()
        rc, stdout = launcher.run(command(job, a, data), runs / "logs" / f"{job.name}.log", job.name)
        if job.method == "evalnoise" and rc == 0:
            rec = json.loads(stdout.strip().splitlines()[-1])
            job.path.write_text(json.dumps({**rec, "command": shlex.join(command(job, a, data)[1:])}, indent=1) + "\n")
        ok = rc == 0 and complete(job)
        tag = "done" if ok else "stopped" if launcher.stopping else "fail"
        print(f"[{tag}] {job.name}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
        return "done" if ok else "failed"

    if launcher.dry_run:
        for job in jobs:
            if complete(job):
                print(f"# complete: {job.name}")
            else:
                launcher.run(command(job, a, data), Path(), job.name)
        return {}
    pending = list(jobs)
    running: dict[Future, Job] = {}
    with ThreadPoolExecutor(a.jobs) as pool:
        try:
            _schedule(pending, running, state, pool, one, a, runs, deadline)
        except KeyboardInterrupt:  # stop the runs here: leaving the with-block waits for them
            launcher.stop()
            raise
    return state


def _schedule(pending: list[Job], running: dict[Future, Job], state: dict[str, str], pool: ThreadPoolExecutor, one,
              a: argparse.Namespace, runs: Path, deadline) -> None:
    """launch()'s loop: start what is ready and fits, wait for one to finish, repeat."""
    while pending or running:
        for job in list(pending):
            if len(running) >= a.jobs:
                break
            dep = state.get(job.dep.name) if job.dep else "done"  # None: queued or running
            if dep in ("failed", "deadline"):
                print(f"[skip] {job.name}: {job.source.name} did not complete", flush=True)
                state[job.name] = "failed"
                pending.remove(job)
            elif dep == "done":
                pending.remove(job)
                if deadline is not None and not complete(job):
                    need = estimate_s(job, runs, a) * MARGIN
                    left = (deadline - datetime.datetime.now().astimezone()).total_seconds()
                    if need > left:
                        print(f"[deadline] {job.name}: not started (needs ~{need / 3600:.2f} h, "
                              f"{max(left, 0) / 3600:.2f} h left)", flush=True)
                        state[job.name] = "deadline"
                        continue
                running[pool.submit(one, job)] = job
        if not running:
            break
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for f in finished:
            state[running.pop(f).name] = f.result()


def study_record(a: argparse.Namespace, data: str | None, command_line: str) -> dict:
    """What summarize.py needs besides the runs: the settings, budgets and the dataset each run got."""
    return {"command": command_line, "env": a.env, "dataset": a.dataset, "dataset_arg": data, "seeds": a.seeds,
            "pretrain_steps": a.pretrain_steps, "pretrain_eval_every": a.pretrain_eval_every,
            "online_steps": a.online_steps, "eval_every": a.eval_every, "eval_episodes": a.eval_episodes,
            "retained": a.retained, "cql_args": a.cql_args, "online_args": a.online_args, "rlpd_args": a.rlpd_args}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--dataset", default="hopper-medium-replay-v5", help="generated dataset id or .hdf5 path")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--pretrain-steps", type=int, default=50_000, help="CQL gradient steps (WSRL: 250k)")
    ap.add_argument("--pretrain-eval-every", type=int, default=5_000, help="CQL: evaluate (and checkpoint) every")
    ap.add_argument("--online-steps", type=int, default=20_000, help="env steps of each online run (WSRL: 500k)")
    ap.add_argument("--eval-every", type=int, default=2_000, help="online: evaluate (and checkpoint) every this many "
                    "env steps; step 0 is always evaluated")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--retained", action="store_true", help="also retained-data fine-tuning (offline ratio 0.5)")
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="training processes at a time")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "wsrl_study")
    ap.add_argument("--deadline", default=None, help="+<h>h, +<m>m or an ISO time: start no stage whose estimate "
                    "ends after it")
    ap.add_argument("--pretrain-rate", type=float, default=PRETRAIN_RATE, help="CQL gradient steps/s the deadline "
                    "assumes until a cql run here has measured its own")
    ap.add_argument("--online-rate", type=float, default=ONLINE_RATE, help="online env steps/s the deadline assumes "
                    "until a run of the method here has measured its own")
    ap.add_argument("--generate-minutes", type=float, default=120.0, help="what the deadline assumes a dataset "
                    "generation takes")
    ap.add_argument("--cql-args", default="", help='extra `ctrl-rl train cql` flags, e.g. "--threads 1"')
    ap.add_argument("--online-args", default="", help="extra flags of the wsrl, rlpd and retained runs (wsrl's "
                    "network shape comes from the CQL checkpoint)")
    ap.add_argument("--rlpd-args", default="", help="extra flags of the rlpd runs only (e.g. a network shape)")
    ap.add_argument("--generate-args", default="", help="extra `ctrl-rl data generate` flags")
    ap.add_argument("--name", default="wsrl_study", help="the summary's file names: <name>.{json,md,png} here")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--summarize", action="store_true", help="launch nothing; write wsrl_study.{json,md,png}")
    a = ap.parse_args(argv)
    for flag in ("pretrain_steps", "pretrain_eval_every", "online_steps", "eval_every", "eval_episodes"):
        if getattr(a, flag) <= 0:
            raise SystemExit(f"--{flag.replace('_', '-')} {getattr(a, flag)}: expected a positive number")
    return a


def summarizer():
    """This folder's summarize.py as a module (under its own name: other studies have a summarize.py too)."""
    return load_module(RESULTS / "summarize.py", "wsrl_study_summarize")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the runs like Ctrl-C does


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    runs = a.runs_dir.resolve()
    this = shlex.join(["python", "experiments/wsrl_study/wsrl_study.py", *argv])
    summarize = summarizer()
    if a.summarize:
        summarize.summarize(runs, a.out_dir.resolve(), name=a.name)
        return
    deadline = parse_deadline(a.deadline, datetime.datetime.now().astimezone())
    launcher = Launcher(runs, a.dry_run)
    if not a.dry_run:
        runs.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, _interrupt)
    kept = a.out_dir.resolve() / "kept" / a.name
    jobs = study_jobs(a.seeds, runs, a.pretrain_steps, a.online_steps, a.retained, kept)
    try:  # every job kept complete (another machine ran them): no dataset to make
        data = a.dataset if all(complete(j) for j in jobs) else resolve_dataset(a, runs, launcher, deadline)
        if not a.dry_run:
            record = merged_study_record(runs / "study.json", study_record(a, data, this),
                                         same=("env", "dataset", "dataset_arg"), union=("seeds",), order={"seeds": int})
            (runs / "study.json").write_text(json.dumps(record, indent=2) + "\n")
        if data is None:
            print(f"[skip] every run: dataset {a.dataset} is not available", flush=True)
            return
        state = launch(jobs, a, data, runs, launcher, deadline)
    except KeyboardInterrupt:
        launcher.stop()
        print("interrupted: the runs stopped at their last checkpoint; run the same command to resume", flush=True)
        sys.exit(130)
    if not a.dry_run:
        left = sorted(k for k, v in state.items() if v != "done")
        print(f"[study] {len(state) - len(left)} of {len(state)} jobs done" + (f"; not done: {left}" if left else ""),
              flush=True)
        summarize.summarize(runs, a.out_dir.resolve(), name=a.name)


if __name__ == "__main__":
    main()
