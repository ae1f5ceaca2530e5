"""Batched environments: the BatchedEnv protocol, backends (``backends.py``), the id registry, wrappers, check_env."""

from ctrl_rl.envs.protocol import BatchedEnv, EnvSpec, RobotStateLayout, StepOut

__all__ = ["BatchedEnv", "EnvSpec", "RobotStateLayout", "StepOut", "make_env", "spec_of"]


def make_env(*args, **kwargs):
    """Build a BatchedEnv from an id such as ``torch:Pendulum`` or ``HalfCheetah-v5`` (see registry.make_env)."""
    from ctrl_rl.envs.registry import make_env as _make_env

    return _make_env(*args, **kwargs)


def spec_of(*args, **kwargs):
    """The EnvSpec of an id without building the env where its backend can (see registry.spec_of)."""
    from ctrl_rl.envs.registry import spec_of as _spec_of

    return _spec_of(*args, **kwargs)
