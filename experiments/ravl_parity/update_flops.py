"""What bounds a RAVL gradient step here: its matmul FLOPs, its rate, and the machine's rate at the same products.

Issue 28 section 3 asks for ctrl_rl's RAVL at >= 2x the official code's gradient steps/s "since its ensemble and
rollouts are batched". ``speed.py`` measures both; this script says how much room the arithmetic leaves. In one
process at ``--threads`` threads it builds ctrl_rl's ``ravl`` with the CLI's defaults (10 EDAC critics of 3x256,
batch 256) at HalfCheetah sizes (obs 17, action 6) on a synthetic replay, counts one update's matmul FLOPs
(FlopCounterMode, checked against the products torch.profiler records), times blocks of updates, and times plain
``torch.mm`` / ``torch.bmm`` at the same shapes (``common.matmul_replay_gflops``) and a 2048^2 product.

The official update (CORL's EDAC in ``agent_training/agent.py``) runs the same products: its critics are one
``VectorizedLinear`` ensemble (``x @ weight + bias`` over ``[N, B, in]``), the same widths, batch and EDAC
diversity term (a gradient of every critic w.r.t. the actions). So a gradient-step rate R of either code means
R x FLOPs per second, and 2x the official rate needs 2 x R_official x FLOPs within what the products allow.

    python experiments/ravl_parity/update_flops.py [--threads 2] [--official-rate 15.45]

Writes ravl_update_flops.{json,md} beside this script.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # experiments/: common.py
from common import (  # noqa: E402
    call_flops,
    git_commit,
    large_matmul_gflops,
    matmul_calls,
    matmul_flops,
    matmul_replay_gflops,
    synthetic_replay,
    write_result,
)

OBS, ACT, BATCH, ROWS = 17, 6, 256, 100_000  # HalfCheetah-v5 sizes, RAVL's batch


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--updates", type=int, default=40, help="updates per timed block")
    ap.add_argument("--turns", type=int, default=5, help="timed blocks (median)")
    ap.add_argument("--official-rate", type=float, default=None,
                    help="the official code's gradient steps/s from speed.py's same-day run, for the last column")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch

    from ctrl_rl.algos import registry
    from ctrl_rl.core.perf import tune_allocator
    from ctrl_rl.core.protocols import Algorithm
    from ctrl_rl.envs.protocol import EnvSpec

    torch.set_num_threads(a.threads)
    tune_allocator()
    entry = registry.get("ravl")
    cfg = entry.default_config()
    spec = EnvSpec("synthetic:halfcheetah", (OBS,), False, ACT, (-1.0,) * ACT, (1.0,) * ACT)
    torch.manual_seed(a.seed)
    algo = entry.make(cfg, spec, torch.device("cpu"), torch.Generator().manual_seed(a.seed))
    assert isinstance(algo, Algorithm)
    sample = synthetic_replay(OBS, ACT, BATCH, ROWS, a.seed)
    batches = [sample() for _ in range(a.updates)]
    for _ in range(5):
        algo.update(sample())
    flops = matmul_flops(lambda: algo.update(batches[0]))
    calls = matmul_calls(lambda: algo.update(batches[0]))
    assert call_flops(calls) == flops, f"profiled products {call_flops(calls)} FLOPs, FlopCounterMode {flops}"
    load = os.getloadavg()[0]
    blocks = []
    for _ in range(a.turns):
        t0 = time.perf_counter()
        for b in batches:
            info = algo.update(b)
        float(next(iter(info.values())))
        blocks.append((time.perf_counter() - t0) / a.updates)
    s = statistics.median(blocks)
    same = matmul_replay_gflops(calls)
    large = large_matmul_gflops()
    rate = 1.0 / s
    p = {"commit": git_commit(), "threads": a.threads, "load_before": round(load, 2),
         "time_utc": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M}",
         "config": {"critic_hidden": list(cfg.critic_hidden), "num_critics": cfg.num_critics,
                    "edac_eta": cfg.edac_eta, "batch": BATCH, "obs": OBS, "act": ACT},
         "matmul_flops_per_update": flops, "matmul_calls_per_update": len(calls), "s_per_update_blocks": blocks,
         "updates_per_s": rate, "update_matmul_gflops": flops * rate / 1e9, "same_shapes_mm_gflops": same,
         "large_mm_gflops": large, "efficiency_vs_same_shapes": flops * rate / 1e9 / same,
         "ceiling_updates_per_s": same * 1e9 / flops}
    if a.official_rate:
        p["official_rate"] = a.official_rate
        p["twice_official_needs_fraction_of_same_shapes"] = 2 * a.official_rate * flops / 1e9 / same
    md = [f"# A RAVL gradient step against the machine's matmul rate ({p['time_utc']} UTC, `{p['commit'][:7]}`)",
          "", f"`python experiments/ravl_parity/update_flops.py --threads {a.threads}"
          + (f" --official-rate {a.official_rate}`" if a.official_rate else "`")
          + f", load average {p['load_before']} before the timing.", "",
          "| quantity | value |", "|---|---|",
          f"| matmul FLOPs per update (forward + backward, {len(calls)} products) | {flops / 1e9:.2f} G |",
          f"| ctrl_rl updates/s (median of {a.turns} blocks of {a.updates}) | {rate:.1f} |",
          f"| its matmul rate | {p['update_matmul_gflops']:.0f} GFLOP/s |",
          f"| torch.mm / bmm alone at the same shapes | {same:.0f} GFLOP/s |",
          f"| a 2048^2 product | {large:.0f} GFLOP/s |",
          f"| update / same-shape products | **{p['efficiency_vs_same_shapes']:.2f}** |",
          f"| ceiling: updates/s if the products were all it did | {p['ceiling_updates_per_s']:.1f} |"]
    if a.official_rate:
        md.append(f"| 2x the official {a.official_rate} steps/s needs, of the same-shape rate | "
                  f"**{p['twice_official_needs_fraction_of_same_shapes']:.2f}** |")
    write_result("ravl_update_flops", p, "\n".join(md) + "\n", folder=HERE)
    print("\n".join(md))


if __name__ == "__main__":
    main()
