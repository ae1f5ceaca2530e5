"""Process-level performance settings for CPU training."""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time

_mallopt_done = False


def tune_allocator() -> bool:
    """Keep large tensor allocations in the heap instead of fresh mmaps (glibc only).

    glibc serves allocations above M_MMAP_THRESHOLD with a new mmap and returns them to the OS on free,
    so every large activation tensor of an update pays page faults and zeroing again. On this 2-core
    machine that made elementwise ops on [16384, 64] tensors 1.6x slower and the PPO update about 1.5x
    slower (experiments/massive_parallel/massive_parallel.py). Raising the mmap and trim thresholds keeps freed
    blocks for reuse; memory is then not returned to the OS until the process ends.
    Set CTRL_RL_NO_MALLOPT=1 to skip. Returns True when applied.
    """
    global _mallopt_done
    if _mallopt_done or os.environ.get("CTRL_RL_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return _mallopt_done
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 1 << 31) == 1
    except (OSError, AttributeError):
        ok = False
    _mallopt_done = ok
    return ok


# -- torch threads under contention -------------------------------------------------------------------------
# torch's CPU ops run their parallel regions on GNU OpenMP (libgomp; the only OpenMP runtime in the process,
# MKL included, so KMP_BLOCKTIME does not apply). A libgomp thread that waits -- at a region's barrier or for
# the next region -- spins GOMP_SPINCOUNT=300000 times (a few ms) before it sleeps; libgomp shortens that
# only when its own process has more threads than CPUs, it cannot see other processes. Two 2-thread
# processes on 2 cores, or one next to a busy test suite, then stall: each small region waits for a partner
# thread that is descheduled behind the other process's spinners. The wait policy is read once, when
# torch loads libgomp: OMP_WAIT_POLICY / GOMP_SPINCOUNT set in os.environ before `import torch` take effect
# (and survive torch.set_num_threads), set after it they do nothing -- but no wait policy fixes this (see
# ThreadGovernor), so none is set here.

_STAT_BUSY = (0, 1, 2, 5, 6, 7)  # /proc/stat: user nice system [idle iowait] irq softirq steal (guest is in user)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask (taskset, cpusets), capped by a cgroup v2 CPU quota
    (torch's default thread count ignores the quota)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return n


def default_threads(device_type: str) -> int:
    """The most torch intra-op threads a ``--threads 0`` run uses: every usable core on CPU, under a
    ``ThreadGovernor`` that drops to one thread while other processes use the cores; 0 elsewhere (leave torch's
    setting).

    Every loop gets the same policy. Measured on this 2-core machine, alone: PPO's minibatches of thousands of
    rows, 2 threads 6.0 s against 9.1 s on one (default preset at 600k steps, train seconds,
    experiments/contention/contention.md); the dynamics fit 1.77x, RAVL 1.83x, MOPO 1.48x
    (experiments/model_based_speed); SAC at batch 256 with 256x256 networks on HalfCheetah-v5, whole process of
    1,000 random and 5,000 learning steps, 33-34 s with ``--threads 2`` against 47.3 s on one (issue 30), and
    104 against 69 updates/s (experiments/sac_updates). Tiny networks gain nothing: SAC and IQL at 64x64 on
    torch:Pendulum measured 7.6 s on one thread against 8-9.7 s on two (SAC) and 7.2 against 7.1 s (IQL)
    (experiments/contention, fixed counts) -- earlier the reason off-policy and offline loops were pinned to one
    thread, which cost the common 256-wide case ~1.4x. Governed, such runs cost 1-5% alone against one thread
    (2026-11-26: SAC 64x64 12.48 against 12.31 s, IQL 12.85 against 12.20 s; SAC at its defaults on HalfCheetah-v5
    20.4 against 26.5 s; two default runs side by side 0.98-1.35x their solo time; experiments/contention).
    What one thread buys under contention (a second thread of a batch-256 update stalls at every op's barrier
    behind another process: 4.5 instead of 94 SAC updates/s) the governor gives by dropping to one thread.
    experiments/sac_default_speed and experiments/contention measure the governed default against one thread
    and against SB3.
    """
    if device_type != "cpu":
        return 0
    return usable_cores()


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


_Sample = tuple[float, dict[int, int], float]
"""A ``_cpu_sample()`` result: (monotonic time, busy ticks per CPU, CPU seconds of this process)."""


def _cpu_sample() -> _Sample | None:
    """(monotonic time, busy clock ticks per CPU since boot from /proc/stat, CPU seconds of this process),
    or None where /proc/stat is unavailable (not Linux). About 50 us."""
    t = time.monotonic()
    try:
        with open("/proc/stat") as f:
            busy: dict[int, int] = {}
            for line in f:
                if not line.startswith("cpu"):
                    break
                name, *vals = line.split()
                if name != "cpu":
                    busy[int(name[3:])] = sum(int(vals[i]) for i in _STAT_BUSY if i < len(vals))
    except (OSError, ValueError):
        return None
    try:
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        own = ru.ru_utime + ru.ru_stime
    except ImportError:
        tm = os.times()
        own = tm.user + tm.system
    return t, busy, own


# Taken when this module is first imported. The CLI should import it before torch: the first decision of a
# ThreadGovernor then covers the seconds of imports, during which two runs started together see each other.
_START = _cpu_sample()


def other_cores_busy(since: _Sample, now: _Sample, cpus: list[int]) -> float:
    """Cores' worth of CPU time other processes used on ``cpus`` between two ``_cpu_sample()`` results."""
    dt = now[0] - since[0]
    if dt <= 0:
        return 0.0
    busy = sum(now[1].get(c, 0) - since[1].get(c, 0) for c in cpus) / _TICK
    return max(0.0, busy - (now[2] - since[2])) / dt


def fit_threads(other_busy: float, cpus: int, max_threads: int, slack: float) -> int:
    """Threads that fit on ``cpus`` CPUs next to ``other_busy`` cores of other processes: ``cpus`` minus the busy
    cores rounded up once they exceed ``slack``, between 1 and ``max_threads``."""
    taken = math.ceil(max(0.0, other_busy - slack))
    return max(1, min(max_threads, cpus - taken))


def next_threads(threads: int, other_busy: float, cpus: int, max_threads: int, calm: int, down_slack: float = 0.35,
                 up_slack: float = 0.15, calm_polls: int = 2) -> tuple[int, int]:
    """One decision of ``ThreadGovernor`` (pure): ``(threads, calm)`` after a window in which other processes used
    ``other_busy`` cores. Lowers at once to what fits with ``down_slack``; raises by one only after ``calm_polls``
    windows in a row in which more fit with ``up_slack`` (``calm`` counts them); else keeps the count."""
    low = fit_threads(other_busy, cpus, max_threads, down_slack)
    if low < threads:
        return low, 0
    if fit_threads(other_busy, cpus, max_threads, up_slack) > threads:
        return (threads + 1, 0) if calm + 1 >= calm_polls else (threads, calm + 1)
    return threads, 0


class ThreadGovernor:
    """Keeps torch's intra-op thread count at what the CPUs left free by other processes can hold.

    Every training loop runs under one when ``--threads`` is 0 on CPU (``learn.runtime.RunContext``, with
    ``default_threads`` as ``max_threads``). No fixed setting is both fast alone and robust on a shared 2-core
    machine. Measured with
    experiments/contention/contention.py (default PPO preset at 600k steps; process wall s, training s in
    brackets; medians of clean repeats of one invocation; experiments/contention/contention.md):

    =============================  ===========  ==============================  ========
    setting                        alone        two started together, each      slowdown
    =============================  ===========  ==============================  ========
    torch default, 2 threads       9.2 (5.5)    40.2 / 41.2 (36.0 / 37.0)       4.5x
    --threads 1                    13.5 (9.3)   13.2 / 13.1 (9.2 / 8.9)         1.0x
    OMP_WAIT_POLICY=PASSIVE        12.5 (8.3)   13.6 / 13.5 (9.5 / 9.3)         1.1x
    GOMP_SPINCOUNT=10000           10.4 (6.3)   33.0 / 32.9 (29.0 / 28.8)       3.2x
    ThreadGovernor                 10.8 (6.5)   12.2 / 12.9 (8.3 / 8.7)         1.3x
    ThreadGovernor, 2nd 4 s later  9.7 (5.8)    11.5 / 11.8 (7.8 / 8.2)         1.25x
    =============================  ===========  ==============================  ========

    The preset as shipped (3M steps): default 28 s alone, 136-138 s each in a pair; governed 31.8 s alone
    against 31.7 s for the default (4 interleaved repeats), 42.7 / 43.1 s each in a pair, where two
    one-thread runs take 44 s each -- the floor, as two runs on two cores get one core each. One thread
    is robust but 1.4-1.6x slower alone; a passive wait policy makes two threads as slow as one (every
    region then wakes its worker through the kernel); a shorter spin barely helps. Next to a busy test
    suite a default run took 55-300 s instead of 10 s. The governor measures instead of guessing: alone
    it keeps every thread (no change in any clean solo run), next to another run it drops to one thread,
    and the survivor returns to two when the other ends. A load-average test at start cannot do this:
    load1 is a 1-minute average (1.2-3 before solo runs on an idle machine, ~0 for a run started at the
    same moment).

    Every ``interval`` s, checked at ``poll()`` -- by default before every optimizer step of any torch
    optimizer (torch's global step pre-hook), so loops need no call -- it reads /proc/stat and this
    process's CPU time and sets ``torch.set_num_threads(t)``: t = CPUs of the affinity mask minus the cores
    other processes used (rounded up beyond ``down_slack``), between 1 and ``max_threads``. It lowers t at
    once and raises it by one only after ``calm_polls`` polls in a row with a core free (``up_slack``). The
    first decision, at construction, covers the time since ctrl_rl.core.perf was imported (if that was
    0.3-60 s ago; else it starts at one thread). A poll costs ~0.5 us, a decision ~50 us. Other processes
    include this run's own subprocesses (gymnasium async envs), which is intended: they need the cores too.

    Create it on the thread that trains (torch's thread count is per thread; polls from other threads are
    ignored). ``close()`` removes the hook and restores the count found at construction. Without /proc/stat
    or with CTRL_RL_FIXED_THREADS=1 it sets ``max_threads`` once and never changes it. CTRL_RL_THREAD_LOG=1 prints
    every decision to stderr.
    """

    def __init__(self, max_threads: int, interval: float = 0.3, down_slack: float = 0.35, up_slack: float = 0.15,
                 calm_polls: int = 2, hook: bool = True):
        import torch

        self._torch = torch
        self.max_threads = max(1, int(max_threads))
        self.interval, self.down_slack, self.up_slack, self.calm_polls = interval, down_slack, up_slack, calm_polls
        self.cpus = _affinity()
        self.threads_on_entry = torch.get_num_threads()
        self.other_busy: float | None = None  # cores other processes used in the last window
        self.changes = 0
        self._calm = 0
        self._owner = threading.get_ident()
        self._handle = None
        last, start = _cpu_sample(), _START
        self._last = last
        self._measures = (last is not None and start is not None
                          and not os.environ.get("CTRL_RL_FIXED_THREADS"))
        self.threads = self.max_threads
        self._log = bool(os.environ.get("CTRL_RL_THREAD_LOG"))
        if self._measures and self.max_threads > 1 and last is not None and start is not None:
            if interval <= last[0] - start[0] <= 60.0:  # a longer history says little about now
                self.other_busy = other_cores_busy(start, last, self.cpus)
                self.threads = fit_threads(self.other_busy, len(self.cpus), self.max_threads, self.down_slack)
            else:
                self.threads = 1  # no window to judge: one thread until the polls say otherwise (~0.6 s)
        if self._log:
            print(f"[threads] start at {self.threads} of {self.max_threads}"
                  + (f" (other processes used {self.other_busy:.2f} cores)" if self.other_busy is not None else ""),
                  file=sys.stderr, flush=True)
        if self._measures and hook:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._handle = register_optimizer_step_pre_hook(self._hook)
        self._apply()

    def _hook(self, *_: object) -> None:  # torch's optimizer step pre-hooks must return None
        self.poll()

    def _apply(self) -> None:
        # only on a change: set_num_threads also pins MKL's thread count, which torch's default leaves dynamic
        if self._torch.get_num_threads() != self.threads:
            self._torch.set_num_threads(self.threads)

    def poll(self) -> int:
        """Re-decide if ``interval`` s have passed since the last decision; returns the thread count."""
        last = self._last  # not None while self._measures
        if (self.max_threads == 1 or not self._measures or last is None or time.monotonic() - last[0] < self.interval
                or threading.get_ident() != self._owner):
            return self.threads
        now = _cpu_sample()
        if now is None:  # /proc/stat gone since the last sample: keep the current count
            return self.threads
        self.other_busy = other_cores_busy(last, now, self.cpus)
        self._last = now
        want, self._calm = next_threads(self.threads, self.other_busy, len(self.cpus), self.max_threads, self._calm,
                                        self.down_slack, self.up_slack, self.calm_polls)
        if want != self.threads:
            if self._log:
                print(f"[threads] {self.threads} -> {want}: other processes used {self.other_busy:.2f} cores",
                      file=sys.stderr, flush=True)
            self.threads, self.changes = want, self.changes + 1
        self._apply()  # also undoes a count a loop set in between
        return self.threads

    def cap(self, max_threads: int) -> int:
        """Change the most threads the governor may use (e.g. 1 once a loop knows its envs step in their own
        threads, as envpool's do on <= 2 cores); lowering applies at once, raising at the next calm polls."""
        self.max_threads = max(1, int(max_threads))
        if self.threads > self.max_threads:
            self.threads = self.max_threads
            self._apply()
        return self.threads

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._measures = False
        if self._torch.get_num_threads() != self.threads_on_entry:
            self._torch.set_num_threads(self.threads_on_entry)
