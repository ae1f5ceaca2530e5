"""Process-level performance settings for CPU training."""

from __future__ import annotations

import ctypes
import math
import os
import sys
import time

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



# -- torch threads under contention -------------------------------------------------------------------------
# Measured with experiments/bench/contention.py on this 2-core machine (AMD EPYC, torch 2.13 with GNU
# OpenMP); the numbers are in experiments/results/contention.md.
#
# torch's CPU ops run their parallel regions on libgomp, whose threads spin-wait about 3 ms (GOMP_SPINCOUNT
# 300000) at every barrier and between regions before they sleep. libgomp shortens the spin only when its
# *own* process has more threads than CPUs; it cannot see other processes. Two default PPO runs started
# together (2 threads each, 4 spinning threads on 2 cores) then take 15-25x their solo time: each small
# region waits for a partner thread that is descheduled behind the other process's spinners. One busy
# other process (a test suite) does the same to a single run.
#
# No fixed setting is both fast alone and robust: on an idle machine the second thread makes the default
# PPO run 1.3-1.8x faster, but only thanks to the spinning (OMP_WAIT_POLICY=PASSIVE makes two threads as
# slow as one, since every region then wakes its worker through the kernel); one thread per process
# holds up under contention but is that much slower alone. So the thread count follows the machine:
# ThreadGovernor measures the CPU time other processes used on our CPUs and drops to the threads that fit.

_STAT_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal (guest is inside user)
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


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cpu_sample() -> tuple[float, dict[int, int], float] | None:
    """(monotonic time, busy clock ticks per CPU since boot from /proc/stat, CPU seconds of this process),
    or None where /proc/stat is unavailable."""
    t = time.monotonic()
    try:
        with open("/proc/stat") as f:
            busy = {}
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


# Taken when this module is first imported: the CLI imports it before torch, so the first decision of a
# ThreadGovernor covers the seconds of imports during which two runs started together see each other.
_START = _cpu_sample()


def other_cores_busy(since, now, cpus: list[int]) -> float:
    """Cores' worth of CPU time that other processes used on ``cpus`` between two ``_cpu_sample()``s."""
    dt = now[0] - since[0]
    if dt <= 0:
        return 0.0
    busy = sum(now[1].get(c, 0) - since[1].get(c, 0) for c in cpus) / _TICK
    return max(0.0, busy - (now[2] - since[2])) / dt


class ThreadGovernor:
    """Keeps torch's intra-op thread count at what the CPUs left by other processes can hold.

    Measured on this 2-core machine (experiments/results/contention.md), default PPO (torch:Pendulum,
    1024 envs, 600k steps): alone, 2 threads train in ~7.5 s and 1 thread in ~10.3 s; two copies started
    together take 15-25x their solo time with 2 threads each, 1.0x with 1 thread each (15 s each), and
    1.0-1.1x under this governor while a copy alone keeps the 2-thread speed.

    Every ``interval`` seconds (checked at ``poll()``, which by default runs before every optimizer step of
    any torch optimizer, through torch's global step pre-hook) it reads /proc/stat and this process's CPU
    time, and sets ``torch.set_num_threads(t)`` with t = CPUs of our affinity mask minus the cores other
    processes used (rounded up beyond ``down_slack``), between 1 and ``max_threads``. It lowers the count at
    once and raises it only after ``calm_polls`` consecutive polls with the extra core free (``up_slack``),
    so two governed runs settle at one thread each and the survivor returns to two when the other ends.
    The first decision, at construction, covers the time since ctrl_rl.core.perf was imported.

    Call it from the thread that runs the training (torch's thread count is per thread). ``close()``
    removes the hook and restores the thread count found at construction. Without /proc/stat (not Linux)
    or with ``max_threads`` 1 it sets ``max_threads`` once and does nothing else.
    Set CTRL_RL_FIXED_THREADS=1 to keep ``max_threads`` fixed.
    """

    def __init__(self, max_threads: int, interval: float = 0.3, down_slack: float = 0.35, up_slack: float = 0.15,
                 calm_polls: int = 2, hook: bool = True):
        import threading

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
        now = _cpu_sample()
        self._enabled = (now is not None and self.max_threads > 1 and _START is not None
                         and not os.environ.get("CTRL_RL_FIXED_THREADS"))
        self.threads = self.max_threads
        if self._enabled:
            if now[0] - _START[0] >= interval:
                self.other_busy = other_cores_busy(_START, now, self.cpus)
                self.threads = self._fit(self.down_slack)
            else:
                self.threads = 1  # too short a window to judge: one thread until the first poll says otherwise
            self._last = now
            if hook:
                from torch.optim.optimizer import register_optimizer_step_pre_hook

                self._handle = register_optimizer_step_pre_hook(self._hook)
        torch.set_num_threads(self.threads)

    def _hook(self, *_) -> None:  # torch's optimizer pre-hooks must return None
        self.poll()

    def _fit(self, slack: float) -> int:
        """Threads that fit on our CPUs next to ``other_busy`` cores of other processes."""
        taken = math.ceil(max(0.0, self.other_busy - slack))
        return max(1, min(self.max_threads, len(self.cpus) - taken))

    def poll(self) -> int:
        """Re-decide if ``interval`` has passed since the last decision; returns the current thread count."""
        if not self._enabled or time.monotonic() - self._last[0] < self.interval:
            return self.threads
        import threading

        if threading.get_ident() != self._owner:
            return self.threads
        now = _cpu_sample()
        self.other_busy = other_cores_busy(self._last, now, self.cpus)
        self._last = now
        want = self.threads
        if self._fit(self.down_slack) < self.threads:
            want, self._calm = self._fit(self.down_slack), 0
        elif self._fit(self.up_slack) > self.threads:
            self._calm += 1
            if self._calm >= self.calm_polls:
                want, self._calm = self.threads + 1, 0
        else:
            self._calm = 0
        if want != self.threads:
            self.threads, self.changes = want, self.changes + 1
        if self._torch.get_num_threads() != self.threads:  # also undoes a loop's own setting
            self._torch.set_num_threads(self.threads)
        return self.threads

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._enabled = False
        self._torch.set_num_threads(self.threads_on_entry)


def default_threads(device_type: str, kind: str) -> int:
    """Most torch intra-op threads a run uses for ``--threads 0``; 0 keeps torch's default (non-CPU devices).

    ``kind``: "onpolicy" (PPO: updates on minibatches of thousands of rows, where a second thread pays:
    1.3-1.8x faster alone on 2 cores) -> every usable core (the cgroup quota respected), to be governed
    by ThreadGovernor; "offpolicy" or "offline" (batch-256 updates of ~10^2 small ops) -> 1, as before.
    """
    if device_type != "cpu":
        return 0
    if kind == "onpolicy":
        return usable_cores()
    if kind in ("offpolicy", "offline"):
        return 1
    raise ValueError(f"unknown loop kind {kind!r}: expected onpolicy, offpolicy or offline")


def openmp_loaded() -> bool:
    """Whether an OpenMP runtime (libgomp, libiomp, libomp) is already mapped into this process: from then
    on its environment variables are read and changing them has no effect."""
    try:
        with open("/proc/self/maps") as f:
            return any(("libgomp" in ln or "libiomp" in ln or "libomp" in ln) for ln in f)
    except OSError:
        return "torch" in sys.modules


def configure_openmp_spin(spincount: int = 10_000) -> bool:
    """Shorten libgomp's busy-wait before a waiting OpenMP thread sleeps: GOMP_SPINCOUNT (default 300000,
    about 3 ms), set in os.environ before torch is imported (libgomp reads it once, when torch loads it;
    torch.set_num_threads later keeps it). Skipped when the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, or
    when an OpenMP runtime is already loaded. Returns True when set.
    """
    if openmp_loaded() or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return False
    os.environ["GOMP_SPINCOUNT"] = str(int(spincount))
    return True
