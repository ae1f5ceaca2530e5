"""Seeding: one explicit torch.Generator per consumer, derived from the run seed."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """Seed Python, NumPy and torch's global RNGs and return a fresh generator on ``device``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]  # torch stub gap: its seed is unannotated
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def rng_state() -> dict[str, Any]:
    """Global RNG states (Python, NumPy, torch CPU) for checkpoints."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
