"""Batched environments: the BatchedEnv protocol, backends, wrappers and check_env."""

from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec, StepOut

__all__ = ["BatchedEnv", "EnvSpec", "StepOut", "make_env"]


def make_env(*args, **kwargs):
    """Build a BatchedEnv from an id such as ``torch:Pendulum`` or ``HalfCheetah-v5`` (see registry.make_env)."""
    from ctrl_rl.envs.registry import make_env as _make_env

    return _make_env(*args, **kwargs)
