"""Gymnasium's MuJoCo v5 locomotion tasks as pure torch functions of a batch of simulator arrays (``warp:`` envs).

Each task is a ``WarpTask`` record: the MJCF file that ships with gymnasium, a frozen config whose fields are
gymnasium's own constructor arguments with gymnasium's defaults (``HalfCheetah-v5``: ``frame_skip=5``,
``ctrl_cost_weight=0.1``, ...) plus ``max_episode_steps`` (1000, gymnasium's registration), and four pure functions
of ``Views`` (torch tensors over the simulator's arrays, N worlds):

- ``observe(cfg, v, at_reset) -> [N,O]``: gymnasium's ``_get_obs``;
- ``position(v) -> [N,P]``: what gymnasium differences over a step for the forward velocity (``qpos[0]``; Ant's torso
  ``xpos[:2]``; Humanoid's mass centre ``xipos`` weighted by body mass, ``[:2]``);
- ``reward(cfg, v, action, velocity) -> (reward [N], healthy [N] bool)``: gymnasium's ``_get_rew`` and
  ``is_healthy`` (always healthy for HalfCheetah); the env terminates where ``~healthy`` and
  ``cfg.terminate_when_unhealthy``;
- the reset distribution: ``qpos0 + U(-s, s)`` and ``qvel`` from ``s * N(0, 1)`` (HalfCheetah, Ant) or ``U(-s, s)``
  (Hopper, Walker2d, Humanoid), ``s = reset_noise_scale``, as gymnasium's ``reset_model``.

The formulas are gymnasium 1.x's ``gymnasium/envs/mujoco/*_v5.py``, restated; where a quantity comes from the
simulator at a particular moment, it is read at the same moment: every derived array (``xpos``, ``cinert``, ``cvel``,
``qfrc_actuator``) is the one of the last forward pass inside ``mj_step`` (before the last integration), and
``cfrc_ext`` is recomputed after the ``frame_skip`` steps (gymnasium calls ``mj_rnePostConstraint`` there). At a reset,
gymnasium runs ``mj_resetData`` and ``mj_forward``, which leaves ``cfrc_ext`` at zero and, with ``ctrl = 0`` and
motor-only actuators, ``qfrc_actuator`` at zero: ``observe(..., at_reset=True)`` gives those parts as zeros.

Departures: the simulator is MuJoCo Warp in float32 (gymnasium: MuJoCo in float64), and Humanoid's model asks for
MuJoCo's PGS solver, which MuJoCo Warp does not have: ``solver`` names the Newton solver there (same iterations).
How far trajectories drift from gymnasium's is measured in tests/envs/test_warp.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch


class Views(NamedTuple):
    """The simulator arrays a task reads, as torch tensors of N worlds (views of the simulator's memory)."""

    qpos: torch.Tensor  # [N,nq]
    qvel: torch.Tensor  # [N,nv]
    xpos: torch.Tensor  # [N,nbody,3] body frame positions
    xipos: torch.Tensor  # [N,nbody,3] body centres of mass
    cinert: torch.Tensor  # [N,nbody,10] com-based inertia and mass
    cvel: torch.Tensor  # [N,nbody,6] com-based velocity (rot:lin)
    qfrc_actuator: torch.Tensor  # [N,nv]
    cfrc_ext: torch.Tensor  # [N,nbody,6] com-based external (contact) force
    body_mass: torch.Tensor  # [nbody]


# ---- configs: gymnasium's v5 constructor arguments and defaults ----------------------------------------------------


@dataclass(frozen=True)
class HalfCheetahConfig:
    """``HalfCheetah-v5``'s arguments (gymnasium's defaults)."""

    frame_skip: int = 5  # MuJoCo steps per env step (dt = 0.01 s x 5)
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 0.1
    reset_noise_scale: float = 0.1
    exclude_current_positions_from_observation: bool = True  # drop qpos[0] (x)
    max_episode_steps: int = 1000  # gymnasium's registration


@dataclass(frozen=True)
class HopperConfig:
    """``Hopper-v5``'s arguments (gymnasium's defaults)."""

    frame_skip: int = 4
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    terminate_when_unhealthy: bool = True
    healthy_state_range: tuple[float, float] = (-100.0, 100.0)  # bounds of qpos[2:] and qvel, exclusive
    healthy_z_range: tuple[float, float] = (0.7, float("inf"))  # bounds of the torso height qpos[1], exclusive
    healthy_angle_range: tuple[float, float] = (-0.2, 0.2)  # bounds of the torso angle qpos[2], exclusive
    reset_noise_scale: float = 5e-3
    exclude_current_positions_from_observation: bool = True
    max_episode_steps: int = 1000


@dataclass(frozen=True)
class Walker2dConfig:
    """``Walker2d-v5``'s arguments (gymnasium's defaults)."""

    frame_skip: int = 4
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    terminate_when_unhealthy: bool = True
    healthy_z_range: tuple[float, float] = (0.8, 2.0)  # exclusive
    healthy_angle_range: tuple[float, float] = (-1.0, 1.0)  # exclusive
    reset_noise_scale: float = 5e-3
    exclude_current_positions_from_observation: bool = True
    max_episode_steps: int = 1000


@dataclass(frozen=True)
class AntConfig:
    """``Ant-v5``'s arguments (gymnasium's defaults; ``main_body`` is the torso, body 1)."""

    frame_skip: int = 5
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 0.5
    contact_cost_weight: float = 5e-4
    healthy_reward: float = 1.0
    terminate_when_unhealthy: bool = True
    healthy_z_range: tuple[float, float] = (0.2, 1.0)  # bounds of qpos[2], inclusive (gymnasium's Ant only)
    contact_force_range: tuple[float, float] = (-1.0, 1.0)  # cfrc_ext is clipped to it (cost and observation)
    reset_noise_scale: float = 0.1
    exclude_current_positions_from_observation: bool = True  # drop qpos[:2] (x, y)
    include_cfrc_ext_in_observation: bool = True
    max_episode_steps: int = 1000


@dataclass(frozen=True)
class HumanoidConfig:
    """``Humanoid-v5``'s arguments (gymnasium's defaults)."""

    frame_skip: int = 5
    forward_reward_weight: float = 1.25
    ctrl_cost_weight: float = 0.1
    contact_cost_weight: float = 5e-7
    contact_cost_range: tuple[float, float] = (float("-inf"), 10.0)  # the summed contact cost is clipped to it
    healthy_reward: float = 5.0
    terminate_when_unhealthy: bool = True
    healthy_z_range: tuple[float, float] = (1.0, 2.0)  # exclusive
    reset_noise_scale: float = 1e-2
    exclude_current_positions_from_observation: bool = True
    include_cinert_in_observation: bool = True
    include_cvel_in_observation: bool = True
    include_qfrc_actuator_in_observation: bool = True
    include_cfrc_ext_in_observation: bool = True
    max_episode_steps: int = 1000


# ---- shared terms ----------------------------------------------------------------------------------------------------


def _ctrl_cost(weight: float, action: torch.Tensor) -> torch.Tensor:
    return weight * action.square().sum(dim=1)  # [N]


def _inside(x: torch.Tensor, bounds: tuple[float, float], inclusive: bool = False) -> torch.Tensor:
    low, high = bounds
    return (low <= x) & (x <= high) if inclusive else (low < x) & (x < high)


def _planar_obs(cfg: Any, v: Views, clip_qvel: bool) -> torch.Tensor:
    """HalfCheetah, Hopper, Walker2d: ``qpos`` (without x when excluded) and ``qvel`` (clipped to +-10 for the two
    hoppers, as gymnasium)."""
    qpos = v.qpos[:, 1:] if cfg.exclude_current_positions_from_observation else v.qpos  # [N,nq-1]
    qvel = v.qvel.clamp(-10.0, 10.0) if clip_qvel else v.qvel  # [N,nv]
    return torch.cat([qpos, qvel], dim=1)  # [N,O]


def _x_position(v: Views) -> torch.Tensor:
    return v.qpos[:, :1]  # [N,1]


def _forward_and_survive(cfg: Any, action: torch.Tensor, velocity: torch.Tensor, healthy: torch.Tensor
                         ) -> torch.Tensor:
    """``forward_reward_weight * x_velocity + healthy_reward * healthy - ctrl_cost`` (the hoppers' reward)."""
    return (cfg.forward_reward_weight * velocity[:, 0] + cfg.healthy_reward * healthy.float()
            - _ctrl_cost(cfg.ctrl_cost_weight, action))  # [N]


# ---- HalfCheetah ----------------------------------------------------------------------------------------------------


def _cheetah_obs(cfg: HalfCheetahConfig, v: Views, at_reset: bool) -> torch.Tensor:
    return _planar_obs(cfg, v, clip_qvel=False)


def _cheetah_reward(cfg: HalfCheetahConfig, v: Views, action: torch.Tensor, velocity: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    reward = cfg.forward_reward_weight * velocity[:, 0] - _ctrl_cost(cfg.ctrl_cost_weight, action)  # [N]
    return reward, torch.ones_like(reward, dtype=torch.bool)


# ---- Hopper ----------------------------------------------------------------------------------------------------------


def _hopper_obs(cfg: HopperConfig, v: Views, at_reset: bool) -> torch.Tensor:
    return _planar_obs(cfg, v, clip_qvel=True)


def _hopper_reward(cfg: HopperConfig, v: Views, action: torch.Tensor, velocity: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    state = torch.cat([v.qpos[:, 2:], v.qvel], dim=1)  # [N,nq-2+nv], gymnasium's state_vector()[2:]
    healthy = (_inside(state, cfg.healthy_state_range).all(dim=1)
               & _inside(v.qpos[:, 1], cfg.healthy_z_range) & _inside(v.qpos[:, 2], cfg.healthy_angle_range))  # [N]
    return _forward_and_survive(cfg, action, velocity, healthy), healthy


# ---- Walker2d --------------------------------------------------------------------------------------------------------


def _walker_obs(cfg: Walker2dConfig, v: Views, at_reset: bool) -> torch.Tensor:
    return _planar_obs(cfg, v, clip_qvel=True)


def _walker_reward(cfg: Walker2dConfig, v: Views, action: torch.Tensor, velocity: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    healthy = _inside(v.qpos[:, 1], cfg.healthy_z_range) & _inside(v.qpos[:, 2], cfg.healthy_angle_range)  # [N]
    return _forward_and_survive(cfg, action, velocity, healthy), healthy


# ---- Ant -------------------------------------------------------------------------------------------------------------


def _ant_contact_forces(cfg: AntConfig, v: Views, at_reset: bool) -> torch.Tensor:
    forces = torch.zeros_like(v.cfrc_ext) if at_reset else v.cfrc_ext  # [N,nbody,6]
    return forces.clamp(*cfg.contact_force_range)  # [N,nbody,6]


def _ant_obs(cfg: AntConfig, v: Views, at_reset: bool) -> torch.Tensor:
    parts = [v.qpos[:, 2:] if cfg.exclude_current_positions_from_observation else v.qpos, v.qvel]
    if cfg.include_cfrc_ext_in_observation:
        parts.append(_ant_contact_forces(cfg, v, at_reset)[:, 1:].flatten(1))  # [N,(nbody-1)*6], no world body
    return torch.cat(parts, dim=1)  # [N,O]


def _ant_position(v: Views) -> torch.Tensor:
    return v.xpos[:, 1, :2]  # [N,2] the torso's x, y


def _ant_reward(cfg: AntConfig, v: Views, action: torch.Tensor, velocity: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    healthy = torch.isfinite(torch.cat([v.qpos, v.qvel], dim=1)).all(dim=1) & _inside(
        v.qpos[:, 2], cfg.healthy_z_range, inclusive=True)  # [N]
    contact_cost = cfg.contact_cost_weight * _ant_contact_forces(cfg, v, False).square().sum(dim=(1, 2))  # [N]
    reward = _forward_and_survive(cfg, action, velocity, healthy) - contact_cost  # [N]
    return reward, healthy


# ---- Humanoid --------------------------------------------------------------------------------------------------------


def _humanoid_obs(cfg: HumanoidConfig, v: Views, at_reset: bool) -> torch.Tensor:
    parts = [v.qpos[:, 2:] if cfg.exclude_current_positions_from_observation else v.qpos, v.qvel]
    if cfg.include_cinert_in_observation:
        parts.append(v.cinert[:, 1:].flatten(1))  # [N,(nbody-1)*10]
    if cfg.include_cvel_in_observation:
        parts.append(v.cvel[:, 1:].flatten(1))  # [N,(nbody-1)*6]
    if cfg.include_qfrc_actuator_in_observation:
        actuator = v.qfrc_actuator[:, 6:]  # [N,nv-6], without the free joint
        parts.append(torch.zeros_like(actuator) if at_reset else actuator)
    if cfg.include_cfrc_ext_in_observation:
        contact = v.cfrc_ext[:, 1:].flatten(1)  # [N,(nbody-1)*6]
        parts.append(torch.zeros_like(contact) if at_reset else contact)
    return torch.cat(parts, dim=1)  # [N,O]


def _mass_centre(v: Views) -> torch.Tensor:
    return (v.body_mass[:, None] * v.xipos).sum(dim=1)[:, :2] / v.body_mass.sum()  # [N,2]


def _humanoid_reward(cfg: HumanoidConfig, v: Views, action: torch.Tensor, velocity: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    healthy = _inside(v.qpos[:, 2], cfg.healthy_z_range)  # [N]
    contact_cost = (cfg.contact_cost_weight * v.cfrc_ext.square().sum(dim=(1, 2))).clamp(*cfg.contact_cost_range)  # [N]
    reward = _forward_and_survive(cfg, action, velocity, healthy) - contact_cost  # [N]
    return reward, healthy


# ---- the task table -------------------------------------------------------------------------------------------------


def _obs_size(nq: int, nv: int, nbody: int, skip: int, per_body: int = 0, actuator: int = 0) -> int:
    return nq - skip + nv + (nbody - 1) * per_body + actuator


@dataclass(frozen=True)
class WarpTask:
    """One Gymnasium v5 task on MuJoCo Warp (see the module docstring).

    Attributes:
        xml_file: the MJCF in gymnasium's ``envs/mujoco/assets``.
        config: its config class (gymnasium's arguments and defaults).
        obs_dim: ``obs_dim(cfg, nq, nv, nbody) -> O``.
        observe, position, reward: the pure functions of the module docstring.
        qvel_noise: the reset distribution of ``qvel`` around zero.
        contact_forces: whether the task reads ``cfrc_ext`` (the env then recomputes it after the physics steps).
        reset_kinematics: whether the observation or ``position`` of a fresh state needs body positions (the env then
            runs MuJoCo Warp's kinematics on it, as gymnasium's ``mj_forward`` at reset).
        solver: MuJoCo's solver to use instead of the model's (``"newton"``), or None for the model's own.
    """

    xml_file: str
    config: type
    obs_dim: Callable[[Any, int, int, int], int]
    observe: Callable[[Any, Views, bool], torch.Tensor]
    position: Callable[[Views], torch.Tensor]
    reward: Callable[[Any, Views, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    qvel_noise: Literal["uniform", "normal"]
    contact_forces: bool = False
    reset_kinematics: bool = False
    solver: Literal["newton"] | None = None


def _planar_dim(cfg: Any, nq: int, nv: int, nbody: int) -> int:
    return _obs_size(nq, nv, nbody, int(cfg.exclude_current_positions_from_observation))


def _ant_dim(cfg: AntConfig, nq: int, nv: int, nbody: int) -> int:
    return _obs_size(nq, nv, nbody, 2 * cfg.exclude_current_positions_from_observation,
                     6 * cfg.include_cfrc_ext_in_observation)


def _humanoid_dim(cfg: HumanoidConfig, nq: int, nv: int, nbody: int) -> int:
    per_body = (10 * cfg.include_cinert_in_observation + 6 * cfg.include_cvel_in_observation
                + 6 * cfg.include_cfrc_ext_in_observation)
    return _obs_size(nq, nv, nbody, 2 * cfg.exclude_current_positions_from_observation, per_body,
                     (nv - 6) * cfg.include_qfrc_actuator_in_observation)


TASKS: dict[str, WarpTask] = {
    "HalfCheetah-v5": WarpTask("half_cheetah.xml", HalfCheetahConfig, _planar_dim, _cheetah_obs, _x_position,
                               _cheetah_reward, "normal"),
    "Hopper-v5": WarpTask("hopper.xml", HopperConfig, _planar_dim, _hopper_obs, _x_position, _hopper_reward,
                          "uniform"),
    "Walker2d-v5": WarpTask("walker2d_v5.xml", Walker2dConfig, _planar_dim, _walker_obs, _x_position, _walker_reward,
                            "uniform"),
    "Ant-v5": WarpTask("ant.xml", AntConfig, _ant_dim, _ant_obs, _ant_position, _ant_reward, "normal",
                       contact_forces=True, reset_kinematics=True),
    "Humanoid-v5": WarpTask("humanoid.xml", HumanoidConfig, _humanoid_dim, _humanoid_obs, _mass_centre,
                            _humanoid_reward, "uniform", contact_forces=True, reset_kinematics=True, solver="newton"),
}
