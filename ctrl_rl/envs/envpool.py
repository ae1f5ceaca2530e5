"""envpool (C++ thread-pool simulators) as a BatchedEnv.

envpool runs N simulators in C++ threads and returns NumPy batches. It resets *on the next step*:
the step after an episode ends ignores the action and returns the new episode's first observation
with reward 0. ``EnvpoolEnv`` turns that into the protocol's same-step auto-reset: after each step,
the envs that ended (``terminated | truncated``) are reset at once with envpool's subset reset
``env.reset(done_ids)`` (synchronous in sync mode), their step observation is kept as ``final_obs``
and the fresh observation goes into ``obs``. envpool then treats those envs as running, so their
next step is an ordinary step (``elapsed_step`` 1), not a dummy reset step.

Conventions of envpool 1.2.5 that this adapter relies on (checked in tests/envs/test_backends.py):

- ``env_type="gymnasium"``; sync mode (``batch_size == num_envs``) returns the batch in env-id order.
- ``terminated = done & ~trunc`` and ``trunc = done & (elapsed_step >= max_episode_steps)``: a terminal
  state reached on the very last allowed step is reported as *truncated* by envpool; the gymnasium
  API carries no discount, so this adapter cannot tell (gymnasium's TimeLimit reports both flags and
  the gymnasium adapter keeps ``terminated``). It only matters for tasks that can terminate exactly at
  the time limit.
- ``reset(seed=...)`` is ignored by envpool (seeds are fixed by ``envpool.make(seed=...)``), so a seeded
  ``reset`` here re-creates the pool with the new seed.
- dm_control tasks (``CheetahRun-v1``) return a dict of observations; it is flattened in sorted key
  order, like the direct ``dmc:`` backend. envpool pads each task's dict with the keys of its
  domain's other tasks (``HumanoidRun-v1`` carries ``position``); those are dropped, so the vector is
  dm_control's own observation of the task (``_DMC_FOREIGN_KEYS``).
- MuJoCo observations are float64; they are cast to float32.
- MuJoCo Playground tasks (``Go1JoystickFlatTerrain-v1``, ``PandaPickCube-v1``, ...; envpool's spec classes
  ``Playground*EnvSpec``, listed by ``playground_tasks()``) keep their observation dict as separate float32 parts:
  ``state`` (what the robot measures, with Playground's sensor noise) and ``privileged_state`` (simulator-only
  quantities for an asymmetric critic), which ``spec.privileged_parts`` names; tasks whose observation is one
  vector (the Panda, Aloha, Barkour, H1, Op3 tasks) have the single ``state`` part. ``spec.dt`` is the
  task's control period ``ctrl_dt`` times its ``action_repeat`` (AlohaSinglePegInsertion: 0.0025 s x 2).
  Checked in tests/envs/test_playground.py. The Go1 joystick tasks carry their robot (``spec.robot``: joints in
  actuator order, the ``home`` keyframe as default pose, ``kp`` / ``kd``, the action as ``default pose +
  action_scale * action``), read from the task's model file and envpool's config by ``envs/playground.py``.
- An observation that is a rank-3 uint8 Box (Atari's stacked frames ``[4,84,84]``) is an image: the env
  hands out the dict ``{"image/frames": uint8 [N,C,H,W]}`` (``core/obs.py``), ``spec.parts`` is that one
  part, and the CNN of ``core/encoders.make_encoder`` reads it (checked in tests/envs/test_envpool_atari.py).
  The frames are envpool's as they are, channels first; the ``C`` channels of the stack are the last ``C``
  frames, oldest first.

Atari (``envpool:Breakout-v5`` and the other ``*-v5`` ALE tasks; envpool 1.2 bundles the ROMs) runs with
envpool's defaults unless ``,key=value`` options in the id change them (``envpool:Breakout-v5,reward_clip=true``):

- ``frame_skip=4`` (an action repeated for 4 frames), ``stack_num=4``, grayscale 84x84 (``gray_scale``,
  ``img_height``, ``img_width``; INTER_AREA resize), ``noop_max=30`` random no-ops at reset,
  ``use_fire_reset=True`` (FIRE at reset), ``repeat_action_probability=0`` (no sticky actions, unlike ALE's
  own v5), the minimal action set, ``max_episode_steps=27000`` agent steps (108k frames; a truncation).
- ``episodic_life=False``: an episode is the whole game, a lost life is no episode end.
  ``episodic_life=True`` is refused: envpool continues the game after a lost life only in its own next-step
  reset, and the same-step reset here would start a new game at every lost life.
- ``reward_clip=False``: the reward is the game's score change, unclipped (the DQN and IMPALA papers train on
  rewards clipped to [-1, 1]), so the logged episode return is the game score.
- One agent step is ``frame_skip`` emulator frames; ``spec.dt`` is ``frame_skip / 60`` s (the console's 60 Hz).

Checkpointing: an envpool simulator state cannot be saved. ``state_dict()`` holds metadata only
(seed and counters); after ``load_state_dict`` the next ``reset()`` re-seeds the pool from it, so a
resumed run continues with fresh episodes and is not bit-exact with an uninterrupted one.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import numpy as np
import torch

from ctrl_rl.core.obs import Obs, ObsPart, state_shape
from ctrl_rl.envs.playground import playground_robot
from ctrl_rl.envs.protocol import EnvSpec, StepOut, action_to_numpy
from ctrl_rl.envs.reseed import load_metadata_state, metadata_state
from ctrl_rl.errors import UserInputError

if TYPE_CHECKING:
    import gymnasium

# The observation part of an image task (Atari's stacked grayscale frames).
IMAGE_PART = "image/frames"

# Atari 2600 frames per second (NTSC); an agent step is ``frame_skip`` frames.
_ATARI_FPS = 60.0

# Seconds per step of classic-control tasks (envpool's config does not say; values from gymnasium).
_CLASSIC_DT = {"Pendulum": 0.05, "CartPole": 0.02, "Acrobot": 0.2}

# dm_control's control timestep per domain (``suite.load(...).control_timestep()``), which envpool's
# dm_control tasks reproduce at their default ``frame_skip`` (= physics substeps per control step).
_DMC_CONTROL_DT = {
    "Acrobot": 0.01, "BallInCup": 0.02, "Cartpole": 0.01, "Cheetah": 0.01, "Dog": 0.015,
    "Finger": 0.02, "Fish": 0.04, "Hopper": 0.02, "Humanoid": 0.025, "HumanoidCMU": 0.02,
    "Lqr": 0.03, "Manipulator": 0.01, "Pendulum": 0.02, "PointMass": 0.02, "Quadruped": 0.02,
    "Reacher": 0.02, "Stacker": 0.01, "Swimmer": 0.03, "Walker": 0.025,
}  # fmt: skip


# envpool's dm_control tasks share one observation dict per domain: keys of the domain's other tasks
# are present and padded (zeros; QuadrupedRun's "origin" even holds values dm_control's task does not
# observe). Dropping them gives exactly dm_control's observation for the task (the same keys as the
# ``dmc:`` backend); derived by comparing envpool.make_spec with suite.load for every task.
_DMC_FOREIGN_KEYS = {
    "DogRun-v1": ("ball_state", "target_position"),
    "DogStand-v1": ("ball_state", "target_position"),
    "DogTrot-v1": ("ball_state", "target_position"),
    "DogWalk-v1": ("ball_state", "target_position"),
    "FingerSpin-v1": ("target_position", "dist_to_target"),
    "FishUpright-v1": ("target",),
    "HumanoidRun-v1": ("position",),
    "HumanoidRunPureState-v1": ("joint_angles", "head_height", "extremities", "torso_vertical", "com_velocity"),
    "HumanoidStand-v1": ("position",),
    "HumanoidWalk-v1": ("position",),
    "QuadrupedEscape-v1": ("ball_state", "target_position"),
    "QuadrupedFetch-v1": ("origin", "rangefinder"),
    "QuadrupedRun-v1": ("origin", "rangefinder", "ball_state", "target_position"),
    "QuadrupedWalk-v1": ("origin", "rangefinder", "ball_state", "target_position"),
}


class EnvpoolEnv:
    """N envpool simulators of one task, stepped as a batch; see the module docstring.

    Args:
        task: envpool task id without prefix (``HalfCheetah-v5``, ``CartPole-v1``, ``CheetahRun-v1``).
        num_envs: N.
        device: where returned tensors live (the simulation itself runs on CPU threads).
        seed: envpool seed (env i gets a stream derived from it); ``reset(seed)`` re-creates the pool.
        num_threads: envpool worker threads (0: envpool's default).
        **make_kwargs: passed to ``envpool.make`` (e.g. ``max_episode_steps``, ``frame_skip``).
    """

    def __init__(
        self,
        task: str,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        seed: int = 0,
        num_threads: int = 0,
        **make_kwargs: Any,
    ) -> None:
        if make_kwargs.get("batch_size", num_envs) != num_envs:
            raise UserInputError(
                f"batch_size={make_kwargs['batch_size']!r} for envpool task {task!r}: expected it unset or equal "
                f"to num_envs={num_envs} (this adapter runs envpool in sync mode)."
            )
        make_kwargs.pop("batch_size", None)
        _check_make_kwargs(task, make_kwargs)
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self._task = task
        self._make_kwargs = dict(make_kwargs, num_threads=int(num_threads))
        self._seed = int(seed)
        self._env = self._make(self._seed)
        self._fresh = True  # the pool has not been reset or stepped since it was made with self._seed
        self._pending_seed: int | None = None  # set by load_state_dict
        self._resets = 0
        self._episodes = 0

        self.spec = _spec(task, self._env.spec, self._env.observation_space, self._env.action_space)
        self._image = self.spec.parts[0].name == IMAGE_PART  # Atari's stacked frames [C,H,W], the one image part
        self._obs_keys = _obs_keys(task, self._env.spec, self._env.observation_space)
        # Playground's parts: (name, start, stop) columns of the concatenated array handed out as a dict
        self._split = _part_columns(self.spec.obs_parts) if self.spec.obs_parts and not self._image else None
        act_space = self._env.action_space
        self._action_shape = (self.num_envs,) if self.spec.discrete else (self.num_envs, self.spec.action_dim)
        self._action_dtype = act_space.dtype
        self._ids = np.arange(self.num_envs, dtype=np.int32)  # [N]

    def _make(self, seed: int) -> Any:
        import envpool

        with warnings.catch_warnings():
            # envpool builds float32 Boxes from float64 bounds; gymnasium warns about the cast each time.
            warnings.filterwarnings("ignore", message=".*precision lowered.*")
            env = envpool.make(self._task, env_type="gymnasium", num_envs=self.num_envs, seed=seed, **self._make_kwargs)
            # The spaces are built (and cached) lazily on first access and warn then: touch them here, inside
            # the filter, for that side effect.
            _ = env.observation_space, env.action_space
        return env

    # ---- the BatchedEnv protocol ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> Obs:
        """Start a new episode in every env; a ``seed`` re-creates the pool with that seed."""
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
        self._pending_seed = None
        if seed is not None and not (self._fresh and int(seed) == self._seed):
            self._env.close()
            self._seed = int(seed)
            self._env = self._make(self._seed)
        self._fresh = False
        obs, info = self._env.reset()
        self._resets += 1
        obs = self._flat(obs)  # [N,O] or [N,C,H,W]
        order = np.asarray(info["env_id"])
        if not np.array_equal(order, self._ids):
            obs[order] = obs.copy()
        return self._obs(obs)

    def step(self, action: torch.Tensor) -> StepOut:
        """One step of every env, then a same-step reset of the envs whose episode ended."""
        self.step_async(action)
        return self.step_wait()

    def step_async(self, action: torch.Tensor) -> None:
        """Hand the actions to envpool's worker threads and return at once; ``step_wait`` collects.

        Lets a collector compute the actions of another group of envs while these simulate.
        """
        self._fresh = False
        act = action_to_numpy(action, self.spec, self._action_shape, self._action_dtype)  # [N,A] or [N]
        self._pending_action = act  # keep the buffer alive until envpool has read it
        self._env.send(act)

    def step_wait(self) -> StepOut:
        """Receive the step started by ``step_async`` and apply the same-step reset."""
        obs, reward, terminated, truncated, info = self._env.recv()
        self._pending_action = None
        obs = self._flat(obs)  # [N,O] float32 or [N,C,H,W] uint8, an owned copy
        reward = np.asarray(reward, dtype=np.float32)  # [N]
        terminated = np.asarray(terminated, dtype=bool)  # [N]
        truncated = np.asarray(truncated, dtype=bool) & ~terminated  # [N]; envpool already ensures this
        elapsed = np.asarray(info["elapsed_step"], dtype=np.int64)  # [N]
        order = np.asarray(info["env_id"])
        if not np.array_equal(order, self._ids):  # sync mode returns env-id order; stay correct if not
            inv = np.argsort(order)
            obs, reward, terminated, truncated, elapsed = (x[inv] for x in
                                                           (obs, reward, terminated, truncated, elapsed))
        final_obs = obs.copy()  # [N,O] or [N,C,H,W]
        done = terminated | truncated  # [N]
        done_ids = np.flatnonzero(done).astype(np.int32)
        if done_ids.size:
            reset_obs, reset_info = self._env.reset(done_ids)
            obs[np.asarray(reset_info["env_id"])] = self._flat(reset_obs)
            self._episodes += int(done_ids.size)
        return StepOut(
            obs=self._obs(obs),
            reward=self._tensor(reward),
            terminated=self._tensor(terminated),
            truncated=self._tensor(truncated),
            final_obs=self._obs(final_obs),
            info={"elapsed_step": self._tensor(elapsed)},  # steps of the episode this step belongs to
        )

    def close(self) -> None:
        self._env.close()

    # ---- checkpointing (metadata only; see the module docstring) -------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Seed and counters only: envpool cannot save its simulators, resume re-seeds (not bit-exact)."""
        return metadata_state(self.spec.env_id, "envpool", self._seed, self._resets, self._episodes)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Schedule a re-seed for the next ``reset()`` from the saved seed and counters (not bit-exact)."""
        self._pending_seed, self._resets, self._episodes = load_metadata_state(d, self.spec.env_id)

    # ---- NumPy <-> torch boundary ----------------------------------------------------------------

    def _flat(self, obs: Any) -> np.ndarray:
        """envpool observations (array or dict of arrays) -> an owned ``[n,O]`` float32 array (flattened), or for an
        image task an owned ``[n,C,H,W]`` uint8 array (kept as it is)."""
        if self._image:
            return np.array(obs, dtype=np.uint8)  # copy: envpool may reuse its buffers
        if self._obs_keys is None:
            return np.array(obs, dtype=np.float32)  # copy: envpool may reuse its buffers
        n = len(obs[self._obs_keys[0]])
        return np.concatenate([np.asarray(obs[k], dtype=np.float32).reshape(n, -1) for k in self._obs_keys], axis=1)

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device)

    def _obs(self, x: np.ndarray) -> Obs:
        """The ``Obs`` form of a ``_flat`` result: ``[N,O]``, ``{"image/frames": [N,C,H,W]}``, or a Playground
        task's parts ``{"state": [N,O], "privileged_state": [N,P]}`` (each its own contiguous copy)."""
        if self._image:
            return {IMAGE_PART: self._tensor(x)}
        if self._split is not None:
            return {name: self._tensor(np.ascontiguousarray(x[:, a:b])) for name, a, b in self._split}
        return self._tensor(x)

    def __repr__(self) -> str:
        return f"EnvpoolEnv({self._task!r}, num_envs={self.num_envs}, device={str(self.device)!r})"


def envpool_spec(task: str, num_threads: int = 0, batch_size: int | None = None, **make_kwargs: Any) -> EnvSpec:
    """The spec of ``envpool:<task>`` with ``make_kwargs`` from ``envpool.make_spec`` (envpool's config and spaces
    of the task, no simulator or thread pool built): what ``EnvpoolEnv(task, **make_kwargs).spec`` is."""
    import envpool

    _check_make_kwargs(task, make_kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")  # as in EnvpoolEnv._make
        spec = envpool.make_spec(task, num_threads=int(num_threads), **make_kwargs)
        return _spec(task, spec, spec.gymnasium_observation_space, spec.gymnasium_action_space)


def _check_make_kwargs(task: str, make_kwargs: dict[str, Any]) -> None:
    if make_kwargs.get("episodic_life"):
        raise UserInputError(
            f"episodic_life=True for envpool task {task!r}: expected it off. envpool continues the game after a "
            "lost life only in its own next-step reset; this adapter resets at once, which would restart the "
            "whole game at every lost life."
        )


def playground_tasks() -> tuple[str, ...]:
    """The MuJoCo Playground tasks the installed envpool ships (its registry entries of
    ``envpool.mujoco.playground``, without the ``MuJoCoPlayground/`` aliases), sorted."""
    from envpool.registration import registry

    return tuple(sorted(t for t, (module, _, _) in registry.specs.items()
                        if module == "envpool.mujoco.playground" and "/" not in t))


# The robot and kind of each Playground spec class (envpool's ``Playground<Robot>EnvSpec``), for `ctrl-rl list envs`;
# a class not here is listed by its name.
_PLAYGROUND_ROBOTS = {
    "Go1": "quadruped Unitree Go1", "Go1Getup": "quadruped Unitree Go1", "Go1Handstand": "quadruped Unitree Go1",
    "Barkour": "quadruped Google Barkour", "SpotJoystick": "quadruped Boston Dynamics Spot",
    "SpotGetup": "quadruped Boston Dynamics Spot", "SpotGait": "quadruped Boston Dynamics Spot",
    "G1": "humanoid Unitree G1", "H1": "humanoid Unitree H1", "T1": "humanoid Booster T1",
    "Op3": "humanoid Robotis OP3", "Apollo": "humanoid Apptronik Apollo",
    "BerkeleyHumanoid": "humanoid Berkeley Humanoid", "Panda": "arm Franka Panda",
    "PandaRobotiq": "arm Franka Panda with a Robotiq gripper", "Aloha": "bimanual ALOHA",
}  # fmt: skip


def playground_label(task: str) -> str:
    """``MuJoCo Playground, quadruped Unitree Go1`` for ``Go1JoystickFlatTerrain-v1``: the family a listing shows."""
    from envpool.registration import registry

    spec_cls = registry.specs[task][1]  # e.g. PlaygroundGo1EnvSpec
    name = spec_cls.removeprefix("Playground").removesuffix("EnvSpec")
    if name == "Hand":  # the LEAP hand and the Aero hand share the class
        return f"MuJoCo Playground, dexterous hand ({'Aero' if task.startswith('Aero') else 'LEAP'})"
    return f"MuJoCo Playground, {_PLAYGROUND_ROBOTS.get(name, name)}"


def _is_playground(envpool_spec: Any) -> bool:
    return type(envpool_spec).__name__.startswith("Playground")


def _obs_keys(task: str, envpool_spec: Any, obs_space: Any) -> list[str] | None:
    """The keys of a dict observation in the order they are concatenated, else None: a dm_control task's own keys,
    sorted; a Playground task's parts, ``state`` first, the other robot parts, then the privileged ones (sorted)."""
    import gymnasium

    if not isinstance(obs_space, gymnasium.spaces.Dict):
        return None
    if _is_playground(envpool_spec):
        return sorted(obs_space.spaces, key=lambda k: (k != "state", k.startswith("privileged"), k))
    foreign = _DMC_FOREIGN_KEYS.get(task, ())
    return sorted(k for k in obs_space.spaces if k not in foreign)


def _part_columns(parts: tuple[ObsPart, ...]) -> list[tuple[str, int, int]]:
    """``(name, start, stop)`` of each vector part in the concatenated ``[N, sum]`` array, in ``parts`` order."""
    out, start = [], 0
    for p in parts:
        out.append((p.name, start, start + p.numel))
        start += p.numel
    return out


def _numel(space: gymnasium.spaces.Space) -> int:
    """Elements of one sample of a part of a dict observation (a Box in envpool: it has a shape)."""
    if space.shape is None:
        raise ValueError(f"envpool observation part {space} has no shape: expected a Box")
    return int(np.prod(space.shape))


def _spec(task: str, envpool_spec: Any, obs_space: Any, act_space: Any) -> EnvSpec:
    """The EnvSpec of a task from envpool's spec object (config, spec class) and its gymnasium spaces."""
    import gymnasium

    image = (isinstance(obs_space, gymnasium.spaces.Box) and obs_space.dtype == np.uint8
             and len(obs_space.shape) == 3)  # Atari's stacked frames [C,H,W]
    obs_parts: tuple[ObsPart, ...] = ()
    if image:
        obs_shape: tuple[int, ...] = ()  # no 'state' part
        obs_parts = (ObsPart(IMAGE_PART, tuple(int(s) for s in obs_space.shape), torch.uint8),)
    elif isinstance(obs_space, gymnasium.spaces.Dict) and _is_playground(envpool_spec):
        obs_parts = tuple(ObsPart(k, (_numel(obs_space[k]),), torch.float32)
                          for k in _obs_keys(task, envpool_spec, obs_space) or ())
        obs_shape = state_shape(obs_parts)
    elif isinstance(obs_space, gymnasium.spaces.Dict):
        obs_shape = (sum(_numel(obs_space[k]) for k in _obs_keys(task, envpool_spec, obs_space) or ()),)
    else:
        obs_shape = tuple(int(s) for s in obs_space.shape)
    discrete = isinstance(act_space, gymnasium.spaces.Discrete)
    if discrete:
        action_dim, low, high = int(act_space.n), (), ()
    else:
        action_dim = int(np.prod(act_space.shape))
        low = tuple(float(x) for x in np.broadcast_to(act_space.low, act_space.shape).ravel())
        high = tuple(float(x) for x in np.broadcast_to(act_space.high, act_space.shape).ravel())
    config = envpool_spec.config._asdict()
    max_steps = config.get("max_episode_steps")
    # a Playground legged task's robot (joint names, default pose, PD gains, action scale / offset), else None
    robot = playground_robot(task, config) if _is_playground(envpool_spec) else None
    return EnvSpec(
        env_id=f"envpool:{task}",
        obs_shape=obs_shape,
        discrete=discrete,
        action_dim=action_dim,
        action_low=low,
        action_high=high,
        dt=_envpool_dt(task, envpool_spec),
        max_episode_steps=int(max_steps) if max_steps is not None else None,
        backend="envpool",
        obs_parts=obs_parts,
        privileged_parts=tuple(p.name for p in obs_parts if p.name.startswith("privileged")),
        robot=robot,
        action_units=robot.action_space().units if robot is not None else (),
        action_space_name=robot.default_action if robot is not None else None,
    )


def _envpool_dt(task: str, spec: Any) -> float:
    """Seconds per step, from what envpool's spec of the task exposes (0.0 when it cannot be found out)."""
    import envpool

    config = spec.config._asdict()
    spec_name = type(spec).__name__  # e.g. GymHalfCheetahEnvSpec, DmcCheetahEnvSpec, PendulumEnvSpec
    if spec_name == "AtariEnvSpec":
        return config["frame_skip"] / _ATARI_FPS
    if _is_playground(spec):
        return float(config["ctrl_dt"]) * int(config.get("action_repeat", 1))
    if spec_name.startswith("Dmc") and spec_name.endswith("EnvSpec"):
        control_dt = _DMC_CONTROL_DT.get(spec_name[3 : -len("EnvSpec")])
        if control_dt is None:
            return 0.0
        default_skip = envpool.make_spec(task).config.frame_skip
        return control_dt * config["frame_skip"] / default_skip  # dt = physics timestep * substeps
    if "xml_file" in config and "frame_skip" in config:
        # envpool loads "<name>_envpool.xml" when it ships one (walker2d_v5.xml -> walker2d_v5_envpool.xml).
        folder = os.path.join(config["base_path"], "mujoco", "assets_gym")
        stem = os.path.splitext(config["xml_file"])[0]
        paths = [os.path.join(folder, f) for f in (f"{stem}_envpool.xml", config["xml_file"])]
        path = next((p for p in paths if os.path.exists(p)), None)
        if path is None:
            return 0.0
        # Read <option timestep> rather than compiling: some of envpool's older XMLs (Hopper) use
        # settings that current MuJoCo refuses. 0.002 s is MuJoCo's default timestep.
        option = ElementTree.parse(path).getroot().find("option")
        timestep = float(option.get("timestep", 0.002)) if option is not None else 0.002
        return timestep * config["frame_skip"]
    return _CLASSIC_DT.get(task.split("-")[0], 0.0)
