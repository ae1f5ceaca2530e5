"""Data-parallel helpers over torch.distributed (gloo on CPU, nccl on CUDA), launched by torchrun."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


SINGLE_PROCESS = DistInfo()  # the train functions' default: one process (frozen, so one shared instance is safe)


def init_from_env(device: str) -> DistInfo:
    """Join the process group torchrun describes in the environment (WORLD_SIZE > 1), else single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size())


def all_reduce_mean_(tensors: list[torch.Tensor]) -> None:
    """Average a list of tensors across ranks in place, through one flat buffer (one collective call)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def broadcast_module_(module: torch.nn.Module) -> None:
    """Make every rank start from rank 0's parameters and buffers."""
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
