"""Learning-curve plots from a run's metrics.jsonl."""

from __future__ import annotations

import os
from pathlib import Path

from ctrl_rl.errors import UserInputError


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _formats() -> list[str]:
    """File extensions matplotlib's Agg canvas writes (png, pdf, svg, jpg, ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return sorted(FigureCanvasAgg.get_supported_filetypes())


def check_plot_out(out: str | Path) -> Path:
    """The output path of a plot, or one UserInputError sentence: an extension matplotlib cannot write,
    a missing or unwritable folder, or an existing directory."""
    out = Path(out)
    ext = out.suffix.lower().lstrip(".")
    formats = _formats()
    if ext not in formats:
        got = f"has extension {out.suffix!r}" if out.suffix else "has no file extension"
        raise UserInputError(f"plot output {str(out)!r} {got}: expected one of "
                             f"{', '.join('.' + f for f in formats)}")
    if out.is_dir():
        raise UserInputError(f"plot output {str(out)!r} is a directory: "
                             f"expected a file path such as {str(out / 'curve.png')!r}")
    parent = out.parent
    if not parent.is_dir():
        raise UserInputError(f"plot output {str(out)!r} is in a folder that does not exist ({str(parent)!r}): "
                             "expected an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserInputError(f"plot output {str(out)!r} is in a folder that is not writable: "
                             "expected a folder you can write to")
    return out


def _curve_rows(run_dir: Path) -> list[dict]:
    """The rows with an episode return, after checking every row has the fields the plot needs."""
    from ctrl_rl.learn.logging import read_metrics

    path = run_dir / "metrics.jsonl"
    rows = read_metrics(run_dir)
    for i, r in enumerate(rows, 1):
        missing = [k for k in ("step", "wall_time") if not _number(r.get(k))]
        if r.get("episode_return") is None:
            missing = [k for k in missing if k == "step"]
        elif not _number(r["episode_return"]):
            missing.append("episode_return")
        if missing:
            raise UserInputError(f"{str(path)!r} row {i} has no numeric {missing[0]!r}: expected rows written by "
                                 "`ctrl-rl train` (step, wall_time, episode_return)")
    return [r for r in rows if r.get("episode_return") is not None]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw episode return vs env steps and vs wall time; returns the image path (default
    ``run_dir/learning_curve.png``). Every input is checked before anything is drawn, and the image is
    written to a temporary file renamed into place, so a failure leaves nothing behind."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise UserInputError(f"{str(run_dir)!r} has no metrics.jsonl: "
                             "expected a run directory written by `ctrl-rl train`")
    out = check_plot_out(run_dir / "learning_curve.png" if out is None else out)
    rows = _curve_rows(run_dir)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        try:
            fig.savefig(tmp, dpi=110, format=out.suffix.lower().lstrip("."))
            os.replace(tmp, out)
        except (OSError, ValueError, KeyError, RuntimeError) as e:  # disk full, a format Pillow lacks, ...
            raise UserInputError(f"plot output {str(out)!r} could not be written "
                                 f"({str(e).strip()[:120] or type(e).__name__}): "
                                 "expected a writable .png, .pdf or .svg path") from None
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out
