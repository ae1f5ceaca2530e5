"""Run one official SAC Flow from-scratch script (Elessar123/SAC-FLOW) unmodified through the shim; write results.json.

    python experiments/peers/sac_flow_official/run.py --algo flow-g --seed 0 --out /work/peers/runs/flow-g-s0
    python experiments/peers/sac_flow_official/run.py --algo sac --seed 0 --steps 4000 --learning-starts 1000 \\
        --eval-every 2000 --eval-episodes 2 --cpus 1 --out /tmp/sac-smoke

Any Python >= 3.10 runs this file (standard library only); the official script runs in the peer venv (setup.sh) as
``python shim/launch.py CHECKOUT/from_scratch_code/SCRIPT ARGS`` with the run folder as its working directory (the
scripts write ``runs/<run_name>/`` there). Arguments after ``--`` go to the official script as they are (its tyro
flags, e.g. ``-- --policy-delay 3``); a flag given twice counts the last time.

``--settings study`` (the default) passes every flag of the official script that sets something the project's SAC
Flow study sets (experiments/sac_flow/README.md); ``--settings official`` passes only the env, seed and budget, so
the script's own defaults (the paper's CrossQ backbone, 50k random steps) run. README.md has both tables and what
cannot be matched. The study's deterministic evaluation (10 episodes every 5k env steps, seeds seed + 10,000 + k)
is the shim's: the official code has none (sac_flow_shim/evaluate.py).

results.json: the settings and the resolved official ``Args`` (from its wandb config), the commit and whether the
checkout is modified, the training episodes (return, length, env steps) and the evaluations against env steps, env
steps/s after ``learning_starts`` (wall and CPU time, evaluations excluded), and everything the script logged to
tensorboard and wandb (shim stand-ins: tensorboard.jsonl, wandb.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"
COMMIT = "3df8b9dc33de5160851a82322bc6c9005886f3ce"
SCRIPTS = {"sac": "sac_continuous_action_jax.py", "flow-g": "SAC_flow_gru_jax.py",
           "flow-t": "SAC_flow_transformer_jax.py"}
# The project's study (experiments/sac_flow/README.md, presets sac-hopper and sac_flow-hopper) in the official
# scripts' flags: only flags the script has; README.md lists what they cannot set (widths, Adam beta1, ...).
STUDY_COMMON = {"--batch-size": 256, "--learning-starts": 5000, "--buffer-size": 1_000_000, "--gamma": 0.99,
                "--tau": 0.005, "--policy-lr": 3e-4, "--q-lr": 3e-4}  # q-lr is also the scripts' alpha lr
STUDY = {
    "sac": {**STUDY_COMMON, "--alpha": 1.0},  # sac-hopper: init alpha 1.0; target -|A| as the script's
    "flow-g": {**STUDY_COMMON, "--alpha": 0.2, "--policy-delay": 1, "--n-critics": 2, "--denoising-steps": 4,
               "--no-crossq-style": None},  # the study's flows learn against target critics (tau 0.005)
    "flow-t": {**STUDY_COMMON, "--alpha": 0.2, "--policy-delay": 1, "--n-critics": 2, "--denoising-steps": 4,
               "--no-crossq-style": None, "--d-model": 96, "--n-layers": 2},
}


def fail(msg: str) -> None:
    print(f"run.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", default="/work/peers/SAC-FLOW", help="the official code's checkout")
    p.add_argument("--venv", default="/work/peers/sac-flow-venv", help="the peer venv (setup.sh)")
    p.add_argument("--algo", choices=SCRIPTS, required=True, help="sac, flow-g or flow-t (the study's names)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=100_000, help="env steps (--total-timesteps)")
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--settings", choices=("study", "official"), default="study")
    p.add_argument("--learning-starts", type=int, default=None,
                   help="override the random warm-up (smoke runs; default: the settings')")
    p.add_argument("--eval-every", type=int, default=5000, help="env steps between deterministic evaluations (0: none)")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1,
                   help="XLA CPU threads (1: single-threaded Eigen) and OMP/MKL threads (torch: the replay buffer)")
    p.add_argument("--cpus", default=None, help="pin the run to these CPUs, e.g. 1 or 0,1 (default: not pinned)")
    p.add_argument("--out", required=True, help="run folder (outside the repository)")
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    return p.parse_args(argv), extra


def official_flags(args: argparse.Namespace) -> list[str]:
    """The official script's flags for ``args``: env, seed and budget, the study's settings, the warm-up override."""
    flags: dict = {"--env-id": args.env, "--seed": args.seed, "--total-timesteps": args.steps}
    if args.settings == "study":
        flags.update(STUDY[args.algo])
    if args.learning_starts is not None:
        flags["--learning-starts"] = args.learning_starts
    out: list[str] = []
    for k, v in flags.items():
        out += [k] if v is None else [k, str(v)]
    return out


def thread_env(threads: int) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    xla = os.environ.get("XLA_FLAGS", "")
    if threads == 1:
        xla = f"{xla} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1".strip()
    if xla:
        env["XLA_FLAGS"] = xla
    return env


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def speed(clock: list[dict], learning_starts: int) -> dict:
    """Env steps/s after ``learning_starts`` from the shim's clock rows (evaluations excluded): ``after_warmup`` from
    the step at ``learning_starts`` to the end (the first updates' JIT compile included), ``steady`` from the first
    clock row past ``learning_starts + 3`` (every update function compiled; policy delay up to 3) to the end; each in
    wall time and in the process's CPU time (a rate that the other jobs on a shared core change much less)."""
    rows = sorted(clock, key=lambda r: (r["env_steps"], r["_t"]))
    if not rows:
        return {}
    end = rows[-1]

    def rate(a: dict | None) -> dict | None:
        if a is None or end["env_steps"] <= a["env_steps"]:
            return None
        n = end["env_steps"] - a["env_steps"]
        wall = (end["_t"] - a["_t"]) - (end["eval_s"] - a["eval_s"])
        cpu = (end["cpu_s"] - a["cpu_s"]) - (end["eval_cpu_s"] - a["eval_cpu_s"])
        return {"from_env_steps": a["env_steps"], "to_env_steps": end["env_steps"], "seconds": round(wall, 2),
                "cpu_seconds": round(cpu, 2), "env_steps_per_s": round(n / wall, 3) if wall > 0 else None,
                "env_steps_per_cpu_s": round(n / cpu, 3) if cpu > 0 else None}

    start = next((r for r in rows if r["env_steps"] == learning_starts), None)
    steady = next((r for r in rows if r["env_steps"] > learning_starts + 3), None)
    warm = None
    if start is not None:
        wall = start["_t"] - rows[0]["_t"] - (start["eval_s"] - rows[0]["eval_s"])
        warm = round(learning_starts / wall, 1) if wall > 0 else None
    first_update = {r["env_steps"]: r for r in rows}
    compile_s = None
    if learning_starts + 1 in first_update and learning_starts + 2 in first_update:
        compile_s = round(first_update[learning_starts + 2]["_t"] - first_update[learning_starts + 1]["_t"], 2)
    return {"after_warmup": rate(start), "steady": rate(steady), "warmup_env_steps_per_s": warm,
            "first_update_s": compile_s,
            "note": "env steps per second after learning_starts, evaluations excluded; the study's rate is the same "
                    "(its run clock after the 5k-step warm-up). first_update_s: the step of the first update, "
                    "its JIT compile included"}


def collect(out: Path, learning_starts: int) -> dict:
    """What the official run logged (tensorboard.jsonl, wandb.jsonl) and what the shim measured (shim.jsonl).
    ``learning_starts``: the warm-up passed, used where the run has no wandb config (``--no-track``)."""
    tb, wb, shim = (read_jsonl(out / f"{s}.jsonl") for s in ("tensorboard", "wandb", "shim"))
    scalars: dict[str, list] = {}
    for r in tb:
        if "value" in r:
            scalars.setdefault(r["tag"], []).append(r)
    returns, lengths = scalars.pop("charts/episodic_return", []), scalars.pop("charts/episodic_length", [])
    length_at = {r["step"]: r["value"] for r in lengths}
    episodes = [{"env_steps": r["step"] + 1, "return": r["value"], "length": length_at.get(r["step"])}
                for r in returns]  # step: the official global_step of the episode's last transition (0-based)
    init = next((r for r in wb if r.get("_event") == "init"), None)
    final = next((r for r in wb if any(k.startswith("final_stats/") for k in r)), None)
    start = next((r for r in shim if r.get("_event") == "start"), {})
    evals = [{k: r[k] for k in ("env_steps", "return_mean", "return_std", "returns", "lengths", "eval_s")}
             for r in shim if r.get("_event") == "eval"]
    official_args = init["config"] if init else None
    ls = official_args["learning_starts"] if official_args else learning_starts
    return {
        "official_args": official_args,
        "shim": {k: start.get(k) for k in ("jax", "gymnasium", "cpus", "xla_flags", "eval_every", "eval_episodes")},
        "train_episodes": episodes,
        "evals": evals,
        "speed": speed([r for r in shim if r.get("_event") == "clock"], ls),
        "official_sps_prints": [{"step": r["step"], "sps": r["value"]} for r in scalars.get("charts/SPS", [])],
        "final_stats": {k: v for k, v in final.items() if k.startswith("final_stats/")} if final else None,
        "tensorboard_scalars": {tag: [[r["step"], r["value"]] for r in rows] for tag, rows in scalars.items()},
        "wandb_rows": [r for r in wb if "_event" not in r],
        "train_returns_note": "training episodes of the stochastic policy, as the official code logs them "
                              "(charts/episodic_return); env_steps = the official global_step + 1",
    }


def passed_learning_starts(flags: list[str]) -> int:
    """The last ``--learning-starts`` in ``flags``, else the scripts' default (50,000)."""
    found = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f == "--learning-starts"]
    return int(found[-1]) if found else 50_000


def git(checkout: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    checkout = Path(args.checkout)
    script = checkout / "from_scratch_code" / SCRIPTS[args.algo]
    if not script.is_file():
        fail(f"--checkout {checkout}: no from_scratch_code/{SCRIPTS[args.algo]} there; expected a checkout of "
             f"github.com/Elessar123/SAC-FLOW at {COMMIT} (the fetch tool's mirror: git clone "
             f"/work/.mirror/Elessar123+SAC-FLOW/repo {checkout})")
    py = Path(args.venv) / "bin" / "python"
    if not py.is_file():
        fail(f"--venv {args.venv}: no python there; run bash {HERE / 'setup.sh'} {args.venv}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stream in ("tensorboard", "wandb", "shim"):
        (out / f"{stream}.jsonl").unlink(missing_ok=True)
    env = {**os.environ, **thread_env(args.threads), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "SAC_FLOW_SHIM_DIR": str(out),
           "SAC_FLOW_SHIM_EVAL_EVERY": str(args.eval_every), "SAC_FLOW_SHIM_EVAL_EPISODES": str(args.eval_episodes)}
    env.pop("SAC_FLOW_SHIM_CPUS", None)
    if args.cpus:
        env["SAC_FLOW_SHIM_CPUS"] = args.cpus
    flags = official_flags(args)
    cmd = [str(py), str(SHIM / "launch.py"), str(script), *flags, *extra]
    result: dict = {"algo": args.algo, "script": f"from_scratch_code/{SCRIPTS[args.algo]}", "env": args.env,
                    "seed": args.seed, "steps": args.steps, "settings": args.settings,
                    "learning_starts_override": args.learning_starts, "eval_every": args.eval_every,
                    "eval_episodes": args.eval_episodes, "eval_seeds": f"seed + 10000 + k, k < {args.eval_episodes}",
                    "threads": args.threads, "cpus_pinned": args.cpus, "official_flags": flags, "extra_flags": extra,
                    "checkout": str(checkout), "commit": git(checkout, "rev-parse", "HEAD"),
                    "checkout_modified": bool(git(checkout, "status", "--porcelain", "--untracked-files=no")),
                    "command": cmd}
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(out / "stdout.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        rc = proc.wait()
    result.update(returncode=rc, wall_seconds=round(time.perf_counter() - t0, 1),
                  **collect(out, passed_learning_starts(flags + extra)))
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"run.py: {out / 'results.json'} (exit {rc}, {result['wall_seconds']} s)")
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
