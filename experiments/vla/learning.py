"""VLA fine-tuning learning checks (issue: VLA fine-tuning adapters, benchmark 2), each arm a `ctrl-rl train vla` run
per seed, scored by `ctrl-rl eval RUN --episodes N` (deterministic chunks, success rate in the sim).

    # BC on scripted demonstrations (data: ctrl-rl data generate --env manip:Lift --level scripted --format lerobot
    #   --episodes 200 --cameras exterior1 --image-size 64x64 --out data/vla/lift200)
    python experiments/vla/learning.py bc --task Lift --dataset data/vla/lift200 --seeds 0 1 --steps 3000
    # HABC against BC on data that mixes successes and failures (--mis-grasp 0.5: half the episodes never close
    #   the gripper)
    python experiments/vla/learning.py habc --task Lift --dataset data/vla/lift-mixed --seeds 0 1 --steps 3000
    # RL fine-tuning from the BC runs of the first command
    python experiments/vla/learning.py rl --task Lift --dataset data/vla/lift200 --init-tag bc --seeds 0 1 --steps 40

Arms share the backbone (``--backbone``), head, chunk and image size; ``--extra`` adds flags to every arm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "bench"))
from common import git_commit, write_result  # noqa: E402


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _run(cmd: list[str]) -> str:
    p = subprocess.run([sys.executable, "-m", "ctrl_rl", *cmd], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"failed: ctrl-rl {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout


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
    ap.add_argument("--episodes", type=int, default=20, help="evaluation episodes")
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
              "--no-progress", "--log-every", "20", *a.extra]
    if a.part == "bc":
        arms = {"bc": ["--method", "bc", "--total-steps", str(a.steps)]}
    elif a.part == "habc":
        arms = {"bc": ["--method", "bc", "--total-steps", str(a.steps)],
                "habc": ["--method", "habc", "--total-steps", str(a.steps)]}
    else:
        arms = {"rl": ["--method", "rl", "--total-steps", str(a.steps), "--num-envs", str(a.num_envs),
                       "--rollout-chunks", str(a.rollout_chunks)]}
    tag = f"{a.task}_{a.part}_{a.head}_{Path(a.dataset).name}"

    def job(item):
        name, flags, seed = item
        d = a.runs_dir / tag / f"{name}-s{seed}"
        extra = []
        if a.part == "rl":
            init = (a.init_runs_dir or a.runs_dir) / f"{a.task}_bc_{a.head}_{Path(a.dataset).name}" / f"{a.init_tag}-s{seed}"
            extra = ["--init", str(init)]
            before_file = d.parent / f"{d.name}.before.json"  # beside the run: a run directory holds only its own files
            if (init / "checkpoints").is_dir() and not before_file.is_file():
                d.parent.mkdir(parents=True, exist_ok=True)
                before = json.loads(_run(["eval", str(init), "--episodes", str(a.episodes), "--seed", "1"])
                                    .strip().splitlines()[-1])
                before_file.write_text(json.dumps(before))
        if not (d / "checkpoints" / "latest.pt").is_file():
            _run(["train", "vla", *common, *flags, *extra, "--seed", str(seed), "--run-dir", str(d)])
        ev = json.loads(_run(["eval", str(d), "--episodes", str(a.episodes), "--seed", "1"]).strip().splitlines()[-1])
        metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        row = {"success_rate": ev.get("success_rate"), "return_mean": ev["return_mean"],
               "wall_time_s": metrics[-1]["wall_time"], "final_loss": metrics[-1].get("loss/actor",
                                                                                      metrics[-1].get("loss/policy"))}
        if a.part == "rl":
            row["before"] = json.loads((d.parent / f"{d.name}.before.json").read_text()).get("success_rate")
            row["env_steps"] = metrics[-1].get("env_steps")
        print(name, seed, row, flush=True)
        return f"{name}-s{seed}", row

    items = [(name, flags, seed) for name, flags in arms.items() for seed in a.seeds]
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = dict(pool.map(job, items))
    cmd = "python experiments/vla/learning.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# VLA {a.part} on manip:{a.task}", "", f"`{cmd}` (commit {commit})", "",
             f"Backbone {a.backbone} (random init; lora rank {a.lora_rank}), head {a.head}, chunk {a.chunk}, images "
             f"{a.image_size}, one exterior camera + instruction + proprio. Success: `ctrl-rl eval RUN --episodes "
             f"{a.episodes}` (deterministic).", "",
             "| arm | seed | success | return | wall s |" + (" success before RL | env steps |" if a.part == "rl" else ""),
             "|---|---|---|---|---|" + ("---|---|" if a.part == "rl" else "")]
    for k, r in rows.items():
        name, seed = k.rsplit("-s", 1)
        extra = f" {_pct(r['before'])} | {r['env_steps']} |" if a.part == "rl" else ""
        lines.append(f"| {name} | {seed} | {_pct(r['success_rate'])} | {r['return_mean']:.1f} | {r['wall_time_s']:.0f} |{extra}")
    for name in arms:
        s = [rows[f"{name}-s{seed}"]["success_rate"] or 0.0 for seed in a.seeds]
        lines.append(f"\n{name}: mean success {statistics.mean(s):.2f} over seeds {a.seeds}")
    name = f"vla_learning_{tag}{'_' + a.name if a.name else ''}"
    if a.part == "rl":
        _plot_rl(a, tag, name, rows)
    write_result(name, {"command": cmd, "commit": commit, "rows": rows, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}}, "\n".join(lines) + "\n")


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
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"VLA RL from BC on manip:{a.task} ({a.episodes} evaluation episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = ROOT / "experiments" / "results" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
