"""The tabletop manipulation tasks Reach and Lift on MuJoCo Warp: ``warp:Reach``, ``warp:Lift``.

They are ``manip:Reach`` and ``manip:Lift`` (``envs/manipulation/``) with their N worlds in one ``mujoco_warp.Data``
on one device and the controller batched in torch (``warp_manip_control.py``), so a step never leaves the device
and involves no per-world Python. The names are the manipulation tasks' own (``manip:<Task>`` -> ``warp:<Task>``),
as the ``warp:`` locomotion tasks keep gymnasium's names.

The same as ``manip:<Task>``: the MJCF scene (``scene.build_model``: robot, servo gains, joint stops, table, cube,
target), the state observation and its layout (``sim.py``), the action spaces and their convention (``control.py``:
cartesian velocity by default, ``action=joint_velocity``), the 33 physics steps per 1/15 s control step with the
servo reference ramped over 8 chunks with its velocity feed-forward (``sim.py``), the gripper command as a state,
the dense and sparse rewards, the success test (``tasks.py``; Lift's ``grasped`` from the contacts of the last
physics step), the time limit (truncated), ``terminate_on_success``, ``group_size``, the spec and its robot
metadata (``config_spec``, with this id and backend), and ``info``: ``success [N]`` and ``elapsed_step [N]``.

Not supported, refused with one sentence: cameras, ``image_size`` and ``language`` (state observations only),
``randomize`` (every world runs the one model), ``workers`` (the worlds step together on the device). The other
tasks (Push, PickPlace, OpenDrawer) have no ``warp:`` version yet.

One step, with no host synchronisation:

1. the controller (``BatchedDiffIK``) turns the actions ``[N,A]`` into joint targets from the arm's joint angles, the
   gripper command integrates, and the 8 servo references of the ramp are written to a ``[8,N,nu]`` buffer;
2. the physics, captured once as a Warp graph (``warp.GraphLaunches``): for each chunk a copy of its ``ctrl`` rows
   from the buffer, then its physics steps (5 or 4); then MuJoCo Warp's kinematics (``sim.py``'s ``mj_kinematics``
   after ``mj_step``: the site pose of the new state);
3. observation, reward, success of every world (torch on the simulator's arrays, shared through ``wp.to_torch``);
4. same-step auto-reset: a fresh placement is drawn for every world from the env's ``torch.Generator`` (the draws do
   not depend on which worlds ended, as the other ``warp:`` tasks) and written where an episode ended, with the arm
   at the home pose, fingers open, velocities, ``time``, the solver's warm start and the gripper command zeroed (the
   ``manip:`` reset's ``mj_resetData``), and the kinematics of the new states computed for their observation.

Randomness: the placement distributions are ``tasks.py``'s (Reach's target box; Lift's cube box and yaw), drawn in
torch; ``manip:`` draws them in NumPy per env, so the two backends' episodes differ for the same seed. To compare
them from the same state, ``set_state`` starts every world from given positions (tests/envs/test_warp_manip.py does).

Checkpointing: ``state_dict`` holds the simulator state (``qpos``, ``qvel``, ``act``, ``ctrl``, ``time``,
``qacc_warmstart``, the target's ``mocap_pos``), the gripper command, the step counters and the generator state; a
loaded env continues bit-exactly on Warp's CPU device (tested). Precision: float32 (``manip:`` runs MuJoCo in
float64); tests/envs/test_warp_manip.py measures how far the two part and docs/guides/environments.md states it.

On a GPU, ``deterministic=true`` makes Reach's runs repeat bit for bit; with contacts (Lift's cube on the table)
MuJoCo Warp 4.0 still differs run to run in the last bits (measured on an H200: 8e-7 after 20 steps).

Kernels: a cold compile of the scene's kernels takes ~65 s on Warp's CPU device (mesh collisions) and ~4 min for
CUDA (an H200's host), cached in ``WARP_CACHE_PATH`` like the other ``warp:`` tasks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import torch

from ctrl_rl.envs.manipulation import scene
from ctrl_rl.envs.manipulation.config import DEFAULT_IMAGE_SIZE, ManipConfig
from ctrl_rl.envs.manipulation.env import config_spec
from ctrl_rl.envs.manipulation.sim import RAMP_CHUNKS
from ctrl_rl.envs.manipulation.tasks import LIFT_HEIGHT
from ctrl_rl.envs.protocol import EnvSpec, StepOut
from ctrl_rl.envs.warp import (
    GraphLaunches,
    _import_warp,
    _warp_device,
    check_env_args,
    checked_action,
    load_sim_tensors,
)
from ctrl_rl.envs.warp_manip_control import ArmChain, BatchedDiffIK, mat_to_euler
from ctrl_rl.errors import UserInputError, did_you_mean
from ctrl_rl.robots.spec import franka_droid

TASKS = ("Reach", "Lift")
_ENV_OPTIONS = ("graph", "deterministic")
# ManipConfig fields a warp: task refuses unless left at their default (module docstring): (default, the end of the
# refusal's sentence)
_UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "cameras": ((), "the warp: tasks give the state observation only (no cameras are rendered on MuJoCo Warp), "
                "expected the option left out"),
    "image_size": (DEFAULT_IMAGE_SIZE, "the warp: tasks render no cameras, expected the option left out"),
    "language": (False, "the warp: tasks give the state observation only, without the instruction, expected "
                 "language=false"),
    "randomize": (False, "every warp: world runs the one model (no per-episode domain randomisation), expected "
                  "randomize=false"),
    "workers": (0, "the warp: worlds step together on one device, expected workers=0"),
}
# Reset placement boxes (tasks.py): Reach's target (x, y, z); Lift's cube (x, y, yaw)
_REACH_BOX = ((0.35, -0.25, 0.08), (0.65, 0.25, 0.35))
_CUBE_BOX = ((0.40, -0.20, -math.pi / 4), (0.60, 0.20, math.pi / 4))


def manip_config(task: str, options: dict[str, Any]) -> ManipConfig:
    """The ``ManipConfig`` of ``warp:<task>`` with ``options`` (env options excluded); an option it does not take or
    cannot support raises ``UserInputError`` in one sentence."""
    if task not in TASKS:
        raise UserInputError(f"unknown warp: manipulation task {task!r}: expected one of "
                             f"{', '.join('warp:' + t for t in TASKS)}{did_you_mean(task, TASKS)}.")
    accepted = [k for k in ManipConfig.__dataclass_fields__ if k != "task" and k not in _UNSUPPORTED]
    for key in options:
        if key not in ManipConfig.__dataclass_fields__ or key == "task":
            known = accepted + list(_ENV_OPTIONS)
            raise UserInputError(f"warp:{task} has no option {key!r}{did_you_mean(key, known)}: expected one of "
                                 f"{known}.")
    try:
        cfg = ManipConfig.from_options(task, **options)
    except UserInputError as e:  # its sentences name the manip: id
        raise UserInputError(str(e).replace(f"manip:{task}", f"warp:{task}")) from None
    for key, (default, why) in _UNSUPPORTED.items():
        if key in options and getattr(cfg, key) != default:
            raise UserInputError(f"warp:{task} option {key}={options[key]!r}: {why}.")
    return cfg


def warp_manip_spec(task: str, graph: bool = True, deterministic: bool = False, **options: Any) -> EnvSpec:
    """The spec of ``warp:<task>`` (``manip:<task>``'s with this id and backend), from the config alone (no MuJoCo,
    no Warp)."""
    return replace(config_spec(manip_config(task, options)), env_id=f"warp:{task}", backend="warp")


@functools.cache
def _model(task: str) -> Any:
    return scene.build_model(task, franka_droid())


class WarpManipEnv:
    """N worlds of ``warp:Reach`` or ``warp:Lift`` on one Warp device (module docstring).

    Args:
        task: ``Reach`` or ``Lift``.
        num_envs: N.
        device: ``cpu`` (Warp's CPU device) or ``cuda[:k]``; every returned tensor lives there.
        seed: seed of the env's ``torch.Generator`` (the placements); ``reset(seed)`` re-seeds it.
        graph: capture the physics once as a Warp graph and replay it; False launches the kernels eagerly.
        deterministic: on a GPU, ask MuJoCo Warp for a run-to-run deterministic contact order and reductions.
        **options: the ``manip:`` options it supports (``reward``, ``action``, ``max_episode_steps``,
            ``terminate_on_success``, ``group_size``).
    """

    def __init__(self, task: str, num_envs: int = 1, device: str | torch.device = "cpu", seed: int = 0,
                 graph: bool = True, deterministic: bool = False, **options: Any) -> None:
        check_env_args(task, num_envs, graph, deterministic)
        self.config = cfg = manip_config(task, options)
        self.spec = replace(config_spec(cfg), env_id=f"warp:{task}", backend="warp")
        self.task = task
        self.num_envs = n = int(num_envs)
        if n % cfg.group_size:
            raise UserInputError(f"warp:{task} option group_size={cfg.group_size} does not divide the {n} envs: "
                                 "expected a number of envs that is a multiple of the group size.")
        self.device = torch.device(device)
        wp, mjw = _import_warp()
        self._wp, self._mjw = wp, mjw
        self._wp_device = _warp_device(wp, self.device, task)
        if self.device.type == "cuda":
            self.device = torch.device(self._wp_device)
        dev = self.device
        mjm = _model(task)
        robot = self.robot
        with wp.ScopedDevice(self._wp_device):
            self._model = mjw.put_model(mjm)
            if deterministic and dev.type == "cuda":  # the CPU device runs each kernel serially: deterministic
                self._model.opt.deterministic = int(mjw.DeterminismType.ALL)
            # contacts: the cube on the table (4), a grasp and the fingers on the table fit in 64 per world
            self._data = mjw.make_data(mjm, nworld=n, nconmax=64, njmax=256)
        d, t = self._data, wp.to_torch  # views: the same memory as the Warp arrays
        self._qpos, self._qvel, self._act, self._ctrl = t(d.qpos), t(d.qvel), t(d.act), t(d.ctrl)  # [N,nq] ...
        self._time, self._warmstart = t(d.time), t(d.qacc_warmstart)  # [N], [N,nv]
        self._mocap = t(d.mocap_pos)  # [N,nmocap,3]
        self._site_xpos, self._site_xmat = t(d.site_xpos), t(d.site_xmat)  # [N,nsite,3], [N,nsite,3,3]
        self._contact_geom, self._contact_world = t(d.contact.geom), t(d.contact.worldid)  # [C,2], [C]
        self._nacon = t(d.nacon)  # [1]

        def index(x: Any) -> torch.Tensor:
            return torch.as_tensor(x, dtype=torch.int64, device=dev)

        joints = [mjm.joint(name).id for name in scene.JOINT_NAMES]
        self._arm_q = index(mjm.jnt_qposadr[joints])  # [7]
        self._finger_q = index(mjm.jnt_qposadr[[mjm.joint(name).id for name in scene.FINGER_NAMES]])  # [2]
        self._site = int(mjm.site("end_effector").id)
        self.ik = BatchedDiffIK(ArmChain.from_model(mjm, self._site, mjm.jnt_qposadr[joints], dev), robot, cfg.action,
                                dev)
        f32 = functools.partial(torch.as_tensor, dtype=torch.float32, device=dev)
        kp = mjm.actuator_gainprm[:7, 0]
        self._ff = f32(-mjm.actuator_biasprm[:7, 2] / kp * robot.control_hz)  # [7] feed-forward per (rad / step)
        k, m = divmod(scene.SUBSTEPS, RAMP_CHUNKS)
        self._chunks = [k + (1 if i < m else 0) for i in range(RAMP_CHUNKS)]  # sim.py's split of the 33 steps
        self._fractions = f32([(i + 1) / RAMP_CHUNKS for i in range(RAMP_CHUNKS)])[:, None, None]  # [8,1,1]
        self._ramp = torch.zeros(RAMP_CHUNKS, n, mjm.nu, dtype=torch.float32, device=dev)  # [8,N,nu]
        self._ramp_wp = wp.from_torch(self._ramp)
        start = f32(mjm.qpos0).clone()  # [nq] mj_resetData's qpos, then the manip: reset's arm and fingers
        start[self._arm_q] = f32(robot.home)
        start[self._finger_q] = scene.FINGER_OPEN
        self._qpos_start = start
        self._ctrl_start = torch.cat([f32(robot.home), f32([scene.FINGER_OPEN] * 2)])  # [nu]
        mocap_bodies = sorted((int(i), b) for b, i in enumerate(mjm.body_mocapid) if i >= 0)
        self._mocap_start = f32(mjm.body_pos[[b for _, b in mocap_bodies]]).reshape(-1, 3)  # [nmocap,3]
        if task == "Lift":
            cube = mjm.joint("cube")
            self._cube_q, self._cube_v = int(mjm.jnt_qposadr[cube.id]), int(mjm.jnt_dofadr[cube.id])
            self._cube_geom = int(mjm.geom("cube").id)
            self._geom_body = index(mjm.geom_bodyid)  # [ngeom]
            self._fingers = index([mjm.body("panda0_leftfinger").id, mjm.body("panda0_rightfinger").id])  # [2]
        self._launch = GraphLaunches(wp, self._wp_device, dev, bool(graph), (
            self._qpos, self._qvel, self._act, self._ctrl, self._time, self._warmstart))
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(int(seed))
        self._grip = torch.zeros(n, dtype=torch.float32, device=dev)  # [N] the gripper command, 0 open .. 1 closed
        self._elapsed = torch.zeros(n, dtype=torch.int64, device=dev)  # [N]
        self._action_shape = (n, self.spec.action_dim)

    @property
    def robot(self) -> Any:
        return self.spec.robot

    @property
    def action_units(self) -> tuple[str, ...]:
        return self.spec.action_units

    @property
    def action_space_name(self) -> str | None:
        return self.spec.action_space_name

    # ---- the simulator's launches ---------------------------------------------------------------------------------

    def _physics(self) -> None:
        """The control step's physics: each ramp chunk's ``ctrl`` rows, then its steps; then the kinematics."""
        size = self.num_envs * self._ramp.shape[2]
        for k, steps in enumerate(self._chunks):
            self._wp.copy(self._data.ctrl, self._ramp_wp, src_offset=k * size, count=size)
            for _ in range(steps):
                self._mjw.step(self._model, self._data)
        self._mjw.kinematics(self._model, self._data)

    def _kinematics(self) -> None:
        self._mjw.kinematics(self._model, self._data)

    # ---- the BatchedEnv protocol ----------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every world; re-seed the generator first when ``seed`` is given."""
        if seed is not None:
            self.generator.manual_seed(int(seed))
        return self._start(*self._placement())

    def set_state(self, qpos: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """Start a new episode in every world from ``qpos [N,nq]`` (and, for Reach, the target ``[N,3]``), the rest
        as the reset leaves it (zero velocities, gripper command 0, fingers commanded open, the arm's servo at the
        given joints); returns the observation. Used to start from another simulator's state."""
        qpos = torch.as_tensor(qpos, dtype=torch.float32, device=self.device)
        if qpos.shape != self._qpos.shape:
            raise ValueError(f"{self.spec.env_id} takes qpos {tuple(self._qpos.shape)}, got {tuple(qpos.shape)}.")
        mocap = self._mocap.clone()
        if target is not None:
            mocap[:, 0] = torch.as_tensor(target, dtype=torch.float32, device=self.device)
        everywhere = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)  # [N]
        self._restart(everywhere, qpos, mocap)
        self._ctrl[:, :7] = qpos[:, self._arm_q]
        self._elapsed.zero_()
        return self._observe()

    def step(self, action: torch.Tensor) -> StepOut:
        """One 1/15 s control step of every world; worlds whose episode ended start a new one in the same step."""
        a = self._check_action(action).clamp(-1.0, 1.0)  # [N,A]
        q0 = self._qpos[:, self._arm_q]  # [N,7]
        dq = self.ik.joint_targets(q0, a[:, :-1]) - q0  # [N,7]
        self._grip = (self._grip + self.ik.grip_step * a[:, -1]).clamp(0.0, 1.0)  # [N]
        arm = q0 + dq * self._fractions + self._ff * dq  # [8,N,7] the servo's ramped reference
        self._ramp[:, :, :7] = torch.minimum(torch.maximum(arm, self.ik.low), self.ik.high)
        self._ramp[:, :, 7:9] = (scene.FINGER_OPEN * (1.0 - self._grip))[None, :, None]
        self._launch(self._physics)
        final_obs = self._observe()  # [N,O]
        reward, success = self._evaluate()  # [N], [N]
        cfg = self.config
        if cfg.reward == "sparse":
            reward = success.float()
        terminated = success & cfg.terminate_on_success  # [N]
        steps = self._elapsed + 1  # [N]
        truncated = ~terminated & (steps >= cfg.max_episode_steps)  # [N]
        done = terminated | truncated  # [N]
        self._restart(done, *self._placement())
        obs = torch.where(done[:, None], self._observe(), final_obs)  # [N,O]
        self._elapsed = steps.masked_fill(done, 0)  # [N]
        return StepOut(obs=obs, reward=reward, terminated=terminated, truncated=truncated, final_obs=final_obs,
                       info={"success": success, "elapsed_step": steps})

    def close(self) -> None:
        """Drop the captured graphs (the simulator's arrays go with the env)."""
        self._launch.clear()

    # ---- observation, reward, success -------------------------------------------------------------------------------

    def _ee(self) -> torch.Tensor:
        return self._site_xpos[:, self._site]  # [N,3]

    def _cube(self) -> torch.Tensor:
        return self._qpos[:, self._cube_q: self._cube_q + 3]  # [N,3]

    def _observe(self) -> torch.Tensor:
        """The flat ``state`` ``[N,O]`` (``sim.py``'s layout): arm joints, end-effector position and Euler angles
        (roll in [0, 2 pi)), measured gripper closure, the task's privileged state."""
        ee = self._ee()
        euler = mat_to_euler(self._site_xmat[:, self._site])  # [N,3]
        euler = torch.cat([torch.remainder(euler[:, :1], 2 * math.pi), euler[:, 1:]], dim=1)
        gripper = 1.0 - self._qpos[:, self._finger_q].sum(dim=1, keepdim=True) / (2 * scene.FINGER_OPEN)  # [N,1]
        if self.task == "Reach":
            target = self._mocap[:, 0]  # [N,3]
            privileged = [target, target - ee]
        else:
            quat = self._qpos[:, self._cube_q + 3: self._cube_q + 7]  # [N,4] w x y z
            quat = torch.where(quat[:, :1] >= 0, quat, -quat)
            privileged = [self._cube(), quat, self._cube() - ee]
        return torch.cat([self._qpos[:, self._arm_q], ee, euler, gripper, *privileged], dim=1)  # [N,O]

    def _evaluate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dense reward [N], success [N])`` (``tasks.py``)."""
        ee = self._ee()
        if self.task == "Reach":
            dist = (self._mocap[:, 0] - ee).norm(dim=1)  # [N]
            return 1.0 - torch.tanh(10.0 * dist), dist < 0.03
        cube = self._cube()
        lift = cube[:, 2] - (scene.TABLE_Z + scene.CUBE_HALF)  # [N]
        reward = (0.25 * (1.0 - torch.tanh(10.0 * (cube - ee).norm(dim=1))) + 0.25 * self._grasped().float()
                  + 0.5 * (lift / LIFT_HEIGHT).clamp(0.0, 1.0))
        return reward, lift >= LIFT_HEIGHT

    def _grasped(self) -> torch.Tensor:
        """``[N]`` whether the cube touches both fingers in the contacts of the last physics step (``sim.py``)."""
        geom = self._contact_geom.long()  # [C,2] (rows past nacon are stale)
        live = torch.arange(geom.shape[0], device=self.device) < self._nacon  # [C]
        first_is_cube = geom[:, 0] == self._cube_geom  # [C]
        with_cube = live & (first_is_cube | (geom[:, 1] == self._cube_geom))  # [C]
        other_geom = torch.where(first_is_cube, geom[:, 1], geom[:, 0]).clamp(0, self._geom_body.shape[0] - 1)  # [C]
        other = self._geom_body[other_geom]  # [C]
        world = torch.where(with_cube, self._contact_world.long(), 0)  # [C]
        touches = torch.zeros(self.num_envs, 2, dtype=torch.float32, device=self.device)  # [N,2]
        hits = (with_cube[:, None] & (other[:, None] == self._fingers)).float()  # [C,2]
        return touches.index_add_(0, world, hits).gt(0).all(dim=1)  # [N]

    # ---- resets ------------------------------------------------------------------------------------------------------

    def _placement(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A start state for every world, ``(qpos [N,nq], mocap_pos [N,nmocap,3])``, from the generator only: one
        draw per group of ``group_size`` worlds (``tasks.py``'s boxes)."""
        g, groups = self.config.group_size, self.num_envs // self.config.group_size
        u = torch.rand(groups, 3, generator=self.generator, device=self.device).repeat_interleave(g, dim=0)  # [N,3]
        qpos = self._qpos_start.expand(self.num_envs, -1).clone()  # [N,nq]
        mocap = self._mocap_start.expand(self.num_envs, -1, -1).clone()  # [N,nmocap,3]
        box = _REACH_BOX if self.task == "Reach" else _CUBE_BOX
        low, high = (torch.tensor(b, dtype=torch.float32, device=self.device) for b in box)
        x = low + (high - low) * u  # [N,3]
        if self.task == "Reach":
            mocap[:, 0] = x
        else:
            yaw = x[:, 2]  # [N]
            zero = torch.zeros_like(yaw)
            pose = torch.stack([x[:, 0], x[:, 1], zero + scene.TABLE_Z + scene.CUBE_HALF,
                                torch.cos(yaw / 2), zero, zero, torch.sin(yaw / 2)], dim=1)  # [N,7]
            qpos[:, self._cube_q: self._cube_q + 7] = pose
        return qpos, mocap

    def _start(self, qpos: torch.Tensor, mocap: torch.Tensor) -> torch.Tensor:
        everywhere = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)  # [N]
        self._restart(everywhere, qpos, mocap)
        self._elapsed.zero_()
        return self._observe()

    def _restart(self, where: torch.Tensor, qpos: torch.Tensor, mocap: torch.Tensor) -> None:
        """Write the start state ``qpos``/``mocap`` into the worlds ``where [N]`` with the rest reset (the ``manip:``
        reset), in place in the simulator's arrays; then the kinematics of every world for the observation."""
        mask = where[:, None]  # [N,1]
        self._qpos.copy_(torch.where(mask, qpos, self._qpos))
        self._mocap.copy_(torch.where(mask[:, :, None], mocap, self._mocap))
        self._ctrl.copy_(torch.where(mask, self._ctrl_start, self._ctrl))
        self._qvel.masked_fill_(mask, 0.0)
        self._act.masked_fill_(mask, 0.0)
        self._warmstart.masked_fill_(mask, 0.0)
        self._time.masked_fill_(where, 0.0)
        self._grip.masked_fill_(where, 0.0)
        self._launch(self._kinematics)  # also recomputes the running worlds' frames, from their unchanged state

    # ---- checkpointing -----------------------------------------------------------------------------------------------

    _SIM_KEYS = ("qpos", "qvel", "act", "ctrl", "time", "qacc_warmstart", "mocap_pos")

    def _sim_tensors(self) -> tuple[torch.Tensor, ...]:
        return self._qpos, self._qvel, self._act, self._ctrl, self._time, self._warmstart, self._mocap

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-exactly: the simulator state, gripper command, counters, generator."""
        return {"env_id": self.spec.env_id, **{k: x.clone() for k, x in zip(self._SIM_KEYS, self._sim_tensors())},
                "gripper_command": self._grip.clone(), "elapsed_steps": self._elapsed.clone(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        load_sim_tensors(self, d, dict(zip(self._SIM_KEYS, self._sim_tensors())))
        self._grip = d["gripper_command"].to(device=self.device, dtype=torch.float32, copy=True)  # [N]
        self._elapsed = d["elapsed_steps"].to(device=self.device, dtype=torch.int64, copy=True)  # [N]
        self.generator.set_state(d["generator"])
        self._launch(self._kinematics)  # the loaded state's frames (the next step's IK reads qpos, not these)

    # ---- validation -------------------------------------------------------------------------------------------------

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        return checked_action(self, action)

    def __repr__(self) -> str:
        return f"WarpManipEnv({self.spec.env_id!r}, num_envs={self.num_envs}, device={str(self.device)!r})"
