"""Shims that run reference implementations (d3rlpy, Stable-Baselines3) for the comparisons under experiments/."""
