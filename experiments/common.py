"""Shared by the experiment scripts: where the repository is, how results are written, which code ran.

Each study or benchmark is a folder ``experiments/<study>/`` holding its script(s), README and results; a script
imports this module after putting ``experiments/`` on ``sys.path``::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import write_result  # noqa: E402

    RESULTS = Path(__file__).resolve().parent  # the study's folder: results live beside the script
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AB_TREES = Path("/tmp/ctrl_rl_ab")  # worktree(): detached checkouts of the commits an A/B compares


def write_result(name: str, payload: dict, markdown: str | None = None, *, folder: Path) -> Path:
    """Write ``<folder>/<name>.json`` (and ``.md`` when given) and say where. ``folder`` is the study's folder,
    ``experiments/<study>/`` (the calling script's ``RESULTS``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{name}.json"
    dest.write_text(json.dumps(payload, indent=2) + "\n")
    if markdown is not None:
        (folder / f"{name}.md").write_text(markdown)
    print(f"wrote {dest}")
    return dest


def run_preset(preset: str, seed: int, total_steps: int, algo: str = "ppo", extra: tuple[str, ...] = ()
               ) -> tuple[list[dict], float]:
    """Train `ctrl-rl train <algo> --preset <preset> [extra flags]` in a fresh process; returns
    (metrics rows, process seconds)."""
    import subprocess
    import sys
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "ctrl_rl", "train", algo,
               "--preset", str(ROOT / f"experiments/presets/{preset}.json"),
               "--seed", str(seed), "--total-steps", str(total_steps), "--run-dir", f"{d}/r", "--no-progress", *extra]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        seconds = time.perf_counter() - t0  # includes interpreter start-up and imports
        rows = [json.loads(x) for x in Path(f"{d}/r/metrics.jsonl").read_text().splitlines()]
    return rows, seconds


def metrics_rate(rows: list[dict], key: str = "step") -> float:
    """``key`` per second between a run's first and last ``metrics.jsonl`` rows (set-up before the first row and
    work after the last are outside it)."""
    first, last = rows[0], rows[-1]
    return (last[key] - first[key]) / (last["wall_time"] - first["wall_time"])


def git_commit() -> str:
    """The short commit of the checkout the scripts run from, ``+dirty`` when tracked files differ from it."""
    from ctrl_rl.core.provenance import git_commit as commit_of

    return commit_of(ROOT, 7) or "unknown"


def runs_commit(run_dirs) -> str:
    """The commits the runs were started from, as their ``config.json`` records them (``code.started.git``, and
    ``code.resumed.git`` when a resume ran other code); the checkout's commit now, marked as such, for runs that
    did not record theirs."""
    seen: list[str] = []
    unrecorded = False
    for d in run_dirs:
        try:
            code = json.loads((Path(d) / "config.json").read_text()).get("code") or {}
        except (OSError, ValueError):
            code = {}
        commits = [(code.get(k) or {}).get("git") for k in ("started", "resumed") if k in code]
        unrecorded |= not commits or commits[0] is None
        seen += [c for c in commits if c and c not in seen]
    if unrecorded or not seen:
        seen.append(f"{git_commit()} "
                    f"(now: {'some runs did not record theirs' if seen else 'no run recorded its code'})")
    return ", ".join(seen)


def iqm_ci(values: dict[str, list[float]] | dict[str, list[list[float]]]) -> dict[str, dict]:
    """rliable's IQM and its 95% stratified-bootstrap CI for each method's per-seed values: a list is one task's
    seeds; a list of lists is ``[seeds][tasks]`` (several tasks, e.g. normalized scores per game), where the bootstrap
    resamples seeds within each task."""
    import numpy as np
    from rliable import library as rly
    from rliable import metrics

    scores = {k: (lambda a: a.reshape(-1, 1) if a.ndim == 1 else a)(np.asarray(v, dtype=float))
              for k, v in values.items() if len(v) > 0}
    point, ci = rly.get_interval_estimates(scores, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=2000)
    return {k: {"iqm": float(point[k][0]), "ci95": [float(ci[k][0, 0]), float(ci[k][1, 0])], "seeds": len(values[k])}
            for k in scores}


def improvement_ci(pairs: dict[str, tuple[list[list[float]], list[list[float]]]]) -> dict[str, dict]:
    """rliable's probability of improvement P(X > Y) and its 95% stratified-bootstrap CI for each named pair
    ``(X, Y)`` of ``[seeds][tasks]`` scores: per task the Mann-Whitney probability that a run of X scores above a run
    of Y (ties count half), averaged over tasks."""
    import numpy as np
    from rliable import library as rly
    from rliable import metrics

    arrays = {k: [np.asarray(x, dtype=float), np.asarray(y, dtype=float)] for k, (x, y) in pairs.items()}
    point, ci = rly.get_interval_estimates(arrays, lambda x, y: np.array([metrics.probability_of_improvement(x, y)]),
                                           reps=2000)
    return {k: {"p": float(point[k][0]), "ci95": [float(ci[k][0, 0]), float(ci[k][1, 0])]} for k in arrays}


def iqm_seeds(values: list[float], ci=None) -> dict:
    """One method's IQM over seeds with its 95% CI (``ci``: ``iqm_ci`` unless a caller passes its own); one seed is
    the value itself, no bootstrap."""
    if len(values) == 1:
        return {"iqm": values[0], "ci95": [values[0], values[0]], "seeds": 1}
    return (ci or iqm_ci)({"x": values})["x"]


def improvement_seeds(x: list[float], y: list[float], ci=None) -> dict:
    """P(X > Y) over seeds with its 95% CI (``ci``: ``improvement_ci`` unless a caller passes its own); one seed each
    is the comparison itself."""
    if len(x) == 1 and len(y) == 1:
        p = 1.0 if x[0] > y[0] else 0.5 if x[0] == y[0] else 0.0
        return {"p": p, "ci95": [p, p]}
    return (ci or improvement_ci)({"x>y": ([[v] for v in x], [[v] for v in y])})["x>y"]


def dataset_info(path: str | Path, env: str, refs: str = "d4rl") -> dict | None:
    """`ctrl-rl data info PATH --env ENV --refs REFS` (episodes, return_mean, normalized_score, ...), or None when
    it fails."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "ctrl_rl", "data", "info", str(path), "--env", env, "--refs", refs],
                       cwd=ROOT, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None


def copy_rows(src: Path, dest: Path, rows: int, names: tuple[str, ...] | None = None,
              compression: str | None = None) -> None:
    """Write the first ``rows`` rows of the D4RL-layout file ``src`` to ``dest``: every per-row dataset (or only
    ``names``) cut, other datasets whole, the file's attributes copied."""
    import h5py

    with h5py.File(src, "r") as f, h5py.File(dest, "w") as g:
        n = f["observations"].shape[0]  # type: ignore[union-attr]

        def copy(name, obj):
            if isinstance(obj, h5py.Dataset) and (names is None or name in names):
                g.create_dataset(name, data=obj[:rows] if obj.shape and obj.shape[0] == n else obj[()],
                                 compression=compression)

        f.visititems(copy)
        for k, v in f.attrs.items():
            g.attrs[k] = v


def time_calls_ns(fn, calls: int):
    """Wall time of each of ``calls`` calls of ``fn()``, in ns (a NumPy array)."""
    import time

    import numpy as np

    t = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        t[i] = time.perf_counter_ns() - t0
    return t


# ----- same-run A/B of two commits: detached worktrees, one CLI run against a tree -----

def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def git_head(tree: Path) -> str:
    """``<short sha> <subject>`` of a tree's HEAD, marked when its ctrl_rl/ has uncommitted changes (A/B reports)."""
    r = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=tree, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "ctrl_rl"], cwd=tree,
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip()[:90] + (" (+ uncommitted changes in ctrl_rl/)" if dirty else "")


def worktree(rev: str) -> dict:
    """A detached worktree of ``rev`` at /tmp/ctrl_rl_ab/<short-sha> (reused when present and at that commit)."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    short = sha[:7]
    path = AB_TREES / short
    if path.exists():
        head = git("rev-parse", "HEAD", cwd=path)
        assert head == sha, f"{path} is at {head}, expected {sha}: remove it (git worktree remove --force {path})"
    else:
        AB_TREES.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(path), sha)
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=path)
    assert not dirty, f"{path} has uncommitted changes to tracked files: {dirty[:200]}"
    tree = {"rev": rev, "sha": sha, "short": short, "path": str(path), "subject": git("log", "-1", "--format=%s", sha)}
    resolved = subprocess.run([sys.executable, "-c", "import ctrl_rl; print(ctrl_rl.__file__)"], env=tree_env(tree),
                              cwd=path, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    assert Path(resolved).resolve().is_relative_to(path.resolve()), (
        f"with PYTHONPATH={path}, ctrl_rl resolves to {resolved}, not into the tree (the editable install won?)")
    tree["ctrl_rl_file"] = resolved
    return tree


def tree_env(tree: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": tree["path"], "MPLBACKEND": "Agg"}
    env.pop("CTRL_RL_DATA_DIR", None)
    return env



def train(tree: dict, algo: str, args: list[str], run_dir: Path) -> tuple[list[dict], float, float]:
    """``python -m ctrl_rl train ALGO ARGS`` against ``tree``; returns (metrics rows, process wall seconds, process
    CPU seconds (user + system, all its threads, start-up included))."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "ctrl_rl", "train", algo, *args, "--run-dir", str(run_dir), "--no-progress",
           "--checkpoint-every", str(10**9)]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tree["path"], env=tree_env(tree), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (in {tree['path']}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    recorded = (json.loads((run_dir / "config.json").read_text()).get("code") or {}).get("started", {}).get("git")
    assert recorded and tree["sha"].startswith(recorded.split("+")[0]) and "+dirty" not in recorded, (
        f"run in {tree['path']} recorded code {recorded!r}, expected {tree['sha'][:12]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, seconds, cpu


def ab_report_head(p: dict, title: str) -> list[str]:
    """The first lines of a same-run A/B report: ``# <title>: before X vs after Y``, then the two commits, repeats,
    CPUs, date, script wall time and the load before the runs (``p`` holds ``before``, ``after``, ``setting``,
    ``machine``, ``date``, ``wall_s``, ``load_avg_1min``)."""
    b, a = p["before"], p["after"]
    return [f"# {title}: before {b['short']} vs after {a['short']}", "",
            f"before `{b['short']}` ({b['subject']}); after `{a['short']}` ({a['subject']}). "
            f"{p['setting']['repeats']} interleaved repeats, {p['machine']['cpus']} CPUs, {p['date']}, "
            f"script wall time {p['wall_s'] / 60:.1f} min, load average (1 min) before the runs "
            f"{min(p['load_avg_1min'])}-{max(p['load_avg_1min'])}.", ""]


# ----- update cost against the machine's matmul rate -----

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def synthetic_replay(obs_dim: int, act_dim: int, batch: int, rows: int, seed: int):
    """A sampler of ``batch``-row ``Transition``s from an in-memory replay of ``rows`` synthetic transitions
    (observations N(0, 1), actions U(-1, 1), next observations within 0.1 of them, 1% terminations, no
    truncations), for timing updates without an env."""
    import torch

    from ctrl_rl.core.types import Transition

    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, obs_dim, generator=g)  # [R,O]
    data = (obs, torch.rand(rows, act_dim, generator=g) * 2 - 1, torch.randn(rows, generator=g),
            obs + 0.1 * torch.randn(rows, obs_dim, generator=g), torch.rand(rows, generator=g) < 0.01,
            torch.zeros(rows, dtype=torch.bool))

    def sample() -> Transition:
        idx = torch.randint(rows, (batch,), generator=g)  # [B]
        return Transition(*(x[idx] for x in data))

    return sample


def matmul_flops(fn) -> int:
    """Matmul FLOPs of one call of ``fn()`` (forward and backward), counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def matmul_calls(fn) -> list[tuple[str, list[int], list[int]]]:
    """The matrix products one call of ``fn()`` runs, forward and backward: ``(op, shape of the first operand,
    shape of the second)`` per aten mm / addmm / bmm / baddbmm call, from torch.profiler's recorded shapes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    calls = []
    for e in prof.events() or []:
        if e.name in MATMUL_OPS:
            shapes = [list(s) for s in e.input_shapes]
            first = 0 if e.name in ("aten::mm", "aten::bmm") else 1  # addmm / baddbmm: (input, a, b, ...)
            calls.append((e.name, shapes[first], shapes[first + 1]))
    return calls


def call_flops(calls: list[tuple[str, list[int], list[int]]]) -> int:
    """2 m k n per product (times the batch of a bmm) summed over ``calls`` (FlopCounterMode's convention)."""
    total = 0
    for _, a, b in calls:
        batch = a[0] if len(a) == 3 else 1
        total += 2 * batch * a[-2] * a[-1] * b[-1]
    return total


def matmul_replay_gflops(calls: list[tuple[str, list[int], list[int]]], repeats: int = 5, rounds: int = 20) -> float:
    """GFLOP/s of plain ``torch.mm`` / ``torch.bmm`` at the shapes of ``calls`` (contiguous random operands, on the
    current threads): the median over ``repeats`` timings of ``rounds`` passes over every product. What an update
    with these products could reach if it did nothing else."""
    import statistics

    import torch

    pairs = [(torch.randn(a), torch.randn(b)) for _, a, b in calls]

    def one_pass() -> None:
        for x, y in pairs:
            if x.dim() == 3:
                torch.bmm(x, y)
            else:
                torch.mm(x, y)

    for _ in range(3):
        one_pass()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(rounds):
            one_pass()
        times.append((time.perf_counter() - t) / rounds)
    return call_flops(calls) / statistics.median(times) / 1e9


def large_matmul_gflops(n: int = 2048, repeats: int = 5, calls: int = 3) -> float:
    """GFLOP/s of a float32 (n x n) @ (n x n) product on the current threads, median of ``repeats`` timings of
    ``calls`` products: the machine's matmul rate where size is no obstacle."""
    import statistics

    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b, out=(c := torch.empty(n, n)))
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=c)
        rates.append(2 * n**3 * calls / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def profile_table(fn, calls: int, rows: int = 25) -> str:
    """torch.profiler's table of the top ``rows`` ops by self CPU time over ``calls`` calls of ``fn()``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


class Launcher:
    """Runs a study's commands as subprocesses (``ctrl-rl train ...``), logs each to ``<runs>/commands.txt`` and its
    output to the given log, and stops them all on Ctrl-C/SIGTERM (``stop``; the runs checkpoint atomically at every
    evaluation, so a stopped run resumes from its last one). Used by experiments/d4rl/run_table.py and the study
    scripts that drive many runs."""

    def __init__(self, runs: Path, dry_run: bool):
        self.runs, self.dry_run = runs, dry_run
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False

    def run(self, cmd: list[str], log: Path, label: str) -> tuple[int, str]:
        line = shlex.join(cmd)
        if self.dry_run:
            print(line, flush=True)
            return 0, ""
        with self.lock:
            if self.stopping:
                return -1, ""
            with open(self.runs / "commands.txt", "a") as f:
                f.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {label}\n{line}\n")
            print(f"[start] {label}: {line}", flush=True)
            log.parent.mkdir(parents=True, exist_ok=True)
            out = open(log, "a")
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=out, text=True,
                                 env={**os.environ, "MPLBACKEND": "Agg"})
            self.procs.add(p)
        stdout, _ = p.communicate()
        out.write(stdout)
        out.close()
        with self.lock:
            self.procs.discard(p)
        return p.returncode, stdout

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for p in self.procs:  # SIGTERM, not SIGINT: a child of a background shell ignores SIGINT
                p.terminate()


def parse_deadline(text: str | None, now: datetime.datetime) -> datetime.datetime | None:
    """``+6h``, ``+90m`` or an ISO time (``2026-11-26T18:00``, local time unless it says otherwise)."""
    if text is None:
        return None
    m = re.fullmatch(r"\+(\d+(?:\.\d+)?)([hm])", text.strip())
    if m:
        return now + datetime.timedelta(**{"hours" if m.group(2) == "h" else "minutes": float(m.group(1))})
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"--deadline {text!r} is neither +<hours>h, +<minutes>m nor an ISO time: expected e.g. +6h, "
                         "+90m or 2026-11-26T18:00") from None
    return t if t.tzinfo is not None else t.astimezone()


# ---- runs kept in the repository ----------------------------------------------------------------------------------
# The machine a study runs on can be replaced between sessions, and its run directories with it (checkpoints, logs).
# A study keeps the records of its runs (config and logs: small text) in its own folder, ``experiments/<study>/kept/
# <run>/<file>.gz``, committed with its results: its summary reads a kept copy where the run directory is gone, and
# its runner counts a kept run that reached the budget as done instead of running it again.

def keep_run(run_dir: Path, kept: Path, names: tuple[str, ...] = ("config.json", "metrics.jsonl")) -> None:
    """Copy ``run_dir``'s files ``names`` (those it has) into ``kept`` as ``<name>.gz``."""
    for name in names:
        if (run_dir / name).is_file():
            write_gz(kept / f"{name}.gz", (run_dir / name).read_bytes())


def write_gz(path: Path, data: bytes) -> None:
    """``data`` gzipped into ``path`` (atomically). The bytes depend only on ``data`` (no time in the gzip header), so
    keeping an unchanged run again changes no file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(data)
    tmp.replace(path)


def kept_rows(kept: Path, name: str = "metrics.jsonl") -> list[dict]:
    """The JSON lines of a kept file (``[]`` when it was not kept)."""
    p = kept / f"{name}.gz"
    if not p.is_file():
        return []
    return [json.loads(x) for x in gzip.decompress(p.read_bytes()).decode().splitlines() if x.strip()]


def kept_step(kept: Path) -> int:
    """The last ``step`` a kept run logged (0 when none was kept)."""
    return max((int(r["step"]) for r in kept_rows(kept) if "step" in r), default=0)


def read_dir(run_dir: Path, kept: Path) -> Path:
    """The folder to read a run's records from: ``run_dir`` while it has a ``metrics.jsonl`` (the live run); else its
    kept copy (``unpack_kept``); else ``run_dir`` (nothing to read)."""
    if (run_dir / "metrics.jsonl").is_file() or not (kept / "metrics.jsonl.gz").is_file():
        return run_dir
    return unpack_kept(kept)


def read_kept_run(run_dir: Path, kept: Path, read) -> dict | None:
    """``read(folder)`` of the live run, else of its kept copy, marked ``kept`` (read from the copy); a live run that
    ``read`` finds ``complete`` is kept first. ``read`` returns a dict with ``complete``, or None (nothing to read)."""
    r = read(read_dir(run_dir, kept))
    if r is not None:
        r["kept"] = not (run_dir / "metrics.jsonl").is_file()
        if r["complete"] and not r["kept"]:
            keep_run(run_dir, kept)
    return r


def unpack_kept(kept: Path) -> Path:
    """``kept``'s files unpacked under their own names into a temporary folder with ``kept``'s name (the run's)."""
    dest = Path(tempfile.mkdtemp(prefix="ctrl_rl_kept_")) / kept.name
    dest.mkdir()
    for gz in kept.glob("*.gz"):
        (dest / gz.name[: -len(".gz")]).write_bytes(gzip.decompress(gz.read_bytes()))
    return dest


def merged_study_record(path: Path, record: dict, *, same: tuple[str, ...], union: tuple[str, ...],
                        order: dict | None = None) -> dict:
    """A runner's settings ``record`` (what its summary reads from ``path``, ``<runs-dir>/study.json``) with what
    earlier invocations on the same runs dir covered: where the record in ``path`` agrees on every key of ``same``,
    each key of ``union`` becomes the union of both (a list: the earlier entries first; a dict: merged, this call's
    entries winning), so that a second invocation for part of the study (one seed, one variant, run beside the first
    to use a free core) does not narrow what the summary reads; ``order`` (key -> sort key) sorts a merged list.
    ``invocations`` lists every command line."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and all(old.get(k) == record.get(k) for k in same):
        for k in union:
            if isinstance(record.get(k), dict) and isinstance(old.get(k), dict):
                record[k] = {**old[k], **record[k]}
            elif isinstance(record.get(k), list) and isinstance(old.get(k), list):
                record[k] = list(dict.fromkeys([*old[k], *record[k]]))
        record["invocations"] = [*old.get("invocations", [old.get("command")]), record.get("command")]
    else:
        record["invocations"] = [record.get("command")]
    for k, key in (order or {}).items():
        record[k] = sorted(record[k], key=key)
    return record


def load_module(path: Path, name: str):
    """The Python file ``path`` as a module named ``name`` (a study's sibling script such as its summarize.py, under a
    name of its own: several studies have a summarize.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
