"""Run one of the official RAVL scripts as it is, with the shim in place:

    python -O launch.py CHECKOUT/train_ravl_agent.py --env_name halfcheetah-medium-v5 ...

What it changes, and nothing else:

1. ``sys.path``: this folder (the fake ``d4rl``, ``gym``, ``wandb`` packages) and the checkout first, as
   ``python SCRIPT`` would put the checkout.
2. ``shared.utils.SHORTENED_ENV_NAMES`` (the run-name table ``TrainConfig.__post_init__`` looks names up in)
   gains a ``-v5`` entry for every ``-v2`` one, with the same short name (``halfcheetah-medium-v5`` -> ``hc-med``).
3. CPU only (no CUDA in torch): ``Tensor.to`` reads a negative device index as the CPU. The rollout code moves
   its termination flags with ``done.to(reward.get_device())`` (``agent_training/rollout_generation.py``), and
   ``get_device()`` of a CPU tensor is -1, which ``Tensor.to`` refuses; every other call is passed through.

Run it with ``python -O``: both scripts ``assert config.device == "cuda:0"`` before anything else (they refuse the
CPU), and -O drops asserts. It drops the scripts' other asserts too (shape checks that a CUDA run makes).
The official code does not set torch's thread count; ``OMP_NUM_THREADS`` (``run.py --threads``) does, else torch's
default (the physical cores). The line ``[shim] torch threads: N`` says which.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def cpu_device_index_fix() -> None:
    """Item 3 of the module docstring."""
    import torch

    if torch.cuda.is_available():
        return
    to = torch.Tensor.to

    def to_cpu_index(self, *args, **kwargs):
        if args and type(args[0]) is int and args[0] < 0:
            args = ("cpu", *args[1:])
        return to(self, *args, **kwargs)

    torch.Tensor.to = to_cpu_index


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -O launch.py CHECKOUT/SCRIPT.py [official arguments]")
    script = Path(sys.argv[1]).resolve()
    if not script.is_file():
        raise SystemExit(f"no official script at {script}: expected train_dynamics_model.py or train_ravl_agent.py "
                         "of an anyasims/edge-of-reach checkout")
    here = str(Path(__file__).resolve().parent)
    sys.path[:0] = [here, str(script.parent)]
    import shared.utils as utils  # the official checkout's module
    import torch

    names = utils.SHORTENED_ENV_NAMES
    for name, short in list(names.items()):
        if name.endswith("-v2"):
            names.setdefault(name[:-3] + "-v5", short)
    cpu_device_index_fix()
    print(f"[shim] torch {torch.__version__} threads: {torch.get_num_threads()}; asserts "
          f"{'on' if __debug__ else 'off (-O)'}", flush=True)
    sys.argv = [str(script), *sys.argv[2:]]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
