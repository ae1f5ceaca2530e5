"""VLA fine-tuning learning checks (issue: VLA fine-tuning adapters, benchmark 2), each arm a `ctrl-rl train vla_bc`,
`vla_habc` or `vla_rl` run per seed, scored by `ctrl-rl eval RUN --episodes N` (deterministic chunks, success rate in
the sim).

    # BC on scripted demonstrations (data: ctrl-rl data generate --env manip:Lift --level scripted --format lerobot
    #   --episodes 200 --cameras exterior1 --image-size 64x64 --out data/vla/lift200)
    python experiments/vla_learning/learning.py bc --task Lift --dataset data/vla/lift200 --seeds 0 1 --steps 3000
    # HABC against BC on data that mixes successes and failures (--mis-grasp 0.5: half the episodes never close
    #   the gripper)
    python experiments/vla_learning/learning.py habc --task Lift --dataset data/vla/lift-mixed --seeds 0 1 --steps 3000
    # RL fine-tuning from the BC runs of the first command, beside BC continued from them for 1,280 updates (the
    #   control: does RL beat more imitation?), each scored over evaluation seeds 1 and 2
    python experiments/vla_learning/learning.py rl --task Lift --dataset data/vla/lift200 --init-tag bc --seeds 0 1 \
        --steps 40 --control-steps 1280 --eval-seeds 1 2

Arms share the backbone (``--backbone``), head, chunk and image size; ``--extra`` adds flags to every arm whose
algorithm takes them (an RL flag such as ``--sil-coef`` goes to the RL arm only; ``--lr`` to every arm).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _run(cmd: list[str]) -> str:
    p = subprocess.run([sys.executable, "-m", "ctrl_rl", *cmd], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"failed: ctrl-rl {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout


def takes(algo: str) -> set[str]:
    """The flags `ctrl-rl train ALGO` takes: its run, loop and algorithm config fields."""
    from ctrl_rl.algos import registry
    from ctrl_rl.learn.config import RunConfig, loop_config_class

    entry = registry.get(algo)
    classes = (RunConfig, loop_config_class(entry.regime), entry.config)
    return {"--" + f.name.replace("_", "-") for cls in classes for f in dataclasses.fields(cls)}


def flags_for(algo: str, extra: list[str]) -> list[str]:
    """The flags of ``extra`` (each with the values after it) that ``algo`` takes."""
    ok, out, keep = takes(algo), [], False
    for tok in extra:
        if tok.startswith("--"):
            name = tok.split("=", 1)[0]
            keep = name in ok or ("--" + name.removeprefix("--no-")) in ok
        if keep:
            out.append(tok)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["bc", "habc", "rl"])
    ap.add_argument("--task", default="Lift")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--backbone", default="smolvlm-small")
    ap.add_argument("--head", default="regression")
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--image-size", default="64x64")
    ap.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning (the random tiny backbones)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--episodes", type=int, default=20, help="evaluation episodes per evaluation seed")
    ap.add_argument("--eval-seeds", nargs="+", type=int, default=[1],
                    help="evaluation seeds (`ctrl-rl eval --seed`); success pools their episodes")
    ap.add_argument("--control-steps", type=int, default=0,
                    help="rl: also continue BC from the same runs for this many updates (arm bc-cont, same --extra)")
    ap.add_argument("--init-tag", default="bc", help="rl: the tag of the runs it starts from")
    ap.add_argument("--init-runs-dir", type=Path, default=None, help="rl: where those runs are (default --runs-dir)")
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--rollout-chunks", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "vla_learning")
    ap.add_argument("--name", default="", help="suffix of the result files (settings of one part side by side)")
    a = ap.parse_args(argv)
    commit = git_commit()  # the code the runs start from (a commit made while they train is not theirs)
    env = f"manip:{a.task}"
    common = ["--env", env, "--dataset", a.dataset, "--backbone", a.backbone, "--head", a.head, "--chunk",
              str(a.chunk), "--image-size", a.image_size, "--lora-rank", str(a.lora_rank), "--threads", "1",
              "--no-progress", "--log-every", "20"]
    # arm -> (algorithm, its flags)
    if a.part == "bc":
        arms = {"bc": ("vla_bc", ["--total-steps", str(a.steps)])}
    elif a.part == "habc":
        arms = {"bc": ("vla_bc", ["--total-steps", str(a.steps)]),
                "habc": ("vla_habc", ["--total-steps", str(a.steps)])}
    else:
        arms = {"rl": ("vla_rl", ["--total-steps", str(a.steps), "--num-envs", str(a.num_envs),
                                  "--rollout-chunks", str(a.rollout_chunks)])}
        if a.control_steps > 0:
            arms["bc-cont"] = ("vla_bc", ["--total-steps", str(a.control_steps)])
    tag = f"{a.task}_{a.part}_{a.head}_{Path(a.dataset).name}"

    def evaluate(run: Path) -> dict:
        """Deterministic success over every evaluation seed (equal episodes each, so the mean pools them)."""
        evs = [json.loads(_run(["eval", str(run), "--episodes", str(a.episodes), "--seed", str(s)])
                          .strip().splitlines()[-1]) for s in a.eval_seeds]
        succ = [e.get("success_rate") for e in evs]
        return {"success_rate": None if None in succ else statistics.mean(succ),
                "return_mean": statistics.mean(e["return_mean"] for e in evs),
                "per_eval_seed": {str(s): e.get("success_rate") for s, e in zip(a.eval_seeds, evs)}}

    def init_run(seed: int) -> Path:
        return ((a.init_runs_dir or a.runs_dir) / f"{a.task}_bc_{a.head}_{Path(a.dataset).name}"
                / f"{a.init_tag}-s{seed}")

    def before_file(seed: int) -> Path:
        """The start's evaluation, beside the runs (a run directory holds only its own files), shared by the arms."""
        seeds = "-".join(map(str, a.eval_seeds))
        return a.runs_dir / tag / f"before-{a.init_tag}-s{seed}-eval{seeds}-{a.episodes}eps.json"

    def before(seed: int) -> None:
        f = before_file(seed)
        if not (init_run(seed) / "checkpoints").is_dir():
            raise SystemExit(f"rl: the BC run to start from, {init_run(seed)}, has no checkpoints; expected the "
                             f"runs of `learning.py bc` (see --init-runs-dir and --init-tag).")
        if not f.is_file():
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(evaluate(init_run(seed))))

    def job(item):
        name, (algo, flags), seed = item
        d = a.runs_dir / tag / f"{name}-s{seed}"
        init = ["--init", str(init_run(seed))] if a.part == "rl" else []
        if not (d / "checkpoints" / "latest.pt").is_file():
            _run(["train", algo, *common, *flags, *flags_for(algo, a.extra), *init, "--seed", str(seed),
                  "--run-dir", str(d)])
        ev = evaluate(d)
        metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        row = {**ev, "wall_time_s": metrics[-1]["wall_time"],
               "final_loss": metrics[-1].get("loss/actor", metrics[-1].get("loss/policy"))}
        if a.part == "rl":
            row["before"] = json.loads(before_file(seed).read_text()).get("success_rate")
            row["env_steps"] = metrics[-1].get("env_steps", 0)
        print(name, seed, row, flush=True)
        return f"{name}-s{seed}", row

    items = [(name, arm, seed) for name, arm in arms.items() for seed in a.seeds]
    with ThreadPoolExecutor(a.jobs) as pool:
        if a.part == "rl":
            list(pool.map(before, a.seeds))
        rows = dict(pool.map(job, items))
    cmd = "python experiments/vla_learning/learning.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# VLA {a.part} on manip:{a.task}", "", f"`{cmd}` (commit {commit})", "",
             f"Backbone {a.backbone} (random init; lora rank {a.lora_rank}), head {a.head}, chunk {a.chunk}, images "
             f"{a.image_size}, one exterior camera + instruction + proprio. Success: `ctrl-rl eval RUN --episodes "
             f"{a.episodes} --seed S` (deterministic) for S in {a.eval_seeds}, pooled.", "",
             "| arm | seed | success | return | wall s |"
             + (" success before RL | env steps |" if a.part == "rl" else ""),
             "|---|---|---|---|---|" + ("---|---|" if a.part == "rl" else "")]
    for k, r in rows.items():
        name, seed = k.rsplit("-s", 1)
        extra = f" {_pct(r['before'])} | {r['env_steps']} |" if a.part == "rl" else ""
        lines.append(f"| {name} | {seed} | {_pct(r['success_rate'])} | {r['return_mean']:.1f} | "
                     f"{r['wall_time_s']:.0f} |{extra}")
    for name in arms:
        s = [rows[f"{name}-s{seed}"]["success_rate"] or 0.0 for seed in a.seeds]
        lines.append(f"\n{name}: mean success {statistics.mean(s):.2f} over seeds {a.seeds}")
    name = f"vla_learning_{tag}{'_' + a.name if a.name else ''}"
    if a.part == "rl":
        _plot_rl(a, tag, name, rows)
    write_result(name, {"command": cmd, "commit": commit, "rows": rows, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}}, "\n".join(lines) + "\n",
        folder=RESULTS)


def _plot_rl(a, tag: str, name: str, rows: dict) -> None:
    """Training success (the noisy policy, last 32 episodes) over env steps per seed, with the deterministic
    evaluation before and after RL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, seed in enumerate(a.seeds):
        color = f"C{i}"
        d = a.runs_dir / tag / f"rl-s{seed}"
        pts = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        pts = [(r["env_steps"], r["success_rate"]) for r in pts if "success_rate" in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=1, label=f"seed {seed}: training (noisy)")
        r = rows[f"rl-s{seed}"]
        end = pts[-1][0] if pts else 0
        ax.plot([0, end], [r["before"], r["success_rate"]], "o--", color=color, alpha=0.8,
                label=f"seed {seed}: evaluation before / after")
        if f"bc-cont-s{seed}" in rows:
            ax.plot([end], [rows[f"bc-cont-s{seed}"]["success_rate"]], "s", color=color, mfc="none", ms=8,
                    label=f"seed {seed}: BC continued ({a.control_steps} updates, no env steps)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"VLA RL from BC on manip:{a.task} ({a.episodes * len(a.eval_seeds)} evaluation episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
