"""Torch-native batched simulators: whole batches of envs as tensors on CPU or GPU.

Each class satisfies ``ctrl_rl.envs.protocol.BatchedEnv``; ``TORCH_ENVS`` maps the names used in
env ids (``torch:Pendulum``) to the classes. ``gym_wrapper.SingleEnvGym`` gives one env the
single-env gymnasium API (import it from its module; it pulls in gymnasium).
"""

from ctrl_rl.envs.torch_envs.base import TorchEnv
from ctrl_rl.envs.torch_envs.cartpole import CartPole
from ctrl_rl.envs.torch_envs.mountain_car import MountainCarContinuous
from ctrl_rl.envs.torch_envs.pendulum import Pendulum
from ctrl_rl.envs.torch_envs.reacher import Reacher

TORCH_ENVS: dict[str, type[TorchEnv]] = {
    "Pendulum": Pendulum,
    "CartPole": CartPole,
    "MountainCarContinuous": MountainCarContinuous,
    "Reacher": Reacher,
}

__all__ = ["TORCH_ENVS", "CartPole", "MountainCarContinuous", "Pendulum", "Reacher", "TorchEnv"]
