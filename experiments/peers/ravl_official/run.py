"""Run the official RAVL code (anyasims/edge-of-reach) unmodified through the shim, and write ``results.json``.

    python experiments/peers/ravl_official/run.py --stage dynamics --dataset halfcheetah-medium-v5 --seed 0 \\
        --steps 1 --holdout-rows ctrl_rl --out /work/peers/runs/hc-dyn
    python experiments/peers/ravl_official/run.py --stage agent --dataset halfcheetah-medium-v5 --seed 0 \\
        --model /work/peers/runs/hc-dyn --steps 300 --eval-every 300 --eval-episodes 2 --out /work/peers/runs/hc-ag

Any Python runs this file (standard library only); the official scripts run in the peer venv (``setup.sh``) as
``python -O shim/launch.py SCRIPT ARGS`` (launch.py says why -O and what else it sets). Arguments after ``--`` go
to the official script as they are (its pyrallis flags, e.g. ``-- --num_critics 10 --eta 1.0``).

dynamics: ``train_dynamics_model.py --env_name D --seed S --epochs STEPS --min_epochs min(350, STEPS-1)
--save_path OUT/dynamics``. The official split is its own (README.md: random, drawn partly from an
unseeded generator); ``--holdout-rows FILE.npy|ctrl_rl`` keeps those qlearning-view rows out of its data
(``ctrl_rl``: ctrl_rl's holdout for ``--seed``, shim/split.py) and measures the fitted model on them
(shim/holdout_eval.py, raw and standardised MSE). The official code saves ``data.pkl`` but its loader reads
``config.pkl``: a ``config.pkl`` link to ``data.pkl`` is made in the model folder.

agent: ``train_ravl_agent.py --env_name D --seed S --load_model_dir M --epochs E --updates_per_epoch U
--eval_every STEPS_EVAL/U --eval_episodes N``: STEPS gradient steps in epochs of U (default 1000, the official
rollout interval; fewer steps than U make one shorter epoch). The official code evaluates after epochs 0, ``k *
eval_every`` and the last. results.json: returns and normalised scores vs gradient steps, and gradient steps/s
between the official update logs of one epoch (``--log_every`` 100 updates; no rollouts or evaluations inside).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"
COMMIT = "18b50853219676d120c6238f399664500eaa1f0c"
SCRIPTS = {"dynamics": "train_dynamics_model.py", "agent": "train_ravl_agent.py"}


def fail(msg: str) -> None:
    print(f"run.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse() -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", default="/work/peers/edge-of-reach", help="the official code's checkout")
    p.add_argument("--venv", default="/work/peers/ravl-venv", help="the peer venv (setup.sh)")
    p.add_argument("--stage", choices=SCRIPTS, required=True)
    p.add_argument("--dataset", required=True, help="e.g. halfcheetah-medium-v5 (a file in ctrl_rl's dataset cache)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, required=True, help="dynamics: epochs at most; agent: gradient steps")
    p.add_argument("--updates-per-epoch", type=int, default=1000, help="agent: gradient steps per rollout round")
    p.add_argument("--eval-every", type=int, default=None, help="agent: gradient steps (a multiple of an epoch)")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--model", default=None, help="agent: the dynamics stage's --out, or a model_* folder")
    p.add_argument("--holdout-rows", default=None, help="dynamics: .npy of qlearning-view rows, or 'ctrl_rl'")
    p.add_argument("--max-rows", type=int, default=None,
                   help="smoke runs: the official code sees only the first N dataset rows (after --holdout-rows)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS (default: torch's own choice)")
    p.add_argument("--refs", choices=("local", "d4rl"), default="local", help="reference returns for scores")
    p.add_argument("--out", required=True, help="run folder (outside the repository: checkpoints are large)")
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    return p.parse_args(argv), extra


def find_model(path: Path) -> Path:
    """A saved official model folder (weights.pt + data.pkl) at ``path`` or the newest one under it."""
    if (path / "weights.pt").is_file():
        found = path
    else:
        cands = sorted((p.parent for p in path.rglob("weights.pt") if p.parent.name.startswith("model_")),
                       key=lambda p: p.stat().st_mtime)
        if not cands:
            fail(f"--model {path}: no official dynamics model (model_*/weights.pt) there; run --stage dynamics first")
        found = cands[-1]
    link = found / "config.pkl"
    if not link.exists():
        link.symlink_to("data.pkl")  # the official loader reads config.pkl; the saver writes data.pkl
    return found


def run_logged(cmd: list[str], env: dict, out: Path) -> tuple[int, str, float]:
    """Run ``cmd``, echoing and saving stdout (stdout.log); stderr (tqdm bars) goes to stderr.log."""
    t0 = time.perf_counter()
    lines = []
    with open(out / "stdout.log", "w") as log, open(out / "stderr.log", "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
            lines.append(line)
        rc = proc.wait()
    return rc, "".join(lines), time.perf_counter() - t0


def floats(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"M\d+: ([-+0-9.eE]+|nan|inf)", text)]


def dynamics_results(stdout: str) -> dict:
    """Per-epoch holdout losses (raw MSE per member) and epoch times from the official script's prints."""
    epochs, val = [], []
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Validation Losses:") and i + 1 < len(lines):
            val.append(floats(lines[i + 1]))
    train_loss = [float(m.group(2)) for m in re.finditer(r"Epoch: (\d+), Total Loss: ([-+0-9.eE]+)", stdout)]
    took = [float(v) for v in re.findall(r"Epoch training took ([0-9.eE+-]+) seconds", stdout)]
    for e, v in enumerate(val):
        row = {"epoch": e, "val_mse_raw": v, "val_mse_raw_mean": sum(v) / len(v),
               "val_mse_raw_best5": sum(sorted(v)[:5]) / min(5, len(v))}
        if e >= 1 and e - 1 < len(took):
            row["train_seconds"] = took[e - 1]
        if e >= 1 and e - 1 < len(train_loss):
            row["last_batch_loss"] = train_loss[e - 1]
        epochs.append(row)
    final = re.search(r"Model validation losses: \[([^\]]*)\]", stdout)
    return {"epochs": epochs, "final_val_mse_raw_sorted": [float(v) for v in final.group(1).split()] if final else None,
            "units": "raw targets (s' - s, r), mean over rows and O+1 dims, on the official run's own validation "
                     "split; epoch 0 = before training"}


def agent_results(log: Path, upe: int) -> dict:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    evals = [{"step": r["update"], "epoch": r["epoch"], "return_mean": r["eval/reward_mean"],
              "return_std": r["eval/reward_std"], "normalized_mean": r.get("eval/normalized_score_mean"),
              "normalized_std": r.get("eval/normalized_score_std"), "t": r["_t"]}
             for r in rows if "eval/reward_mean" in r]
    updates = [r for r in rows if "critic_loss" in r]
    rates = []
    for a, b in zip(updates, updates[1:]):
        if a["epoch"] == b["epoch"] and b["_t"] > a["_t"]:
            rates.append((b["update"] - a["update"], b["_t"] - a["_t"]))
    steps, secs = sum(n for n, _ in rates), sum(t for _, t in rates)
    rollouts = [{k: r[k] for k in r if k.startswith("rollouts/") or k in ("epoch", "update")} for r in rows
                if "rollouts/time" in r]
    return {"evals": evals, "grad_steps_per_s": steps / secs if secs else None,
            "grad_steps_timed": steps, "grad_seconds_timed": secs, "rollouts": rollouts,
            "last_update_info": updates[-1] if updates else None, "updates_per_epoch": upe,
            "grad_steps_per_s_note": "between the official update logs inside one epoch: agent.update plus batch "
                                     "sampling, no rollouts or evaluations"}


def main() -> None:
    args, extra = parse()
    checkout = Path(args.checkout)
    script = checkout / SCRIPTS[args.stage]
    if not script.is_file():
        fail(f"--checkout {checkout}: no {SCRIPTS[args.stage]} there; expected a checkout of "
             f"github.com/anyasims/edge-of-reach at {COMMIT} (the fetch tool's mirror: git clone "
             f"/work/.mirror/anyasims+edge-of-reach/repo {checkout}; else git clone "
             f"https://github.com/anyasims/edge-of-reach {checkout} && git -C {checkout} checkout {COMMIT})")
    py = Path(args.venv) / "bin" / "python"
    if not py.is_file():
        fail(f"--venv {args.venv}: no python there; run bash {HERE / 'setup.sh'} {args.venv}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAVL_SHIM_REFS": args.refs, "PYTHONUNBUFFERED": "1"}
    env.pop("RAVL_SHIM_EXCLUDE_ROWS", None)
    env.pop("RAVL_SHIM_MAX_ROWS", None)
    if args.max_rows is not None:
        env["RAVL_SHIM_MAX_ROWS"] = str(args.max_rows)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    cuda = subprocess.run([str(py), "-c", "import torch; print(torch.cuda.is_available())"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip() == "True"
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    official: list[str] = ["--env_name", args.dataset, "--seed", str(args.seed)]
    result: dict = {"stage": args.stage, "dataset": args.dataset, "seed": args.seed, "checkout": str(checkout),
                    "commit": commit, "checkout_modified": bool(dirty), "cuda": cuda, "refs": args.refs,
                    "max_rows": args.max_rows}
    rows_file = None
    if args.stage == "dynamics":
        official += ["--epochs", str(args.steps), "--min_epochs", str(min(350, args.steps - 1)),
                     "--save_path", str(out / "dynamics")]
        if args.holdout_rows is not None:
            rows_file = out / "holdout_rows.npy" if args.holdout_rows == "ctrl_rl" else Path(args.holdout_rows)
            if args.holdout_rows == "ctrl_rl":
                subprocess.run([str(py), str(SHIM / "split.py"), args.dataset, str(args.seed), str(rows_file)],
                               env=env, check=True)
            env["RAVL_SHIM_EXCLUDE_ROWS"] = str(rows_file)
    else:
        if args.model is None:
            fail("--stage agent needs --model: the dynamics stage's --out (or a model_* folder)")
        model = find_model(Path(args.model))
        upe = min(args.updates_per_epoch, args.steps)
        epochs = math.ceil(args.steps / upe)
        every = args.eval_every or upe
        if every % upe:
            fail(f"--eval-every {every}: expected a multiple of the epoch, {upe} gradient steps")
        official += ["--load_model_dir", str(model), "--epochs", str(epochs), "--updates_per_epoch", str(upe),
                     "--eval_every", str(every // upe), "--eval_episodes", str(args.eval_episodes)]
        log = out / "wandb.jsonl"
        log.unlink(missing_ok=True)
        env["RAVL_SHIM_LOG"] = str(log)
        result.update(model=str(model), gradient_steps=epochs * upe)
    cmd = [str(py), *([] if cuda else ["-O"]), str(SHIM / "launch.py"), str(script), *official, *extra]
    result["command"] = cmd
    print("+", " ".join(cmd), flush=True)
    rc, stdout, wall = run_logged(cmd, env, out)
    threads = re.search(r"\[shim\] torch \S+ threads: (\d+)", stdout)
    result.update(returncode=rc, wall_seconds=round(wall, 1), torch_threads=int(threads.group(1)) if threads else None)
    if rc == 0 and args.stage == "dynamics":
        result["fit"] = dynamics_results(stdout)
        model = find_model(out / "dynamics")
        result["model"] = str(model)
        if rows_file is not None:
            held = out / "holdout_eval.json"
            every_row = {**env, "RAVL_SHIM_EXCLUDE_ROWS": "", "RAVL_SHIM_MAX_ROWS": ""}
            subprocess.run([str(py), str(SHIM / "holdout_eval.py"), str(checkout), str(model), args.dataset,
                            str(rows_file), str(held)], env=every_row, check=True)
            result["holdout"] = json.loads(held.read_text())
    elif rc == 0:
        result.update(agent_results(out / "wandb.jsonl", upe))
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"run.py: {out / 'results.json'} (exit {rc}, {wall:.1f} s)")
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
