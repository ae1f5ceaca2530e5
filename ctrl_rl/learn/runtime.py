"""Set-up shared by the training loops: device, torch threads, allocator, run directory, progress bar."""

from __future__ import annotations

from pathlib import Path

import torch

from ctrl_rl.config import save_config
from ctrl_rl.core.perf import tune_allocator
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.logging import RunLogger


def setup_device(device_name: str, threads: int) -> torch.device:
    """Check the device, set torch's intra-op threads (0 keeps torch's default) and tune the CPU allocator."""
    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda was requested but torch reports no CUDA device: expected --device cpu on this machine")
    if threads > 0:
        torch.set_num_threads(threads)
    if device.type == "cpu":
        tune_allocator()
    return device


def single_thread_by_default(device: torch.device, threads: int) -> None:
    """Off-policy and offline updates are ~10^2 small ops on batch-256 tensors: with ``--threads 0`` they run
    on one torch thread on CPU. A second OpenMP thread gains little on an idle 2-core machine, and when
    other processes compete every op's barrier waits for a descheduled worker (measured: 4.5 instead of
    94 SAC updates/s). ``--threads N`` overrides."""
    if threads == 0 and device.type == "cpu":
        torch.set_num_threads(1)


def open_run_dir(run_dir: Path, algo: str, run, cfg, resume_step: int | None) -> RunLogger:
    """Create the run directory and its checkpoints/, write the resolved config, open the metrics logger
    (on resume, rows past ``resume_step`` are dropped)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    save_config(run_dir / "config.json", algo, run, cfg)
    return RunLogger(run_dir, resume_step=resume_step)


def progress_bar(enabled: bool, total: int, initial: int, desc: str, unit: str = "step"):
    """A tqdm bar (or None when disabled)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit=unit, unit_scale=True, dynamic_ncols=True, desc=desc, mininterval=0.5)
