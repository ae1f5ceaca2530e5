"""Robots as plain data, on the ground floor: specs (joints, limits, rates, action spaces) and the safety filter.

Nothing here imports another ctrl_rl package except ``ctrl_rl.errors``: the simulated tasks (``envs``), the
VLA data and the deployment application (``ctrl_rl.deploy``) all read these files.
"""
