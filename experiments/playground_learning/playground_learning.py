"""Learning study (issue 31): PPO on MuJoCo Playground's Go1JoystickFlatTerrain and PandaPickCube through envpool.

Each run is one process of ``ctrl-rl train ppo --preset <go1-joystick|panda-pickcube> --seed S --total-steps N``
(experiments/presets; where every number comes from: this folder's README). While it runs, every checkpoint it writes
(``checkpoint_every`` 50 iterations: 256,000 env steps for both presets) is evaluated here: the deterministic policy on
raw envpool, ``--eval-episodes`` envs with one episode each and a fixed seed (every checkpoint meets the same commands
or cube positions), keeping the per-episode sums of the task's reward terms from envpool's ``info`` beside the return
(Go1: ``reward_tracking_lin_vel``, ``reward_tracking_ang_vel``; Panda: ``reward_box_target``, ``reward_lifted``,
``reward_success``). The adapter does not pass ``info`` on, so the loop's own metrics cannot hold them. One process
per run rather than segments: building the pool costs 0.1-0.2 s per env here, paid once per process.
Every invocation first measures raw envpool stepping (random actions, the preset's ``num_envs``, envpool's default
threads), so that the training speed reads as a fraction of it, as for HalfCheetah (experiments/ppo_halfcheetah_sps).

Runs live in ``<runs-dir>/<task>-s<seed>``; calling the script again continues each run with ``--resume`` up to
``--steps`` (an interrupted run loses at most the iterations since its last checkpoint). ``--time-limit`` stops the
training process after that many seconds of the invocation (the short check of a machine). Every summary keeps each
run's ``config.json``, ``metrics.jsonl`` and ``evals.jsonl`` (and the raw measurements) in ``kept/`` beside this
script (gzip, committed with the results): where a run directory is gone (the study moved to another machine), the
summary reads the kept copy, and a kept run at ``--steps`` counts as done; a kept run short of it starts over (its
checkpoint went with the machine) and replaces the kept copy once it has gone further.

    python experiments/playground_learning/playground_learning.py --task go1 --seeds 0 1 2 --steps 20000000
    python experiments/playground_learning/playground_learning.py --task panda --seeds 0 1 2 --steps 20000000
    python experiments/playground_learning/playground_learning.py --summarize-only
    python experiments/playground_learning/playground_learning.py --dry-run --task go1

Writes experiments/playground_learning/playground_learning.{json,md,png}: per seed, the evaluation return and reward
terms against env steps and wall time, the training episode return of the loop's metrics, the final IQM with rliable's
95% CI over seeds, and env-steps/s as a fraction of raw envpool.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import ROOT, iqm_ci, keep_run, kept_rows, kept_step, runs_commit, unpack_kept, write_gz, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

# Playground's published budgets (mujoco_playground/config/{locomotion,manipulation}_params.py, brax PPO) and the
# terms of envpool's info each task reports per step.
TASKS = {
    "go1": {"preset": "go1-joystick", "envpool": "Go1JoystickFlatTerrain-v1", "playground_steps": 200_000_000,
            "playground_envs": 8192, "terms": ("reward_tracking_lin_vel", "reward_tracking_ang_vel")},
    "panda": {"preset": "panda-pickcube", "envpool": "PandaPickCube-v1", "playground_steps": 20_000_000,
              "playground_envs": 2048, "terms": ("reward_box_target", "reward_lifted", "reward_success")},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--task", action="append", choices=sorted(TASKS), default=[], help="task(s) to train")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20_000_000, help="env steps per run")
    ap.add_argument("--eval-episodes", type=int, default=16, help="evaluation episodes (one per env)")
    ap.add_argument("--raw-steps", type=int, default=200_000,
                    help="env steps of the raw envpool measurement (0: skip it)")
    ap.add_argument("--time-limit", type=float, default=0.0, help="stop the training process after this many "
                    "seconds of this invocation (0: none); the next call resumes it")
    ap.add_argument("--runs-dir", default=str(ROOT / "runs/playground_learning"))
    ap.add_argument("--summarize-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    return ap.parse_args(argv)


def preset(task: str) -> dict:
    return json.loads((ROOT / f"experiments/presets/{TASKS[task]['preset']}.json").read_text())


def raw_envpool(task: str, num_envs: int, steps: int, seed: int = 0) -> float:
    """Env steps/s of raw envpool with uniform random actions in [-1, 1] (the simulator's ceiling here)."""
    import envpool
    import numpy as np

    env = envpool.make(TASKS[task]["envpool"], env_type="gymnasium", num_envs=num_envs, seed=seed)
    rng = np.random.default_rng(seed)
    act = rng.uniform(-1, 1, (64, num_envs, env.action_space.shape[0]))  # [64,N,A], reused round-robin
    env.reset()
    iters = max(1, steps // num_envs)
    t0 = time.perf_counter()
    for i in range(iters):
        env.step(act[i % 64])
    sps = iters * num_envs / (time.perf_counter() - t0)
    env.close()
    return sps


def evaluate(task: str, run_dir: Path, episodes: int, seed: int = 12345) -> dict:
    """Deterministic return and reward-term sums of the run's latest checkpoint, one episode per env on raw envpool.

    The observation goes to the policy as the adapter hands it out (float32; a dict of parts for Go1's
    ``state``/``privileged_state``, a ``[N,O]`` tensor for Panda) and the action to envpool unchanged, as in training.
    """
    import envpool
    import numpy as np
    import torch

    from ctrl_rl.learn.evaluate import load_policy

    torch.set_num_threads(1)  # a batch of a few envs: one thread, leaving the cores to envpool's workers
    algo, _, _, ck = load_policy(str(run_dir))
    env = envpool.make(TASKS[task]["envpool"], env_type="gymnasium", num_envs=episodes, seed=seed)
    terms = TASKS[task]["terms"]
    ret = np.zeros(episodes)  # [N]
    sums = {k: np.zeros(episodes) for k in terms}
    length = np.zeros(episodes, dtype=np.int64)
    alive = np.ones(episodes, dtype=bool)
    obs, _ = env.reset()
    with torch.no_grad():
        while alive.any():
            if isinstance(obs, dict):
                o = {k: torch.as_tensor(np.asarray(v), dtype=torch.float32) for k, v in obs.items()}  # [N,O_k]
            else:
                o = torch.as_tensor(np.asarray(obs), dtype=torch.float32)  # [N,O]
            a = algo.act(o, deterministic=True).numpy().astype(np.float64)  # [N,A]
            obs, r, term, trunc, info = env.step(a)
            ret += np.where(alive, r, 0.0)
            for k in terms:
                sums[k] += np.where(alive, info[k], 0.0)
            length += alive
            alive &= ~(np.asarray(term) | np.asarray(trunc))
    env.close()
    out = {"step": int(ck["counters"]["step"]), "return": float(ret.mean()), "returns": ret.round(4).tolist(),
           "length": float(length.mean())}
    for k in terms:  # per-step mean of each term over the episode (a tracking term is in [0, 1] per step)
        out[f"{k}/sum"] = float(sums[k].mean())
        out[f"{k}/per_step"] = float((sums[k] / np.maximum(length, 1)).mean())
    return out


def train_command(run_dir: Path, task: str, seed: int, steps: int) -> list[str]:
    """The run's command: ``--resume`` once it has a checkpoint, else a fresh run of the preset."""
    cmd = [sys.executable, "-m", "ctrl_rl", "train", "ppo", "--total-steps", str(steps), "--no-progress"]
    if (run_dir / "checkpoints/latest.pt").exists():
        return cmd + ["--resume", str(run_dir)]
    return cmd + ["--preset", TASKS[task]["preset"], "--seed", str(seed), "--run-dir", str(run_dir)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


KEEP = ("config.json", "metrics.jsonl", "evals.jsonl")


def kept_dir(name: str) -> Path:
    return RESULTS / "kept" / name


def steps_done(run_dir: Path) -> int:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return int(rows[-1]["step"]) if rows else 0


def evaluate_new_checkpoint(task: str, run_dir: Path, episodes: int) -> None:
    """Evaluate the run's latest checkpoint unless its step is in ``evals.jsonl`` already (a copy is evaluated: the
    trainer replaces ``latest.pt`` atomically while it runs)."""
    ck = run_dir / "checkpoints/latest.pt"
    if not ck.exists():
        return
    copy = run_dir / "eval_checkpoint.pt"
    shutil.copyfile(ck, copy)
    seen = {e["step"] for e in read_jsonl(run_dir / "evals.jsonl")}
    from ctrl_rl.learn.checkpoint import load_checkpoint

    step = int(load_checkpoint(copy)["counters"]["step"])
    if step in seen:
        return
    ev = evaluate(task, copy, episodes)
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["step"] <= step]
    ev["wall_time"] = rows[-1]["wall_time"] if rows else 0.0  # the run's own clock at that step
    with open(run_dir / "evals.jsonl", "a") as f:
        f.write(json.dumps(ev) + "\n")
    print(f"{run_dir.name} step {step:,}: eval return {ev['return']:.3f} (length {ev['length']:.0f})", flush=True)


def run(args: argparse.Namespace) -> None:
    """Train each (task, seed) in one process to ``--steps``, evaluating every checkpoint it writes while it runs."""
    runs = Path(args.runs_dir)
    deadline = time.perf_counter() + args.time_limit if args.time_limit else None
    for task in args.task:
        n = preset(task)["run"]["num_envs"]
        if not args.dry_run and args.raw_steps > 0:
            t0 = time.perf_counter()
            # in a child process: envpool keeps about 50 MB per env, which this process would hold while training runs
            out = subprocess.run([sys.executable, __file__, "--raw-only", task, str(n), str(args.raw_steps)],
                                 check=True, capture_output=True, text=True, cwd=ROOT).stdout
            sps = float(out.split()[-1])
            runs.mkdir(parents=True, exist_ok=True)
            with open(runs / f"raw_{task}.jsonl", "a") as f:
                f.write(json.dumps({"num_envs": n, "sps": round(sps, 1), "time": time.time()}) + "\n")
            print(f"raw envpool {TASKS[task]['envpool']} x{n}: {sps:,.0f} env-steps/s "
                  f"({time.perf_counter() - t0:.0f} s with building the pool)", flush=True)
        for seed in args.seeds:
            run_dir = runs / f"{task}-s{seed}"
            if not run_dir.exists() and kept_step(kept_dir(run_dir.name)) >= args.steps:
                print(f"{run_dir.name}: complete in its kept copy ({kept_dir(run_dir.name)})", flush=True)
                continue
            if not args.dry_run and steps_done(run_dir) >= args.steps:
                evaluate_new_checkpoint(task, run_dir, args.eval_episodes)
                continue
            cmd = train_command(run_dir, task, seed, args.steps)
            print("$", shlex.join(cmd), flush=True)
            if args.dry_run:
                continue
            proc = subprocess.Popen(cmd, cwd=ROOT)
            last = None
            while proc.poll() is None:
                time.sleep(5)
                ck = run_dir / "checkpoints/latest.pt"
                if ck.exists() and ck.stat().st_mtime != last:
                    last = ck.stat().st_mtime
                    evaluate_new_checkpoint(task, run_dir, args.eval_episodes)
                if deadline is not None and time.perf_counter() > deadline:
                    proc.terminate()  # the run continues from its last checkpoint at the next call
                    proc.wait()
                    print(f"time limit {args.time_limit:.0f} s reached", flush=True)
                    return
            if proc.returncode != 0:
                raise SystemExit(f"{shlex.join(cmd)} exited with {proc.returncode}")
            evaluate_new_checkpoint(task, run_dir, args.eval_episodes)


def summarize(args: argparse.Namespace) -> None:
    runs = Path(args.runs_dir)
    payload: dict = {"commit": None, "tasks": {}}
    md = ["# MuJoCo Playground learning study (PPO, envpool, CPU)", ""]
    dirs = []
    for task, meta in TASKS.items():
        names = sorted({d.name for d in [*runs.glob(f"{task}-s*"), *(RESULTS / "kept").glob(f"{task}-s*")]})
        if not names:
            continue
        p = preset(task)
        raw_rows = {r["time"]: r for r in kept_rows(RESULTS / "kept", f"raw_{task}.jsonl")}
        raw_rows.update({r["time"]: r for r in read_jsonl(runs / f"raw_{task}.jsonl")})
        if raw_rows:
            write_gz(RESULTS / "kept" / f"raw_{task}.jsonl.gz",
                     "".join(json.dumps(r) + "\n" for _, r in sorted(raw_rows.items())).encode())
        raw = [r["sps"] for _, r in sorted(raw_rows.items())]
        per_seed = {}
        for name in names:
            d, kept = runs / name, kept_dir(name)
            live = steps_done(d)
            if live >= kept_step(kept) and live > 0:
                keep_run(d, kept, KEEP)  # the live run has gone at least as far as the kept copy
            else:
                d = unpack_kept(kept)  # the kept copy went further (an earlier machine)
            dirs.append(d)
            rows = [r for r in read_jsonl(d / "metrics.jsonl")]
            evals = read_jsonl(d / "evals.jsonl")
            sps = [r["sps"] for r in rows[len(rows) // 10:]]  # past the first tenth (start-up)
            per_seed[d.name] = {
                "train": [{k: r.get(k) for k in ("step", "wall_time", "episode_return", "episode_length")}
                          for r in rows],
                "evals": evals, "steps": rows[-1]["step"] if rows else 0,
                "wall_time": rows[-1]["wall_time"] if rows else 0.0,
                "sps_median": sorted(sps)[len(sps) // 2] if sps else None,
            }
        finals = {"return": [s["evals"][-1]["return"] for s in per_seed.values() if s["evals"]]}
        for k in meta["terms"]:
            finals[f"{k}/per_step"] = [s["evals"][-1][f"{k}/per_step"] for s in per_seed.values() if s["evals"]]
        iqm = iqm_ci({k: v for k, v in finals.items() if v}) if finals["return"] else {}
        raw_med = sorted(raw)[len(raw) // 2] if raw else None
        sps_all = [s["sps_median"] for s in per_seed.values() if s["sps_median"]]
        sps_med = sorted(sps_all)[len(sps_all) // 2] if sps_all else None
        payload["tasks"][task] = {
            "env": p["run"]["env"], "preset": meta["preset"], "num_envs": p["run"]["num_envs"],
            "playground_steps": meta["playground_steps"], "playground_envs": meta["playground_envs"],
            "raw_envpool_sps": raw, "train_sps_median": sps_med,
            "fraction_of_raw": (sps_med / raw_med) if sps_med and raw_med else None,
            "final_iqm": iqm, "seeds": per_seed,
        }
        md += [f"## {p['run']['env']} (preset `{meta['preset']}`, {p['run']['num_envs']} envs)", "",
               f"Playground's budget: {meta['playground_steps']:,} env steps with {meta['playground_envs']} envs.", "",
               "| seed | env steps | wall (s) | env-steps/s | eval return (last) | "
               + " | ".join(f"{k} per step" for k in meta["terms"]) + " |",
               "|---|---|---|---|---|" + "---|" * len(meta["terms"])]
        for name, s in per_seed.items():
            last = s["evals"][-1] if s["evals"] else {}
            md.append(f"| {name} | {s['steps']:,} | {s['wall_time']:.0f} | {s['sps_median'] or 0:,.0f} | "
                      f"{last.get('return', float('nan')):.3f} | "
                      + " | ".join(f"{last.get(f'{k}/per_step', float('nan')):.3f}" for k in meta["terms"]) + " |")
        md.append("")
        if raw_med:
            md.append(f"Raw envpool with random actions, same {p['run']['num_envs']} envs: {raw_med:,.0f} env-steps/s; "
                      f"training runs at {sps_med or 0:,.0f} ({(sps_med or 0) / raw_med:.0%} of raw).")
        for k, v in iqm.items():
            md.append(f"- final {k}: IQM {v['iqm']:.3f}, 95% CI [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}] "
                      f"over {v['seeds']} seed(s)")
        md.append("")
    payload["commit"] = runs_commit(dirs)
    md.append(f"Code: {payload['commit']}.")
    write_result("playground_learning", payload, "\n".join(md) + "\n", folder=RESULTS)
    plot(payload)


def plot(payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(payload["tasks"].items())
    if not tasks:
        return
    fig, axes = plt.subplots(len(tasks), 3, figsize=(15, 4 * len(tasks)), squeeze=False)
    for row, (task, t) in zip(axes, tasks, strict=True):
        term = TASKS[task]["terms"][0]
        for name, s in t["seeds"].items():
            ev = s["evals"]
            row[0].plot([e["step"] for e in ev], [e["return"] for e in ev], marker="o", label=name)
            row[1].plot([e["wall_time"] / 60 for e in ev], [e["return"] for e in ev], marker="o", label=name)
            row[2].plot([e["step"] for e in ev], [e[f"{term}/per_step"] for e in ev], marker="o", label=name)
            tr = [r for r in s["train"] if r["episode_return"] is not None]
            row[0].plot([r["step"] for r in tr], [r["episode_return"] for r in tr], alpha=0.3, lw=0.8)
        row[0].set(title=f"{t['env']}: eval return (faint: training episodes)", xlabel="env steps")
        row[1].set(title="eval return against wall time", xlabel="minutes")
        row[2].set(title=f"{term} per step (eval)", xlabel="env steps")
        row[0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "playground_learning.png", dpi=110)
    print(f"wrote {RESULTS / 'playground_learning.png'}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--raw-only"]:  # TASK NUM_ENVS STEPS: the raw measurement, in its own process
        print(raw_envpool(argv[1], int(argv[2]), int(argv[3])))
        return
    args = parse_args(argv)
    if not args.summarize_only:
        run(args)
    if not args.dry_run:
        summarize(args)


if __name__ == "__main__":
    main()
