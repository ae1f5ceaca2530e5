"""MuJoCo Warp (batched MuJoCo on a Warp device: CUDA, or Warp's CPU device) as a BatchedEnv: ``warp:<Task>``.

The tasks are Gymnasium's MuJoCo v5 locomotion tasks (``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``, ``Ant-v5``,
``Humanoid-v5``) on the MJCF files that ship inside the installed gymnasium, with gymnasium's observations, rewards,
terminations, frame skip, reset noise and time limit (``envs/warp_tasks.py`` states them; options are gymnasium's
constructor arguments, ``warp:Hopper-v5,ctrl_cost_weight=0.01``). N worlds share one ``mujoco_warp.Data`` on one
device; ``torch.device("cpu")`` runs on Warp's CPU device, ``cuda[:k]`` on that GPU.

One step, with no host synchronisation and no per-world Python:

1. the action ``[N,A]`` is copied into ``Data.ctrl`` (a torch view of the Warp array: ``wp.to_torch`` shares the
   memory, so observations, rewards and the reset are torch operations on the simulator's own arrays);
2. the physics: ``frame_skip`` calls of ``mujoco_warp.step``, then ``rne_postconstraint`` for the tasks that read
   contact forces (gymnasium's ``mj_rnePostConstraint`` after ``mj_step``). The launches are captured once into a
   Warp graph and replayed (``graph=True``, the default): a CUDA graph on a GPU, and Warp's CPU graph on the CPU
   device, which replays the same kernels ~50x faster than launching them from Python at a few worlds (trajectories
   bit-identical to the eager launches, tested). ``graph=false`` launches the kernels one by one;
3. observation, reward and termination of every world (``warp_tasks``), the time limit;
4. same-step auto-reset: a fresh start state is drawn for *every* world from the env's ``torch.Generator`` (as the
   torch-native envs do: the generator's use does not depend on which worlds ended, so runs are reproducible from the
   seed and the actions) and written where the episode ended, with ``time``, ``act``, ``ctrl`` and the solver's
   warm start zeroed (``mj_resetData``); for Ant and Humanoid the body kinematics of the new states are computed
   (gymnasium's ``mj_forward`` at reset) to observe them. ``final_obs`` keeps the ended episodes' last observation.

The previous step's body position that the forward velocity differences against (gymnasium reads it from the data
before ``mj_step``) is kept by the env, ``[N,P]``, so that it travels with the state.

Checkpointing: ``state_dict`` holds the simulator state (``qpos``, ``qvel``, ``act``, ``ctrl``, ``time`` and the
solver warm start ``qacc_warmstart``), the step counters, that position and the generator state; a loaded env
continues bit-exactly like an uninterrupted one on Warp's CPU device (tested). On a GPU, MuJoCo Warp orders contacts
and reduces with atomics; ``deterministic=true`` asks it for a run-to-run deterministic order (slower).

Kernels: MuJoCo Warp compiles its kernels on first use (cold, on the CPU device: ~25 s for the first task, a few
seconds for each other, as they share most kernels) and Warp caches them on disk, in ``WARP_CACHE_PATH`` (default
``~/.cache/warp/<warp version>``), so later processes load them in about a second.
"""

from __future__ import annotations

import functools
import importlib.util
import numbers
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrl_rl.envs.protocol import EnvSpec, StepOut
from ctrl_rl.envs.warp_tasks import TASKS, Views, WarpTask
from ctrl_rl.errors import UserInputError, did_you_mean

# Options of the env itself, next to the task's config fields.
_ENV_OPTIONS = ("graph", "deterministic")


def assets_dir() -> Path:
    """gymnasium's MuJoCo assets (``gymnasium/envs/mujoco/assets``), found without importing gymnasium."""
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or spec.origin is None:
        raise UserInputError("warp: envs need the gymnasium package for their MJCF files: expected it installed "
                             "(pip install gymnasium).")
    return Path(spec.origin).parent / "envs" / "mujoco" / "assets"


def _load_model(task: WarpTask) -> Any:
    """The task's ``mujoco.MjModel``, compiled from gymnasium's MJCF file (a few milliseconds)."""
    from ctrl_rl.envs.gymnasium import filter_mujoco_warnings
    from ctrl_rl.envs.mujoco_bindings import import_mujoco

    filter_mujoco_warnings()  # HalfCheetah's and Walker2d's files use the deprecated settotalmass
    return import_mujoco().MjModel.from_xml_path(str(assets_dir() / task.xml_file))


@dataclass(frozen=True)
class _ModelInfo:
    nq: int
    nv: int
    nbody: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    timestep: float


@functools.cache
def _model_info(name: str) -> _ModelInfo:
    mjm = _load_model(TASKS[name])
    bounds = np.asarray(mjm.actuator_ctrlrange, dtype=np.float32)  # [A,2]; float32 as gymnasium's action space
    return _ModelInfo(int(mjm.nq), int(mjm.nv), int(mjm.nbody), tuple(float(x) for x in bounds[:, 0]),
                      tuple(float(x) for x in bounds[:, 1]), float(mjm.opt.timestep))


def task_config(name: str, options: dict[str, Any]) -> Any:
    """The config of ``warp:<name>`` with ``options`` (gymnasium's argument names) set; a name it does not take or a
    value of the wrong kind raises ``UserInputError`` in one sentence."""
    cls = TASKS[name].config
    defaults = {f.name: f.default for f in fields(cls)}
    accepted = list(defaults) + list(_ENV_OPTIONS)
    for key, value in options.items():
        if key not in defaults:
            raise UserInputError(f"warp:{name} has no option {key!r}{did_you_mean(key, accepted)}: expected one of "
                                 f"{accepted}.")
        _check_value(name, key, value, defaults[key])
    return cls(**{k: tuple(float(x) for x in v) if isinstance(v, list | tuple) else v for k, v in options.items()})


def _check_value(name: str, key: str, value: Any, default: Any) -> None:
    if isinstance(default, bool):
        ok, expected = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1
        expected = "an integer >= 1"
    elif isinstance(default, float):
        ok, expected = isinstance(value, numbers.Real) and not isinstance(value, bool), "a number"
    else:  # a (low, high) range
        ok = (isinstance(value, list | tuple) and len(value) == 2
              and all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in value) and value[0] <= value[1])
        expected = "a (low, high) pair of numbers with low <= high"
    if not ok:
        raise UserInputError(f"warp:{name} option {key}={value!r}: expected {expected}.")


def warp_spec(name: str, graph: bool = True, deterministic: bool = False, **options: Any) -> EnvSpec:
    """The spec of ``warp:<name>`` with ``options``, from the task's MJCF file and config (MuJoCo compiles the model;
    no Warp device or kernel is touched): what ``WarpEnv(name, ..., **options).spec`` is."""
    task, cfg, info = TASKS[name], task_config(name, options), _model_info(name)
    return EnvSpec(
        env_id=f"warp:{name}",
        obs_shape=(task.obs_dim(cfg, info.nq, info.nv, info.nbody),),
        discrete=False,
        action_dim=len(info.action_low),
        action_low=info.action_low,
        action_high=info.action_high,
        dt=info.timestep * cfg.frame_skip,
        max_episode_steps=int(cfg.max_episode_steps),
        backend="warp",
    )


def _import_warp() -> tuple[Any, Any]:
    """``(warp, mujoco_warp)``, Warp initialised without its start-up banner and per-module load lines (its log level
    raised from the default info to warnings; a level the user chose stays)."""
    import warp as wp

    if wp.config.log_level == wp.LOG_INFO:
        wp.config.log_level = wp.LOG_WARNING
    import mujoco_warp as mjw

    wp.init()
    return wp, mjw


def _warp_device(wp: Any, device: torch.device, name: str) -> str:
    """The Warp device of a torch device: ``cpu`` -> Warp's CPU device, ``cuda[:k]`` -> ``cuda:k``."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        if not wp.is_cuda_available():
            raise UserInputError(f"device {str(device)!r} for warp:{name}: Warp finds no usable CUDA driver here, "
                                 "expected 'cpu' or a machine whose NVIDIA driver supports warp-lang's CUDA build.")
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    raise UserInputError(f"device {str(device)!r} for warp:{name}: expected 'cpu' or 'cuda[:k]'.")


def check_env_args(task: str, num_envs: int, graph: bool, deterministic: bool) -> None:
    """The warp envs' constructor arguments beside the task's options: a positive world count and boolean switches."""
    if int(num_envs) < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}.")
    for key, value in (("graph", graph), ("deterministic", deterministic)):
        _check_value(task, key, value, False)


def checked_action(env: Any, action: torch.Tensor) -> torch.Tensor:
    """``action`` as float32 on ``env.device`` after a shape check against ``env._action_shape`` at the public entry
    (metadata only, no host sync); the warp envs' step."""
    action = torch.as_tensor(action, device=env.device)
    if tuple(action.shape) != env._action_shape:
        raise ValueError(f"{env.spec.env_id} expects float actions of shape {env._action_shape} "
                         f"(num_envs={env.num_envs}), got shape {tuple(action.shape)}.")
    return action.to(torch.float32)


def load_sim_tensors(env: Any, d: dict[str, Any], targets: dict[str, torch.Tensor]) -> None:
    """A warp env's ``load_state_dict``: ``d`` must be for ``env``'s id and hold every key of ``targets`` (the
    simulator's arrays as torch views) at its shape; all are checked before any is copied in place."""
    if d.get("env_id") != env.spec.env_id:
        raise ValueError(f"state_dict is for env {d.get('env_id')!r}, not {env.spec.env_id!r}.")
    missing = [key for key in targets if key not in d]
    if missing:
        raise ValueError(f"state_dict for {env.spec.env_id!r} lacks {', '.join(missing)}: expected the keys "
                         f"{', '.join(targets)} that the env's own state_dict() writes.")
    for key, target in targets.items():
        if tuple(d[key].shape) != tuple(target.shape):
            raise ValueError(f"state_dict holds {key} of shape {tuple(d[key].shape)}, expected "
                             f"{tuple(target.shape)} (num_envs={env.num_envs}).")
    for key, target in targets.items():
        target.copy_(d[key].to(device=env.device, dtype=target.dtype))


class GraphLaunches:
    """Runs groups of Warp launches in order with the torch work around them on one device: each group (a function
    that launches kernels) is captured once into a Warp graph and replayed (``graph=True``), or launched eagerly.

    Args:
        wp: the ``warp`` module.
        wp_device: the Warp device (``cpu``, ``cuda:k``).
        device: the matching torch device.
        graph: capture and replay; False launches eagerly.
        state: the tensors the groups change, put back after the eager run that precedes a capture.
    """

    def __init__(self, wp: Any, wp_device: str, device: torch.device, graph: bool,
                 state: tuple[torch.Tensor, ...]) -> None:
        self._wp, self._wp_device, self._device, self.graph = wp, wp_device, device, graph
        self._state = state
        self._graphs: dict[str, Any] = {}

    def __call__(self, fn: Callable[[], None]) -> None:
        """Run ``fn``'s Warp launches after the torch work queued so far and before the torch work that follows:
        replaying its captured graph when ``graph`` is set (captured on first use, keyed by ``fn``'s name), else
        launching them."""
        wp = self._wp
        on_cuda = self._device.type == "cuda"
        stream = wp.stream_from_torch(self._device) if on_cuda else None  # torch's current stream
        with wp.ScopedDevice(self._wp_device):
            if not self.graph:
                if stream is None:
                    fn()
                else:
                    with wp.ScopedStream(stream):
                        fn()
                return
            key = fn.__name__
            if key not in self._graphs:
                self._graphs[key] = self._capture(fn, stream)
            wp.capture_launch(self._graphs[key], stream=stream)

    def _capture(self, fn: Callable[[], None], stream: Any) -> Any:
        """``fn``'s launches as a Warp graph. ``fn`` runs once eagerly first, so that exactly the kernels it uses are
        compiled or loaded (Warp's own ``force_module_load`` would build every MuJoCo Warp module, ~2x the cold
        compile), and the state is put back after it."""
        wp = self._wp
        saved = [x.clone() for x in self._state]
        if stream is None:
            fn()
        else:
            with wp.ScopedStream(stream):
                fn()
        for target, value in zip(self._state, saved):
            target.copy_(value)
        if stream is not None:
            torch.cuda.synchronize(self._device)  # capture on Warp's own stream (torch's may be the legacy one)
        with wp.ScopedCapture(device=self._wp_device, force_module_load=False) as capture:
            fn()
        return capture.graph

    def clear(self) -> None:
        """Drop the captured graphs."""
        self._graphs.clear()


class WarpEnv:
    """N worlds of one ``warp:`` task on one Warp device, stepped as a batch; see the module docstring.

    Args:
        task: the task name without prefix (``HalfCheetah-v5``).
        num_envs: N, the number of worlds.
        device: ``cpu`` (Warp's CPU device) or ``cuda[:k]``; every returned tensor lives there.
        seed: seed of the env's ``torch.Generator`` (the reset noise); ``reset(seed)`` re-seeds it.
        graph: capture the physics launches once and replay them (module docstring); False launches them eagerly.
        deterministic: on a GPU, ask MuJoCo Warp for a run-to-run deterministic contact order and reductions.
        **options: the task's config fields (gymnasium's arguments, ``max_episode_steps``).
    """

    def __init__(self, task: str, num_envs: int = 1, device: str | torch.device = "cpu", seed: int = 0,
                 graph: bool = True, deterministic: bool = False, **options: Any) -> None:
        check_env_args(task, num_envs, graph, deterministic)
        self.spec = warp_spec(task, **options)
        self.cfg = task_config(task, options)
        self.task = TASKS[task]
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.graph = bool(graph)
        wp, mjw = _import_warp()
        self._wp, self._mjw = wp, mjw
        self._wp_device = _warp_device(wp, self.device, task)
        if self.device.type == "cuda":
            self.device = torch.device(self._wp_device)
        mjm = _load_model(self.task)
        if self.task.solver == "newton":
            mjm.opt.solver = int(mjw.SolverType.NEWTON)  # MuJoCo Warp has no PGS (Humanoid's own solver)
        with wp.ScopedDevice(self._wp_device):
            self._model = mjw.put_model(mjm)
            if deterministic and self.device.type == "cuda":  # the CPU device runs each kernel serially: deterministic
                self._model.opt.deterministic = int(mjw.DeterminismType.ALL)
            self._data = mjw.make_data(mjm, nworld=self.num_envs)
        d = self._data
        t = wp.to_torch  # views: the same memory as the Warp arrays
        self._qpos, self._qvel, self._act, self._ctrl = t(d.qpos), t(d.qvel), t(d.act), t(d.ctrl)  # [N,nq] ...
        self._time, self._warmstart = t(d.time), t(d.qacc_warmstart)  # [N], [N,nv]
        self._views = Views(self._qpos, self._qvel, t(d.xpos), t(d.xipos), t(d.cinert), t(d.cvel),
                            t(d.qfrc_actuator), t(d.cfrc_ext),
                            torch.as_tensor(mjm.body_mass, dtype=torch.float32, device=self.device))
        self._qpos0 = torch.as_tensor(mjm.qpos0, dtype=torch.float32, device=self.device)  # [nq]
        self._launch = GraphLaunches(wp, self._wp_device, self.device, self.graph, (
            self._qpos, self._qvel, self._act, self._ctrl, self._time, self._warmstart))
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self._elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # [N]
        self._position = self.task.position(self._views).clone()  # [N,P]
        self._action_shape = (self.num_envs, self.spec.action_dim)

    # ---- the simulator's launches ---------------------------------------------------------------------------------

    def _physics(self) -> None:
        for _ in range(self.cfg.frame_skip):
            self._mjw.step(self._model, self._data)
        if self.task.contact_forces:
            self._mjw.rne_postconstraint(self._model, self._data)

    def _kinematics(self) -> None:
        """Body positions, inertias and velocities of the current ``qpos``/``qvel`` (what gymnasium's ``mj_forward``
        at reset gives the observation)."""
        self._mjw.kinematics(self._model, self._data)
        self._mjw.com_pos(self._model, self._data)
        self._mjw.com_vel(self._model, self._data)

    # ---- the BatchedEnv protocol ----------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every world; re-seed the generator first when ``seed`` is given."""
        if seed is not None:
            self.generator.manual_seed(int(seed))
        return self._start(*self._fresh_state())

    def set_state(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """Start a new episode in every world from ``qpos [N,nq]`` and ``qvel [N,nv]`` (gymnasium's ``set_state``
        after ``mj_resetData``); returns the observation. Used to start from another simulator's state."""
        qpos = torch.as_tensor(qpos, dtype=torch.float32, device=self.device)
        qvel = torch.as_tensor(qvel, dtype=torch.float32, device=self.device)
        if qpos.shape != self._qpos.shape or qvel.shape != self._qvel.shape:
            raise ValueError(f"{self.spec.env_id} takes qpos {tuple(self._qpos.shape)} and qvel "
                             f"{tuple(self._qvel.shape)}, got {tuple(qpos.shape)} and {tuple(qvel.shape)}.")
        return self._start(qpos, qvel)

    def step(self, action: torch.Tensor) -> StepOut:
        """Advance every world by ``frame_skip`` MuJoCo steps and reset the worlds whose episode ended (same step)."""
        action = self._check_action(action)  # [N,A]
        self._ctrl.copy_(action)
        self._launch(self._physics)
        v, cfg = self._views, self.cfg
        final_obs = self.task.observe(cfg, v, False)  # [N,O]
        position = self.task.position(v).clone()  # [N,P]
        velocity = (position - self._position) / self.spec.dt  # [N,P]
        reward, healthy = self.task.reward(cfg, v, action, velocity)  # [N], [N]
        terminated = ~healthy if getattr(cfg, "terminate_when_unhealthy", False) else torch.zeros_like(healthy)  # [N]
        steps = self._elapsed + 1  # [N]
        truncated = (steps >= cfg.max_episode_steps) & ~terminated  # [N]; terminated wins
        done = terminated | truncated  # [N]
        self._restart(done, *self._fresh_state())
        obs = torch.where(done[:, None], self.task.observe(cfg, v, True), final_obs)  # [N,O]
        self._position = torch.where(done[:, None], self.task.position(v), position)  # [N,P]
        self._elapsed = steps.masked_fill(done, 0)  # [N]
        return StepOut(obs=obs, reward=reward.to(torch.float32), terminated=terminated, truncated=truncated,
                       final_obs=final_obs, info={"elapsed_step": steps})

    def close(self) -> None:
        """Drop the captured graphs (the simulator's arrays go with the env)."""
        self._launch.clear()

    # ---- resets ------------------------------------------------------------------------------------------------------

    def _start(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """Every world from ``qpos [N,nq]``, ``qvel [N,nv]`` at step 0; returns the first observation ``[N,O]``."""
        everywhere = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)  # [N]
        self._restart(everywhere, qpos, qvel)
        self._elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # [N]
        self._position = self.task.position(self._views).clone()  # [N,P]
        return self.task.observe(self.cfg, self._views, True)  # [N,O]

    def _fresh_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A start state for every world, ``(qpos [N,nq], qvel [N,nv])``, from the generator only (the task's reset
        noise around ``qpos0`` and zero velocity)."""
        s, g = self.cfg.reset_noise_scale, self.generator
        u = torch.rand(self._qpos.shape, generator=g, device=self.device)  # [N,nq]
        qpos = self._qpos0 + (2.0 * u - 1.0) * s  # [N,nq] U(-s, s) around qpos0
        if self.task.qvel_noise == "normal":
            qvel = s * torch.randn(self._qvel.shape, generator=g, device=self.device)  # [N,nv]
        else:
            qvel = (2.0 * torch.rand(self._qvel.shape, generator=g, device=self.device) - 1.0) * s  # [N,nv]
        return qpos, qvel

    def _restart(self, where: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> None:
        """Write ``qpos``/``qvel`` into the worlds ``where [N]`` with the rest of the state reset (``mj_resetData``),
        in place in the simulator's arrays; then the kinematics of every world when the task observes them."""
        mask = where[:, None]  # [N,1]
        self._qpos.copy_(torch.where(mask, qpos, self._qpos))
        self._qvel.copy_(torch.where(mask, qvel, self._qvel))
        self._act.masked_fill_(mask, 0.0)
        self._ctrl.masked_fill_(mask, 0.0)
        self._warmstart.masked_fill_(mask, 0.0)
        self._time.masked_fill_(where, 0.0)
        if self.task.reset_kinematics:  # also recomputes the running worlds' bodies: their next step recomputes them
            self._launch(self._kinematics)

    # ---- checkpointing -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-exactly: the simulator state, counters, position, generator state."""
        return {
            "env_id": self.spec.env_id,
            "qpos": self._qpos.clone(), "qvel": self._qvel.clone(), "act": self._act.clone(),
            "ctrl": self._ctrl.clone(), "time": self._time.clone(), "qacc_warmstart": self._warmstart.clone(),
            "elapsed_steps": self._elapsed.clone(), "position": self._position.clone(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        load_sim_tensors(self, d, {"qpos": self._qpos, "qvel": self._qvel, "act": self._act, "ctrl": self._ctrl,
                                   "time": self._time, "qacc_warmstart": self._warmstart})
        self._elapsed = d["elapsed_steps"].to(device=self.device, dtype=torch.int64, copy=True)  # [N]
        self._position = d["position"].to(device=self.device, dtype=torch.float32, copy=True)  # [N,P]
        self.generator.set_state(d["generator"])

    # ---- validation -------------------------------------------------------------------------------------------------

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        return checked_action(self, action)

    def __repr__(self) -> str:
        return f"WarpEnv({self.spec.env_id!r}, num_envs={self.num_envs}, device={str(self.device)!r})"
