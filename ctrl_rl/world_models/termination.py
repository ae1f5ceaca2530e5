"""Termination functions of the Gymnasium MuJoCo v5 locomotion tasks, as batched torch functions.

A model rollout (MOPO, RAVL) needs the task's ``terminated`` for states the model invents. Each function here is
``fn(obs [...,O], act [...,A], next_obs [...,O]) -> bool [...]`` and computes, from ``next_obs`` alone, the
env's own ``terminated = not is_healthy`` with the v5 default arguments on the v5 default observation layout
(``exclude_current_positions_from_observation=True``: the root x, and for Ant also y, are not observed).
``obs`` and ``act`` are accepted for the common signature and unused. Leading dims are free (``[N,O]`` or
``[E,B,O]``); comparisons run in the input's dtype, on its device, with no host sync.

What each task checks (gymnasium 1.x ``*_v5.py``, ``is_healthy``; bounds strict unless said):

=============  ===========================================================  ====================================
task           health check of the env                                      from the observation
=============  ===========================================================  ====================================
Hopper-v5      ``0.7 < qpos[1] < inf``, ``-0.2 < qpos[2] < 0.2``,            obs[0] = qpos[1], obs[1] = qpos[2],
               every element of ``state_vector()[2:]`` (``qpos[2:]`` and     obs[1:5] = qpos[2:]; obs[5:] is
               the *unclipped* ``qvel``) in ``(-100, 100)``                  ``clip(qvel, -10, 10)`` (see below)
Walker2d-v5    ``0.8 < qpos[1] < 2.0``, ``-1 < qpos[2] < 1``                 obs[0], obs[1]: exact
HalfCheetah-v5 never terminates                                             --
Ant-v5         ``state_vector()`` (qpos, qvel) all finite and                obs[0] = qpos[2], obs[:27] =
               ``0.2 <= qpos[2] <= 1.0`` (closed interval)                   (qpos[2:], qvel); obs[27:] are
                                                                            contact forces, not checked
=============  ===========================================================  ====================================

Parts of a check that the observation cannot show, and what is done about them:

- Hopper's velocity range: the observation clips ``qvel`` to ``[-10, 10]``, so ``|qvel| >= 100`` cannot be seen;
  a clipped velocity always passes here (the env would terminate on such a velocity, a crash this function misses).
- Ant's finiteness of ``qpos[0:2]`` (x, y): not observed; taken as finite (they integrate velocities that are
  observed, and an infinite position follows from an infinite velocity, which is seen). Ant's check also accepts
  the 27-element observation without contact forces (``include_cfrc_ext_in_observation=False``, envpool's
  ``use_contact_force=False``), since it reads only the first 27 elements.
- Precision: a float32 observation (the project's datasets and models) rounds values; within about 1e-7 of a
  bound the float64 state and its float32 observation can fall on different sides (a float64 observation is
  exact). NaN fails every comparison, so a NaN in a checked element counts as unhealthy, as in the env.

``get_termination(env_id)`` returns the function for ``Hopper-v5``, ``Walker2d-v5``, ``HalfCheetah-v5`` or
``Ant-v5``, with or without a ``gym:``, ``gymnasium:``, ``envpool:`` or ``true:`` prefix (envpool's v5 tasks use
the same defaults and layout). Env options that change the health check or the layout are refused; reward-only
options and ``max_episode_steps`` are not. Shape letters: O obs dim, A action dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ctrl_rl.envs.registry import split_env_options
from ctrl_rl.errors import UserInputError

TerminationFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# id prefixes whose v5 MuJoCo tasks share gymnasium's defaults ("true" is world_models.true_dynamics)
_PREFIXES = ("gym", "gymnasium", "envpool", "true")
# env options that leave the health check and the observation layout alone
_NEUTRAL_OPTIONS = frozenset({"max_episode_steps", "forward_reward_weight", "ctrl_cost_weight", "contact_cost_weight",
                              "healthy_reward", "reset_noise_scale"})


def _state(next_obs: torch.Tensor, sizes: tuple[int, ...], task: str) -> torch.Tensor:
    """``next_obs`` after checking its last dim (metadata only: no host sync)."""
    if next_obs.dim() < 1 or next_obs.shape[-1] not in sizes:
        want = " or ".join(str(s) for s in sizes)
        raise UserInputError(f"{task}'s termination function got next_obs of shape {tuple(next_obs.shape)}: expected "
                             f"a last dim of {want} (the v5 default observation layout).")
    return next_obs


def hopper_termination(obs: torch.Tensor, act: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """Hopper-v5: not (0.7 < z < inf, |angle| < 0.2, every observed qpos[2:] and clipped qvel in (-100, 100)).

    The unclipped velocity half of the range check is not observable (module docstring)."""
    s = _state(next_obs, (11,), "Hopper-v5")  # [...,11]: qpos[1:6], clip(qvel, -10, 10)
    z, angle, rest = s[..., 0], s[..., 1], s[..., 1:]  # [...], [...], [...,10]
    healthy = (z > 0.7) & (z < math.inf) & (angle > -0.2) & (angle < 0.2)  # [...]
    healthy &= ((rest > -100.0) & (rest < 100.0)).all(dim=-1)
    return ~healthy


def walker2d_termination(obs: torch.Tensor, act: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """Walker2d-v5: not (0.8 < z < 2.0 and -1 < angle < 1); exact from the observation."""
    s = _state(next_obs, (17,), "Walker2d-v5")  # [...,17]: qpos[1:9], clip(qvel, -10, 10)
    z, angle = s[..., 0], s[..., 1]  # [...]
    return ~((z > 0.8) & (z < 2.0) & (angle > -1.0) & (angle < 1.0))


def halfcheetah_termination(obs: torch.Tensor, act: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """HalfCheetah-v5 never terminates: all False."""
    s = _state(next_obs, (17,), "HalfCheetah-v5")
    return torch.zeros(s.shape[:-1], dtype=torch.bool, device=s.device)  # [...]


def ant_termination(obs: torch.Tensor, act: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
    """Ant-v5: not (qpos[2:], qvel all finite and 0.2 <= z <= 1.0); contact forces (obs[27:]) are not checked,
    as in the env; the unobserved x, y are taken as finite (module docstring)."""
    s = _state(next_obs, (105, 27), "Ant-v5")[..., :27]  # [...,27]: qpos[2:15], qvel[0:14]
    z = s[..., 0]  # [...]
    return ~(torch.isfinite(s).all(dim=-1) & (z >= 0.2) & (z <= 1.0))


TERMINATIONS: dict[str, TerminationFn] = {
    "Hopper-v5": hopper_termination,
    "Walker2d-v5": walker2d_termination,
    "HalfCheetah-v5": halfcheetah_termination,
    "Ant-v5": ant_termination,
}


def _task(env_id: str) -> tuple[str, dict]:
    """(bare task id, options) of ``env_id``; a known prefix is dropped."""
    base, options = split_env_options(env_id)
    prefix, sep, name = base.partition(":")
    return (name if sep and prefix in _PREFIXES else base), options


def has_termination(env_id: str) -> bool:
    """True if ``get_termination(env_id)`` returns a function (never raises)."""
    try:
        task, options = _task(env_id)
    except UserInputError:
        return False
    return task in TERMINATIONS and set(options) <= _NEUTRAL_OPTIONS


def get_termination(env_id: str) -> TerminationFn:
    """The termination function of ``env_id`` (``Hopper-v5``, ``gym:Walker2d-v5``, ``envpool:Ant-v5``, ...)."""
    task, options = _task(env_id)
    if task not in TERMINATIONS:
        raise UserInputError(f"env {env_id!r} has no termination function: expected one of "
                             f"{', '.join(TERMINATIONS)} (Gymnasium MuJoCo v5 layout), or --learn-termination to "
                             f"learn one from the dataset's terminals.")
    changed = sorted(set(options) - _NEUTRAL_OPTIONS)
    if changed:
        raise UserInputError(f"env {env_id!r} sets {', '.join(changed)}, which the {task} termination function does "
                             f"not follow: expected the task's default health check and observation layout, or "
                             f"--learn-termination to learn one from the dataset's terminals.")
    return TERMINATIONS[task]


__all__ = ["TERMINATIONS", "TerminationFn", "ant_termination", "get_termination", "halfcheetah_termination",
           "has_termination", "hopper_termination", "walker2d_termination"]
