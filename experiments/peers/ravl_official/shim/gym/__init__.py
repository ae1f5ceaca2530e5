"""gym 0.23 stand-in for the official RAVL code: ``make`` gives a Gymnasium v5 env behind gym 0.23's API
(ravl_shim.GymEnv); ``Env`` is there for the official code's type hints."""

from gymnasium import Env
from ravl_shim import GymEnv


def make(name: str, **kwargs) -> GymEnv:
    return GymEnv(name, **kwargs)


__all__ = ["Env", "make"]
