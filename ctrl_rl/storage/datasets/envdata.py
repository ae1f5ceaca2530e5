"""Offline data opened for an env: loaded, checked against the env's observation and action sizes, its actions
mapped from the env's units to the agent's [-1, 1], clipped.

Datasets store actions in the env's own units (what the env's ``step`` took: Pendulum's torque in [-2, 2], a
robot's joint velocities in rad/s), while agents act in [-1, 1] and the training env's ``ActionRescale`` maps that
interval onto the env's bounds (``envs.wrappers``). ``to_agent_units`` is that map's inverse and the one place a
dataset's actions change units; every loop that trains on a dataset reads it through ``open_dataset``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.registry import spec_of
from ctrl_rl.envs.wrappers import action_affine
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.loader import load_dataset
from ctrl_rl.storage.datasets.offline import OfflineDataset

BOUNDS_TOLERANCE = 1e-6
"""How far past [-1, 1] (in agent units) a mapped action may lie and still count as inside the bounds: float32
rounding of data recorded at the bounds."""

CLIP_FLAG = "--clip-dataset-actions"


def _fmt(values: tuple[float, ...]) -> str:
    return f"{values[0]:g}" if len(set(values)) == 1 else "[" + ", ".join(f"{v:g}" for v in values) + "]"


def unit_bounds(spec: EnvSpec) -> bool:
    """Whether ``spec``'s continuous actions are bounded by exactly -1 and 1 in every dimension (the MuJoCo
    locomotion tasks): there the env's units are the agent's."""
    A = spec.action_dim
    return not spec.discrete and spec.action_low == (-1.0,) * A and spec.action_high == (1.0,) * A


def to_agent_units(action: torch.Tensor, spec: EnvSpec, dataset: str, clip: bool) -> tuple[torch.Tensor, int]:
    """Dataset actions ``[S,A]`` in ``spec``'s units (the env's own spec, ``spec_of``: not the training env's
    rescaled one) mapped to the agent's [-1, 1]: ``a = 2 (a_env - low) / (high - low) - 1`` per dimension with
    finite bounds (``ActionRescale``'s inverse, written ``(a_env - bias) / scale``); dimensions with an infinite
    bound pass through. Returns ``(actions, rows clipped)``.

    Bounds of exactly +-1 everywhere (MuJoCo locomotion) give ``action`` itself, so those runs stay bit-identical;
    a discrete action space is left alone. A row with a dimension past the bounds (by more than
    ``BOUNDS_TOLERANCE`` in agent units) is refused in one sentence naming ``dataset``, the rows and the largest
    excess in env units, or, with ``clip``, clipped to the bounds and counted.
    """
    if spec.discrete or not action.is_floating_point():
        return action, 0
    assert action.ndim == 2 and action.shape[1] == spec.action_dim, \
        f"expected dataset actions [S,{spec.action_dim}], got {tuple(action.shape)}"
    finite, half, mid = action_affine(spec, torch.float64)  # [A] each: ActionRescale's map, inverted below
    agent = action if unit_bounds(spec) else ((action.double() - mid) / half).to(action.dtype)  # [S,A]
    bad = (agent.abs() > 1 + BOUNDS_TOLERANCE) & finite  # [S,A]
    rows = int(bad.any(1).sum())
    if rows == 0:
        return agent, 0
    excess = float(((agent.double().abs() - 1) * half)[bad].max())  # env units
    where = f"the bounds of env {spec.env_id!r} (low {_fmt(spec.action_low)}, high {_fmt(spec.action_high)})"
    if not clip:
        raise UserInputError(f"dataset {dataset} has {rows} of {action.shape[0]} actions outside {where}, by up to "
                             f"{excess:.6g} in env units: expected actions in the env's units inside its bounds, or "
                             f"pass {CLIP_FLAG} to clip them to the bounds")
    if agent is action:
        agent = action.clone()
    agent = torch.where(finite, agent.clamp(-1.0, 1.0), agent)  # [S,A]
    print(f"clipped {rows} of {action.shape[0]} dataset actions to the env's bounds ({CLIP_FLAG}; by up to "
          f"{excess:.6g} in env units): dataset {dataset}, {where}", flush=True)
    return agent, rows


def open_dataset(dataset: str, env_id: str, action_clip: float | None, clip_to_bounds: bool = False,
                 view: Literal["qlearning", "trajectory"] = "qlearning") -> OfflineDataset:
    """``--dataset`` for training in ``env_id``: checked against the env's sizes, its actions in the agent's units
    (``to_agent_units`` with the env's own bounds; ``clip_to_bounds``: ``--clip-dataset-actions``), then clipped to
    +-``action_clip`` (the loop's ``--clip-actions``, inside tanh's open range). ``view="qlearning"``: a file
    through the ``qlearning`` view (exactly ``d4rl.qlearning_dataset``), a Minari or LeRobot dataset through its
    episodes; ``"trajectory"``: whole episodes of any source."""
    spec = spec_of(env_id)
    source_view = None if view == "qlearning" and not Path(dataset).is_file() else view  # Minari/LeRobot: episodes
    ds = load_dataset(dataset, view=source_view, obs_dim=spec.obs_dim, action_dim=spec.action_dim)
    ds.action, clipped = to_agent_units(ds.action, spec, dataset, clip_to_bounds)
    ds.metadata["action_units"] = "agent"
    ds.metadata["actions_clipped"] = clipped
    if action_clip is not None:
        ds.action.clamp_(-action_clip, action_clip)
    return ds
