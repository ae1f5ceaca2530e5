"""MuJoCo's Python bindings as one typed object, for the modules that call MuJoCo directly.

``mujoco`` ships no type information for its compiled modules (``mujoco._structs``, ``_functions``, ``_enums``,
``_render``: no ``.pyi`` files), and ``mujoco/__init__.py`` star-imports every binding from them, so a type
checker knows none of ``MjData``, ``mj_step`` or ``mjtObj``. ``import_mujoco()`` returns the package itself, typed
as ``MuJoCo``: a protocol that names every binding ctrl_rl uses, so that a misspelt name is caught and the list
of what ctrl_rl relies on is in one place. Add a name here before using it. The members are ``Any`` (structs,
enums) or ``Callable[..., Any]`` (functions): the bindings have no signatures to take more from.

The import stays lazy, a call rather than a module-level import: ``MUJOCO_GL`` must be set before mujoco is first
imported (``ctrl_rl.envs.manipulation.render``), and importing ``ctrl_rl.envs`` must not need mujoco.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast


class MuJoCo(Protocol):
    """The bindings of the ``mujoco`` package that ctrl_rl uses."""

    # structs (their classes: constructors, ``MjSpec.from_string``)
    MjModel: Any
    MjData: Any
    MjSpec: Any
    MjvScene: Any
    MjvOption: Any
    MjvCamera: Any
    MjrContext: Any
    MjrRect: Any
    # enums
    mjtObj: Any
    mjtTrn: Any
    mjtLimited: Any
    mjtCamera: Any
    mjtCatBit: Any
    mjtRndFlag: Any
    mjtFontScale: Any
    mjtFramebuffer: Any
    # simulation
    mj_step: Callable[..., Any]
    mj_forward: Callable[..., Any]
    mj_rnePostConstraint: Callable[..., Any]
    mj_resetData: Callable[..., Any]
    mj_setConst: Callable[..., Any]
    mj_kinematics: Callable[..., Any]
    mj_comPos: Callable[..., Any]
    mj_jacSite: Callable[..., Any]
    mj_id2name: Callable[..., Any]
    mj_name2id: Callable[..., Any]
    mju_mat2Quat: Callable[..., Any]
    mju_quat2Mat: Callable[..., Any]
    get_mju_user_warning: Callable[..., Any]
    set_mju_user_warning: Callable[..., Any]
    # rendering
    mjv_updateScene: Callable[..., Any]
    mjr_setBuffer: Callable[..., Any]
    mjr_render: Callable[..., Any]
    mjr_readPixels: Callable[..., Any]


def import_mujoco() -> MuJoCo:
    """``import mujoco``, typed as ``MuJoCo`` (an ``ImportError`` when mujoco is not installed)."""
    import mujoco

    return cast(MuJoCo, mujoco)
