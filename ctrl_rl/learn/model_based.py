"""The world-model and model-based offline loops.

``train_dynamics`` (regime ``world-model``, ``ctrl-rl train dynamics``): fits a dynamics ensemble on
``--dataset`` epoch by epoch with early stopping (``world_models.ensemble.fit``); every epoch's holdout loss and
calibration go to metrics.jsonl and TensorBoard. The run directory then holds ``model.pt`` (weights, elites,
normalisers, the config and the task it was fitted on), which agents reuse with ``--model RUN``.

``train_model_based`` (regime ``model-based``): the model comes from ``--model RUN`` or is fitted first in
``RUN_DIR/dynamics`` (a resumable dynamics run, with the agent entry's ``model_defaults``). The model's imagined
data reaches the agent through a collector, the one the entry names (``AlgoEntry.collector``), whose loop config
holds that collector's settings (and so its flags) beside the common ``model`` and ``clip_actions``
(``ModelBasedLoopConfig``):

- ``FlatRollouts`` (the default; ``FlatRolloutsLoopConfig``; mbpo, mopo, ravl): every ``--rollout-every`` gradient
  steps the current actor is rolled out for ``--rollout-length`` steps in a ``ModelEnv`` from ``--rollout-starts``
  dataset states (rewards penalised by ``--penalty``) into a FIFO model buffer holding ``--retain-rounds`` rounds;
  every batch takes ``--real-ratio`` of its rows from the dataset and the rest from the model buffer.
  ``--model true`` puts the real simulator in the model's place (``TrueDynamicsEnv``, states set from the
  dataset's ``infos/qpos`` and ``infos/qvel``): RAVL's edge-of-reach experiment.
- ``TapeRollouts`` (``collector="tapes"``; ``TapeRolloutsLoopConfig``; neubay): real history prefixes continued in
  the model by the recurrent actor (one elite per rollout, truncated by uncertainty or the horizon), whole tapes
  into a tape buffer; each collection pays for ``ceil(--utd x transitions added)`` gradient steps on
  ``--batch-transitions`` rows.

The collector checks the agent's capability (``core.protocols.Recurrent``, ``world_models.history.HistoryAgent``);
the loop never looks at an algorithm's name. Evaluation, logging, checkpoints and a ``Scheduled`` agent's
``schedule(progress)`` are the offline loop's (``learn.offline.run_updates``); checkpoints also hold the
collector's state (model buffer and model env, or tape buffer and collector generator), so ``--resume``
continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.protocols import Algorithm, Recurrent
from ctrl_rl.envs.registry import spec_of
from ctrl_rl.envs.wrappers import ActionRescale
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint, save_checkpoint
from ctrl_rl.learn.config import (
    FlatRolloutsLoopConfig,
    ModelBasedLoopConfig,
    RunConfig,
    TapeRolloutsLoopConfig,
    WorldModelLoopConfig,
    ensure_loop,
)
from ctrl_rl.learn.offline import env_spec, run_updates
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainingDiverged, TrainResult, check_memory, load_state
from ctrl_rl.storage.datasets import open_dataset, to_replay, unit_bounds
from ctrl_rl.storage.replay import MixedSampler, ReplayBuffer
from ctrl_rl.storage.tapes import TapeBuffer
from ctrl_rl.world_models.ensemble import EnsembleDynamics, fit
from ctrl_rl.world_models.history import (
    HistoryAgent,
    HistoryCollector,
    trajectories_from_dataset,
    uncertainty_threshold,
)
from ctrl_rl.world_models.model_env import ModelDiverged, ModelEnv, imagine
from ctrl_rl.world_models.termination import get_termination, has_termination

MODEL_FILE = "model.pt"
MODEL_KIND = "dynamics-model-1"
MODEL_ACTION_UNITS = "agent"  # model.pt's action_units: fitted on actions in the agent's [-1, 1] (open_dataset)
TRUE_MODEL = "true"  # --model true: the real simulator in the model's place
WORLD_MODEL = "world-model"  # the regime of the dynamics fit, registered below


def model_entry() -> registry.AlgoEntry:
    """The registered world-model algorithm (the dynamics ensemble) that agents fit first and load."""
    found = [e for e in registry.entries() if e.regime == WORLD_MODEL]
    if len(found) != 1:
        raise RuntimeError(f"expected exactly one registered world-model algorithm, found {[e.name for e in found]}")
    return found[0]


def task_of(env_id: str) -> str:
    """The task an env id names, without backend prefix and version (``envpool:Hopper-v5`` -> ``hopper``)."""
    name = env_id.split(":", 1)[-1].split(",", 1)[0]
    return name.rsplit("-v", 1)[0].lower()


# -- world-model regime -------------------------------------------------------------------------------------

def dataset_arrays(run: RunConfig, spec, clip_actions: float | None, device: torch.device,
                   view: Literal["trajectory", "qlearning"] = "trajectory") -> dict[str, torch.Tensor]:
    """The dataset's transitions with a known next observation, as the tensors ``fit`` takes.

    They come from the ``trajectory`` view (``view="qlearning"`` only to study fits made before on those rows):
    a terminal row's next observation is the stored ``next_observations``
    (the state the episode ended in), or the row is dropped when the file stores none. The ``qlearning`` view
    (``d4rl.qlearning_dataset``) would give it the next episode's first observation, harmless for TD targets,
    which a terminal zeroes, but a teleport to the start state for a dynamics model: fitted on those rows, a Hopper
    model learned never to fall (from the 3,231 terminal rows of hopper-medium-v5, its predicted next states ended
    the episode 0.4% of the time, the real ones always). RAVL's and MOPO's code fit on the ``qlearning`` rows;
    NeuBay's takes ``next_observations`` where the file has them, as here."""
    assert run.dataset is not None  # train_dynamics refused a run without --dataset
    buf = to_replay(open_dataset(run.dataset, run.env, clip_actions, run.clip_dataset_actions, view=view), device)
    # the model's data: flat observations of spec.obs_dim (open_dataset checked the sizes)
    assert isinstance(buf.obs, torch.Tensor) and isinstance(buf.next_obs, torch.Tensor)
    n = len(buf)
    return {"obs": buf.obs[:n], "act": buf.action[:n], "next_obs": buf.next_obs[:n], "reward": buf.reward[:n],
            "terminated": buf.terminated[:n]}


class _FitPaused(Exception):
    """``max_iterations`` epochs of a dynamics fit are done before the fit is: stop as an interruption would."""


def train_dynamics(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                   max_iterations: int | None = None) -> TrainResult:
    """Fit a dynamics ensemble on ``run.dataset``: at most ``run.total_steps`` epochs (``cfg.max_epochs`` caps them
    too), early stopping as ``cfg`` says. Every epoch checkpoints the fit (``fit``'s state), so a resumed run
    continues from its last finished epoch; ``max_iterations`` stops an unfinished fit after that many epochs as
    an interruption would (no model file; the result's ``algo`` is None). The ensemble's batched matmuls (members x
    batch rows) run on every core the thread governor finds free (``RunContext``; 1.77x on two cores alone)."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    loop = run.loop
    assert isinstance(loop, WorldModelLoopConfig)  # ensure_loop: the world-model regime's loop config
    if run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: expected the offline data the "
                             "model is fitted on")
    max_epochs = run.total_steps if cfg.max_epochs is None else min(run.total_steps, cfg.max_epochs)
    cfg = dataclasses.replace(cfg, max_epochs=max_epochs, min_epochs=min(cfg.min_epochs, max_epochs))
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        spec = env_spec(run, algo_name, True)
        if ctx.checkpoint is not None and (ctx.run_dir / MODEL_FILE).is_file():
            model = load_model(ctx.run_dir, spec, run.env, ctx.device)
            return TrainResult(ctx.run_dir, ctx.counters["step"], ctx.counters["step"], float("nan"), ctx.wall_time(),
                               model)
        data = dataset_arrays(run, spec, loop.clip_actions, ctx.device)
        gen = ctx.seed(run.seed)
        model = entry.make(cfg, spec, ctx.device, gen)
        if not isinstance(model, EnsembleDynamics):
            raise TypeError(f"{algo_name} runs in the world-model loop but builds a {type(model).__name__}: expected "
                            "an EnsembleDynamics")
        ctx.start(max_epochs, ctx.counters.get("step", 0), f"dynamics {Path(run.dataset).name}", unit="ep")

        def progress(epoch: int, m: dict) -> None:
            row = {"step": epoch, "wall_time": round(ctx.wall_time(), 3),
                   **{k: v for k, v in m.items() if k != "epoch" and not isinstance(v, list)}}
            ctx.log(row)
            ctx.advance(1, f"holdout_mse={m['holdout_mse']:.4g} calibration={m['calibration']:.2f}")

        def checkpoint(state: dict) -> None:
            ctx.save({"fit_state": state}, {"step": state["epoch"], "last_return": float("nan")})
            if max_iterations is not None and state["epoch"] >= max_iterations and not state["stopped"] \
                    and state["epoch"] < max_epochs:
                raise _FitPaused  # as if interrupted here: the checkpoint resumes it

        resumed = ctx.checkpoint.get("fit_state") if ctx.checkpoint is not None else None
        if resumed is not None:
            print(f"resuming the fit after epoch {resumed['epoch']}")
        try:
            history = fit(model, data, gen, progress, resumed, checkpoint)
        except UserInputError as e:
            raise TrainingDiverged(str(e)) from None
        except _FitPaused:
            done = max_iterations or 0
            return TrainResult(ctx.run_dir, done, done, float("nan"), ctx.wall_time(), None)
        epochs = history[-1]["epoch"] if history else 0
        last = history[-1] if history else {}
        recall = termination_recall(model, data, run.env)
        if recall is not None:
            print(f"terminations: from the dataset's {int(data['terminated'].sum())} terminal transitions, the elites' "
                  f"predicted next states end the episode {100 * recall:.1f}% of the time (the data's: 100%)",
                  flush=True)
        save_model(ctx.run_dir, model, run.env, {"epochs": epochs, "fit_seconds": round(ctx.wall_time(), 1),
                                                 **{k: last.get(k) for k in ("holdout_mse_best", "calibration")},
                                                 "termination_recall": recall})
        ctx.save({"model_file": MODEL_FILE}, {"step": epochs, "last_return": float("nan")})
        return TrainResult(ctx.run_dir, epochs, epochs, float("nan"), ctx.wall_time(), model)


@torch.no_grad()
def termination_recall(model: EnsembleDynamics, data: dict[str, torch.Tensor], env_id: str) -> float | None:
    """Of ``data``'s transitions that ended an episode (``terminated``), the fraction whose next state predicted by an
    elite's mean the task's termination function ends as well, averaged over the elites: near 1 for a model that
    learned where the data falls, near 0 for one fitted on rows whose next state is the next episode's start. None
    where the task has no termination function or the data has no terminal row."""
    if not has_termination(env_id) or not bool(data["terminated"].any()):
        return None
    ended = data["terminated"].bool()  # [S]
    obs, act = data["obs"][ended], data["act"][ended]  # [T,O], [T,A]
    done = get_termination(env_id)
    hits = []
    for e in model.elite_ids.tolist():
        members = torch.full((obs.shape[0],), e, dtype=torch.int64, device=obs.device)  # [T]
        nxt = model.predict(obs, act, members=members, sample=False).next_obs  # [T,O]
        hits.append(done(obs, act, nxt).float().mean())
    return float(torch.stack(hits).mean())


def save_model(run_dir: Path, model: EnsembleDynamics, env_id: str, summary: dict) -> Path:
    """``RUN_DIR/model.pt``: the model's meta (sizes, config), weights, the task it models, the units of the actions
    it was fitted on (``action_units``: the agent's [-1, 1]) and a fit summary."""
    path = Path(run_dir) / MODEL_FILE
    save_checkpoint(path, {"algo": model_entry().name, "config": model.meta()["config"], "kind": MODEL_KIND,
                           "meta": model.meta(), "task": task_of(env_id), "env": env_id,
                           "action_units": MODEL_ACTION_UNITS, "state": model.state_dict(), "summary": summary})
    return path


def load_model(model_dir: str | Path, spec, env_id: str, device: torch.device) -> EnsembleDynamics:
    """The model of a dynamics run (``--model RUN``), checked against the env it will imagine: its task, sizes and
    the units of the actions it was fitted on. A model saved before ``action_units`` was recorded was fitted on the
    dataset's raw actions in env units, which are the agent's only where the env's bounds are exactly +-1."""
    d = Path(model_dir)
    path = d / MODEL_FILE if d.is_dir() else d
    if not path.is_file():
        raise UserInputError(f"--model {model_dir}: no {MODEL_FILE} there, expected the directory of a finished "
                             "`ctrl-rl train dynamics` run")
    data = load_checkpoint(path)
    if data.get("kind") != MODEL_KIND:
        raise UserInputError(f"--model {model_dir}: {path.name} is not a ctrl_rl dynamics model, expected the "
                             f"{MODEL_FILE} of a `ctrl-rl train dynamics` run")
    meta = data["meta"]
    if data.get("task") != task_of(env_id):
        raise UserInputError(f"--model {model_dir} was fitted on {data.get('env')!r}, expected a model of "
                             f"{task_of(env_id)!r} for --env {env_id}")
    units = data.get("action_units")
    if units is None and not unit_bounds(spec_of(env_id)):
        raise UserInputError(f"--model {model_dir} was fitted on raw dataset actions in the units of --env {env_id}, "
                             "whose action bounds are not +-1 (a model saved before ctrl_rl mapped dataset actions to "
                             "the agent's [-1, 1]): expected a model fitted in the agent's units, refit it with "
                             "`ctrl-rl train dynamics`")
    if units is not None and units != MODEL_ACTION_UNITS:
        raise UserInputError(f"--model {model_dir} was fitted on actions in {units!r} units: expected a model fitted "
                             f"in the agent's units ({MODEL_ACTION_UNITS!r}, [-1, 1]), refit it with "
                             "`ctrl-rl train dynamics`")
    if (meta["obs_dim"], meta["act_dim"]) != (spec.obs_dim, spec.action_dim):
        raise UserInputError(f"--model {model_dir} predicts observations of {meta['obs_dim']} and actions of "
                             f"{meta['act_dim']} dimensions, expected {spec.obs_dim} and {spec.action_dim} "
                             f"(the observation layout of --env {env_id})")
    model = EnsembleDynamics.from_meta(meta).to(device)
    load_state(model, data["state"], "dynamics model", path)
    if model.elites.numel() < 1:
        raise UserInputError(f"--model {model_dir} has no elite members, expected a finished fit (the run may have "
                             "been stopped before its first epoch ended)")
    return model


# -- model-based regime -------------------------------------------------------------------------------------

def termination_for(env_id: str, model: EnsembleDynamics):
    """The task's termination function, or None when the model learned a termination head."""
    if has_termination(env_id):
        return get_termination(env_id)
    if getattr(model.cfg, "learn_termination", False):
        return None
    return get_termination(env_id)  # raises: says which tasks have one and how to learn one


def model_source(run: RunConfig, algo_name: str, run_dir: Path, max_iterations: int | None,
                 dyn_overrides: Mapping[str, Any] | None = None) -> str | Path | None:
    """Where a model-based run's model comes from: ``--model`` (a run directory, or ``true``), else a model fitted
    first (``fit_first``); None when ``max_iterations`` stopped that fit. Checks that ``--dataset`` is given."""
    if run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset PATH_OR_ID: expected the offline data its "
                             "model rollouts start from")
    loop = run.loop
    assert isinstance(loop, ModelBasedLoopConfig)  # ensure_loop: the model-based regime's loop config
    if loop.model is not None:
        return loop.model
    return fit_first(run, run_dir, max_iterations, dyn_overrides)


def fit_first(run: RunConfig, run_dir: Path, max_iterations: int | None,
              dyn_overrides: Mapping[str, Any] | None = None) -> Path | None:
    """Fit the model in ``RUN_DIR/dynamics`` with the ``dynamics`` defaults (and ``dyn_overrides``, e.g. NeuBay's
    LayerNorm ensemble) unless it is there; returns its directory, or None when ``max_iterations`` stopped the fit."""
    loop = run.loop
    assert isinstance(loop, ModelBasedLoopConfig)  # ensure_loop: the model-based regime's loop config
    entry = model_entry()
    model_dir = Path(run_dir) / entry.name
    if (model_dir / MODEL_FILE).is_file():
        return model_dir
    dyn_run = dataclasses.replace(run, run_dir=str(model_dir), resume=None, log_every=1, checkpoint_every=1,
                                  eval_every=0, total_steps=entry.run_defaults.get("total_steps", 2000),
                                  loop=WorldModelLoopConfig(clip_actions=loop.clip_actions))
    resume = (model_dir / "checkpoints" / "latest.pt").is_file()
    print(f"fitting the dynamics model first: {model_dir} (reuse it with --model {model_dir})")
    train_dynamics(dyn_run, entry.name, entry.default_config(**(dyn_overrides or {})), model_dir, resume,
                   max_iterations)
    return model_dir if (model_dir / MODEL_FILE).is_file() else None


def make_world(run: RunConfig, loop: FlatRolloutsLoopConfig, spec, model_dir, n_envs: int, device: torch.device,
               starts: torch.Tensor, ds):
    """The env the rollouts run in: the learned model as a ModelEnv, or the real simulator (``--model true``).
    ``spec`` is the agent's (actions in [-1, 1]), the units the model was fitted in and the actor acts in."""
    if model_dir == TRUE_MODEL:
        from ctrl_rl.world_models.true_dynamics import TrueDynamicsEnv

        if "qpos" not in ds.infos or "qvel" not in ds.infos:
            raise UserInputError(f"--model true needs the simulator state of every dataset row: {run.dataset} has no "
                                 "infos/qpos and infos/qvel, expected a dataset generated by `ctrl-rl data generate`")
        env_id = run.env.split(":", 1)[-1]
        true_env = TrueDynamicsEnv(env_id, ds.infos["qpos"], ds.infos["qvel"], n_envs, seed=run.seed + 7,
                                   device=device)
        if unit_bounds(true_env.spec):
            return true_env
        return ActionRescale(true_env)  # the agent acts in [-1, 1]: mapped to the simulator's bounds
    model = load_model(model_dir, spec, run.env, device)
    return ModelEnv(model, starts, n_envs, spec.action_low, spec.action_high, run.env, termination_for(run.env, model),
                    loop.member_mode, None, loop.penalty, loop.penalty_kind, device=device, seed=run.seed + 7)


class Collector(Protocol):
    """The data side of the model-based loop: how the model's rollouts reach the agent (``run_updates``' rounds)."""

    sampler: Any
    """What every update's batch is drawn from: ``sample(n, generator)``."""
    batch_size: int
    """Rows per update."""
    record: dict
    """Figures the checkpoint's counters keep (the tapes collector's ``u_max``)."""

    def bind(self, algo: Any) -> None:
        """The agent whose actor rolls out; refused (``TypeError``) when it lacks the collector's capability."""
        ...

    def before(self, step: int) -> dict[str, float]:
        """Before gradient step ``step + 1``: collect when due; the collection's figures for the next metrics row."""
        ...

    def state(self) -> dict:
        """The checkpoint's payload besides the agent (buffer, model env or collector generator)."""
        ...

    def restore(self, checkpoint: dict, where: Path) -> None:
        """Load ``state()``'s payload from a checkpoint (one sentence when it does not fit)."""
        ...


def _diverged(step: int, e: Exception) -> TrainingDiverged:
    return TrainingDiverged(f"before gradient step {step + 1}: {e}")  # ModelDiverged, with the gradient step


class FlatRollouts:
    """The default collector (MBPO, MOPO, RAVL): before every ``rollout_every``-th gradient step, one round of
    ``rollout_length``-step rollouts of the current actor from ``rollout_starts`` dataset states (rewards penalised
    by ``penalty``) into a FIFO model buffer of ``retain_rounds`` rounds; every batch takes ``real_ratio`` of its
    rows from the dataset (``MixedSampler``). Checkpoints hold the model buffer and the model env."""

    def __init__(self, run: RunConfig, loop: FlatRolloutsLoopConfig, spec, model_dir: str | Path,
                 device: torch.device):
        assert run.dataset is not None  # model_source refused a run without --dataset
        ds = open_dataset(run.dataset, run.env, loop.clip_actions, run.clip_dataset_actions)
        real = to_replay(ds, device)
        assert isinstance(real.obs, torch.Tensor)  # the model's data: flat observations of spec.obs_dim
        starts = real.obs[: len(real)]  # [S,O] states with a valid next state
        cap = loop.rollout_starts * loop.rollout_length * loop.retain_rounds
        check_memory(cap * 4 * (2 * spec.obs_dim + spec.action_dim + 3), f"the model buffer of {cap:,} transitions",
                     "--rollout-starts, --retain-rounds or --rollout-length", device)
        self.env = make_world(run, loop, spec, model_dir if model_dir == TRUE_MODEL else Path(model_dir),
                              loop.rollout_starts, device, starts, ds)
        self.buffer = ReplayBuffer(cap, spec.obs_shape, spec.action_dim, device)
        self.sampler = MixedSampler(self.buffer, real, loop.real_ratio)
        self.batch_size, self.steps, self.every = loop.batch_size, loop.rollout_length, loop.rollout_every
        self.record: dict = {}
        self.algo: Any = None

    def bind(self, algo: Any) -> None:
        if isinstance(algo, Recurrent):
            raise TypeError(f"{type(algo).__name__} keeps an acting state across steps, which rollout rounds from "
                            "fresh dataset states do not carry: expected its entry to name collector='tapes'")
        self.algo = algo

    def before(self, step: int) -> dict[str, float]:
        if step % self.every != 0 and len(self.buffer) > 0:
            return {}
        try:
            stats = imagine(self.env, lambda o: self.algo.act(o), self.steps, self.buffer)
        except UserInputError as e:
            raise _diverged(step, e) from None
        return {k: round(float(v), 6) for k, v in stats.items()}

    def state(self) -> dict:
        return {"model_buffer": self.buffer.state_dict(), "model_env": self.env.state_dict()}

    def restore(self, checkpoint: dict, where: Path) -> None:
        load_state(self.buffer, checkpoint["model_buffer"], "model buffer", where)
        load_state(self.env, checkpoint["model_env"], "model env", where)


class TapeRollouts:
    """The ``tapes`` collector (NeuBay; docs/algorithms/neubay.md#the-loop): the dataset read as whole trajectories
    (``world_models.history``) and ``u_max`` (``uncertainty_quantile`` of the model's epistemic figure over the
    data) computed once; before the first gradient step and whenever the previous collection's updates are used
    up, one collection of ``parallel_rollouts`` real histories continued in the model by the current recurrent
    actor (one elite per rollout, truncated by ``u_max`` or when the time from the trajectory's start reaches
    ``horizon``), added to the tape buffer as whole tapes; it pays for ``ceil(utd x transitions added)`` gradient
    steps, each on ``batch_transitions`` rows of concatenated tapes. Checkpoints hold the tape buffer and the
    collector (its generator and the steps left of the current collection)."""

    def __init__(self, run: RunConfig, loop: TapeRolloutsLoopConfig, spec, model_dir: str | Path,
                 device: torch.device):
        if model_dir == TRUE_MODEL:
            raise UserInputError("--model true puts the simulator in the model's place for k-step rollouts from "
                                 "dataset states: expected a `ctrl-rl train dynamics` run (or no --model) for "
                                 "history rollouts")
        horizon = loop.horizon if loop.horizon is not None else spec.max_episode_steps
        if horizon is None:
            raise UserInputError(f"env {run.env!r} has no time limit: expected --horizon N, the steps after which an "
                                 "imagined episode is truncated")
        model = load_model(model_dir, spec, run.env, device)
        assert run.dataset is not None  # model_source refused a run without --dataset
        ds = open_dataset(run.dataset, run.env, loop.clip_actions, run.clip_dataset_actions, view="trajectory")
        data = trajectories_from_dataset(ds, horizon, device)
        del ds
        u_max, u_stats = uncertainty_threshold(model, data.obs, data.action, loop.uncertainty_quantile)
        O, A = spec.obs_dim, spec.action_dim
        most = min(loop.buffer_transitions,
                   math.ceil(run.total_steps / loop.utd) + 2 * loop.parallel_rollouts * horizon)
        check_memory(most * (4 * (2 * O + A + 1) + 3), f"the tape buffer of up to {most:,} transitions",
                     "--buffer-transitions", device)
        self.buffer = TapeBuffer(loop.buffer_transitions, O, A, device)
        self.collector = HistoryCollector(model, data, termination_for(run.env, model), horizon, u_max,
                                          loop.parallel_rollouts, run.env, seed=run.seed + 7)
        self.sampler, self.batch_size, self.utd = self.buffer, loop.batch_transitions, loop.utd
        self.record = {"u_max": u_max}
        self.remaining = 0  # gradient steps still paid for by the last collection
        self.collections = 0
        # figures of the set-up, logged with the first collection of this process
        self.first_row = {"rollout/u_max": u_max, **{f"rollout/{k}": round(v, 6) for k, v in u_stats.items()},
                          "rollout/history_trajectories": float(data.lengths.numel())}
        self.algo: Any = None

    def bind(self, algo: Any) -> None:
        if not (isinstance(algo, HistoryAgent) and isinstance(algo, Recurrent)):
            raise TypeError(f"{type(algo).__name__} cannot continue histories: expected a recurrent agent with the "
                            "history collector's warm_up, advance and sample_action (HistoryAgent)")
        self.algo = algo

    def before(self, step: int) -> dict[str, float]:
        if self.remaining > 0:
            self.remaining -= 1
            return {}
        try:
            tapes, stats = self.collector.collect(self.algo)
        except ModelDiverged as e:
            raise _diverged(step, e) from None
        added = self.buffer.add(tapes)
        paid = max(1, math.ceil(self.utd * added))
        self.remaining = paid - 1
        self.collections += 1
        row = {**self.first_row, **{k: round(v, 6) for k, v in stats.items()}, "rollout/updates_paid": float(paid),
               "rollout/collections": float(self.collections), "buffer/transitions": float(len(self.buffer)),
               "buffer/tapes": float(self.buffer.num_tapes)}
        self.first_row = {}
        return row

    def state(self) -> dict:
        return {"tape_buffer": self.buffer.state_dict(), "collector": self.state_dict()}

    def restore(self, checkpoint: dict, where: Path) -> None:
        load_state(self.buffer, checkpoint["tape_buffer"], "tape buffer", where)
        load_state(self, checkpoint["collector"], "collector", where)

    def state_dict(self) -> dict:
        return {"collector": self.collector.state_dict(), "remaining": self.remaining, "collections": self.collections}

    def load_state_dict(self, state: dict) -> None:
        self.collector.load_state_dict(state["collector"])
        self.remaining, self.collections = int(state["remaining"]), int(state["collections"])


# the collector of each model-based loop config (the regime's default, then the ones an entry names)
COLLECTORS: dict[type, type] = {FlatRolloutsLoopConfig: FlatRollouts, TapeRolloutsLoopConfig: TapeRollouts}


def train_model_based(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                      max_iterations: int | None = None) -> TrainResult:
    """Train a model-based agent on ``run.dataset`` through its entry's collector (see the module docstring)."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    model_dir = model_source(run, algo_name, run_dir, max_iterations, entry.model_defaults)
    if model_dir is None:
        return TrainResult(Path(run_dir), 0, 0, float("nan"), 0.0, None)
    assert run.dataset is not None  # model_source refused a run without --dataset
    # threads governed like the on-policy loops: the agents' ensembles (RAVL's 10 critics, NeuBay's 2048-row tape
    # batches) and the model's rollouts gain 1.5-1.8x from a second core alone (experiments/model_based_speed)
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        spec = env_spec(run, algo_name, entry.continuous_only)
        # the data side first (dataset, model, buffer), then the seeded agent
        collector: Collector = COLLECTORS[type(run.loop)](run, run.loop, spec, model_dir, ctx.device)
        gen = ctx.seed(run.seed)
        algo = entry.make(cfg, spec, ctx.device, gen)
        if not isinstance(algo, Algorithm):
            raise TypeError(f"{algo_name} runs in the model-based loop but builds a {type(algo).__name__}, "
                            "not an Algorithm")
        collector.bind(algo)
        step, last_return = 0, float("nan")
        if ctx.checkpoint is not None:
            ck, where = ctx.checkpoint, ctx.ck_dir / "latest.pt"
            load_state(algo, ck["algo_state"], "networks", where)
            collector.restore(ck, where)
            ctx.restore_rng()
            step, last_return = ctx.counters["step"], ctx.counters["last_return"]
        ctx.start(run.total_steps, step, f"{algo_name} {Path(run.dataset).name}", unit="upd")
        sampler, batch_size = collector.sampler, collector.batch_size
        return run_updates(ctx, algo, lambda: entry.update_step(algo, sampler, batch_size, cfg), step, last_return,
                           collector.record, max_iterations, collector)


def _train_dynamics(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
                    dist_info) -> TrainResult:
    return train_dynamics(run, algo_name, cfg, run_dir, resume, max_iterations)


def _train_model_based(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
                       dist_info) -> TrainResult:
    return train_model_based(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    WORLD_MODEL, WorldModelLoopConfig, _train_dynamics, has_policy=False,
    summary="dataset -> a dynamics ensemble fitted epoch by epoch (holdout, early stopping, elites) -> model.pt"))
register_regime(Regime(
    "model-based", FlatRolloutsLoopConfig, _train_model_based, collectors={"tapes": TapeRolloutsLoopConfig},
    summary="dataset -> fitted model -> imagined rollouts of the actor -> a flat model buffer (k-step rollouts, "
            "mixed with real rows) or episode tapes (history rollouts, collector 'tapes') -> update"))
