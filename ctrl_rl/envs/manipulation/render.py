"""Offscreen camera rendering for the manipulation tasks, one OpenGL context per process.

Backend: EGL (``MUJOCO_GL=egl`` is set when unset, before ``mujoco`` is first imported by this package; on a CPU
machine EGL runs on Mesa's llvmpipe), falling back to OSMesa when an EGL context cannot be made. Shadows and
reflections are off (``scene.flags[mjRND_SHADOW]`` / ``[mjRND_REFLECTION]``): with them a 180x320 frame takes
0.6-0.9 s instead of ~0.1 s on this kind of machine (``shared/research/dependencies.md``, "Offscreen rendering").

``CameraRenderer`` owns one context, one ``MjrContext`` (meshes, textures: identical for every env of a task, since
domain randomisation changes colours, lights, cameras, friction and mass, never geometry or textures) and one
``MjvScene``. ``render(model, data, camera)`` builds the scene from *that env's* model and data, so per-env
randomised colours, lights and camera poses show up while the GPU-side assets are shared. Images come out uint8
``[3,H,W]`` (channels first, row 0 at the top). Call ``close()`` to free the context (``ManipEnv.close`` does).
"""

from __future__ import annotations

import os

import numpy as np

from ctrl_rl.envs.mujoco_bindings import import_mujoco

os.environ.setdefault("MUJOCO_GL", "egl")


def _gl_context(width: int, height: int):
    """An offscreen GL context: the backend ``MUJOCO_GL`` names (egl by default), else OSMesa."""
    backend = os.environ.get("MUJOCO_GL", "egl").lower()
    errors = []
    for name in dict.fromkeys((backend, "osmesa")):  # the chosen backend first, osmesa as the fallback
        try:
            if name == "egl":
                from mujoco.egl import GLContext
            elif name == "osmesa":
                from mujoco.osmesa import GLContext
            else:
                from mujoco.glfw import GLContext
            ctx = GLContext(width, height)
            ctx.make_current()
            return ctx
        except Exception as e:  # noqa: BLE001 -- any failure of one backend means: try the next
            errors.append(f"{name}: {type(e).__name__}: {e}")
    raise RuntimeError("no offscreen OpenGL context could be made for the manip: cameras (" + "; ".join(errors)
                       + "): expected EGL (libegl1 with Mesa) or OSMesa (libosmesa6).")


class CameraRenderer:
    """Renders named cameras of any env of one task at ``height x width`` (see the module docstring)."""

    def __init__(self, model, height: int, width: int) -> None:
        mujoco = import_mujoco()

        if width > model.vis.global_.offwidth or height > model.vis.global_.offheight:
            raise ValueError(f"image {height}x{width} exceeds the offscreen buffer "
                             f"{model.vis.global_.offheight}x{model.vis.global_.offwidth}.")
        self.height, self.width = int(height), int(width)
        self._gl = _gl_context(self.width, self.height)
        self._mjr = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._mjr)
        self._scene = mujoco.MjvScene(model, maxgeom=1000)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._opt = mujoco.MjvOption()
        self._opt.sitegroup[:] = 0  # sites (the end-effector and handle markers) are not part of the scene
        self._cam = mujoco.MjvCamera()
        self._cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._rect = mujoco.MjrRect(0, 0, self.width, self.height)
        self._rgb = np.empty((self.height, self.width, 3), dtype=np.uint8)  # [H,W,3] GL's bottom-up rows
        self._mujoco = mujoco

    def render(self, model, data, camera_id: int, out: np.ndarray | None = None) -> np.ndarray:
        """The image of camera ``camera_id`` in ``(model, data)`` as uint8 ``[3,H,W]`` (written into ``out``)."""
        mj, gl = self._mujoco, self._gl
        if gl is None:
            raise RuntimeError("CameraRenderer.render() after close(): expected a renderer that is still open.")
        gl.make_current()
        self._cam.fixedcamid = camera_id
        mj.mjv_updateScene(model, data, self._opt, None, self._cam, mj.mjtCatBit.mjCAT_ALL, self._scene)
        mj.mjr_render(self._rect, self._scene, self._mjr)
        mj.mjr_readPixels(self._rgb, None, self._rect, self._mjr)
        if out is None:
            out = np.empty((3, self.height, self.width), dtype=np.uint8)  # [3,H,W]
        out[...] = self._rgb[::-1].transpose(2, 0, 1)  # flip rows to top-down, channels first
        return out

    def close(self) -> None:
        gl, mjr = self._gl, self._mjr
        if gl is None or mjr is None:  # closed already (the two are made and dropped together)
            return
        # GL object ids belong to a context: freeing them while another renderer's context is current would
        # delete that renderer's buffers and textures (it then renders black), so this context goes first.
        gl.make_current()
        mjr.free()
        self._mjr = None
        gl.free()
        self._gl = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown: the GL library may be gone already
            pass
