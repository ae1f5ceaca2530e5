"""d4rl stand-in for the official RAVL code: ``qlearning_dataset`` on ctrl_rl's D4RL-layout files (ravl_shim)."""

from ravl_shim import qlearning_dataset

__all__ = ["qlearning_dataset"]
