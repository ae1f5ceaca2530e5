"""Run one of the official SAC Flow from-scratch scripts as it is, with the shim in place:

    python launch.py CHECKOUT/from_scratch_code/SAC_flow_gru_jax.py --env-id Hopper-v5 ...

What it changes, and nothing else (README.md has the table):

1. ``sys.path``: this folder (the ``wandb`` stand-in and ``sac_flow_shim``), the script's folder (as ``python
   SCRIPT`` would put it) and the checkout's root (the scripts import ``cleanrl_utils.buffers`` from there; the
   official setup gets it with ``pip install -e .``).
2. ``torch.utils.tensorboard`` is ``sac_flow_shim.tensorboard`` (its ``SummaryWriter`` records to JSON lines).
3. ``gymnasium.vector.SyncVectorEnv`` is ``sac_flow_shim.vector.OldApiSyncVectorEnv`` (Gymnasium 0.29's step API
   on 1.x), which calls the run monitor: clock rows and, every ``$SAC_FLOW_SHIM_EVAL_EVERY`` env steps (0: never),
   the deterministic evaluation of ``$SAC_FLOW_SHIM_EVAL_EPISODES`` episodes (``sac_flow_shim.evaluate``).
4. ``$SAC_FLOW_SHIM_CPUS`` (e.g. ``1``): the process is pinned to those CPUs before JAX starts.

The script's source is compiled and run in a globals dict that this file keeps (what ``runpy.run_path`` does), so
that the evaluation can read the actor's current parameters from it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python launch.py CHECKOUT/from_scratch_code/SCRIPT.py [official arguments]")
    script = Path(sys.argv[1]).resolve()
    if not script.is_file():
        raise SystemExit(f"no official script at {script}: expected a from_scratch_code/*.py of an "
                         "Elessar123/SAC-FLOW checkout")
    cpus = os.environ.get("SAC_FLOW_SHIM_CPUS")
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(script.parent), str(script.parent.parent)]
    import gymnasium
    import jax
    import torch.utils
    from sac_flow_shim import evaluate, record, tensorboard, vector  # record.T0: the rows' clock starts here

    sys.modules["torch.utils.tensorboard"] = tensorboard
    torch.utils.tensorboard = tensorboard
    gymnasium.vector.SyncVectorEnv = vector.OldApiSyncVectorEnv

    g: dict = {"__name__": "__main__", "__file__": str(script), "__builtins__": __builtins__}
    every = int(os.environ.get("SAC_FLOW_SHIM_EVAL_EVERY", "0"))
    episodes = int(os.environ.get("SAC_FLOW_SHIM_EVAL_EPISODES", "10"))
    vector.OldApiSyncVectorEnv.monitor = vector.RunMonitor(
        every, evaluate.Evaluator(g, episodes) if every and episodes else None, lambda: g["args"].learning_starts)
    affinity = sorted(os.sched_getaffinity(0))
    record.write("shim", {"_event": "start", "script": str(script), "argv": sys.argv[2:], "cpus": affinity,
                          "jax": jax.__version__, "gymnasium": gymnasium.__version__,
                          "xla_flags": os.environ.get("XLA_FLAGS"), "eval_every": every, "eval_episodes": episodes})
    print(f"[shim] jax {jax.__version__}, gymnasium {gymnasium.__version__}, "
          f"cpus {affinity}, XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}", flush=True)
    sys.argv = [str(script), *sys.argv[2:]]
    code = compile(script.read_text(), str(script), "exec")
    exec(code, g)
    record.write("shim", {"_event": "end"})


if __name__ == "__main__":
    main()
