"""Process set-up shared by the training loops: the device, torch threads and the allocator."""

from __future__ import annotations

import torch

from ctrl_rl.core.perf import tune_allocator
from ctrl_rl.errors import UserInputError


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
