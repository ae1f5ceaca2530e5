"""One MuJoCo tabletop env (``ManipSim``) and a group of them with auto-reset and rendering (``SimGroup``).

NumPy and MuJoCo only (no torch), so worker processes stay light; ``env.py`` turns a group's arrays into tensors.
Conventions (frames, units, joint angles) as in ``scene.py``; actions as in ``control.py``; tasks in ``tasks.py``.

The flat ``state`` vector (float32), in order:

====== ======================= ===========================================================================
index  name                    meaning
====== ======================= ===========================================================================
0:7    joint_position          arm joint angles (rad, Franka's convention, within ``RobotSpec`` limits)
7:13   cartesian_position      end-effector xyz (m, robot base frame) + xyz-extrinsic Euler angles (rad)
13     gripper_position        measured finger closure, 0 open .. 1 closed
14:    privileged              the task's object state (``tasks.TASK_INFO[task].privileged``)
====== ======================= ===========================================================================

A control step (1/15 s) runs 33 physics steps of ~2.02 ms. The arm's joint targets from ``DiffIK`` are not set at
once: the position servo's reference ramps from the measured joints to the target in 8 equal increments over the
step, each with the velocity feed-forward ``kv/kp * dq / T`` (so the servo is a PD on a moving reference). A
step target would saturate the 87 N m shoulder torques for the first third of the step and bend the path (a pure x
command moved the end effector 0.15 of a step in z); the ramp keeps the path straight (tested) and the
motion per step within ~5% of the command below the joint speed limits.

Seeding: env ``i`` of a group draws every episode's randomness (object placement, the instruction phrasing,
domain randomisation) from ``np.random.default_rng([seed, i // group_size])`` (``i`` the global env index), so
results do not depend on how envs are spread over worker processes, and with ``group_size G`` each block of G envs
replays the same episodes.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from ctrl_rl.envs.manipulation import scene, tasks
from ctrl_rl.envs.manipulation.control import DiffIK, euler_to_mat, mat_to_euler
from ctrl_rl.envs.mujoco_bindings import import_mujoco

PROPRIO_DIM = 14
LANGUAGE_LEN = 64
RAMP_CHUNKS = 8


def encode_instruction(text: str, length: int = LANGUAGE_LEN) -> np.ndarray:
    """``[L]`` int64 token ids: the UTF-8 bytes of ``text`` plus 1 (0 is padding), truncated / padded to ``length``."""
    raw = np.frombuffer(text.encode("utf-8")[:length], dtype=np.uint8).astype(np.int64) + 1
    out = np.zeros(length, dtype=np.int64)
    out[: raw.size] = raw
    return out


def decode_instruction(tokens) -> str:
    """The text of ``encode_instruction`` tokens (padding dropped)."""
    t = np.asarray(tokens, dtype=np.int64)
    return bytes((t[t > 0] - 1).astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class ManipSim:
    """One env of a task: model, data, controller, task hooks (see the module docstring).

    Args:
        task: a name from ``tasks.TASKS``.
        cfg: the ``ManipConfig`` (action space, randomisation).
        robot: the ``RobotSpec``.
        base_model: the task's compiled model; copied when the config randomises the model.
    """

    def __init__(self, task: str, cfg, robot, base_model) -> None:
        mujoco = import_mujoco()

        self._mj = mujoco
        self.task, self.cfg, self.robot = task, cfg, robot
        self.model = copy.copy(base_model) if cfg.randomize else base_model
        self._base = base_model
        m = self.model
        self.data = mujoco.MjData(m)
        jid = [m.joint(n).id for n in scene.JOINT_NAMES]
        self.qpos_idx = m.jnt_qposadr[jid].copy()  # [7]
        self.dof_idx = m.jnt_dofadr[jid].copy()  # [7]
        self.finger_idx = m.jnt_qposadr[[m.joint(n).id for n in scene.FINGER_NAMES]].copy()  # [2]
        self.site_id = m.site("end_effector").id
        self.ik = DiffIK(m, self.site_id, self.qpos_idx, self.dof_idx, robot, cfg.action)
        self.camera_ids = {c: m.camera(c).id for c in scene.CAMERAS}
        kp = m.actuator_gainprm[:7, 0]
        self._ff = -m.actuator_biasprm[:7, 2] / kp * robot.control_hz  # [7] feed-forward per (rad / step)
        n = scene.SUBSTEPS
        self._chunks = [n // RAMP_CHUNKS + (1 if i < n % RAMP_CHUNKS else 0) for i in range(RAMP_CHUNKS)]
        self.g_cmd = 0.0
        names = {mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, i) for i in range(m.nbody)}
        self._finger_bodies = (m.body("panda0_leftfinger").id, m.body("panda0_rightfinger").id)
        if "cube" in names:
            self._cube_qpos = m.jnt_qposadr[m.joint("cube").id]
            self._cube_dof = m.jnt_dofadr[m.joint("cube").id]
            self._cube_geom = m.geom("cube").id
        if "target" in names:
            self._target_mocap = m.body_mocapid[m.body("target").id]
        if "cabinet" in names:
            self._cabinet_mocap = m.body_mocapid[m.body("cabinet").id]
            self._drawer_qpos = m.jnt_qposadr[m.joint("drawer").id]
            self._handle_site = m.site("handle").id
        self._cabinet_yaw = 0.0

    # ---- episode ---------------------------------------------------------------------------------------------

    def reset(self, rng: np.random.Generator) -> None:
        mj, m, d = self._mj, self.model, self.data
        mj.mj_resetData(m, d)
        home = np.asarray(self.robot.home, dtype=np.float64)
        if self.cfg.randomize:
            self._randomize(rng)
            mj.mj_setConst(m, d)  # masses changed: refresh the derived constants (without it contacts blow up)
            mj.mj_resetData(m, d)
            home = np.clip(home + rng.uniform(-0.03, 0.03, 7), self.ik.low, self.ik.high)
        d.qpos[self.qpos_idx] = home
        d.qpos[self.finger_idx] = scene.FINGER_OPEN
        d.ctrl[:7] = home
        d.ctrl[7:9] = scene.FINGER_OPEN
        self.g_cmd = 0.0
        tasks.reset_task(self.task, self, rng)
        mj.mj_forward(m, d)

    def step(self, action: np.ndarray) -> None:
        """Advance one control step (1/15 s) with ``action`` ``[A]`` in [-1, 1] (``control.py``)."""
        mj, m, d = self._mj, self.model, self.data
        a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        q0 = d.qpos[self.qpos_idx].copy()  # [7]
        dq = self.ik.joint_targets(d, a[:-1]) - q0  # [7]
        self.g_cmd = min(max(self.g_cmd + self.ik.grip_step * a[-1], 0.0), 1.0)
        d.ctrl[7:9] = scene.FINGER_OPEN * (1.0 - self.g_cmd)
        ff = self._ff * dq  # [7]
        for k, n in enumerate(self._chunks):
            d.ctrl[:7] = np.clip(q0 + dq * ((k + 1) / RAMP_CHUNKS) + ff, self.ik.low, self.ik.high)
            mj.mj_step(m, d, nstep=n)
        mj.mj_kinematics(m, d)  # positions of the new state (mj_step leaves those of its last sub-step's start)
        mj.mj_comPos(m, d)

    # ---- what the tasks and observations read --------------------------------------------------------------------

    @property
    def ee_pos(self) -> np.ndarray:
        return self.data.site_xpos[self.site_id].copy()

    @property
    def ee_rot(self) -> np.ndarray:
        return self.data.site_xmat[self.site_id].reshape(3, 3).copy()

    @property
    def gripper(self) -> float:
        """Measured gripper position: 0 open (both fingers at 0.04 m) .. 1 closed."""
        return float(1.0 - self.data.qpos[self.finger_idx].sum() / (2 * scene.FINGER_OPEN))

    @property
    def target_pos(self) -> np.ndarray:
        return self.data.mocap_pos[self._target_mocap].copy()

    @property
    def cube_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Cube centre ``[3]`` and orientation quaternion ``[4]`` (w, x, y, z; sign chosen with w >= 0)."""
        q = self.data.qpos[self._cube_qpos: self._cube_qpos + 7]
        quat = q[3:7] if q[3] >= 0 else -q[3:7]
        return q[:3].copy(), quat.copy()

    @property
    def handle_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._handle_site].copy()

    @property
    def drawer_opening(self) -> float:
        return float(self.data.qpos[self._drawer_qpos])

    @property
    def pull_dir(self) -> np.ndarray:
        """Unit xy direction the drawer slides out along (the cabinet's -x)."""
        return np.array([-math.cos(self._cabinet_yaw), -math.sin(self._cabinet_yaw)])

    def cube_grasped(self) -> bool:
        """The cube touches both fingers (contacts of the last physics step)."""
        d = self.data
        if d.ncon == 0:
            return False
        geoms = d.contact.geom  # [ncon,2]
        bodies = self.model.geom_bodyid[geoms]  # [ncon,2]
        with_cube = (geoms == self._cube_geom).any(axis=1)  # [ncon]
        other = np.where(geoms[:, 0] == self._cube_geom, bodies[:, 1], bodies[:, 0])[with_cube]
        return bool(np.isin(self._finger_bodies, other).all())

    def set_target(self, pos) -> None:
        self.data.mocap_pos[self._target_mocap] = pos

    def set_cube(self, pos, quat) -> None:
        a = self._cube_qpos
        self.data.qpos[a: a + 3] = pos
        self.data.qpos[a + 3: a + 7] = quat
        self.data.qvel[self._cube_dof: self._cube_dof + 6] = 0.0

    def set_cabinet(self, pos, yaw: float) -> None:
        self._cabinet_yaw = yaw
        self.data.mocap_pos[self._cabinet_mocap] = pos
        self.data.mocap_quat[self._cabinet_mocap] = [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]

    def state(self) -> np.ndarray:
        """The flat ``state`` vector ``[O]`` float32 (layout in the module docstring)."""
        d = self.data
        ee_euler = mat_to_euler(self.ee_rot)
        # roll in [0, 2 pi) rather than DROID's (-pi, pi]: the working orientation (pointing down) has roll pi,
        # where DROID's wrap would flip the input by 2 pi from step to step; the rotation is the same
        ee_euler[0] = ee_euler[0] % (2 * math.pi)
        priv = tasks.privileged(self.task, self)
        return np.concatenate([d.qpos[self.qpos_idx], self.ee_pos, ee_euler, [self.gripper], priv]).astype(np.float32)

    # ---- domain randomisation (``randomize=true``) -----------------------------------------------------------

    def _randomize(self, rng: np.random.Generator) -> None:
        """Colours, lights, camera poses, friction and masses, re-drawn around the nominal model every episode."""
        m, b = self.model, self._base
        # colours: materials (table, cabinet, drawer, floor tint) and geoms without a material; the cube stays
        # red-ish and the target green-ish so the instructions stay true
        m.mat_rgba[:, :3] = np.clip(b.mat_rgba[:, :3] * rng.uniform(0.7, 1.3, (m.nmat, 3)), 0.0, 1.0)
        m.geom_rgba[:, :3] = np.clip(b.geom_rgba[:, :3] * rng.uniform(0.85, 1.15, (m.ngeom, 3))
                                     + rng.uniform(-0.05, 0.05, (m.ngeom, 3)), 0.0, 1.0)
        # lights: position, direction, intensity; the headlight's intensity
        m.light_pos[:] = b.light_pos + rng.uniform(-0.3, 0.3, b.light_pos.shape)
        dirs = b.light_dir + rng.uniform(-0.2, 0.2, b.light_dir.shape)
        m.light_dir[:] = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
        m.light_diffuse[:] = b.light_diffuse * rng.uniform(0.6, 1.4, (m.nlight, 1))
        m.vis.headlight.diffuse[:] = b.vis.headlight.diffuse * rng.uniform(0.6, 1.4)
        m.vis.headlight.ambient[:] = b.vis.headlight.ambient * rng.uniform(0.6, 1.4)
        # cameras: +-2 cm and +-3 deg (exterior), +-5 mm and +-2 deg (wrist)
        for name, cid in self.camera_ids.items():
            wrist = name == "wrist_image_left"
            m.cam_pos[cid] = b.cam_pos[cid] + rng.uniform(-1, 1, 3) * (0.005 if wrist else 0.02)
            tilt = euler_to_mat(rng.uniform(-1, 1, 3) * math.radians(2.0 if wrist else 3.0))
            r = np.empty(9)
            self._mj.mju_quat2Mat(r, b.cam_quat[cid])
            q = np.empty(4)
            self._mj.mju_mat2Quat(q, (tilt @ r.reshape(3, 3)).ravel())
            m.cam_quat[cid] = q
        # friction (sliding coefficient of every geom) x 0.7..1.3; object masses (and inertias) x 0.5..2
        m.geom_friction[:, 0] = b.geom_friction[:, 0] * rng.uniform(0.7, 1.3, m.ngeom)
        for name in ("cube", "drawer"):
            if self._mj.mj_name2id(m, self._mj.mjtObj.mjOBJ_BODY, name) >= 0:
                i = m.body(name).id
                s = rng.uniform(0.5, 2.0)
                m.body_mass[i] = b.body_mass[i] * s
                m.body_inertia[i] = b.body_inertia[i] * s
        if self._mj.mj_name2id(m, self._mj.mjtObj.mjOBJ_JOINT, "drawer") >= 0:
            j = m.joint("drawer").id
            m.dof_frictionloss[m.jnt_dofadr[j]] = b.dof_frictionloss[b.jnt_dofadr[j]] * rng.uniform(0.5, 1.5)


class SimGroup:
    """``n`` envs of one task stepped one after the other, with auto-reset and camera rendering.

    Args:
        task, cfg, robot: as ``ManipSim``.
        n: number of envs in this group.
        offset: global index of the group's first env (for seeding).
    """

    def __init__(self, task: str, cfg, robot, n: int, offset: int = 0) -> None:
        self.task, self.cfg, self.n, self.offset = task, cfg, int(n), int(offset)
        base = scene.build_model(task, robot)
        self.sims = [ManipSim(task, cfg, robot, base) for _ in range(self.n)]
        self.info = tasks.TASK_INFO[task]
        self.limit = cfg.max_episode_steps
        self.elapsed = np.zeros(self.n, dtype=np.int64)  # [n]
        self.phrasing = np.zeros(self.n, dtype=np.int64)  # [n] index of each env's instruction
        self.seed(0)
        self.renderer = None
        if cfg.cameras:
            from ctrl_rl.envs.manipulation.render import CameraRenderer

            self.renderer = CameraRenderer(base, *cfg.image_size)

    def seed(self, seed: int) -> None:
        G = self.cfg.group_size
        self.rngs = [np.random.default_rng([int(seed), (self.offset + i) // G]) for i in range(self.n)]

    def _reset_one(self, i: int) -> None:
        self.sims[i].reset(self.rngs[i])
        self.phrasing[i] = self.rngs[i].integers(3)
        self.elapsed[i] = 0

    def _observe(self, rows=None) -> dict[str, np.ndarray]:
        """Observation arrays of envs ``rows`` (all by default): ``state [n,O]``, ``image/<cam> [n,3,H,W]``, ``language
        [n,L]`` (only the parts the config asks for)."""
        rows = range(self.n) if rows is None else rows
        obs = {"state": np.stack([self.sims[i].state() for i in rows])}  # [n,O]
        renderer = self.renderer  # made in __init__ when the config has cameras; None again after close()
        for cam in self.cfg.cameras:
            if renderer is None:
                raise RuntimeError(f"manip:{self.task}: camera {cam!r} cannot be rendered after close().")
            imgs = np.empty((len(rows), 3, *self.cfg.image_size), dtype=np.uint8)  # [n,3,H,W]
            for k, i in enumerate(rows):
                sim = self.sims[i]
                renderer.render(sim.model, sim.data, sim.camera_ids[cam], out=imgs[k])
            obs[f"image/{cam}"] = imgs
        if self.cfg.language:
            obs["language"] = np.stack([encode_instruction(self.info.instructions[self.phrasing[i]]) for i in rows])
        return obs

    def instructions(self) -> list[str]:
        """The current episode's instruction of every env."""
        return [self.info.instructions[p] for p in self.phrasing]

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        if seed is not None:
            self.seed(seed)
        for i in range(self.n):
            self._reset_one(i)
        return {"obs": self._observe(), "phrasing": self.phrasing.copy()}

    def step(self, actions: np.ndarray) -> dict[str, Any]:
        """Step every env with ``actions [n,A]``; envs whose episode ended are reset in the same step."""
        reward = np.empty(self.n, dtype=np.float32)  # [n]
        success = np.zeros(self.n, dtype=bool)  # [n]
        for i, sim in enumerate(self.sims):
            sim.step(actions[i])
            r, ok = tasks.evaluate(self.task, sim)
            reward[i] = float(ok) if self.cfg.reward == "sparse" else r
            success[i] = ok
        self.elapsed += 1
        elapsed = self.elapsed.copy()  # [n] steps of the episode each step belongs to
        phrasing = self.phrasing.copy()  # [n] instruction of the episode each step belongs to
        terminated = success & self.cfg.terminate_on_success  # [n]
        truncated = ~terminated & (self.elapsed >= self.limit)  # [n]
        final = self._observe()
        done = np.flatnonzero(terminated | truncated)
        obs = final
        if done.size:
            for i in done.tolist():
                self._reset_one(i)
            fresh = self._observe(done)
            obs = {k: v.copy() for k, v in final.items()}
            for k, v in fresh.items():
                obs[k][done] = v
        return {"obs": obs, "final_obs": final, "reward": reward, "terminated": terminated, "truncated": truncated,
                "success": success, "elapsed": elapsed, "phrasing": phrasing, "next_phrasing": self.phrasing.copy()}

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None
