"""Operations dispatched per update: one seed alone against N seeds batched by ``--seeds`` (issue 30, part 4).

On a GPU a small update (256-wide MLPs, batch 256) is bound by the host: every dispatched operation costs Python,
dispatcher and (for most) a kernel launch, whatever the tensor sizes. N separate processes issue N streams of
operations from N CPU cores; one ``--seeds`` process issues its batched stream from one. So on a GPU one process
can only win where its update dispatches fewer than 1/N of the separate processes' operations, i.e. fewer than
one seed's own update. This script counts them (``TorchDispatchMode``: every operation that reaches a kernel or a
view, the optimizer steps included), on CPU with the algorithms' default configs at Hopper's sizes (11
observations, 3 actions), batch 256. Adam runs its per-tensor loop on CPU; on CUDA it defaults to the multi-tensor
(foreach) form, which launches fewer kernels per step for a run alone and for a batched run alike.

    python experiments/seed_batching/op_count.py                 # IQL, SAC, CQL; seeds 3
    python experiments/seed_batching/op_count.py --algos iql --seeds 5

Writes ``op_count.{json,md}`` to ``--out`` (default: this folder). Counts do not depend on the machine.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import git_commit, write_result  # noqa: E402

from ctrl_rl.algos import registry  # noqa: E402
from ctrl_rl.core.seeds import batch_seeds  # noqa: E402
from ctrl_rl.core.types import Transition  # noqa: E402
from ctrl_rl.envs.protocol import EnvSpec  # noqa: E402
from ctrl_rl.learn.seeds import stack_batches  # noqa: E402

RESULTS = Path(__file__).resolve().parent
SPEC = EnvSpec("synthetic:hopper-sized", (11,), False, 3, (-1.0,) * 3, (1.0,) * 3)
# operations that only make a view or alias (no kernel on a GPU, still host time)
VIEWS = {"aten.detach.default", "aten.select.int", "aten.unsqueeze.default", "aten.view.default", "aten.t.default",
         "aten.slice.Tensor", "aten.transpose.int", "aten.expand.default", "aten.squeeze.dim",
         "aten._unsafe_view.default", "aten.alias.default", "aten.permute.default", "aten.unbind.int",
         "aten.as_strided.default",
         "aten.split.Tensor", "aten.squeeze.default", "aten.chunk.default", "aten.reshape.default"}


class Count(TorchDispatchMode):
    """Counts the operations dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def batch(size: int, seed: int) -> Transition:
    g = torch.Generator().manual_seed(seed)
    return Transition(obs=torch.randn(size, 11, generator=g), action=torch.rand(size, 3, generator=g) * 2 - 1,
                      reward=torch.randn(size, generator=g), next_obs=torch.randn(size, 11, generator=g),
                      terminated=torch.zeros(size, dtype=torch.bool), truncated=torch.zeros(size, dtype=torch.bool))


def counted(update, make_batch) -> collections.Counter[str]:
    """The operations of one update after three warm-up updates (lazy optimizer state, delayed actor steps)."""
    for _ in range(3):
        update(make_batch())
    x = make_batch()
    with Count() as c:
        update(x)
    return c.ops


def summary(ops: collections.Counter[str]) -> dict:
    views = sum(n for k, n in ops.items() if k in VIEWS)
    return {"ops": sum(ops.values()), "kernels": sum(ops.values()) - views, "views": views,
            "top": ops.most_common(10)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", nargs="+", default=["iql", "sac", "cql"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for name in a.algos:
        entry = registry.get(name)
        cfg = entry.default_config()
        if entry.seed_layout is None:
            raise SystemExit(f"--algos {name!r} has no seed layout: expected one of the algorithms --seeds trains")
        alone = entry.make(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
        one = counted(alone.update, lambda: batch(a.batch_size, 0))
        members = [entry.make(cfg, SPEC, "cpu", torch.Generator().manual_seed(s)) for s in range(a.seeds)]
        together = batch_seeds(members, entry.seed_layout)
        many = counted(together.update,
                       lambda: stack_batches([batch(a.batch_size, k) for k in range(a.seeds)]))
        r1, rn = summary(one), summary(many)
        rows[name] = {"alone": r1, "batched": rn, "ops_ratio": rn["ops"] / r1["ops"],
                      "kernels_ratio": rn["kernels"] / r1["kernels"]}
        print(f"{name}: alone {r1['ops']} ops ({r1['kernels']} not views), {a.seeds} seeds batched {rn['ops']} "
              f"({rn['kernels']}) = {rows[name]['ops_ratio']:.2f}x ({rows[name]['kernels_ratio']:.2f}x) one seed's",
              flush=True)
    md = [f"# op_count: operations per update, one seed alone against {a.seeds} seeds batched (`--seeds`)", "",
          f"commit {git_commit()}, batch {a.batch_size}, default configs, Hopper's sizes", "",
          "| algo | alone: ops (not views) | batched: ops (not views) | batched / alone | N separate / batched |",
          "|---|---|---|---|---|"]
    for name, r in rows.items():
        md.append(f"| {name} | {r['alone']['ops']} ({r['alone']['kernels']}) | {r['batched']['ops']} "
                  f"({r['batched']['kernels']}) | {r['ops_ratio']:.2f}x ({r['kernels_ratio']:.2f}x) | "
                  f"{a.seeds / r['ops_ratio']:.2f}x ({a.seeds / r['kernels_ratio']:.2f}x) |")
    md += ["", "A host-bound GPU update gains from batching only where `batched / alone` is below 1 (N separate "
           "processes issue their operations from N cores).", ""]
    write_result("op_count", {"commit": git_commit(), "seeds": a.seeds, "batch_size": a.batch_size,
                              "spec": {"obs": 11, "actions": 3}, "algos": rows}, "\n".join(md), folder=a.out)


if __name__ == "__main__":
    main()
