"""Torch-native batched simulators: whole batches of envs as tensors on CPU or GPU.

Each class satisfies ``ctrl_rl.envs.protocol.BatchedEnv``. ``TORCH_ENVS`` maps the names used in env
ids (``torch:Pendulum``) to the simulators with a flat float32 observation; ``TORCH_PIXEL_ENVS`` those
whose observation has several parts (camera images, ``spec.parts``). ``make_env`` builds both alike (and
``spec_of`` reads their ``static_spec`` without building one);
they are kept apart because ``gym_wrapper.SingleEnvGym`` (the single-env gymnasium API; import it from
its module, it pulls in gymnasium) and the gymnasium-style tests cover flat observations only.
"""

from ctrl_rl.envs.torch_envs.base import TorchEnv
from ctrl_rl.envs.torch_envs.cartpole import CartPole
from ctrl_rl.envs.torch_envs.mountain_car import MountainCarContinuous
from ctrl_rl.envs.torch_envs.pendulum import Pendulum
from ctrl_rl.envs.torch_envs.point_mass import PointMass, PointMassPixels
from ctrl_rl.envs.torch_envs.reacher import Reacher

TORCH_ENVS: dict[str, type[TorchEnv]] = {
    "Pendulum": Pendulum,
    "CartPole": CartPole,
    "MountainCarContinuous": MountainCarContinuous,
    "Reacher": Reacher,
    "PointMass": PointMass,
}

TORCH_PIXEL_ENVS: dict[str, type[TorchEnv]] = {
    "PointMassPixels": PointMassPixels,
}

__all__ = [
    "TORCH_ENVS", "TORCH_PIXEL_ENVS", "CartPole", "MountainCarContinuous", "Pendulum", "PointMass", "PointMassPixels",
    "Reacher", "TorchEnv",
]
