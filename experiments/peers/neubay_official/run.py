"""Run the official NeuBay code (twni2016/neubay @ 5604bad, JAX/Equinox) unmodified through the shim, on CPU, and
write ``results.json``.

    python experiments/peers/neubay_official/run.py --stage dynamics --dataset hopper-medium-v5 --members 7 \\
        --epochs 5 --out /work/peers/runs/neubay-dyn
    python experiments/peers/neubay_official/run.py --stage agent --dataset hopper-medium-v5 \\
        --model /work/peers/runs/neubay-dyn --steps 300 --out /work/peers/runs/neubay-agent

Any Python runs this file (standard library only); the official scripts run in the peer venv (``setup.sh``) as
``python shim/launch.py SCRIPT HYDRA_OVERRIDES`` with the working directory ``--out``. Arguments after ``--`` are
further hydra overrides for the official script, as they are (e.g. ``-- train.batch_size=1024``).

dynamics: ``offline_world/cont_ensemble.py --config-path=CHECKOUT/configs/d4rl_loco --config-name=base
dataset_name=D seed=S ensemble.total_size=MEMBERS [ensemble.total_epochs=EPOCHS] ensemble.save_dir=OUT/ckpt``: the
official fit (4 x 200 LayerNorm + LeakyReLU blocks, Gaussian NLL, AdamW 1e-3, batch 256, holdout min(20%, 1000)
rows, per-member best checkpoint, stop after 5 epochs without a 1% gain, or at EPOCHS). The official default is 128
members; ``--members 7`` matches ctrl_rl's 7-member runs.

agent: ``offline_cont.py --config-path=... --config-name=base task=<task>_<level> dataset_name=D seed=S
collect.ensemble_size=K eval.real_episodes=E ensemble.save_dir=MODEL/ckpt``: the official per-dataset config
(``configs/d4rl_loco/task/<task>_<level>.yaml``: encoder lr, real weight, fixed or tuned temperature) over the base
config (batch 2048 transitions, 100 parallel rollouts, UTD 0.05, 10 critics, LRU 256/128 x 2, ...). K, the members
the rollouts sample from (official 100 of 128), defaults to the largest divisor of ``collect.parallel_size`` (100)
not above the model's members - 2 (5 for a 7-member model, as ctrl_rl's 5 elites of 7): the official ``_step``
splits the 100 rollouts evenly over the K members and fails otherwise. The run stops after ``--steps`` gradient
steps (the shim's step timer; the official loop would run ``train.grad_steps``, 2M, which stays the length of the
cosine schedules).

Gradient steps/s (shim/launch.py): steps ``--warmup`` + 1 .. ``--steps`` over their wall time, from the end of
step ``--warmup`` (the first step compiles; every warm-up step is waited for and timed alone) to the end of the last
step (its outputs waited for). No waiting in between: JAX's asynchronous dispatch runs as in the official loop.
``steps_per_s`` counts everything in that window (batch sampling from the tape buffer, host-to-device copies,
updates, and any collection or evaluation that falls in it); ``update_steps_per_s`` leaves out the collections and
evaluations inside it. ``compile_seconds`` = first step's time minus the median of the other warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"
COMMIT = "5604bad"  # "update readme"; the repository's latest
SCRIPTS = {"dynamics": "offline_world/cont_ensemble.py", "agent": "offline_cont.py"}


def fail(msg: str) -> None:
    print(f"run.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse() -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", default="/work/peers/neubay", help="the official code's checkout")
    p.add_argument("--venv", default="/work/peers/neubay-venv", help="the peer venv (setup.sh)")
    p.add_argument("--stage", choices=SCRIPTS, required=True)
    p.add_argument("--dataset", required=True, help="e.g. hopper-medium-v5 (a file in ctrl_rl's dataset cache)")
    p.add_argument("--data-file", default=None, help="read this D4RL-layout .hdf5 instead of the cached <dataset>")
    p.add_argument("--max-rows", type=int, default=None, help="smoke runs: only the first N rows of the file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--members", type=int, default=128, help="dynamics: ensemble.total_size (official 128)")
    p.add_argument("--epochs", type=int, default=None, help="dynamics: ensemble.total_epochs (default: early stop)")
    p.add_argument("--model", default=None, help="agent: the dynamics stage's --out")
    p.add_argument("--steps", type=int, default=None, help="agent: gradient steps, then stop")
    p.add_argument("--warmup", type=int, default=3, help="agent: steps timed alone before the window (>= 1)")
    p.add_argument("--rollout-members", type=int, default=None,
                   help="agent: collect.ensemble_size (default: see above; must divide collect.parallel_size)")
    p.add_argument("--eval-episodes", type=int, default=None, help="agent: eval.real_episodes (official 20)")
    p.add_argument("--cpus", default=None, help="run under taskset -c CPUS (e.g. 0): XLA then uses those cores")
    p.add_argument("--out", required=True, help="run folder (outside the repository)")
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    a = p.parse_args(argv)
    if a.stage == "agent" and (a.model is None or a.steps is None):
        fail("--stage agent needs --model (a dynamics run's --out) and --steps")
    if a.warmup < 1:
        fail("--warmup must be at least 1 (the first step compiles)")
    if a.stage == "agent" and a.steps <= a.warmup:
        fail(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    return a, extra


def checkout_state(checkout: Path) -> dict:
    def git(*args):
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD")
    if not head:
        fail(f"no git checkout at {checkout}: see README.md (Setup)")
    return {"path": str(checkout), "commit": head, "expected": COMMIT, "at_expected": head.startswith(COMMIT),
            "modified": bool(git("status", "--porcelain", "--untracked-files=no"))}


def model_header(model_out: Path, dataset: str) -> dict:
    files = sorted((model_out / "ckpt" / dataset).glob("ensemble_seed*.eqx"))
    if not files:
        fail(f"--model {model_out}: no ckpt/{dataset}/ensemble_seed*.eqx (run --stage dynamics --out there first)")
    with open(files[0], "rb") as f:
        return {"file": str(files[0]), **json.loads(f.readline().decode())}


def wandb_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def main() -> None:
    a, extra = parse()
    checkout = Path(a.checkout).resolve()
    state = checkout_state(checkout)
    py = Path(a.venv) / "bin" / "python"
    if not py.is_file():
        fail(f"no peer venv at {a.venv}: run `bash experiments/peers/neubay_official/setup.sh`")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("wandb.jsonl", "timing.json"):
        (out / name).unlink(missing_ok=True)
    task, level = a.dataset.split("-", 1)[0], a.dataset.split("-", 1)[1].rsplit("-v", 1)[0]
    overrides = [f"--config-path={checkout / 'configs' / 'd4rl_loco'}", "--config-name=base"]
    settings: dict = {}
    if a.stage == "dynamics":
        overrides += [f"dataset_name={a.dataset}", f"seed={a.seed}", f"ensemble.total_size={a.members}",
                      f"ensemble.save_dir={out / 'ckpt'}", f"ensemble.plot_dir={out / 'plt'}"]
        if a.epochs is not None:
            overrides.append(f"ensemble.total_epochs={a.epochs}")
    else:
        model_out = Path(a.model).resolve()
        header = model_header(model_out, a.dataset)
        settings["model"] = header
        task_yaml = checkout / "configs" / "d4rl_loco" / "task" / f"{task}_{level.replace('-', '_')}.yaml"
        if task_yaml.is_file():
            overrides.append(f"task={task_yaml.stem}")
        else:
            print(f"run.py: no official per-dataset config {task_yaml.name}: the base config's values apply",
                  file=sys.stderr)
        k = a.rollout_members
        if k is None:
            n = header["ensemble_size"]
            k = 100 if n >= 128 else max(d for d in range(1, max(1, n - 2) + 1) if 100 % d == 0)
        overrides += [f"dataset_name={a.dataset}", f"seed={a.seed}", f"collect.ensemble_size={k}",
                      f"ensemble.save_dir={model_out / 'ckpt'}", f"ensemble.plot_dir={out / 'plt'}"]
        if a.eval_episodes is not None:
            overrides.append(f"eval.real_episodes={a.eval_episodes}")
    overrides += extra
    env = dict(os.environ, NEUBAY_SHIM_LOG=str(out / "wandb.jsonl"), NEUBAY_SHIM_TIMING=str(out / "timing.json"),
               PYTHONUNBUFFERED="1")
    env.pop("NEUBAY_SHIM_STEPS", None)
    if a.stage == "agent":
        env.update(NEUBAY_SHIM_STEPS=str(a.steps), NEUBAY_SHIM_WARMUP=str(a.warmup))
    if a.data_file:
        env["NEUBAY_SHIM_DATASET"] = str(Path(a.data_file).resolve())
    if a.max_rows:
        env["NEUBAY_SHIM_MAX_ROWS"] = str(a.max_rows)
    cmd = [str(py), str(SHIM / "launch.py"), str(checkout / SCRIPTS[a.stage]), *overrides]
    if a.cpus is not None:
        if not shutil.which("taskset"):
            fail("--cpus needs taskset (util-linux)")
        cmd = ["taskset", "-c", a.cpus, *cmd]
    print("run.py:", " ".join(cmd), flush=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with open(out / "stdout.log", "w") as so, open(out / "stderr.log", "w") as se:
        rc = subprocess.run(cmd, cwd=out, env=env, stdout=so, stderr=se).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = (out / "stderr.log").read_text().splitlines()[-25:]
        fail(f"the official script failed (exit {rc}); last lines of {out / 'stderr.log'}:\n" + "\n".join(tail))
    rows = wandb_rows(out / "wandb.jsonl")
    config = next((r.get("config") for r in rows if r.get("_event") == "init"), None) or {}
    result: dict = {"stage": a.stage, "dataset": a.dataset, "data_file": a.data_file, "max_rows": a.max_rows,
                    "seed": a.seed, "checkout": state, "command": cmd, "hydra_overrides": overrides,
                    "process_wall_s": round(wall, 2), "load_avg_before": load_before,
                    "load_avg_after": os.getloadavg(), "cpus": a.cpus or f"all ({os.cpu_count()})",
                    "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    versions = subprocess.run([str(py), "-c", "import jax, jaxlib, equinox, optax, numpy, gym, gymnasium, mujoco;"
                               "print(jax.__version__, jaxlib.__version__, equinox.__version__, optax.__version__,"
                               " numpy.__version__, gym.__version__, gymnasium.__version__, mujoco.__version__)"],
                              capture_output=True, text=True).stdout.split()
    result["versions"] = dict(zip(["jax", "jaxlib", "equinox", "optax", "numpy", "gym", "gymnasium", "mujoco"],
                                  versions))
    if a.stage == "dynamics":
        epochs = [r for r in rows if "epoch" in r and "mse_valid" in r]
        result["config"] = config
        result["epochs"] = [{"epoch": r["epoch"], "wall_min": r.get("wall_min"), "mse_valid": r["mse_valid"],
                             "mse_best": r["mse_best"], "unc_epi_mean": r.get("unc/epi_mean")} for r in epochs]
        result["settings"] = {"members": a.members, "hidden": "4 x 200, LayerNorm + LeakyReLU",
                              **{k: config.get(k) for k in ("total_epochs", "batch_size", "lr", "weight_decay",
                                                            "has_ln", "max_epochs_since_update", "improve_thres")}}
    else:
        timing = json.loads((out / "timing.json").read_text())
        warm = timing["warmup_step_seconds"]
        result["timing"] = timing
        result["compile_seconds"] = round(warm[0] - statistics.median(warm[1:]), 2) if len(warm) > 1 else None
        w = timing.get("window") or {}
        result["gradient_steps_per_s"] = w.get("steps_per_s")
        result["update_steps_per_s"] = w.get("update_steps_per_s")
        result["timed_steps"] = w.get("steps")
        result["config"] = config
        tr, mdl, col = config.get("train", {}), config.get("model", {}), config.get("collect", {})
        result["settings"] = {
            "batch_transitions": tr.get("batch_size"), "utd": tr.get("utd"), "buffer_transitions":
            tr.get("buffer_size"), "parallel_rollouts": col.get("parallel_size"),
            "rollout_members": col.get("ensemble_size"), "model_members": settings["model"].get("ensemble_size"),
            "model_hidden": f"4 x {settings['model'].get('hidden_size')}, LayerNorm {settings['model'].get('has_ln')}",
            "horizon": "env time limit (1000), max_rollout_len " + str(col.get("max_rollout_len")),
            "unc_quantile": col.get("unc_quantile"), "penalty_coef": col.get("penalty_coef"),
            "lru": mdl.get("memory"), "head": f"{mdl.get('head_n_layers')} x {mdl.get('head_d_hidden')}",
            "num_critics": mdl.get("num_critics"), "sampled_critics": mdl.get("sampled_critics"),
            "encoder_lr": tr.get("critic_enc_lr"), "head_lr": tr.get("critic_head_lr"),
            "real_weight": tr.get("real_weight"), "alpha": "fixed 0.2" if mdl.get("target_alpha_ratio") is None
            else f"learned, target -|A| x {mdl.get('target_alpha_ratio')}", "gamma": tr.get("gamma"),
            "tau": tr.get("target_tau"), "schedule_steps": tr.get("grad_steps"),
            "eval_episodes": config.get("eval", {}).get("real_episodes")}
        result["evaluations"] = timing.get("evaluations")
        result["collections"] = timing.get("collections")
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    if a.stage == "agent":
        print(f"run.py: {result['timed_steps']} timed gradient steps: {result['gradient_steps_per_s']:.3f} steps/s "
              f"({result['update_steps_per_s']:.3f} without collections/evaluations in the window); compile "
              f"{result['compile_seconds']} s; process {wall:.0f} s -> {out / 'results.json'}")
    else:
        last = result["epochs"][-1] if result["epochs"] else {}
        print(f"run.py: {len(result['epochs'])} epochs, last validation MSE {last.get('mse_valid')} "
              f"(best {last.get('mse_best')}); process {wall:.0f} s -> {out / 'results.json'}")


if __name__ == "__main__":
    main()
