"""Learning-curve plots from a run's metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from ctrl_rl.errors import UserInputError


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw episode return vs env steps and vs wall time; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctrl_rl.learn.logging import read_metrics

    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise UserInputError(f"{str(run_dir)!r} has no metrics.jsonl: expected a run directory written by `ctrl-rl train`")
    rows = [r for r in read_metrics(run_dir) if r.get("episode_return") is not None]
    steps = [r["step"] for r in rows]
    wall = [r["wall_time"] for r in rows]
    ret = [r["episode_return"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    axes[0].plot(steps, ret, lw=1.5, marker=".", ms=3)
    axes[0].set_xlabel("environment steps")
    axes[0].set_ylabel("mean episode return")
    axes[1].plot(wall, ret, lw=1.5, marker=".", ms=3, color="tab:orange")
    axes[1].set_xlabel("wall time [s]")
    for ax in axes:
        ax.grid(alpha=0.3)
        if not rows:
            ax.text(0.5, 0.5, "no finished episode logged yet", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(run_dir.name, fontsize=10)
    fig.tight_layout()
    out = out or run_dir / "learning_curve.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
