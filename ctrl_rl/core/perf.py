"""Process-level performance settings for CPU training."""

from __future__ import annotations

import ctypes
import os
import sys

_DONE = False


def tune_allocator() -> bool:
    """Keep large tensor allocations in the heap instead of fresh mmaps (glibc only).

    glibc serves allocations above M_MMAP_THRESHOLD with a new mmap and returns them to the OS on free,
    so every large activation tensor of an update pays page faults and zeroing again. On this 2-core
    machine that made elementwise ops on [16384, 64] tensors 1.6x slower and the PPO update about 1.5x
    slower (experiments/bench/massive_parallel.py). Raising the mmap and trim thresholds keeps freed
    blocks for reuse; memory is then not returned to the OS until the process ends.
    Set CTRL_RL_NO_MALLOPT=1 to skip. Returns True when applied.
    """
    global _DONE
    if _DONE or os.environ.get("CTRL_RL_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return _DONE
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 1 << 31) == 1
    except (OSError, AttributeError):
        ok = False
    _DONE = ok
    return ok

