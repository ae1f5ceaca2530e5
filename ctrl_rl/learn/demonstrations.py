"""The demonstrations loop: LeRobot demonstrations -> ``update(batch)`` of a VLA, evaluated in ``--env`` by success
rate; one step is one update (``--total-steps`` counts updates).

Every step draws ``--batch-size`` demonstration frames (``vla.data.Demos.sample``: images, proprio, chunk, the
instruction's index, and what a sample weighting reads) with the run's generator, on the training device, and
passes them to ``update``. The algorithm draws nothing itself.

The set-up here is shared with the chunk-rollouts loop (``learn/chunk_rollouts.py``), whose data flow includes
this one (its SFT anchor):

- a ``manip:`` env id without ``cameras=``, ``image_size=`` or ``language=`` gets the loop's ``--cameras``,
  ``--image-size`` and ``language=true`` (the resolved id is saved, so evaluation and export see the same
  observation);
- without a simulator (real-robot data: ``robot:<name>``, which the CLI picks from the dataset's ``robot_type`` or
  ``--robot`` when no ``--env`` is given) the id is completed from the dataset (``storage.datasets.envdata.
  robot_env_id``: the state's width, the cameras among its videos, the image size, an instruction), the policy's
  ``--proprio-columns`` left at the manipulation tasks' default become the whole state, and nothing is evaluated;
- the demonstrations are read for the model's cameras, image size, chunk and proprioception
  (``VLAModel.load_demos``);
- ``--init RUN`` starts from another VLA run's policy (one of the entry's ``init_from``; the policy's shape fields
  come from that run's config, ``AlgoEntry.init_fields``), whose normalisation statistics it keeps; otherwise the
  statistics come from the demonstrations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ctrl_rl.algos import registry
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.registry import has_simulator, spec_of
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import read_init
from ctrl_rl.learn.config import DemonstrationsLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.offline import env_spec, run_updates
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainResult, load_state
from ctrl_rl.storage.datasets.envdata import robot_env_id
from ctrl_rl.vla.data import Demos
from ctrl_rl.vla.model import DROID_PROPRIO, DemonstrationLearner


def complete_env_id(env: str, cameras: str, image_size: str) -> str:
    """A ``manip:`` id with the cameras, image size and instruction a VLA needs added where the id has none."""
    if not env.startswith("manip:"):
        return env
    have = {kv.split("=", 1)[0] for kv in env.split(",")[1:]}
    extra = [f"{k}={v}" for k, v in (("cameras", cameras), ("image_size", image_size), ("language", "true"))
             if k not in have]
    return ",".join([env, *extra])


@dataclass
class Init:
    """The policy a run starts from (``--init``): its weights and where they were read."""

    policy: dict[str, Any]
    path: str


def prepare(entry, run: RunConfig, cfg, resume: bool) -> tuple[RunConfig, Any, Init | None]:
    """Checks and settings before the run directory is touched: the dataset is given, the env id is completed, and
    ``--init`` is read (its shape fields into ``cfg``); a resumed run has them in its saved config already."""
    if run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {entry.name}` needs --dataset DIR: expected demonstrations in the "
                             "LeRobot layout (ctrl-rl data generate --env manip:Lift --level scripted "
                             "--format lerobot)")
    loop = run.loop
    assert isinstance(loop, DemonstrationsLoopConfig)
    env = complete_env_id(run.env, loop.cameras, loop.image_size)
    if not has_simulator(env) and not resume:  # a real robot: its spec completed from the demonstrations
        env = robot_env_id(env, str(run.dataset), loop.state_key, loop.cameras, loop.image_size, language=True)
        width = spec_of(env).obs_dim
        if getattr(cfg, "proprio_columns", None) == DROID_PROPRIO and loop.init is None:
            cfg = dataclasses.replace(cfg, proprio_columns=f"0:{width}")  # the robot's state is the proprioception
    run = dataclasses.replace(run, env=env)
    init = None
    if loop.init is not None and not resume:
        cfg, state, path = read_init(entry, cfg, loop.init)
        init = Init(state["policy"], path)
    return run, cfg, init


@dataclass
class Start:
    """What a demonstrations run starts from."""

    algo: Any
    spec: EnvSpec
    demos: Demos
    step: int
    last_return: float
    static: dict[str, torch.Tensor]
    """Figures logged with every row (trainable fraction, demonstration frames)."""


def start(ctx: RunContext, entry, run: RunConfig, cfg, init: Init | None) -> Start:
    """The algorithm built for the env's spec, its demonstrations, and its state: the run's checkpoint on a resume,
    else ``init``'s policy, else the demonstrations' statistics."""
    loop = run.loop
    assert isinstance(loop, DemonstrationsLoopConfig)
    spec = env_spec(run, entry.name, True)
    gen = ctx.seed(run.seed)
    algo = entry.make(cfg, spec, ctx.device, gen)
    if not isinstance(algo, DemonstrationLearner):
        raise TypeError(f"{entry.name} runs on demonstrations but has no VLAModel `model` and `start_from`")
    demos = algo.model.load_demos(str(run.dataset), spec.action_space_name or "", loop.action_key, loop.state_key)
    step, last_return = 0, float("nan")
    if ctx.checkpoint is not None:
        load_state(algo, ctx.checkpoint["algo_state"], "networks", ctx.ck_dir / "latest.pt")
        ctx.restore_rng()
        step, last_return = ctx.counters["step"], ctx.counters["last_return"]
    elif init is not None:
        try:
            algo.start_from(init.policy)
        except (RuntimeError, KeyError, ValueError) as e:
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise UserInputError(f"--init {init.path!r} does not fit env {run.env!r} and this run's policy ({first}): "
                                 "expected a run on the same task, cameras and dataset keys") from None
    else:
        algo.model.set_statistics(demos.proprio, demos.action)
    static = {"stats/trainable_fraction": torch.tensor(algo.model.trainable_fraction()),
              "stats/demo_frames": torch.tensor(float(demos.num_frames))}
    return Start(algo, spec, demos, step, last_return, static)


def train_demonstrations(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                         max_iterations: int | None = None) -> TrainResult:
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    run, cfg, init = prepare(entry, run, cfg, resume)
    loop = run.loop
    assert isinstance(loop, DemonstrationsLoopConfig)
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        s = start(ctx, entry, run, cfg, init)
        algo, gen = s.algo, s.algo.gen
        ctx.start(run.total_steps, s.step, f"{algo_name} {Path(str(run.dataset)).name}", unit="upd")

        def update() -> dict:
            return {**algo.update(s.demos.sample(loop.batch_size, gen, ctx.device)), **s.static}

        return run_updates(ctx, algo, update, s.step, s.last_return, {}, max_iterations)


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_demonstrations(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "demonstrations", DemonstrationsLoopConfig, _train,
    summary="LeRobot demonstrations -> update(batch) of a VLA, evaluated in the env by success rate"))
