"""How a dynamics fit does on the transitions that end an episode, and where its holdout error comes from.

For one `ctrl-rl train dynamics` run (finished, ``model.pt``, or under way, ``checkpoints/latest.pt``) on the
dataset it was fitted on, with the rows it was fitted on (``--rows trajectory``: since ``72ef603``;
``--rows qlearning``: ``d4rl.qlearning_dataset``'s rows, before it), this script rebuilds the fit's own holdout
split (the run's seed, the model's initialisation drawn from it, then the split: ``world_models.ensemble.fit``) and
reports:

- ``termination_recall`` (``learn.model_based.termination_recall``) over all terminal rows and over the holdout's:
  the share whose next state, as each elite's mean predicts it, the task's termination function ends;
- the elites' holdout MSE on standardised targets, per output dimension (s' - s, then the reward), and how much of
  it the worst 1% of holdout rows carry, with and without the terminal rows;
- the run's per-epoch holdout MSE as its ``metrics.jsonl`` logged it, up to the scored epoch.

    python experiments/fit_terminal_rows/fit_terminal_rows.py --run RUN_DIR --dataset hopper-medium-v5 \\
        --env Hopper-v5 --rows trajectory --name hopper-medium-trajectory

Writes ``<name>.{json,md}`` here. One thread; a 1M-row dataset takes about two minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent


def load_fit(run_dir: Path, env: str):
    """(model, epoch, seed, finished) of a dynamics run: ``model.pt`` when the fit ended, else what ``fit`` would
    leave if it stopped now: each member's best weights so far and the elites by their best holdout MSE."""
    from ctrl_rl.envs.registry import spec_of
    from ctrl_rl.learn import model_based as mb
    from ctrl_rl.learn.checkpoint import load_checkpoint

    config = json.loads((run_dir / "config.json").read_text())
    seed, spec = int(config["run"]["seed"]), spec_of(env)
    if (run_dir / mb.MODEL_FILE).is_file():
        model = mb.load_model(run_dir, spec, env, torch.device("cpu"))
        epoch = load_checkpoint(run_dir / mb.MODEL_FILE)["summary"]["epochs"]
        return model, int(epoch), seed, True
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["fit_state"]
    entry = mb.model_entry()
    cfg = entry.default_config(**{k: tuple(v) if isinstance(v, list) else v for k, v in config["config"].items()})
    model = entry.make(cfg, spec, torch.device("cpu"), torch.Generator().manual_seed(seed))
    model.load_state_dict(state["model"])
    with torch.no_grad():
        for param, best in zip(model.parameters(), state["best_params"]):
            param.copy_(best)
        model.holdout_mse.copy_(state["best"])
        model.elite_ids.copy_(state["best"].argsort()[:cfg.elites])
    return model, int(state["epoch"]), seed, False


def holdout_rows(model, seed: int, rows: int, env: str) -> torch.Tensor:
    """The fit's holdout row indices: the seeded generator after the model's initialisation, then ``fit``'s split."""
    from ctrl_rl.envs.registry import spec_of
    from ctrl_rl.learn import model_based as mb
    from ctrl_rl.world_models.ensemble import holdout_split

    gen = torch.Generator().manual_seed(seed)
    mb.model_entry().make(model.cfg, spec_of(env), torch.device("cpu"), gen)  # draws what the run's initialisation drew
    return holdout_split(model.cfg, rows, gen, "cpu")[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a `ctrl-rl train dynamics` run directory")
    p.add_argument("--dataset", required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--rows", choices=("trajectory", "qlearning"), required=True,
                   help="the rows the fit was made on: trajectory (since 72ef603) or qlearning (before)")
    p.add_argument("--name", required=True, help="result file name (without extension)")
    p.add_argument("--max-holdout", type=int, default=50000, help="holdout rows to score (the first of the split)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    from ctrl_rl.envs.registry import spec_of
    from ctrl_rl.learn.config import RunConfig
    from ctrl_rl.learn.model_based import dataset_arrays, termination_recall

    model, epoch, seed, finished = load_fit(args.run, args.env)
    data = dataset_arrays(RunConfig(env=args.env, dataset=args.dataset), spec_of(args.env), None, torch.device("cpu"),
                          view=args.rows)  # the rows the fit saw
    data["terminated"] = data["terminated"].bool()
    n = data["obs"].shape[0]
    hold = holdout_rows(model, seed, n, args.env)
    scored = hold[:args.max_holdout]
    with torch.no_grad():
        x = model.inputs(data["obs"][scored], data["act"][scored])  # [H,I]
        y = model.targets(data["obs"][scored], data["next_obs"][scored], data["reward"][scored])  # [H,D]
        mean, _, _ = model.run(x, model.elite_ids)  # [K,H,D]
    sq = (y - mean).square().mean(0)  # [H,D] over elites
    row = sq.mean(1)  # [H]
    worst = row.sort(descending=True).values[:max(1, row.numel() // 100)]
    ended = data["terminated"][scored]  # [H]
    hold_terminal = {k: v[hold] for k, v in data.items()}
    out = {
        "run": str(args.run), "dataset": args.dataset, "env": args.env, "rows": args.rows, "epoch": epoch,
        "finished": finished, "seed": seed, "dataset_rows": n, "terminal_rows": int(data["terminated"].sum()),
        "holdout_rows": int(hold.numel()), "scored_holdout_rows": int(scored.numel()),
        "termination_recall_all": termination_recall(model, data, args.env),
        "termination_recall_holdout": termination_recall(model, hold_terminal, args.env),
        "holdout_mse_elites": float(sq.mean()),
        "holdout_mse_elites_without_terminal_rows": float(sq[~ended].mean()) if bool((~ended).any()) else None,
        "holdout_mse_per_dim": [round(float(v), 6) for v in sq.mean(0)],
        "share_of_squared_error_in_worst_1pct_rows": float(worst.sum() / row.sum()),
        "row_mse_quantiles": {str(q): float(v) for q, v in zip(
            (0.5, 0.9, 0.99, 0.999), torch.quantile(row[:20000], torch.tensor([0.5, 0.9, 0.99, 0.999])))},
        "commit": git_commit(),
        # the run's own per-epoch log up to the scored epoch: elites' holdout MSE as the fit measured it
        "history": [{k: r[k] for k in ("step", "wall_time", "holdout_mse_elites", "holdout_mse_best", "calibration")}
                    for r in map(json.loads, (args.run / "metrics.jsonl").read_text().splitlines())][:epoch],
    }
    dims = " | ".join(f"{v:.4f}" for v in out["holdout_mse_per_dim"])
    mse, share = out["holdout_mse_elites"], out["share_of_squared_error_in_worst_1pct_rows"]
    md = [f"# Dynamics fit on {args.dataset}, {args.rows} rows, epoch {epoch}{'' if finished else ' (under way)'}",
          "", f"`{args.run}`, commit {out['commit']}", "",
          "| figure | value |", "|---|---|",
          f"| terminal rows in the data | {out['terminal_rows']} of {n} |",
          f"| termination_recall (all terminal rows / holdout's) | {out['termination_recall_all']} / "
          f"{out['termination_recall_holdout']} |",
          f"| elites' holdout MSE (standardised), {out['scored_holdout_rows']} rows | {mse:.4f} |",
          f"| ... without the terminal rows | {out['holdout_mse_elites_without_terminal_rows']} |",
          f"| share of the squared error in the worst 1% of rows | {share:.3f} |",
          f"| per dimension (s' - s, then r) | {dims} |", ""]
    write_result(args.name, out, "\n".join(md), folder=RESULTS)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
