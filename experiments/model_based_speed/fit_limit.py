"""How close the dynamics fit runs to this machine's arithmetic limit (issue 28, section 2: "report its wall time and
fraction of the limit").

In one process, at the thread count the fit uses on an idle machine (every core), three rates are measured:

- **fit**: one epoch of ``world_models.ensemble.fit`` (the default 7 members of 4x200, SiLU, batch 256, learned
  log-variance bounds, Adam) on synthetic HalfCheetah-sized rows (17 obs + 6 actions -> 18 targets), as FLOP/s of
  the epoch's matrix products: forward ``2 * sum(in * out)`` per row and member, backward twice that (gradients of
  inputs and weights); the first layer's input gradient is not needed, and is counted anyway (about 1%);
- **same-shape limit**: the same chain of batched products (``torch.baddbmm`` on ``[7, 256, in] x [7, in, out]``,
  forward and backward through autograd, no loss, no optimizer), i.e. what the fit's matrix products alone can reach
  at its shapes;
- **peak**: a 4096 x 4096 float32 matmul, the machine's large-matrix rate.

The fraction fit / same-shape limit says what the fit's other work costs (the Gaussian NLL, the indexing of each
member's bootstrap rows, Adam, the holdout evaluation); fit / peak says how far small batched products are from
large ones. Medians of ``--repeats``.

    python experiments/model_based_speed/fit_limit.py [--rows 100000] [--repeats 3]

Writes fit_limit.{json,md} beside this script. Run on a quiet machine (the reading records the load average).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import git_commit, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent
OBS, ACT = 17, 6  # HalfCheetah-v5


def layer_dims(cfg) -> list[tuple[int, int]]:
    dims = (OBS + ACT, *cfg.hidden, 2 * (OBS + 1))
    return list(zip(dims[:-1], dims[1:]))


def fit_epoch_rate(rows: int, seed: int) -> tuple[float, float, int]:
    """Seconds of one fit epoch (training rows only: the holdout is 20%), the rows trained on, and its FLOPs."""
    from ctrl_rl.world_models.ensemble import DynamicsConfig, EnsembleDynamics, fit

    cfg = DynamicsConfig(min_epochs=0, max_epochs=1)
    model = EnsembleDynamics(OBS, ACT, cfg)
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, OBS, generator=g)
    data = {"obs": obs, "act": torch.rand(rows, ACT, generator=g) * 2 - 1,
            "next_obs": obs + 0.1 * torch.randn(rows, OBS, generator=g), "reward": torch.randn(rows, generator=g),
            "terminated": torch.zeros(rows, dtype=torch.bool)}
    t0 = time.perf_counter()
    hist = fit(model, data, generator=g)
    wall = time.perf_counter() - t0
    n_train = rows - int(cfg.holdout_ratio * rows)
    flops = 3 * 2 * cfg.members * n_train * sum(i * o for i, o in layer_dims(cfg))
    assert len(hist) == 1
    return wall, n_train, flops


def chain_rate(batch: int, steps: int) -> float:
    """FLOP/s of the fit's product chain alone: forward and backward of batched affine maps at its shapes."""
    from ctrl_rl.world_models.ensemble import DynamicsConfig

    cfg = DynamicsConfig()
    E = cfg.members
    ws = [(torch.randn(E, i, o) / i ** 0.5).requires_grad_() for i, o in layer_dims(cfg)]
    bs = [torch.zeros(E, 1, o, requires_grad=True) for _, o in layer_dims(cfg)]
    x = torch.randn(E, batch, OBS + ACT)

    def once():
        h = x
        for k, (w, b) in enumerate(zip(ws, bs)):
            h = torch.baddbmm(b, h, w)
            if k < len(ws) - 1:
                h = torch.nn.functional.silu(h)
        h.sum().backward()

    for _ in range(20):
        once()
    t0 = time.perf_counter()
    for _ in range(steps):
        once()
    dt = time.perf_counter() - t0
    return steps * 3 * 2 * E * batch * sum(i * o for i, o in layer_dims(cfg)) / dt


def peak_rate(n: int = 4096, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return reps * 2 * n ** 3 / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    load = os.getloadavg()[0]
    fits, chains, peaks = [], [], []
    n_train = flops = 0
    for r in range(a.repeats):
        wall, n_train, flops = fit_epoch_rate(a.rows, r)
        fits.append(flops / wall)
        chains.append(chain_rate(256, 300))
        peaks.append(peak_rate())
        print(f"repeat {r}: fit {fits[-1] / 1e9:.1f} GFLOP/s ({n_train / wall:,.0f} rows/s), same-shape chain "
              f"{chains[-1] / 1e9:.1f}, 4096^2 matmul {peaks[-1] / 1e9:.1f}", flush=True)
    fit_r, chain_r, peak_r = (statistics.median(v) for v in (fits, chains, peaks))
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(),
               "command": "python experiments/model_based_speed/fit_limit.py " + " ".join(argv or sys.argv[1:]),
               "threads": a.threads, "load_average_before": load, "rows": a.rows, "train_rows": n_train,
               "flops_per_epoch": flops, "gflops": {"fit": fit_r / 1e9, "same_shape_chain": chain_r / 1e9,
                                                    "peak_4096": peak_r / 1e9},
               "repeats": {"fit": fits, "chain": chains, "peak": peaks},
               "fit_rows_per_s": fit_r / flops * n_train,
               "fraction_of_same_shape": fit_r / chain_r, "fraction_of_peak": fit_r / peak_r}
    md = ["# The dynamics fit against the machine's arithmetic limit", "",
          f"`{payload['command']}` ({payload['date']}, commit {payload['commit']}, {a.threads} threads, load average "
          f"{load:.2f} before)", "",
          f"| rate (medians of {a.repeats}) | GFLOP/s | the fit's fraction |", "|---|---|---|",
          f"| fit, one epoch (7 x 4x200, batch 256), {payload['fit_rows_per_s']:,.0f} rows/s | {fit_r / 1e9:.1f} | - |",
          f"| its product chain alone, same shapes | {chain_r / 1e9:.1f} | **{fit_r / chain_r:.2f}** |",
          f"| 4096^2 float32 matmul | {peak_r / 1e9:.1f} | {fit_r / peak_r:.2f} |", ""]
    write_result("fit_limit", payload, "\n".join(md) + "\n", folder=RESULTS)


if __name__ == "__main__":
    main()
