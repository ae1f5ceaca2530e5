"""Run configuration: typed, frozen dataclasses; presets; save/load of the resolved config.

A run is described by ``RunConfig`` (env, budget, seed, device, logging) holding the algorithm's own
frozen config in ``algo``. Presets are JSON files (``experiments/presets/<name>.json``) of the form
``{"algo": "ppo", "run": {...RunConfig fields...}, "config": {...algorithm fields...}}``; the embedded
``default`` preset is defined here so that ``ctrl-rl train`` works without the repository checkout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctrl_rl.algos.ppo import PPOConfig
from ctrl_rl.algos.sac import SACConfig
from ctrl_rl.algos.cql import CalQLConfig, CQLConfig
from ctrl_rl.algos.iql import IQLConfig
from ctrl_rl.algos.sac_flow import SACFlowConfig, SACFlowO2OConfig
from ctrl_rl.algos.wsrl import RLPDConfig, WSRLConfig
from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class RunConfig:
    """Everything about a training run that is not an algorithm hyperparameter."""

    env: str = "torch:Pendulum"
    """Environment id, e.g. torch:Pendulum, HalfCheetah-v5, gym:Pendulum-v1, dmc:cheetah-run (`ctrl-rl list envs`)."""
    num_envs: int = 4096
    """Parallel environments in total (split evenly across processes under torchrun)."""
    total_steps: int = 4_000_000
    """Environment steps to train for, summed over all environments and processes."""
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
    """Log every this many iterations (PPO: updates; off-policy: steps of all envs)."""
    checkpoint_every: int = 20
    """Write a checkpoint every this many iterations (and always at the end)."""
    pipeline: bool = False
    """envpool only: split the envs into two groups and compute one group's actions while the other
    simulates (exactly on-policy). Off by default: on 2 cores it measured no faster, since the
    simulator threads already fill both cores; it may pay off with more cores."""
    progress: bool = True
    """Show a progress bar."""
    threads: int = 0
    """torch intra-op threads (0: auto; 1 for off-policy training on CPU and for PPO with envpool on a
    machine with <= 2 cores, where small ops on two threads stall when other processes compete; else
    torch's default)."""
    dataset: str | None = None
    """Offline data: a D4RL or ctrl_rl .hdf5 file, a generated dataset id (hopper-medium-v5) or a Minari id
    (cql, calql, iql train on it; rlpd, sac_flow_o2o and wsrl with --offline-ratio mix it into batches)."""
    eval_every: int = 0
    """Evaluate the deterministic policy in --env every this many gradient steps (offline algorithms; 0: only
    at the end) or env steps (off-policy; 0: never), logging its return and normalized score."""
    eval_episodes: int = 10
    """Episodes per evaluation (one per parallel env)."""
    save_replay: bool = False
    """Off-policy: put the replay buffer into checkpoints, so a resumed run continues with the same data."""
    keep_every: int = 0
    """Off-policy: also keep a snapshot (checkpoint without the replay buffer) every this many iterations
    as checkpoints/step_<N>.pt, e.g. to pick behaviour policies for datasets (0: keep only latest.pt)."""
    collect_threads: int = 0
    """torch threads while collecting a rollout (0: auto, 1 for envpool on CPU so its worker threads get
    the cores, else the same as for the update)."""

    def __post_init__(self) -> None:
        for name in ("num_envs", "total_steps", "log_every", "checkpoint_every", "scale_envs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {v!r}: expected a positive integer")
        if self.keep_every < 0:
            raise UserInputError(f"invalid --keep-every {self.keep_every!r}: expected 0 (off) or a positive number of iterations")
        if self.eval_episodes < 1 or self.eval_every < 0:
            raise UserInputError(f"invalid --eval-episodes {self.eval_episodes!r} / --eval-every {self.eval_every!r}: "
                                 "expected a positive number of episodes and a non-negative interval")
        for name in ("threads", "collect_threads"):
            if getattr(self, name) < 0:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: expected 0 (auto) or a positive integer")


ALGO_CONFIGS: dict[str, type] = {"ppo": PPOConfig, "sac": SACConfig, "sac_flow": SACFlowConfig, "cql": CQLConfig,
                                  "calql": CalQLConfig, "iql": IQLConfig, "wsrl": WSRLConfig, "rlpd": RLPDConfig,
                                  "sac_flow_o2o": SACFlowO2OConfig}

# Run settings that differ per algorithm when no preset gives them (off-policy: one env, log and
# checkpoint intervals in iterations = steps of all envs).
ALGO_RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "sac": {"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 50_000},
    "sac_flow": {"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 50_000},
    # offline: total_steps counts gradient steps (WSRL pre-trains CQL for 250k steps on locomotion; IQL 1M)
    "cql": {"total_steps": 250_000, "log_every": 1000, "checkpoint_every": 25_000, "eval_every": 25_000},
    "calql": {"total_steps": 250_000, "log_every": 1000, "checkpoint_every": 25_000, "eval_every": 25_000},
    "iql": {"total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 50_000, "eval_every": 50_000},
    # offline-to-online: env steps online (WSRL 500k, evaluated every 20k; SAC Flow O2O 1M)
    "wsrl": {"num_envs": 1, "total_steps": 500_000, "log_every": 1000, "checkpoint_every": 25_000, "eval_every": 20_000},
    "rlpd": {"num_envs": 1, "total_steps": 500_000, "log_every": 1000, "checkpoint_every": 25_000, "eval_every": 20_000},
    "sac_flow_o2o": {"num_envs": 1, "total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 25_000,
                     "eval_every": 20_000},
}


@dataclass(frozen=True)
class Preset:
    name: str
    algo: str
    run: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    description: str = ""


# The embedded default: PPO on the torch-native Pendulum, no download, about a minute on 2 CPU cores.
DEFAULT_PRESET = Preset(
    name="default",
    algo="ppo",
    description="PPO on torch-native Pendulum (1024 envs, 3M steps); passes return -200 in under a minute on 2 cores",
    run={"env": "torch:Pendulum", "num_envs": 1024, "total_steps": 3_000_000, "reward_scale": True},
    config={"rollout_steps": 32, "minibatch_size": 4096, "epochs": 5, "lr": 1e-3, "gamma": 0.98},
)


def preset_dirs() -> list[Path]:
    """Where named presets are looked up: $CTRL_RL_PRESETS, ./experiments/presets, the source checkout's."""
    dirs = []
    if os.environ.get("CTRL_RL_PRESETS"):
        dirs.append(Path(os.environ["CTRL_RL_PRESETS"]))
    dirs.append(Path.cwd() / "experiments" / "presets")
    dirs.append(Path(__file__).resolve().parent.parent / "experiments" / "presets")
    return dirs


def list_presets() -> dict[str, Preset]:
    out = {"default": DEFAULT_PRESET}
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
                             '{"algo": ..., "run": {...}, "config": {...}}')
    unknown = set(raw) - {"algo", "run", "config", "description"}
    if unknown:
        raise UserInputError(f"preset file {str(path)!r} has unknown keys {sorted(unknown)}: expected algo, run, config, description")
    return Preset(path.stem, raw["algo"], raw.get("run", {}), raw.get("config", {}), raw.get("description", ""))


def load_preset(name_or_path: str) -> Preset:
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise UserInputError(f"preset file {name_or_path!r} does not exist: expected a JSON preset file or a name from `ctrl-rl list presets`")
        return _read_preset(p)
    presets = list_presets()
    if name_or_path not in presets:
        import difflib

        close = difflib.get_close_matches(name_or_path, presets, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserInputError(f"unknown preset {name_or_path!r}: expected one of {sorted(presets)}{hint}")
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
        import difflib

        key = sorted(unknown)[0]
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserInputError(f"unknown {what} key {key!r}{hint}: expected one of {sorted(names)}")
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
    if dataclasses.is_dataclass(tp) and isinstance(v, dict):
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


def save_config(path: Path, algo: str, run: RunConfig, algo_cfg: Any) -> None:
    """Write the resolved config as JSON (atomically)."""
    payload = {"algo": algo, "run": to_dict(run), "config": to_dict(algo_cfg)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def load_config(path: Path) -> tuple[str, RunConfig, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"run config {str(path)!r} could not be read ({e}): expected the config.json a training run writes") from None
    if not isinstance(raw, dict) or raw.get("algo") not in ALGO_CONFIGS:
        raise UserInputError(f"run config {str(path)!r} names no known algorithm: expected 'algo' in {sorted(ALGO_CONFIGS)}")
    algo = raw["algo"]
    return algo, from_dict(RunConfig, raw.get("run", {}), "run"), from_dict(ALGO_CONFIGS[algo], raw.get("config", {}), algo)
