"""Behaviour policies of the D4RL-protocol datasets: one small file per (task, level), and their manifest.

The policies that generate ``medium`` and ``expert`` data are SAC actors (tanh-Gaussian,
docs/tutorials/d4rl-data.md#behaviour-policies,
docs/tutorials/d4rl-data.md) taken from snapshots of one seeded SAC training run per task. Each ships with the package
as
``ctrl_rl/data/behaviour/<task>-v5-<level>.pt``, a ``torch.save`` dict readable with ``weights_only=True``::

    {"format": "ctrl_rl.behaviour", "version": 1, "env_id": "Hopper-v5", "level": "medium",
     "obs_dim": 11, "action_dim": 3,
     "sac_config": {...SACConfig fields...},            # rebuilds ctrl_rl's SAC Actor
     "actor": {...state dict, float32...},
     "source": {"run_command", "checkpoint_step", "train_seed",
                "eval_return_mean", "eval_return_std", "eval_episodes"}}

``manifest.json`` next to them records, per task: the training command and resolved configs, the chosen
checkpoint steps with their evaluation returns, the locally measured reference returns (uniform random and
expert policy, 100 episodes each) and the medium-replay recipe (the run's first ``env_steps`` transitions).
``experiments/data/export_behaviour.py`` writes both from a training run; ``ctrl-rl data generate`` reads them.

``$CTRL_RL_BEHAVIOUR_DIR`` replaces the package directory (tests, or policies trained elsewhere).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium
import torch

from ctrl_rl.algos.sac import Actor, SACConfig
from ctrl_rl.envs.gymnasium import make
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OffPolicyLoopConfig, from_dict, load_preset
from ctrl_rl.storage.datasets.cache import TASK_ENVS
from ctrl_rl.storage.datasets.scores import ReferenceScores, task_key

FORMAT = "ctrl_rl.behaviour"
VERSION = 1
MANIFEST_FORMAT = "ctrl_rl.behaviour_manifest"
MANIFEST_NAME = "manifest.json"
BEHAVIOUR_DIR_ENV = "CTRL_RL_BEHAVIOUR_DIR"
POLICY_LEVELS = ("medium", "expert")
_SOURCE_KEYS = ("run_command", "checkpoint_step", "train_seed", "eval_return_mean", "eval_return_std", "eval_episodes")


def behaviour_dir() -> Path:
    """``$CTRL_RL_BEHAVIOUR_DIR``, else the package's ``ctrl_rl/data/behaviour`` (package data, see setup.cfg)."""
    env = os.environ.get(BEHAVIOUR_DIR_ENV)
    return Path(env).expanduser() if env else Path(__file__).resolve().parents[1] / "data" / "behaviour"


def task_of(env_id: str) -> str:
    """``Hopper-v5`` (also ``envpool:Hopper-v5``, ``hopper``) -> ``hopper``; refuses tasks without policies."""
    key = task_key(env_id.split(":", 1)[-1])
    if key not in TASK_ENVS or env_id.split(":", 1)[-1] not in (TASK_ENVS[key], key):
        raise UserInputError(f"env {env_id!r} has no D4RL-protocol behaviour policies: expected one of "
                             f"{', '.join(sorted(TASK_ENVS.values()))}")
    return key


def behaviour_path(task: str, level: str, root: str | Path | None = None) -> Path:
    """Where the ``level`` policy of ``task`` (``hopper``, ``Hopper-v5``) lives."""
    if level not in POLICY_LEVELS:
        raise UserInputError(f"behaviour level {level!r}: expected one of {', '.join(POLICY_LEVELS)}")
    return Path(root if root is not None else behaviour_dir()) / f"{task_of(task)}-v5-{level}.pt"


def env_dims(env_id: str) -> tuple[int, int]:
    """Observation and action dims of a Gymnasium env id (``Hopper-v5`` -> ``(11, 3)``)."""
    try:
        env = make(env_id)
    except gymnasium.error.Error as e:
        raise UserInputError(f"env {env_id!r} cannot be made by gymnasium ({e}): expected a MuJoCo v5 id such as "
                             f"Hopper-v5") from None
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gymnasium.spaces.Box) or not isinstance(act_space, gymnasium.spaces.Box):
            raise UserInputError(f"env {env_id!r} has observation space {obs_space} and action space {act_space}: "
                                 f"expected Box spaces, as a MuJoCo v5 env such as Hopper-v5 has")
        return int(obs_space.shape[0]), int(act_space.shape[0])
    finally:
        env.close()


# -- building the actor ---------------------------------------------------------------------------------
def build_actor(sac_config: Mapping[str, Any], obs_dim: int, action_dim: int, env_id: str = "") -> Actor:
    """ctrl_rl's SAC ``Actor`` for a saved ``SACConfig`` dict (lists become tuples), in evaluation mode.

    Keys that are no longer ``SACConfig`` fields are skipped: the shipped files were written when the loop
    settings (``batch_size``, ``buffer_size``...) still lived in the algorithm config, and the actor never
    depended on them. A state dict that does not fit the rebuilt actor is still refused by ``load_behaviour``."""
    fields = {f.name for f in dataclasses.fields(SACConfig)}
    cfg = from_dict(SACConfig, {k: v for k, v in sac_config.items() if k in fields}, "behaviour sac_config")
    spec = EnvSpec(env_id, (int(obs_dim),), False, int(action_dim))
    return Actor(cfg, spec).eval()


def actor_from_checkpoint(ck: Mapping[str, Any], obs_dim: int, action_dim: int,
                          source: str = "checkpoint") -> Actor:
    """The actor of a loaded SAC training checkpoint (``ck["algo_state"]["actor"]``), in evaluation mode."""
    actor = build_actor(ck["config"]["algo"], obs_dim, action_dim, ck["config"]["run"]["env"])
    try:
        actor.load_state_dict(ck["algo_state"]["actor"])
    except (RuntimeError, KeyError) as e:
        raise UserInputError(f"{source}: its actor does not fit obs_dim={obs_dim}, action_dim={action_dim} "
                             f"({str(e).splitlines()[0][:100]}): expected a SAC checkpoint of this task") from None
    return actor


def training_command(run: Mapping[str, Any], algo_cfg: Mapping[str, Any], algo: str = "sac") -> str:
    """The `ctrl-rl train` command of a resolved run config: its preset (or env), seed, budget, snapshot and
    replay flags, plus the algorithm fields that differ from the preset's (documentation; the manifest also
    keeps the resolved configs, which are what a re-run uses)."""
    parts = ["ctrl-rl", "train", algo]
    base: dict[str, Any] = {}
    preset_loop: dict[str, Any] = {}
    if run.get("preset"):
        parts += ["--preset", str(run["preset"])]
        try:
            preset = load_preset(str(run["preset"]))
            base = dict(preset.config)
            preset_loop = dict(preset.loop)
            if preset.run.get("env") != run.get("env"):
                parts += ["--env", str(run["env"])]
        except UserInputError:  # the preset file is not here: every field below is still in the manifest
            pass
    else:
        parts += ["--env", str(run["env"])]
    if run.get("num_envs", 1) != 1:
        parts += ["--num-envs", str(run["num_envs"])]
    parts += ["--seed", str(run["seed"]), "--total-steps", str(run["total_steps"])]
    defaults = {k: list(v) if isinstance(v, tuple) else v for k, v in SACConfig().__dict__.items()}
    for key, value in algo_cfg.items():
        ref = base.get(key, defaults.get(key))
        if key in defaults and value != ref:
            vals = value if isinstance(value, (list, tuple)) else [value]
            if isinstance(value, bool):
                parts.append(f"--{'' if value else 'no-'}{key.replace('_', '-')}")
            else:
                parts += [f"--{key.replace('_', '-')}", *map(str, vals)]
    loop = dict(run.get("loop") or {})  # loop settings (format 1 runs kept keep_every/save_replay in the run)
    keep_every, save_replay = (loop.pop("keep_every", run.get("keep_every")),
                               loop.pop("save_replay", run.get("save_replay")))
    loop_defaults = {**OffPolicyLoopConfig().__dict__, **preset_loop}
    for key, value in loop.items():
        if key in loop_defaults and value != loop_defaults[key] and value is not None:
            parts += [f"--{key.replace('_', '-')}", str(value)]
    if keep_every:
        parts += ["--keep-every", str(keep_every)]
    if save_replay:
        parts.append("--save-replay")
    return " ".join(parts)


# -- the behaviour file -----------------------------------------------------------------------------------
def export_behaviour(checkpoint_path: str | Path, level: str, out_path: str | Path,
                     eval_stats: Mapping[str, float]) -> dict:
    """Write the behaviour file of a SAC training checkpoint; returns the record.

    ``eval_stats``: ``{"mean", "std", "episodes"}`` of the policy's evaluation (sampled actions) that chose it.
    """
    if level not in POLICY_LEVELS:
        raise UserInputError(f"behaviour level {level!r}: expected one of {', '.join(POLICY_LEVELS)}")
    ck = load_checkpoint(Path(checkpoint_path), expect_algo="sac")
    run, algo_cfg = ck["config"]["run"], ck["config"]["algo"]
    state = ck["algo_state"]["actor"]
    env_id = str(run["env"]).split(":", 1)[-1]
    obs_dim, action_dim = env_dims(env_id)
    actor_from_checkpoint(ck, obs_dim, action_dim, str(checkpoint_path))  # refuses a state that does not fit
    record = {
        "format": FORMAT, "version": VERSION, "env_id": env_id, "level": level,
        "obs_dim": obs_dim, "action_dim": action_dim,
        "sac_config": {k: list(v) if isinstance(v, tuple) else v for k, v in algo_cfg.items()},  # as in config.json
        "actor": {k: (v.float() if v.is_floating_point() else v).detach().clone().contiguous()
                  for k, v in state.items()},
        "source": {"run_command": training_command(run, algo_cfg), "checkpoint_step": int(ck["counters"]["step"]),
                   "train_seed": int(run["seed"]), "eval_return_mean": float(eval_stats["mean"]),
                   "eval_return_std": float(eval_stats["std"]), "eval_episodes": int(eval_stats["episodes"])},
    }
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        torch.save(record, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return record


def resolve_behaviour(source: str | Path, level: str | None = None, root: str | Path | None = None) -> Path:
    """A behaviour file path from a path, a name (``hopper-v5-medium``) or a task/env id plus ``level``."""
    if level is not None:
        return behaviour_path(str(source), level, root)
    p = Path(source).expanduser()
    if p.suffix == ".pt" or p.exists() or os.sep in str(source):
        return p
    task, _, lvl = str(source).rpartition("-")
    return behaviour_path(task.removesuffix("-v5"), lvl, root) if task else p


def load_behaviour(source: str | Path, level: str | None = None, root: str | Path | None = None
                   ) -> tuple[Actor, dict]:
    """``(actor in evaluation mode, record)`` of a behaviour file: a path, ``hopper-v5-medium``, or a task or env
    id with ``level``. Every failure is one UserInputError sentence naming the file."""
    path = resolve_behaviour(source, level, root)
    if not path.is_file():
        raise UserInputError(f"no behaviour policy file at {path}: expected a file written by "
                             f"experiments/data/export_behaviour.py from a SAC training run")
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
        raise UserInputError(f"behaviour file {path} is truncated or not a torch file ({first}): expected a file "
                             f"written by experiments/data/export_behaviour.py") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UserInputError(f"behaviour file {path} is not a ctrl_rl behaviour policy: expected a dict with "
                             f"format {FORMAT!r}")
    if record.get("version") != VERSION:
        raise UserInputError(f"behaviour file {path} has version {record.get('version')!r}: expected {VERSION}")
    missing = [k for k in ("env_id", "level", "obs_dim", "action_dim", "sac_config", "actor", "source")
               if k not in record]
    if missing or not isinstance(record["source"], dict) or any(k not in record["source"] for k in _SOURCE_KEYS):
        what = missing[0] if missing else "source fields"
        raise UserInputError(f"behaviour file {path} has no {what!r}: expected env_id, level, obs_dim, action_dim, "
                             f"sac_config, actor and source ({', '.join(_SOURCE_KEYS)})")
    try:
        actor = build_actor(record["sac_config"], record["obs_dim"], record["action_dim"], record["env_id"])
        actor.load_state_dict(record["actor"])
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:
        raise UserInputError(f"behaviour file {path}: its actor does not match its sac_config and dims "
                             f"({str(e).splitlines()[0][:100]}): "
                             "expected the state dict of ctrl_rl's SAC Actor") from None
    record = {k: v for k, v in record.items() if k != "actor"}
    record["path"] = str(path)
    return actor, record


# -- the manifest ---------------------------------------------------------------------------------------------
def load_manifest(root: str | Path | None = None) -> dict:
    """The manifest (``{"format", "version", "tasks": {task: {...}}}``); an empty one when there is no file."""
    path = Path(root if root is not None else behaviour_dir()) / MANIFEST_NAME
    if not path.is_file():
        return {"format": MANIFEST_FORMAT, "version": VERSION, "tasks": {}}
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("tasks"), dict):
            raise ValueError(f"format {manifest.get('format')!r}")
    except (ValueError, AttributeError) as e:
        raise UserInputError(f"behaviour manifest {path} is malformed ({e}): expected JSON with format "
                             f"{MANIFEST_FORMAT!r} and a 'tasks' object") from None
    return manifest


def save_manifest(manifest: Mapping[str, Any], root: str | Path | None = None) -> Path:
    path = Path(root if root is not None else behaviour_dir()) / MANIFEST_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def local_references(manifest: Mapping[str, Any]) -> dict:
    """Task -> ``ReferenceScores`` of every task whose references the manifest holds."""
    out = {}
    for task, entry in manifest.get("tasks", {}).items():
        refs = entry.get("references")
        if refs:
            out[task] = ReferenceScores(float(refs["random"]["mean"]), float(refs["expert"]["mean"]),
                                        entry.get("env_id", TASK_ENVS.get(task, task)), int(refs["random"]["episodes"]))
    return out
