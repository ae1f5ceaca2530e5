"""Same-run A/B of two commits on the model-based workloads of issue 28: RAVL and MOPO gradient steps/s on
halfcheetah-medium-v5 with a 7-member model, NeuBay's `--total-steps 300` bar and gradient steps/s, NeuBay's losses
of a short same-seed run (what it computes), and the dynamics fit's epoch time.

Each workload is a ``python -m ctrl_rl train ...`` subprocess against a detached worktree of ``--before`` and of
``--after`` (``common.worktree``; every run asserts that it recorded the tree's clean commit), with the defaults a
user gets (``--threads 0``) unless a workload says otherwise. Before and after alternate within every repeat
(A B on even repeats, B A on odd ones) so that drifts of the machine's speed hit both alike.

Workloads (every rate from the run's own metrics.jsonl rows: set-up and the final evaluation are outside it):

  ravl           ``train ravl --dataset halfcheetah-medium-v5 --model M`` for ``--mb-steps`` gradient steps (one
                 rollout round of 50,000 starts x 5 steps every 1000 steps, as in a real run; the first round, before
                 the first row, is out): gradient steps / second between the first and the last row
  ravl_medium    the same with ``--matmul-precision medium`` (after tree only; against the before tree's ravl)
  mopo           the same with ``--preset mopo-halfcheetah-medium`` (h = 1, lambda = 1)
  neubay         ``train neubay --env Hopper-v5 --dataset <the first 10,000 rows of hopper-medium-v5> --model <a
                 7-member fit> --total-steps 300``: the process's wall seconds (the issue's bar: well inside 2
                 minutes) and gradient steps / second between the first and the last row
  neubay_bf16    the same with ``--bf16`` (after tree only; against the before tree's neubay)
  neubay_losses  the same for ``--neubay-loss-steps`` steps, ``--threads 1``, a row every step, seed 0, once per tree:
                 the largest relative difference of loss/critic and loss/actor between the trees, step by step
  dynamics       ``train dynamics --dataset <the first 200,000 rows of halfcheetah-medium-v5> --total-steps 2``:
                 training rows / second of the second epoch (row 2's wall time minus row 1's)

    python experiments/model_based_speed/model_based_speed.py [--hc-model RUN] [--before cd8d0c0] [--after HEAD] \
        [--repeats 3] [--workloads ravl ravl_medium mopo neubay neubay_bf16 neubay_losses dynamics]

``--hc-model`` is a finished ``ctrl-rl train dynamics`` run on halfcheetah-medium-v5 (both trees load it); without it
a 7-member 3-epoch fit on the halfcheetah slice, made once by the before tree, serves (model quality does not change
the work: HalfCheetah never terminates). The NeuBay model is fitted once by the before tree (7 members, 20 epochs at
most, on the 10k-row file). Both models and the data slices live in ``/tmp/ctrl_rl_ab/data``.
Writes experiments/model_based_speed/model_based_speed.{json,md} (``--name``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import AB_TREES, ROOT, ab_report_head, copy_rows, train, worktree, write_result  # noqa: E402
from common import metrics_rate as rate  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script
DATA = AB_TREES / "data"
# after-only settings -> the default workload whose before-runs they are compared with
VARIANTS = {"ravl_medium": "ravl", "neubay_bf16": "neubay"}
UNITS = {"ravl": "gradient steps/s", "ravl_medium": "gradient steps/s (--matmul-precision medium)",
         "mopo": "gradient steps/s", "neubay": "gradient steps/s", "neubay_bf16": "gradient steps/s (--bf16)",
         "neubay_wall_s": "s (whole process, --total-steps 300)",
         "neubay_bf16_wall_s": "s (whole process, --total-steps 300, --bf16)",
         "dynamics": "training rows/s (one epoch)"}


def dataset_slice(src_id: str, rows: int) -> Path:
    """The first ``rows`` rows of a cached dataset (every per-row array cut; infos too), written once."""
    from ctrl_rl.storage.datasets.cache import data_dir

    dest = DATA / f"{src_id}-first{rows}.hdf5"
    if dest.exists():
        return dest
    src = data_dir() / f"{src_id}.hdf5"
    if not src.exists():
        raise SystemExit(f"{src} is missing: run `ctrl-rl data generate --env ... --level medium` first")
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    copy_rows(src, tmp, rows)
    tmp.rename(dest)
    return dest


def ravl(tree: dict, a, seed: int, run_dir: Path) -> dict[str, float]:
    rows, _, _ = train(tree, "ravl", ["--env", "HalfCheetah-v5", "--dataset", "halfcheetah-medium-v5", "--model",
                                      str(a.hc_model), "--total-steps", str(a.mb_steps), "--eval-every", "0",
                                      "--eval-episodes", "1", "--log-every", "100", "--seed", str(seed)], run_dir)
    return {"ravl": rate(rows)}


def mopo(tree: dict, a, seed: int, run_dir: Path) -> dict[str, float]:
    preset = Path(tree["path"]) / "experiments" / "presets" / "mopo-halfcheetah-medium.json"
    rows, _, _ = train(tree, "mopo", ["--preset", str(preset), "--model", str(a.hc_model), "--total-steps",
                                      str(a.mb_steps), "--eval-every", "0", "--eval-episodes", "1", "--log-every",
                                      "100", "--seed", str(seed)], run_dir)
    return {"mopo": rate(rows)}


def ravl_medium(tree: dict, a, seed: int, run_dir: Path) -> dict[str, float]:
    rows, _, _ = train(tree, "ravl", ["--env", "HalfCheetah-v5", "--dataset", "halfcheetah-medium-v5", "--model",
                                      str(a.hc_model), "--total-steps", str(a.mb_steps), "--eval-every", "0",
                                      "--eval-episodes", "1", "--log-every", "100", "--seed", str(seed),
                                      "--matmul-precision", "medium"], run_dir)
    return {"ravl_medium": rate(rows)}


def neubay_bf16(tree: dict, a, seed: int, run_dir: Path) -> dict[str, float]:
    rows, seconds, _ = train(tree, "neubay", [*neubay_args(a, a.neubay_steps, seed, 50), "--bf16"], run_dir)
    return {"neubay_bf16": rate(rows), "neubay_bf16_wall_s": seconds}


def neubay_args(a, steps: int, seed: int, log_every: int) -> list[str]:
    return ["--env", "Hopper-v5", "--dataset", str(a.hopper_file), "--model", str(a.hopper_model), "--total-steps",
            str(steps), "--eval-every", "0", "--eval-episodes", "1", "--log-every", str(log_every), "--seed", str(seed)]


def neubay(tree: dict, a, seed: int, run_dir: Path) -> dict[str, float]:
    rows, seconds, _ = train(tree, "neubay", neubay_args(a, a.neubay_steps, seed, 50), run_dir)
    return {"neubay": rate(rows), "neubay_wall_s": seconds}


def dynamics(tree: dict, a, seed: int, run_dir: Path) -> dict[str, float]:
    rows, _, _ = train(tree, "dynamics", ["--env", "HalfCheetah-v5", "--dataset", str(a.hc_file), "--total-steps",
                                          "2", "--min-epochs", "2", "--seed", str(seed)], run_dir)
    assert [r["step"] for r in rows] == [1, 2], rows
    train_rows = a.hc_rows - min(1000, int(0.2 * a.hc_rows))  # RAVL's holdout: min(20%, max_holdout 1000)
    return {"dynamics": train_rows / (rows[1]["wall_time"] - rows[0]["wall_time"])}


def fit_hc_model(tree: dict, a) -> Path:
    """A 7-member fit (the dynamics defaults, 3 epochs) on the halfcheetah slice, by ``tree``, once: the model the
    speed runs imagine with (its quality does not change the work: HalfCheetah never terminates)."""
    d = DATA / f"halfcheetah-7member-{tree['short']}"
    if not (d / "model.pt").is_file():
        train(tree, "dynamics", ["--env", "HalfCheetah-v5", "--dataset", str(a.hc_file), "--total-steps", "3",
                                 "--min-epochs", "0"], d)
    return d


def fit_hopper_model(tree: dict, a) -> Path:
    """A 7-member fit (the dynamics defaults, at most 20 epochs) on the 10k-row Hopper file, by ``tree``, once."""
    d = DATA / f"hopper-7member-{tree['short']}"
    if not (d / "model.pt").is_file():
        train(tree, "dynamics", ["--env", "Hopper-v5", "--dataset", str(a.hopper_file), "--total-steps", "20"], d)
    return d


def neubay_losses(trees: dict, a) -> dict:
    """One short same-seed run per tree, ``--threads 1``, a row every step: the loss curves side by side."""
    runs = {}
    for side, tree in trees.items():
        rows, _, _ = train(tree, "neubay", [*neubay_args(a, a.neubay_loss_steps, 0, 1), "--threads", "1"],
                           AB_TREES / "runs" / f"neubay_losses_{side}")
        runs[side] = rows
    out: dict = {"steps": a.neubay_loss_steps}
    for key in ("loss/critic", "loss/actor", "loss/alpha"):
        b, f = [r[key] for r in runs["before"]], [r[key] for r in runs["after"]]
        out[key] = {"before": b, "after": f,
                    "max_rel_diff": max(abs(x - y) / max(abs(x), 1e-8) for x, y in zip(b, f)),
                    "first_step_rel_diff": abs(b[0] - f[0]) / max(abs(b[0]), 1e-8)}
    return out


def markdown(p: dict) -> str:
    lines = [*ab_report_head(p, "Model-based workloads, same-run A/B"),
             "| workload | unit | before (median) | after (median) | after / before | per repeat before "
             "| per repeat after |", "|---|---|---|---|---|---|---|"]
    for w, m in p["median"].items():
        runs = p["runs"][w]
        before, after = (", ".join(f"{x:,.2f}" for x in runs[side]) for side in ("before", "after"))
        lines.append(f"| {w} | {UNITS.get(w, '')} | {m['before']:,.2f} | {m['after']:,.2f} | "
                     f"**{p['ratio_after_over_before'][w]:.2f}** | {before} | {after} |")
    if "neubay_losses" in p:
        nl = p["neubay_losses"]
        lines += ["", f"NeuBay, same seed, `--threads 1`, {nl['steps']} gradient steps: largest relative difference "
                  "between the trees, step by step (first step in brackets): "
                  + ", ".join(f"{k} {nl[k]['max_rel_diff']:.2e} ({nl[k]['first_step_rel_diff']:.2e})"
                              for k in ("loss/critic", "loss/actor", "loss/alpha")) + "."]
    lines += ["", f"`{p['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="cd8d0c0")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["ravl", "ravl_medium", "mopo", "neubay", "neubay_bf16",
                                                      "neubay_losses", "dynamics"],
                    choices=["ravl", "ravl_medium", "mopo", "neubay", "neubay_bf16", "neubay_losses", "dynamics"])
    ap.add_argument("--hc-model", type=Path, help="a finished dynamics run on halfcheetah-medium-v5 (ravl, mopo); "
                    "default: a 3-epoch 7-member fit on the halfcheetah slice, made once by the before tree")
    ap.add_argument("--mb-steps", type=int, default=1500, help="gradient steps of every ravl/mopo run")
    ap.add_argument("--neubay-steps", type=int, default=300)
    ap.add_argument("--neubay-loss-steps", type=int, default=20)
    ap.add_argument("--hc-rows", type=int, default=200_000, help="rows of the dynamics workload's dataset")
    ap.add_argument("--name", default="model_based_speed")
    a = ap.parse_args()
    if a.hc_model is not None:
        if not (a.hc_model / "model.pt").is_file():
            raise SystemExit("--hc-model: expected a finished `ctrl-rl train dynamics` run on halfcheetah-medium-v5")
        a.hc_model = a.hc_model.resolve()
    t_start = time.time()
    trees = {"before": worktree(a.before), "after": worktree(a.after)}
    for k, t in trees.items():
        print(f"{k}: {t['short']} {t['subject'][:70]} -> {t['ctrl_rl_file']}", flush=True)
    a.hopper_file = dataset_slice("hopper-medium-v5", 10_000)
    a.hc_file = dataset_slice("halfcheetah-medium-v5", a.hc_rows)
    if {"neubay", "neubay_bf16", "neubay_losses"} & set(a.workloads):
        a.hopper_model = fit_hopper_model(trees["before"], a)
    if {"ravl", "ravl_medium", "mopo"} & set(a.workloads) and a.hc_model is None:
        a.hc_model = fit_hc_model(trees["before"], a)
    work = {"ravl": ravl, "ravl_medium": ravl_medium, "mopo": mopo, "neubay": neubay, "neubay_bf16": neubay_bf16,
            "dynamics": dynamics}
    runs: dict[str, dict[str, list[float]]] = {}
    loads = []
    for rep in range(a.repeats):
        for w in [w for w in a.workloads if w in work]:
            order = ("before", "after") if rep % 2 == 0 else ("after", "before")
            if w in VARIANTS:  # a setting only the after tree has: compared with the before tree's default run
                order = ("after",)
            for side in order:
                loads.append(round(os.getloadavg()[0], 2))
                figures = work[w](trees[side], a, rep, AB_TREES / "runs" / f"{w}_{side}")
                for k, v in figures.items():
                    runs.setdefault(k, {"before": [], "after": []})[side].append(v)
                print(f"repeat {rep} {w} {side}: {figures}", flush=True)
    payload: dict = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(ROOT)
                                              if Path(sys.argv[0]).is_absolute() else sys.argv[0]), *sys.argv[1:]]),
        "before": {k: v for k, v in trees["before"].items() if k != "path"},
        "after": {k: v for k, v in trees["after"].items() if k != "path"},
        "setting": {"repeats": a.repeats, "mb_steps": a.mb_steps, "neubay_steps": a.neubay_steps,
                    "hc_rows": a.hc_rows, "hc_model": str(a.hc_model), "hopper_file": str(a.hopper_file)},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_avg_1min": loads or [round(os.getloadavg()[0], 2)],
        "runs": runs,
        "median": {k: {s: statistics.median(v[s]) if v[s] else None for s in ("before", "after")}
                   for k, v in runs.items()},
    }
    for variant, base in VARIANTS.items():  # the variant's after-median against the base workload's before-median
        for suffix in ("", "_wall_s"):
            k, kb = variant + suffix, base + suffix
            if k in payload["median"] and kb in payload["median"] and payload["median"][kb]["before"] is not None:
                payload["median"][k]["before"] = payload["median"][kb]["before"]
    payload["ratio_after_over_before"] = {k: m["after"] / m["before"] for k, m in payload["median"].items()
                                          if m["before"] is not None}
    if "neubay_losses" in a.workloads:
        payload["neubay_losses"] = neubay_losses(trees, a)
    payload["wall_s"] = round(time.time() - t_start, 1)
    write_result(a.name, payload, markdown(payload), folder=RESULTS)


if __name__ == "__main__":
    main()
