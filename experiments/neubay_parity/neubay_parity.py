"""NeuBay gradient steps/s: ctrl_rl against the official code (twni2016/neubay @ 5604bad, JAX on CPU), in one run.

    python experiments/neubay_parity/neubay_parity.py [--dataset hopper-medium-v5] [--model RUN] \\
        [--official-model DIR] [--steps 300] [--repeats 3] [--cpus 0]

Each repeat runs both, alternating (ctrl_rl first on even repeats, the official code first on odd ones) so that
drifts of the machine's speed hit both alike:

* ctrl_rl: ``python -m ctrl_rl train neubay --env <Task>-v5 --dataset D --model M --total-steps STEPS
  --eval-every 0 --eval-episodes 1 --log-every LOG --seed S`` plus the official per-dataset settings
  (``--encoder-lr``, ``--real-weight``, ``--no-learn-alpha`` where the official config fixes the temperature),
  in a detached worktree of ``--ctrl-rl-rev`` (default HEAD; ``experiments/common.py``, the run must record that
  clean commit). Rate: (last row's step - first row's step) / (their wall_time difference), as
  ``experiments/model_based_speed`` measures it: steps LOG+1 .. STEPS, set-up, the first collection and the final
  evaluation outside.
* official: ``experiments/peers/neubay_official/run.py --stage agent --dataset D --model OFFICIAL_MODEL
  --steps STEPS --warmup W --eval-episodes 1 --seed S`` (its per-dataset config, ``task=<task>_<level>``); rate:
  steps W+1 .. STEPS over their wall-clock window, JAX compile time outside (run.py's docstring).

Models: ``--model`` is a finished 7-member ``ctrl-rl train dynamics`` run; without it one is fitted once (7 members,
5 elites, the official model's blocks: ``--layer-norm --activation leaky_relu``, holdout 1000 rows, at most
``--fit-epochs`` epochs). ``--official-model`` is a ``run.py --stage dynamics`` output; without it the official fit
runs once (7 members, at most ``--fit-epochs`` epochs). The rollouts of the official code then sample from its best
5 of the 7 members (ctrl_rl: its 5 elites). Both are kept in ``--work`` and reused by later invocations.

``--max-rows N`` makes both read the first N rows of the dataset (a sliced copy; smoke runs). ``--cpus`` pins both
processes to those cores (taskset / sched_setaffinity; ctrl_rl then gets ``--threads <cores>``); without it each uses
its own default (XLA: every core; ctrl_rl ``--threads 0``: every core while it has them to itself, one while other
processes compete).

Writes experiments/neubay_parity/<--name>.{json,md} (default ``neubay_parity``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, train, worktree, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent
RUN_PY = ROOT / "experiments" / "peers" / "neubay_official" / "run.py"
TASK_ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}

# Settings that differ between the two runs however the flags are set (the matched ones are in "matched").
DIFFERENCES = [
    "framework: the official update is one XLA-compiled JAX function (jax 0.5.3 CPU, float32); ctrl_rl's is PyTorch "
    "eager on the CPU (float32, --bf16 off)",
    "threads: XLA's CPU runtime uses every core it may run on; ctrl_rl --threads 0 uses every core while it has them "
    "to itself and one thread while other processes compete (--cpus pins both to the same cores, ctrl_rl with "
    "--threads <cores>)",
    "world model: each side's own 7-member fit (same blocks: 4 x 200, LayerNorm, LeakyReLU; each side's own loss "
    "details, holdout rows and epoch cap), so rollout lengths under uncertainty truncation and thus tape lengths in "
    "the buffer differ; a gradient step's work does not depend on them (always 2048 transitions of whole tapes)",
    "rollout members: official = its 5 lowest-validation-MSE members of 7, the 100 rollouts split 20 per member; "
    "ctrl_rl = its 5 elites of 7, one per rollout",
    "learning-rate schedules: official cosine over train.grad_steps = 2,000,000 (its default; the shim stops the run "
    "after STEPS); ctrl_rl cosine over --total-steps STEPS (same work per step)",
    "timed window: official steps W+1..STEPS (wall clock around the official loop's own calls, compile in step 1 "
    "outside); ctrl_rl steps LOG+1..STEPS between its first and last metrics rows",
    "evaluation: official evaluates once before step 1 (eval.real_episodes=1); ctrl_rl once at the end "
    "(--eval-episodes 1); both outside the timed window",
]


def fail(msg: str) -> None:
    print(f"neubay_parity: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="hopper-medium-v5", help="a D4RL-layout file in ctrl_rl's dataset cache")
    ap.add_argument("--max-rows", type=int, default=None, help="smoke runs: the first N rows only")
    ap.add_argument("--model", default=None, help="a finished 7-member ctrl-rl dynamics run on the same data")
    ap.add_argument("--official-model", default=None, help="an official fit (run.py --stage dynamics --out)")
    ap.add_argument("--fit-epochs", type=int, default=5, help="epoch cap of the fits made when no model is given")
    ap.add_argument("--steps", type=int, default=300, help="gradient steps per run")
    ap.add_argument("--log-every", type=int, default=50, help="ctrl_rl rows; its timed window starts at this step")
    ap.add_argument("--warmup", type=int, default=3, help="official steps before its timed window (1 compiles)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="seed of repeat 0; repeat r uses seed + r")
    ap.add_argument("--cpus", default=None, help="taskset -c CPUS for both (e.g. 0)")
    ap.add_argument("--ctrl-rl-rev", default="HEAD", help="the ctrl_rl commit measured (a detached worktree)")
    ap.add_argument("--checkout", default="/work/peers/neubay", help="the official checkout")
    ap.add_argument("--venv", default="/work/peers/neubay-venv", help="the official code's venv (setup.sh)")
    ap.add_argument("--work", default="/tmp/neubay_parity", help="models, data slices and runs")
    ap.add_argument("--name", default="neubay_parity", help="result file name in experiments/neubay_parity/")
    a = ap.parse_args()
    if a.steps <= max(a.log_every, a.warmup):
        fail(f"--steps {a.steps} must exceed --log-every {a.log_every} and --warmup {a.warmup}")
    return a


def data_file(a, work: Path) -> Path:
    from ctrl_rl.storage.datasets.cache import data_dir

    src = data_dir() / f"{a.dataset}.hdf5"
    if not src.is_file():
        fail(f"{src} is missing: `ctrl-rl data generate` it first")
    if not a.max_rows:
        return src
    import h5py

    dest = work / "data" / f"{a.dataset}-first{a.max_rows}.hdf5"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
        n = f["observations"].shape[0]

        def copy(name, obj):
            if isinstance(obj, h5py.Dataset):
                g[name] = obj[: a.max_rows] if obj.shape and obj.shape[0] == n else obj[()]

        f.visititems(copy)
        for k, v in f.attrs.items():
            g.attrs[k] = v
    tmp.rename(dest)
    return dest


def official_task_settings(checkout: Path, dataset: str) -> dict:
    """encoder lr, real weight and fixed/learned temperature of the official per-dataset config, as ctrl_rl flags."""
    task, rest = dataset.split("-", 1)
    level = rest.rsplit("-v", 1)[0].replace("-", "_")
    base = (checkout / "configs" / "d4rl_loco" / "base.yaml").read_text()
    path = checkout / "configs" / "d4rl_loco" / "task" / f"{task}_{level}.yaml"
    text = path.read_text() if path.is_file() else ""

    def value(key: str):
        for src in (text, base):
            m = re.search(rf"^\s+{key}:\s*([^\s#]+)", src, re.M)
            if m:
                return m.group(1)
        return None

    enc, real, alpha = value("critic_enc_lr"), value("real_weight"), value("target_alpha_ratio")
    flags = ["--encoder-lr", str(float(enc)), "--real-weight", str(float(real))]
    if alpha in ("null", "None", "~"):
        flags.append("--no-learn-alpha")
    return {"config": str(path) if text else None, "encoder_lr": float(enc), "real_weight": float(real),
            "alpha": "fixed 0.2" if alpha in ("null", "None", "~") else f"learned, target -|A| x {alpha}",
            "ctrl_rl_flags": flags}


def ctrl_rl_model(a, tree: dict, env_id: str, data: Path, work: Path) -> Path:
    if a.model:
        return Path(a.model).resolve()
    d = work / f"ctrl_rl-model-{data.stem}-{a.fit_epochs}ep-{tree['short']}"
    if not (d / "model.pt").is_file():
        print(f"fitting ctrl_rl's 7-member model ({a.fit_epochs} epochs at most) -> {d}", flush=True)
        train(tree, "dynamics", ["--env", env_id, "--dataset", str(data), "--members", "7", "--elites", "5",
                                 "--layer-norm", "--activation", "leaky_relu", "--max-holdout", "1000",
                                 "--total-steps", str(a.fit_epochs), "--min-epochs", "0", "--seed", str(a.seed)], d)
    return d


def official_model(a, data: Path, work: Path) -> Path:
    if a.official_model:
        return Path(a.official_model).resolve()
    d = work / f"official-model-{data.stem}-{a.fit_epochs}ep"
    if not list((d / "ckpt" / a.dataset).glob("ensemble_seed*.eqx")):
        print(f"fitting the official 7-member model ({a.fit_epochs} epochs at most) -> {d}", flush=True)
        official(a, ["--stage", "dynamics", "--members", "7", "--epochs", str(a.fit_epochs), "--seed",
                     str(a.seed)], data, d)
    return d


def official(a, args: list[str], data: Path, out: Path) -> dict:
    cmd = [sys.executable, str(RUN_PY), "--checkout", a.checkout, "--venv", a.venv, "--dataset", a.dataset,
           "--data-file", str(data), "--out", str(out), *args]
    if a.cpus is not None:
        cmd += ["--cpus", a.cpus]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    res = json.loads((out / "results.json").read_text())
    res["process_wall_s"] = round(time.perf_counter() - t0, 2)
    return res


def ctrl_rl_run(a, tree: dict, env_id: str, data: Path, model: Path, flags: list[str], seed: int, run_dir: Path):
    args = ["--env", env_id, "--dataset", str(data), "--model", str(model), "--total-steps", str(a.steps),
            "--eval-every", "0", "--eval-episodes", "1", "--log-every", str(a.log_every), "--seed", str(seed), *flags]
    if a.cpus is not None:
        args += ["--threads", str(len(expand_cpus(a.cpus)))]  # one torch thread per pinned core
        # common.train starts the process itself: pin this process, whose affinity the child inherits
        os.sched_setaffinity(0, {int(c) for c in expand_cpus(a.cpus)})
    try:
        rows, seconds, cpu = train(tree, "neubay", args, run_dir)
    finally:
        if a.cpus is not None:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    first, last = rows[0], rows[-1]
    rate = (last["step"] - first["step"]) / (last["wall_time"] - first["wall_time"])
    return {"gradient_steps_per_s": rate, "window": [first["step"], last["step"]],
            "window_s": round(last["wall_time"] - first["wall_time"], 3), "process_wall_s": round(seconds, 2),
            "process_cpu_s": round(cpu, 2), "rows": len(rows), "command_args": args}


def expand_cpus(spec: str) -> list[str]:
    out: list[str] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += [str(i) for i in range(int(lo), int(hi) + 1)]
        else:
            out.append(part)
    return out


def markdown(p: dict) -> str:
    m = p["median"]
    lines = [f"# NeuBay gradient steps/s: ctrl_rl `{p['ctrl_rl']['short']}` vs the official code (JAX, CPU)", "",
             f"{p['dataset']}{' (first ' + str(p['max_rows']) + ' rows)' if p['max_rows'] else ''}, {p['steps']} "
             f"gradient steps per run, {p['repeats']} alternating repeats, {p['machine']['cpus']} CPUs"
             f"{', pinned to ' + p['cpus'] if p['cpus'] else ''}, {p['date']}, script wall time "
             f"{p['wall_s'] / 60:.1f} min, load average (1 min) before the runs {min(p['load_avg_1min'])}-"
             f"{max(p['load_avg_1min'])}.", "",
             "| | median gradient steps/s | per repeat |", "|---|---|---|"]
    for side in ("ctrl_rl", "official"):
        lines.append(f"| {side} | {m[side]:.3f} | " + ", ".join(f"{x:.3f}" for x in p["runs"][side]) + " |")
    lines += ["", f"**ctrl_rl / official = {p['ratio_ctrl_rl_over_official']:.2f}** (ratio of medians). Official "
              f"compile time (first step minus a steady step): "
              + ", ".join(str(x) for x in p["official_compile_s"]) + " s; official steps/s without collections in "
              "its window: " + ", ".join(f"{x:.3f}" for x in p["official_update_steps_per_s"]) + ".", "",
              "Matched: " + "; ".join(f"{k} {v}" for k, v in p["matched"].items()) + ".", "", "Differences:", ""]
    lines += [f"- {d}" for d in p["differences"]]
    lines += ["", f"`{p['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    a = parse()
    t_start = time.perf_counter()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    task = a.dataset.split("-", 1)[0]
    if task not in TASK_ENVS:
        fail(f"--dataset {a.dataset}: expected one of the tasks {sorted(TASK_ENVS)}")
    env_id = TASK_ENVS[task]
    checkout = Path(a.checkout)
    if not (checkout / "offline_cont.py").is_file():
        fail(f"no official checkout at {checkout}: see experiments/peers/neubay_official/README.md")
    tree = worktree(a.ctrl_rl_rev)
    data = data_file(a, work)
    ts = official_task_settings(checkout, a.dataset)
    model = ctrl_rl_model(a, tree, env_id, data, work)
    omodel = official_model(a, data, work)
    runs: dict[str, list[float]] = {"ctrl_rl": [], "official": []}
    detail: dict[str, list[dict]] = {"ctrl_rl": [], "official": []}
    loads = []
    for r in range(a.repeats):
        seed = a.seed + r
        order = ("ctrl_rl", "official") if r % 2 == 0 else ("official", "ctrl_rl")
        for side in order:
            loads.append(round(os.getloadavg()[0], 2))
            if side == "ctrl_rl":
                res = ctrl_rl_run(a, tree, env_id, data, model, ts["ctrl_rl_flags"], seed,
                                  work / "runs" / f"ctrl_rl-r{r}")
            else:
                full = official(a, ["--stage", "agent", "--model", str(omodel), "--steps", str(a.steps), "--warmup",
                                    str(a.warmup), "--eval-episodes", "1", "--seed", str(seed)], data,
                                work / "runs" / f"official-r{r}")
                res = {k: full[k] for k in ("gradient_steps_per_s", "update_steps_per_s", "compile_seconds",
                                            "timed_steps", "process_wall_s", "settings", "checkout", "versions")}
                res["collections"] = full["timing"]["collections"]
            runs[side].append(res["gradient_steps_per_s"])
            detail[side].append(res)
            print(f"repeat {r} {side}: {res['gradient_steps_per_s']:.3f} gradient steps/s "
                  f"(process {res['process_wall_s']:.0f} s)", flush=True)
    median = {k: statistics.median(v) for k, v in runs.items()}
    osettings = detail["official"][0]["settings"]
    matched = {"dataset": f"the same file ({data})", "batch": f"{osettings['batch_transitions']} transitions of whole "
               "tapes", "parallel rollouts": osettings["parallel_rollouts"], "utd": osettings["utd"],
               "model": "7 members, 5 sampled by the rollouts, 4 x 200 LayerNorm LeakyReLU",
               "agent": f"LRU {osettings['lru']}, heads {osettings['head']}, {osettings['num_critics']} critics, "
               f"target min over {osettings['sampled_critics']}",
               "per-dataset settings": f"encoder lr {ts['encoder_lr']}, real weight {ts['real_weight']}, "
               f"temperature {ts['alpha']}", "uncertainty quantile": osettings["unc_quantile"],
               "horizon": "env time limit 1000", "gamma, tau": f"{osettings['gamma']}, {osettings['tau']}"}
    payload = {
        "dataset": a.dataset, "data_file": str(data), "max_rows": a.max_rows, "steps": a.steps,
        "repeats": a.repeats, "cpus": a.cpus, "ctrl_rl": {k: tree[k] for k in ("sha", "short", "subject")},
        "official": {"checkout": detail["official"][0]["checkout"], "versions": detail["official"][0]["versions"]},
        "models": {"ctrl_rl": str(model), "official": str(omodel)}, "official_task_settings": ts,
        "runs": runs, "median": median, "ratio_ctrl_rl_over_official": median["ctrl_rl"] / median["official"],
        "official_update_steps_per_s": [d["update_steps_per_s"] for d in detail["official"]],
        "official_compile_s": [d["compile_seconds"] for d in detail["official"]],
        "detail": detail, "matched": matched, "differences": DIFFERENCES,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "load_avg_1min": loads,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t_start, 1),
        "command": "python experiments/neubay_parity/neubay_parity.py " + " ".join(sys.argv[1:])}
    write_result(a.name, payload, markdown(payload), folder=RESULTS)
    print(f"median gradient steps/s: ctrl_rl {median['ctrl_rl']:.3f}, official {median['official']:.3f}, "
          f"ratio {payload['ratio_ctrl_rl_over_official']:.2f}")


if __name__ == "__main__":
    if shutil.which("git") is None:
        fail("git is needed (ctrl_rl runs in a detached worktree)")
    main()
