"""Run configuration: typed, frozen dataclasses; presets; save/load of the resolved config.

A run is described by ``RunConfig`` (env, budget, seed, device, logging, dataset, evaluation) holding the
settings of its loop in ``RunConfig.loop`` (one loop config class per regime: ``OnPolicyLoopConfig``,
``OffPolicyLoopConfig``, ``OfflineLoopConfig``), next to the algorithm's own frozen config (``AlgoEntry.config``).
Presets are JSON files (``experiments/presets/<name>.json``) of the form
``{"algo": "sac", "run": {...RunConfig fields...}, "loop": {...loop fields...}, "config": {...algorithm fields...}}``;
the embedded ``default`` preset is defined here so that ``ctrl-rl train`` works without the repository checkout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from ctrl_rl.errors import UserInputError, did_you_mean


def _positive_int(flag: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserInputError(f"invalid --{flag.replace('_', '-')} {v!r}: expected a positive integer")


def _finite_fraction(flag: str, v: Any) -> None:
    if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise UserInputError(f"invalid --{flag.replace('_', '-')} {v!r}: expected a fraction in [0, 1]")


@dataclass(frozen=True)
class OnPolicyLoopConfig:
    """Settings of the on-policy loop (``ctrl_rl.learn.onpolicy``)."""

    pipeline: bool = False
    """envpool only: split the envs into two groups and compute one group's actions while the other
    simulates (exactly on-policy). Off by default: on 2 cores it measured no faster, since the
    simulator threads already fill both cores; it may pay off with more cores."""
    collect_threads: int = 0
    """torch threads while collecting a rollout (0: auto, 1 for envpool on CPU so its worker threads get
    the cores, else the same as for the update)."""

    def __post_init__(self) -> None:
        if not isinstance(self.collect_threads, int) or self.collect_threads < 0:
            raise UserInputError(f"invalid --collect-threads {self.collect_threads!r}: "
                                 "expected 0 (auto) or a positive integer")


@dataclass(frozen=True)
class OffPolicyLoopConfig:
    """Settings of the off-policy loop (``ctrl_rl.learn.offpolicy``), which also runs offline-to-online
    fine-tuning: replay, warm-up, update-to-data ratio, offline data mixed into batches, a pre-trained start."""

    batch_size: int = 256
    """Transitions per update (per batch update with critic minibatches)."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions."""
    learning_starts: int = 5_000
    """Env steps before the first update (warm-up; no update is made before)."""
    warmup_actions: Literal["random", "policy"] = "random"
    """Who acts during the warm-up: uniform random actions, or the (frozen) policy sampling (WSRL)."""
    utd_ratio: float = 1.0
    """Updates per env step (summed over envs; fractions carry over)."""
    n_step: int = 1
    """n-step returns (``storage.replay.NStepSampler``): each sampled transition follows its env n - 1 steps further,
    stopping at an episode end, and bootstraps with gamma^k (FastTD3: 3; 1: one-step SAC)."""
    offline_ratio: float = 0.0
    """Fraction of every batch drawn from --dataset (RLPD 0.5; 0 without offline data)."""
    offline_steps: int = 0
    """Algorithms with an offline pre-training phase (sac_flow_o2o): gradient steps on --dataset before going
    online, run as an offline run in RUN_DIR/pretrain that the online run starts from."""
    init: str | None = None
    """Pre-trained run directory or checkpoint to start from (WSRL: a cql, calql or sac run)."""
    clip_actions: float | None = None
    """Clip actions to +-this before they are stored, and offline actions when loaded (None: no clip; WSRL
    ``--clip_action`` 0.99999, inside tanh's open range)."""
    save_replay: bool = False
    """Put the replay buffer into checkpoints, so a resumed run continues with the same data."""
    keep_every: int = 0
    """Also keep a snapshot (checkpoint without the replay buffer) every this many iterations as
    checkpoints/step_<N>.pt, e.g. to pick behaviour policies for datasets (0: keep only latest.pt)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "buffer_size"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.learning_starts, int) or self.learning_starts < 0:
            raise UserInputError(f"invalid --learning-starts {self.learning_starts!r}: "
                                 "expected a non-negative number of env steps")
        if not isinstance(self.utd_ratio, (int, float)) or not math.isfinite(self.utd_ratio) or self.utd_ratio <= 0:
            raise UserInputError(f"invalid --utd-ratio {self.utd_ratio!r}: "
                                 "expected a positive number of updates per env step")
        _finite_fraction("offline_ratio", self.offline_ratio)
        _positive_int("n_step", self.n_step)
        if self.warmup_actions not in ("random", "policy"):
            raise UserInputError(f"invalid --warmup-actions {self.warmup_actions!r}: expected 'random' or 'policy'")
        if not isinstance(self.offline_steps, int) or self.offline_steps < 0:
            raise UserInputError(f"invalid --offline-steps {self.offline_steps!r}: "
                                 "expected a non-negative number of gradient steps")
        if self.clip_actions is not None and not 0.0 < self.clip_actions <= 1.0:
            raise UserInputError(f"invalid --clip-actions {self.clip_actions!r}: expected a value in (0, 1] or None")
        if not isinstance(self.keep_every, int) or self.keep_every < 0:
            raise UserInputError(f"invalid --keep-every {self.keep_every!r}: "
                                 "expected 0 (off) or a positive number of iterations")


@dataclass(frozen=True)
class OfflineLoopConfig:
    """Settings of the offline loop (``ctrl_rl.learn.offline``)."""

    batch_size: int = 256
    """Transitions per gradient step."""
    clip_actions: float | None = None
    """Clip the dataset's actions to +-this when loading (None: no clip)."""

    def __post_init__(self) -> None:
        _positive_int("batch_size", self.batch_size)
        if self.clip_actions is not None and not 0.0 < self.clip_actions <= 1.0:
            raise UserInputError(f"invalid --clip-actions {self.clip_actions!r}: expected a value in (0, 1] or None")


@dataclass(frozen=True)
class WorldModelLoopConfig:
    """Settings of fitting a dynamics model on a dataset (``ctrl-rl train dynamics``, ``ctrl_rl.learn.model_based``);
    ``--total-steps`` is the most epochs the fit may take."""

    clip_actions: float | None = None
    """Clip the dataset's actions to +-this when loading (None: no clip)."""

    def __post_init__(self) -> None:
        if self.clip_actions is not None and not 0.0 < self.clip_actions <= 1.0:
            raise UserInputError(f"invalid --clip-actions {self.clip_actions!r}: expected a value in (0, 1] or None")


@dataclass(frozen=True)
class ModelBasedLoopConfig:
    """Settings every collector of the model-based loop (``ctrl_rl.learn.model_based``) shares: where the model comes
    from and how the dataset's actions are read. A run's loop config is its collector's subclass
    (``FlatRolloutsLoopConfig``, ``TapeRolloutsLoopConfig``); ``--total-steps`` counts gradient steps."""

    model: str | None = None
    """A ``ctrl-rl train dynamics`` run to take the model from (None: fit one first in RUN_DIR/dynamics; ``true``: the
    real simulator)."""
    clip_actions: float | None = None
    """Clip the dataset's actions to +-this when loading (None: no clip)."""

    def __post_init__(self) -> None:
        if self.clip_actions is not None and not 0.0 < self.clip_actions <= 1.0:
            raise UserInputError(f"invalid --clip-actions {self.clip_actions!r}: expected a value in (0, 1] or None")


@dataclass(frozen=True)
class FlatRolloutsLoopConfig(ModelBasedLoopConfig):
    """The model-based loop with the default collector: k-step rollouts of the actor from dataset states into a flat
    model buffer, batches mixed with real rows (MBPO, MOPO, RAVL). Defaults: MOPO's and RAVL's shared settings, no
    penalty (``mopo`` sets one)."""

    batch_size: int = 256
    """Transitions per gradient step (real and imagined together)."""
    rollout_starts: int = 50_000
    """Dataset states every rollout round starts from (MOPO, RAVL: 50,000)."""
    rollout_every: int = 1000
    """Gradient steps between rollout rounds (MOPO, RAVL: one epoch of 1000)."""
    retain_rounds: int = 5
    """The model buffer keeps the transitions of this many rounds (MOPO, RAVL: 5)."""
    rollout_length: int = 5
    """k: steps of every imagined rollout (MOPO: 1 or 5 per dataset; RAVL: 5)."""
    real_ratio: float = 0.05
    """Fraction of every batch drawn from the dataset; the rest from the model buffer (MOPO, RAVL: 0.05)."""
    penalty: float = 0.0
    """lambda: imagined rewards are r - lambda * u(s, a) with u the ``penalty_kind`` uncertainty (MOPO: 1 or 5)."""
    penalty_kind: Literal["aleatoric", "epistemic", "total_var"] = "aleatoric"
    """u: the model's largest predicted std norm over elites (MOPO), the elites' disagreement, or their
    total variance (``world_models.protocol``)."""
    member_mode: Literal["step", "episode"] = "step"
    """Which elite predicts: a random one per transition (MBPO, MOPO, RAVL) or one per imagined episode."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_size", "rollout_starts", "rollout_every", "retain_rounds", "rollout_length"):
            _positive_int(name, getattr(self, name))
        _finite_fraction("real_ratio", self.real_ratio)
        if not isinstance(self.penalty, (int, float)) or not math.isfinite(self.penalty) or self.penalty < 0:
            raise UserInputError(f"invalid --penalty {self.penalty!r}: expected a finite number >= 0")
        if self.penalty_kind not in ("aleatoric", "epistemic", "total_var"):
            raise UserInputError(f"invalid --penalty-kind {self.penalty_kind!r}: expected 'aleatoric', 'epistemic' "
                                 "or 'total_var'")
        if self.member_mode not in ("step", "episode"):
            raise UserInputError(f"invalid --member-mode {self.member_mode!r}: expected 'step' or 'episode'")


@dataclass(frozen=True)
class TapeRolloutsLoopConfig(ModelBasedLoopConfig):
    """The model-based loop with the ``tapes`` collector (docs/algorithms/neubay.md#imagined-continuations): real
    histories continued in the model by a recurrent actor, whole tapes into a tape buffer the agent samples.
    Defaults: NeuBay's ``configs/d4rl_loco/base.yaml``."""

    batch_transitions: int = 2048
    """Transitions per gradient step: whole tapes concatenated until this many, the last one cut (paper 2048)."""
    parallel_rollouts: int = 100
    """Histories imagined per collection, in lock step (paper 100)."""
    utd: float = 0.05
    """Gradient steps per transition added (history and imagined rows): ceil(utd x added) after every collection
    (paper 0.05)."""
    uncertainty_quantile: float = 1.0
    """u_max = this quantile of the model's epistemic uncertainty over the offline data; a rollout is truncated at
    its first step above it (paper 1.0: the maximum seen on the data)."""
    horizon: int | None = None
    """Rollouts stop when the time counted from the trajectory's start reaches this (None: the env's time limit,
    1000 for the MuJoCo tasks)."""
    buffer_transitions: int = 40_000_000
    """Tape buffer capacity in transitions, oldest whole tapes dropped first (paper 40M; memory grows with use)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_transitions", "parallel_rollouts", "buffer_transitions"):
            _positive_int(name, getattr(self, name))
        if self.horizon is not None:
            _positive_int("horizon", self.horizon)
        if not isinstance(self.utd, (int, float)) or not math.isfinite(self.utd) or self.utd <= 0:
            raise UserInputError(f"invalid --utd {self.utd!r}: "
                                 "expected a positive number of gradient steps per transition")
        _finite_fraction("uncertainty_quantile", self.uncertainty_quantile)


@dataclass(frozen=True)
class ActorLearnerLoopConfig:
    """Settings of the actor-learner loop (``ctrl_rl.learn.actor_learner``); ``--num-envs`` is per actor."""

    actors: int = 2
    """K: actors, each stepping ``--num-envs`` envs with the last weights it received."""
    backend: Literal["inprocess", "process", "ray"] = "inprocess"
    """Where actors run: in the learner's process (in turn; deterministic, resumable exactly), in worker
    processes (torch.multiprocessing), or as Ray actors (``pip install 'ctrl-rl[ray]'``; local, or a cluster
    through ``--ray-address``)."""
    unroll: int = 20
    """T: env steps per segment an actor sends (the paper's unroll length)."""
    segments_per_update: int = 2
    """Segments (each T x num_envs) the learner batches into one update."""
    broadcast_every: int = 1
    """Learner updates between weight broadcasts to the actors."""
    max_policy_lag: int = 100
    """Report segments collected with weights more than this many updates old (they are still used)."""
    actor_timeout: float = 120.0
    """Seconds without a segment from any actor before the learner declares the actors lost."""
    ray_address: str | None = None
    """Ray cluster address (``ray start --head`` prints it); None starts a local Ray instance."""

    def __post_init__(self) -> None:
        for flag in ("actors", "unroll", "segments_per_update", "broadcast_every", "max_policy_lag"):
            _positive_int(flag.replace("_", "-"), getattr(self, flag))
        if not (isinstance(self.actor_timeout, (int, float)) and self.actor_timeout > 0):
            raise UserInputError(f"invalid --actor-timeout {self.actor_timeout!r}: "
                                 "expected a positive number of seconds")


@dataclass(frozen=True)
class DemonstrationsLoopConfig:
    """Settings of the demonstrations loop (``ctrl_rl.learn.demonstrations``): LeRobot demonstrations -> update of a
    VLA; one step is one update."""

    batch_size: int = 16
    """Demonstration frames per batch."""
    action_key: str | None = None
    """The dataset's action feature (keys joined by +); default: the env's own ``action.env``, else the keys of
    DROID's port that hold the robot action space (``action.cartesian_velocity+action.gripper_velocity`` for
    ``cartesian_velocity``; ``storage/datasets/lerobot/robot.py``), else ``action``."""
    state_key: str = "observation.state"
    """The dataset's proprioception (keys joined by +); its width must be that of ``--proprio-columns``."""
    cameras: str = "exterior1"
    """Cameras a ``manip:`` env id without ``cameras=`` gets (and the model sees): names joined by +; without
    ``--env`` (a real robot's data), names or aliases of the dataset's videos, or ``all``."""
    image_size: str = "48x64"
    """H x W a ``manip:`` (or env-less ``robot:``) env id without ``image_size=`` gets (the dataset's frames are
    resized to it)."""
    init: str | None = None
    """A VLA run (or checkpoint) whose policy weights this run starts from (the entry's ``init_from``; the
    policy's shape fields are taken from its config)."""

    def __post_init__(self) -> None:
        _positive_int("batch-size", self.batch_size)


@dataclass(frozen=True)
class ChunkRolloutsLoopConfig(DemonstrationsLoopConfig):
    """Settings of the chunk-rollouts loop (``ctrl_rl.learn.chunk_rollouts``): the demonstrations loop's, and the
    chunks each env executes per update; one step is one update."""

    rollout_chunks: int = 8
    """Chunks each of ``--num-envs`` envs executes per update."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("rollout-chunks", self.rollout_chunks)


LoopConfig = (OnPolicyLoopConfig | OffPolicyLoopConfig | OfflineLoopConfig | WorldModelLoopConfig
              | FlatRolloutsLoopConfig | TapeRolloutsLoopConfig | ActorLearnerLoopConfig | DemonstrationsLoopConfig
              | ChunkRolloutsLoopConfig)


@dataclass(frozen=True)
class RunConfig:
    """Everything about a training run that is not an algorithm hyperparameter; ``loop`` holds the settings of
    the loop the algorithm's regime runs in (``OnPolicyLoopConfig``, ``OffPolicyLoopConfig``, ``OfflineLoopConfig``)."""

    env: str = "torch:Pendulum"
    """Environment id, e.g. torch:Pendulum, HalfCheetah-v5, gym:Pendulum-v1, dmc:cheetah-run (`ctrl-rl list envs`)."""
    num_envs: int = 4096
    """Parallel environments in total (split evenly across processes under torchrun)."""
    total_steps: int = 4_000_000
    """Environment steps to train for, summed over all environments and processes (offline: gradient steps)."""
    seed: int = 0
    """Seed of every random number generator of the run."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Training device."""
    run_dir: str | None = None
    """Where the run is written (default: runs/<algo>-<env>-s<seed>-<time>)."""
    preset: str | None = None
    """Named preset (`ctrl-rl list presets`) or path to a preset JSON file; flags override it."""
    resume: str | None = None
    """Continue the run in this directory from its latest checkpoint."""
    scale_envs: int = 1
    """Multiply num_envs by k and co-scale the algorithm's hyperparameters (PPO: see scale_envs)."""
    reward_scale: bool = False
    """Divide rewards by the running std of the discounted return."""
    log_every: int = 1
    """Log every this many iterations (PPO: updates; off-policy: steps of all envs; offline: gradient steps)."""
    checkpoint_every: int = 20
    """Write a checkpoint every this many iterations (and always at the end)."""
    progress: bool = True
    """Show a progress bar (a plain line every so often when the output is not a terminal)."""
    threads: int = 0
    """torch intra-op threads. 0 (auto): on CPU, every loop uses every core while it has them to itself and one
    thread while other processes compete (adapted every 0.3 s). A fixed count makes reruns and resumes
    bit-identical: the count changes float rounding."""
    matmul_precision: Literal["highest", "high", "medium"] = "highest"
    """Internal precision of float32 matrix multiplications (``torch.set_float32_matmul_precision``; tensors stay
    float32): ``highest`` computes in float32; ``medium`` rounds the inputs to bfloat16 and accumulates in float32
    where the hardware has a fast path (CPUs with AMX or AVX512-BF16, through oneDNN; CUDA GPUs); ``high`` uses
    TF32 on CUDA GPUs (JAX's default there). Measured here: RAVL 1.55x gradient steps/s on two cores
    (experiments/model_based_speed). It changes every number the run computes."""
    dataset: str | None = None
    """Offline data: a D4RL or ctrl_rl .hdf5 file, a generated dataset id (hopper-medium-v5) or a Minari id
    (cql, calql, iql train on it; rlpd, sac_flow_o2o and wsrl with --offline-ratio mix it into batches). Its actions
    are in the env's units and are mapped to the agent's [-1, 1] with the env's bounds when loaded."""
    clip_dataset_actions: bool = False
    """Clip --dataset actions that lie outside the env's action bounds to the bounds (and print how many), instead
    of refusing the dataset."""
    eval_every: int = 0
    """Evaluate the deterministic policy in --env every this many gradient steps (offline algorithms; 0: only
    at the end) or env steps (off-policy; 0: never), logging its return and normalized score."""
    eval_episodes: int = 10
    """Episodes per evaluation (one per parallel env)."""
    loop: Annotated[LoopConfig | None, tyro.conf.Suppress] = None
    """The loop's settings (set from the algorithm's regime; flags of its fields are top-level)."""

    def __post_init__(self) -> None:
        for name in ("num_envs", "total_steps", "log_every", "checkpoint_every", "scale_envs"):
            _positive_int(name, getattr(self, name))
        if self.eval_episodes < 1 or self.eval_every < 0:
            raise UserInputError(f"invalid --eval-episodes {self.eval_episodes!r} / --eval-every {self.eval_every!r}: "
                                 "expected a positive number of episodes and a non-negative interval")
        if self.matmul_precision not in ("highest", "high", "medium"):
            raise UserInputError(f"invalid --matmul-precision {self.matmul_precision!r}: expected 'highest', 'high' "
                                 "or 'medium'")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise UserInputError(f"invalid --threads {self.threads!r}: expected 0 (auto) or a positive integer")


@dataclass(frozen=True)
class Preset:
    name: str
    algo: str
    run: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    loop: dict[str, Any] = field(default_factory=dict)


# The embedded default (PPO on the torch-native Pendulum, no download, about a minute on 2 CPU cores) ships as
# package data beside the other built-in data.
PACKAGE_PRESETS = Path(__file__).resolve().parents[1] / "data" / "presets"


def default_preset() -> Preset:
    """The preset ``ctrl-rl train`` runs with no env and no preset: ``ctrl_rl/data/presets/default.json``."""
    return _read_preset(PACKAGE_PRESETS / "default.json")


def preset_dirs() -> list[Path]:
    """Where named presets are looked up, first match wins: $CTRL_RL_PRESETS, ./experiments/presets, the source
    checkout's experiments/presets, the package's own (the embedded default)."""
    dirs = []
    if os.environ.get("CTRL_RL_PRESETS"):
        dirs.append(Path(os.environ["CTRL_RL_PRESETS"]))
    dirs.append(Path.cwd() / "experiments" / "presets")
    dirs.append(Path(__file__).resolve().parents[2] / "experiments" / "presets")
    dirs.append(PACKAGE_PRESETS)
    return dirs


def list_presets() -> dict[str, Preset]:
    out = {}
    for d in reversed(preset_dirs()):
        if d.is_dir():
            for p in sorted(d.glob("*.json")):
                try:
                    out[p.stem] = _read_preset(p)
                except UserInputError:
                    continue
    return out


def _read_preset(path: Path) -> Preset:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"preset file {str(path)!r} could not be read as JSON ({e}): expected "
                             '{"algo": ..., "run": {...}, "config": {...}}') from None
    if not isinstance(raw, dict) or "algo" not in raw:
        raise UserInputError(f"preset file {str(path)!r} has no 'algo' key: expected "
                             '{"algo": ..., "run": {...}, "loop": {...}, "config": {...}}')
    unknown = set(raw) - {"algo", "run", "loop", "config", "description"}
    if unknown:
        raise UserInputError(f"preset file {str(path)!r} has unknown keys {sorted(unknown)}: "
                             "expected algo, run, loop, config, description")
    parts = {k: raw.get(k, {}) for k in ("run", "loop", "config")}
    bad = [k for k, v in parts.items() if not isinstance(v, dict)]
    if bad:
        raise UserInputError(f"preset file {str(path)!r} has a {bad[0]!r} that is not a JSON object: expected "
                             '{"algo": ..., "run": {...}, "loop": {...}, "config": {...}}')
    return Preset(path.stem, raw["algo"], parts["run"], parts["config"], raw.get("description", ""), parts["loop"])


def load_preset(name_or_path: str) -> Preset:
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise UserInputError(f"preset file {name_or_path!r} does not exist: "
                                 "expected a JSON preset file or a name from `ctrl-rl list presets`")
        return _read_preset(p)
    presets = list_presets()
    if name_or_path not in presets:
        raise UserInputError(f"unknown preset {name_or_path!r}: expected one of {sorted(presets)}"
                             f"{did_you_mean(name_or_path, presets)}")
    return presets[name_or_path]


# -- dataclass <-> dict ----------------------------------------------------------------------------------
def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def from_dict(cls: type, data: dict, what: str = "config") -> Any:
    """Build a (nested) frozen dataclass from a JSON-like dict, converting lists to tuples.

    Unknown keys raise UserInputError naming the key; missing keys take the dataclass default.
    """
    if not isinstance(data, dict):
        raise UserInputError(f"{what} must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        key = sorted(unknown)[0]
        raise UserInputError(f"unknown {what} key {key!r}{did_you_mean(key, names)}: expected one of {sorted(names)}")
    kwargs = {}
    for k, v in data.items():
        kwargs[k] = _convert(hints[k], v, f"{what}.{k}")
    try:
        return cls(**kwargs)
    except UserInputError:
        raise
    except (TypeError, ValueError) as e:
        raise UserInputError(f"invalid {what}: {e}") from None


def _convert(tp: Any, v: Any, what: str) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(v, dict):
        return from_dict(tp, v, what)
    if origin is tuple and isinstance(v, (list, tuple)):
        return tuple(v)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None) and v is None:
                return None
            if typing.get_origin(arg) is tuple and isinstance(v, (list, tuple)):
                return tuple(v)
        return v
    if tp is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def loop_config_class(regime: str, collector: str | None = None) -> type:
    """The loop config class of a regime (``ctrl_rl.learn.regimes``), for an entry that names ``collector``
    (``AlgoEntry.collector``; None: the regime's default)."""
    from ctrl_rl.learn.regimes import get_regime  # the registry imports the loops, which import this module

    return get_regime(regime).loop_config_for(collector)


def ensure_loop(entry, run: RunConfig) -> RunConfig:
    """``run`` with the entry's default loop config when it has none (library use: ``RunConfig(env=...)``); a loop
    config of another regime's class is refused."""
    cls = loop_config_class(entry.regime, entry.collector)
    if run.loop is None:
        return dataclasses.replace(run, loop=cls(**entry.loop_defaults))
    if type(run.loop) is not cls:  # exactly: a subclass holds settings this loop would ignore
        raise UserInputError(f"{entry.name!r} runs in the {cls.__name__} loop: got a {type(run.loop).__name__}")
    return run


def build_run(entry, run: dict, loop: dict, what: str = "run") -> RunConfig:
    """A RunConfig with its loop config, from JSON-like dicts (unknown keys are refused with a sentence)."""
    run = {k: v for k, v in run.items() if k != "loop"}
    loop_cfg = from_dict(loop_config_class(entry.regime, entry.collector), loop, f"{what} loop")
    return dataclasses.replace(from_dict(RunConfig, run, what), loop=loop_cfg)


def save_config(path: Path, algo: str, run: RunConfig, algo_cfg: Any, code: dict | None = None,
                data: dict | None = None) -> None:
    """Write the resolved config as JSON (atomically): ``{"algo", "run": {..., "loop": {...}}, "config"}``,
    ``"code"`` when given (``RunContext``: the code the run started with, and the code of its latest resume) and
    ``"data"`` when given (``RunContext``: the dataset's path, size and sha256)."""
    payload = {"algo": algo, "run": to_dict(run), "config": to_dict(algo_cfg)}
    if code is not None:
        payload["code"] = code
    if data is not None:
        payload["data"] = data
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


# Fields that lived in RunConfig or in algorithm configs before the loop configs existed (format 1 runs and
# checkpoints, and the shipped behaviour policies): moved into the loop config when such a config is read.
_LEGACY_RUN_LOOP_KEYS = ("pipeline", "collect_threads", "save_replay", "keep_every")


def parse_saved(raw: dict, what: str) -> tuple[Any, RunConfig, Any]:
    """``(entry, run, algo config)`` of a saved ``{"algo", "run", "config"}`` dict (config.json or a checkpoint's
    ``config`` with ``algo``). Older layouts are migrated: configs written before loop configs existed (format 1),
    settings an algorithm's config held before they moved to its loop config (the model-based agents'
    ``rollout_length``, ``real_ratio``, ``penalty``, ``penalty_kind``, ``member_mode``), and config fields added
    since the run was saved, which take the entry's defaults (RAVL's ``critic_reduction``)."""
    from ctrl_rl.algos import registry

    if not isinstance(raw, dict) or not isinstance(raw.get("algo"), str):
        raise UserInputError(f"{what} names no algorithm: expected an 'algo' key with one of {registry.names()}")
    entry = registry.get(raw["algo"])
    run = dict(raw.get("run") or {})
    cfg = dict(raw.get("config") or {})
    loop_fields = {f.name for f in dataclasses.fields(loop_config_class(entry.regime, entry.collector))}
    cfg_fields = {f.name for f in dataclasses.fields(entry.config)}
    moved = {k: v for k, v in cfg.items() if k in loop_fields and k not in cfg_fields}
    if "loop" in run:
        loop = {**moved, **dict(run.pop("loop") or {})}
    else:  # format 1: loop settings in the run and algorithm configs
        loop = {k: run[k] for k in _LEGACY_RUN_LOOP_KEYS if k in run and k in loop_fields}
        loop.update(moved)
        if "action_clip" in cfg and "action_clip" not in cfg_fields and "clip_actions" in loop_fields:
            loop["clip_actions"] = cfg["action_clip"]  # the WSRL-family configs clipped stored actions
        run = {k: v for k, v in run.items() if k not in _LEGACY_RUN_LOOP_KEYS}
        cfg = {k: v for k, v in cfg.items() if k in cfg_fields}
    cfg = {**entry.config_defaults, **{k: v for k, v in cfg.items() if k not in moved}}
    return (entry, build_run(entry, run, loop, f"{what} run"),
            from_dict(entry.config, cfg, f"{what} {entry.name} config"))


def load_config(path: Path) -> tuple[str, RunConfig, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"run config {str(path)!r} could not be read ({e}): "
                             "expected the config.json a training run writes") from None
    entry, run, cfg = parse_saved(raw, f"run config {str(path)!r}")
    return entry.name, run, cfg
