"""DROID-style Franka Panda tabletop manipulation in MuJoCo: ``manip:Reach``, ``manip:Lift``, ``manip:Push``,
``manip:PickPlace``, ``manip:OpenDrawer``.

The robot is the Panda of ``envpool_assets`` in a scene composed in code (``scene.py``), driven at DROID's 15 Hz
by DROID's action spaces through differential IK (``control.py``), with the limits, home pose and action scales of
``ctrl_rl.robots.spec.franka_droid()``. Observations are DROID's proprioception plus the task's privileged object
state (``sim.py``), optionally with DROID's three cameras and the instruction (``config.py``); the tasks' rewards,
success tests and time limits are in ``tasks.py``; scripted experts in ``experts.py``. ``ManipEnv`` (``env.py``)
is the BatchedEnv, in-process or over worker processes (``workers.py``).

Modules:

- ``scene``: the MJCF composition (robot from the installed asset package, table, objects, lights, cameras).
- ``control``: DLS differential IK, rotation helpers.
- ``tasks``: placement, privileged state, rewards, success, instructions, time limits.
- ``sim``: one env (``ManipSim``) and a group with auto-reset and rendering (``SimGroup``), NumPy only.
- ``render``: the offscreen renderer (EGL, OSMesa fallback; shadows and reflections off).
- ``config``: ``ManipConfig``, the options of an id (``manip:Lift,cameras=all,image_size=90x160,language=true``).
- ``workers``: the worker-process pool (``workers=K``).
- ``env``: ``ManipEnv``.
- ``experts``: scripted experts for every task.

Importing this package does not import MuJoCo, and neither does ``manip_spec`` (the registry's ``spec_of``);
building an env does. It sets ``MUJOCO_GL=egl`` when unset, so a
MuJoCo imported afterwards renders offscreen (``render.py`` picks its GL backend itself either way).
"""

import os
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

from ctrl_rl.envs.manipulation.tasks import TASKS  # noqa: E402 -- after MUJOCO_GL, before any mujoco import


def make_manip(task: str, num_envs: int = 1, device: Any = "cpu", seed: int = 0, **options: Any):
    """``ManipEnv(task, ...)``; ``options`` are ``ManipConfig`` fields (``make_env`` passes the id's options)."""
    from ctrl_rl.envs.manipulation.env import ManipEnv

    return ManipEnv(task, num_envs=num_envs, device=device, seed=seed, **options)


def manip_spec(task: str, **options: Any):
    """The spec of ``manip:<task>`` with ``options``, from the task's config and the robot spec (no MuJoCo)."""
    from ctrl_rl.envs.manipulation.env import manip_spec as spec

    return spec(task, **options)


__all__ = ["TASKS", "make_manip", "manip_spec"]
