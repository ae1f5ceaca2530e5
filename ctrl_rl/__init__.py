"""ctrl_rl: reinforcement learning for control and robotics, from parallel simulation to a deployed policy."""

__version__ = "0.1.0"
