"""``ManipEnv``: N tabletop manipulation envs as a BatchedEnv (``ctrl_rl/envs/protocol.py``).

The N MuJoCo envs run in this process (a ``SimGroup``, one after the other) or over ``workers=K`` processes (a
``ProcessSimGroup`` on ``core.workers.WorkerPool``); either way this class only converts the group's NumPy arrays
to tensors on ``device``, so NumPy is confined to ``reset`` / ``step`` here. Which is faster depends on the cameras: see
``experiments/manipulation_speed/manipulation.py``.

Protocol mapping:

- observation: the flat float32 ``state`` ``[N,O]`` by default; with cameras or language a dict of parts
  ``state [N,O]`` float32, ``image/<camera> [N,3,H,W]`` uint8, ``language [N,64]`` int64 (``sim.py`` has the state
  layout, ``config.py`` the options);
- reset is automatic in the same step; ``final_obs`` is the last observation of an episode that ended;
- ``terminated`` only with ``terminate_on_success=true`` (on success); the time limit ends episodes ``truncated``;
- ``info``: ``success [N]`` bool (the task's test after this step), ``elapsed_step [N]`` int64 (steps of the
  episode each step belongs to), ``instruction_index [N]`` int64 (which of ``task_instructions`` the episode each
  step belongs to was given).

The spec (``manip_spec``, from the task and its options alone: no MuJoCo) carries the robot (the ``RobotSpec``,
``franka_droid()``), one unit per action dimension, the name of the robot's action space the actions are and where
the joints and the end effector sit in the ``state`` part; the policy export and the deployment runtime read them
there. Attributes read by other code: ``instructions`` (the current episode's instruction of each env, after the
step's auto-reset) and ``task_instructions`` (the task's three phrasings) for data recorders; ``robot``,
``action_units`` and ``action_space_name`` are the spec's.

Checkpointing keeps the seed and counters only (like the other NumPy simulators, ``envs/reseed.py``): a resumed
run re-seeds and continues with fresh episodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ctrl_rl.core.obs import Obs, ObsPart
from ctrl_rl.envs.manipulation.config import ManipConfig
from ctrl_rl.envs.manipulation.sim import LANGUAGE_LEN, PROPRIO_DIM
from ctrl_rl.envs.manipulation.tasks import TASK_INFO
from ctrl_rl.envs.protocol import EnvSpec, RobotStateLayout, StepOut, action_to_numpy
from ctrl_rl.envs.reseed import load_metadata_state, metadata_state
from ctrl_rl.errors import UserInputError
from ctrl_rl.robots.spec import RobotSpec, franka_droid

if TYPE_CHECKING:
    from ctrl_rl.envs.manipulation.sim import SimGroup
    from ctrl_rl.envs.manipulation.workers import ProcessSimGroup

# the first 10 proprio columns (sim.py): 7 joint positions, then the end-effector position
STATE_LAYOUT = RobotStateLayout(joint_position=(0, 7), ee_position=(7, 10))


def manip_spec(task: str, **options: Any) -> EnvSpec:
    """The spec of ``manip:<task>`` with ``options`` (``ManipConfig`` fields), from the config alone."""
    return config_spec(ManipConfig.from_options(task, **options))


def config_spec(cfg: ManipConfig) -> EnvSpec:
    """The spec of a batch of envs with ``cfg`` (``ManipEnv.spec``): shapes, bounds and the robot metadata."""
    robot = franka_droid()
    space = robot.action_space(cfg.action)
    if cfg.action == "cartesian_velocity":
        units = space.units  # m m m rad rad rad 1
    else:  # the joint velocities and the gripper of the cartesian space
        units = space.units + robot.action_space("cartesian_velocity").units[-1:]
    action_dim = len(units)
    obs_dim = PROPRIO_DIM + len(TASK_INFO[cfg.task].privileged)
    parts: tuple[ObsPart, ...] = ()
    if cfg.obs_parts_requested:
        parts = (ObsPart("state", (obs_dim,), torch.float32),)
        parts += tuple(ObsPart(f"image/{c}", (3, *cfg.image_size), torch.uint8) for c in cfg.cameras)
        if cfg.language:
            parts += (ObsPart("language", (LANGUAGE_LEN,), torch.int64),)
    return EnvSpec(
        env_id=f"manip:{cfg.task}", obs_shape=(obs_dim,), discrete=False, action_dim=action_dim,
        action_low=(-1.0,) * action_dim, action_high=(1.0,) * action_dim, dt=robot.dt,
        max_episode_steps=cfg.max_episode_steps, backend="manip", obs_parts=parts, robot=robot, action_units=units,
        action_space_name=cfg.action, robot_state_layout=STATE_LAYOUT,
    )


class ManipEnv:
    """N DROID-style Franka tabletop envs of one task (see the module docstring).

    Args:
        task: Reach, Lift, Push, PickPlace or OpenDrawer.
        num_envs: N.
        device: where returned tensors live.
        seed: base seed; env ``i`` draws from ``np.random.default_rng([seed, i])``.
        **options: the ``ManipConfig`` fields (``cameras``, ``image_size``, ``language``, ``reward``,
            ``randomize``, ``action``, ``max_episode_steps``, ``terminate_on_success``, ``workers``).
    """

    def __init__(self, task: str, num_envs: int = 1, device: str | torch.device = "cpu", seed: int = 0,
                 **options: Any) -> None:
        self.config = cfg = ManipConfig.from_options(task, **options)
        self.num_envs = int(num_envs)
        if self.num_envs % cfg.group_size:
            raise UserInputError(f"manip:{task} option group_size={cfg.group_size} does not divide the {self.num_envs} "
                                 "envs: expected a number of envs that is a multiple of the group size.")
        self.device = torch.device(device)
        self.spec = config_spec(cfg)
        self.task_instructions = TASK_INFO[task].instructions
        self._action_shape = (self.num_envs, self.spec.action_dim)
        self._seed = int(seed)
        self._pending_seed: int | None = None
        self._resets = 0
        self._episodes = 0
        self._started = False
        self._group: SimGroup | ProcessSimGroup | None  # None once closed
        if cfg.workers > 0:
            from ctrl_rl.envs.manipulation.workers import ProcessSimGroup

            self._group = ProcessSimGroup(task, cfg, self.robot, self.num_envs, cfg.workers)
        else:
            from ctrl_rl.envs.manipulation.sim import SimGroup

            self._group = SimGroup(task, cfg, self.robot, self.num_envs)
        self.instructions: list[str] = []

    @property
    def robot(self) -> RobotSpec:
        assert self.spec.robot is not None
        return self.spec.robot

    @property
    def action_units(self) -> tuple[str, ...]:
        return self.spec.action_units

    @property
    def action_space_name(self) -> str:
        assert self.spec.action_space_name is not None
        return self.spec.action_space_name

    # ---- the BatchedEnv protocol ---------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> Obs:
        """Start a new episode in every env; with ``seed`` (or the construction seed the first time) re-seed."""
        if seed is None:
            seed = self._pending_seed if self._pending_seed is not None else (None if self._started else self._seed)
        self._pending_seed = None
        if seed is not None:
            self._seed = int(seed)
        out = self._live_group().reset(seed)
        self._set_instructions(out["phrasing"])
        self._resets += 1
        self._started = True
        return self._obs(out["obs"])

    def step(self, action: torch.Tensor) -> StepOut:
        """One 1/15 s step of every env; envs whose episode ended start a new one in the same step."""
        if not self._started:
            raise RuntimeError(f"{self.spec.env_id}: call reset() before the first step().")
        act = action_to_numpy(action, self.spec, self._action_shape, np.float64)  # [N,A]
        out = self._live_group().step(act)
        done = out["terminated"] | out["truncated"]  # [N]
        self._episodes += int(done.sum())
        self._set_instructions(out["next_phrasing"])
        t = self._tensor
        return StepOut(
            obs=self._obs(out["obs"]),
            reward=t(out["reward"]),
            terminated=t(out["terminated"]),
            truncated=t(out["truncated"]),
            final_obs=self._obs(out["final_obs"], copy=True),
            info={"success": t(out["success"]), "elapsed_step": t(out["elapsed"]),
                  "instruction_index": t(out["phrasing"])},
        )

    def _live_group(self) -> SimGroup | ProcessSimGroup:
        if self._group is None:
            raise RuntimeError(f"{self.spec.env_id}: the env is closed; expected reset() and step() before close().")
        return self._group

    def close(self) -> None:
        group, self._group = getattr(self, "_group", None), None
        if group is not None:
            group.close()

    # ---- checkpointing (metadata only; see the module docstring) ---------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return metadata_state(self.spec.env_id, "manip", self._seed, self._resets, self._episodes)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self._pending_seed, self._resets, self._episodes = load_metadata_state(d, self.spec.env_id)

    # ---- NumPy -> torch ----------------------------------------------------------------------------------------

    def _set_instructions(self, phrasing: np.ndarray) -> None:
        self.instructions = [self.task_instructions[int(p)] for p in phrasing]

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

    def _obs(self, arrays: dict[str, np.ndarray], copy: bool = False) -> Obs:
        """The group's arrays as the spec's observation form (a plain ``[N,O]`` tensor or a dict of parts);
        ``copy`` gives tensors that share no memory with ``arrays`` (``final_obs`` may alias ``obs``)."""
        conv = (lambda x: torch.tensor(x, device=self.device)) if copy else self._tensor
        if self.spec.is_flat:
            return conv(arrays["state"])  # [N,O]
        return {p.name: conv(arrays[p.name]) for p in self.spec.parts}

    def __repr__(self) -> str:
        return f"ManipEnv({self.config.task!r}, num_envs={self.num_envs}, device={str(self.device)!r})"

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass
