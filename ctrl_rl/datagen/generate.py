"""D4RL-protocol datasets regenerated on Gymnasium MuJoCo v5 (docs/tutorials/d4rl-data.md): ``ctrl-rl data generate``.

Levels, for Hopper-v5, HalfCheetah-v5 and Walker2d-v5:

* ``random``: uniform actions in ``[-1, 1]^A`` (log-prob ``-A log 2``), 1M transitions.
* ``medium`` / ``expert``: actions *sampled* from the shipped SAC behaviour policy (``behaviour.py``; medium is the
  snapshot at about one third of the expert's normalized score, expert the best one), 1M transitions.
* ``medium-expert``: medium then expert, the medium file cut after its last complete episode (D4RL's
  ``stitch_dataset.py``).
* ``medium-replay``: the replay buffer of the behaviour-training run up to the medium snapshot, in insertion order.
  ``--from-run RUN_DIR`` reads it from that run's ``checkpoints/latest.pt`` (trained with ``--save-replay``, buffer
  not wrapped). Without it the seeded training recorded in the manifest is re-run in-process for that many env
  steps in a temporary directory on ``RERUN_THREADS`` torch threads; this reproduces the rows exactly only on the
  same machine and torch version (and simulator build: the training env is envpool's when installed). The replay
  stores neither qpos/qvel nor log-probs, so this level has no ``infos/`` keys.

Rows follow the D4RL layout (docs/guides/datasets.md#d4rl-hdf5-layout): ``observations``, ``next_observations``,
``actions``, ``rewards``,
``terminals`` (true termination), ``timeouts`` (the 1000-step limit; a termination on the last step counts as
terminated, ctrl_rl's protocol), ``infos/action_log_probs``, ``infos/qpos``, ``infos/qvel`` (the simulator state
the observation was computed from, read from ``env.unwrapped.data`` before each step). Episodes are contiguous and
end where ``terminals | timeouts``; the file has exactly the requested number of rows, so the last episode may be
cut, with neither flag on its last row (as in D4RL's files).

Collection steps ``num_envs`` Gymnasium envs in lockstep with one batched policy forward pass per step; env i
is reset with seed ``seed + i`` and then keeps its own RNG. MuJoCo's step is most of the cost, so the envs are split
over ``workers`` forked processes (default: one per core), which only step them: the rows do not depend on
``workers``. Finished episodes are appended whole in the order they end (never interleaved); the episodes still
running when the file is full are dropped. The data therefore depend on ``seed`` and ``num_envs``; both are
recorded. Measured cost (experiments/data/bench_collect.py, on a busy 2-core machine): about 220 CPU-seconds per 1M
Hopper/Walker2d rows of a SAC policy, 100 for HalfCheetah: an estimated one to two minutes per 1M with two
workers on two idle cores (not measured idle). Files go to ``$CTRL_RL_DATA_DIR``, else
``$XDG_CACHE_HOME/ctrl_rl/datasets``, else ``~/.cache/ctrl_rl/datasets``, as ``<task>-<level>-v5.hdf5``, written
atomically; ``load_dataset("hopper-medium-v5")`` finds them there (``ctrl_rl.storage.datasets.cache`` owns the cache
and the ids, so reading needs nothing from here). ``plan`` refuses an output path, or the local reference file,
that cannot be written before any generation work.

The medium-replay re-run is the one call into the training loop: ``_rerun_replay`` (``train_offpolicy``).

Shape letters: N envs, H episode horizon, S rows, O obs dim, A action dim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import gymnasium
import numpy as np
import torch

from ctrl_rl.core.provenance import cpu_model, file_sha256
from ctrl_rl.core.workers import LocalWorkers, WorkerPool
from ctrl_rl.datagen import behaviour as B
from ctrl_rl.envs.gymnasium import make
from ctrl_rl.errors import UserInputError, did_you_mean
from ctrl_rl.learn.checkpoint import find_checkpoint, load_checkpoint
from ctrl_rl.learn.config import parse_saved
from ctrl_rl.learn.offpolicy import train_offpolicy
from ctrl_rl.learn.progress import progress_bar
from ctrl_rl.storage.datasets.cache import DATA_DIR_ENV, LEVELS, check_writable, data_dir, dataset_name
from ctrl_rl.storage.datasets.native import DatasetMeta, write_dataset
from ctrl_rl.storage.datasets.scores import (
    D4RL_REFERENCES,
    D4RL_SOURCE,
    LOCAL_REFS_ENV,
    default_local_references_path,
    load_local_references,
    normalized_score_from,
    save_local_references,
)

_REPLAY_KEYS = {"obs": "observations", "action": "actions", "reward": "rewards", "next_obs": "next_observations",
                "terminated": "terminals", "truncated": "timeouts"}

Policy = Callable[[torch.Tensor, torch.Generator], "tuple[torch.Tensor, torch.Tensor]"]


class SamplingActor(Protocol):
    """What ``collect`` takes as a policy: ctrl_rl's SAC ``Actor`` (``behaviour.load_behaviour``) or any module
    with its ``sample``: a sampled action ``[N,A]`` and its log-density ``[N]`` for observations ``[N,O]``."""

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]: ...


# -- collection -----------------------------------------------------------------------------------------------------
def _sampler(policy: SamplingActor | None, action_dim: int) -> Policy:
    if policy is None:  # uniform in [-1, 1]^A: density 2^-A
        logp = -action_dim * math.log(2.0)

        def uniform(obs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            a = torch.rand((obs.shape[0], action_dim), generator=gen) * 2 - 1  # [N,A]
            return a, torch.full((obs.shape[0],), logp)  # [N]
        return uniform
    return policy.sample  # a tanh-Gaussian SAC actor: sampled action [N,A] and its log-density [N]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Small-batch forward passes: a second torch thread only adds barrier waits (the simulators hold the cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def make_envs(env_id: str, n: int, max_episode_steps: int | None = None) -> tuple[list, int]:
    """``n`` unwrapped Gymnasium MuJoCo envs and the episode horizon (the registered time limit unless given).
    The time limit is applied by the caller, so that ``terminated`` and ``truncated`` stay apart."""
    try:
        envs = [make(env_id) for _ in range(n)]
    except gymnasium.error.Error as e:
        raise UserInputError(f"env {env_id!r} cannot be made by gymnasium ({e}): expected a MuJoCo v5 id such as "
                             f"Hopper-v5") from None
    registered = envs[0].spec.max_episode_steps if envs[0].spec is not None else None
    horizon = int(max_episode_steps or registered or 1000)
    raw = [e.unwrapped for e in envs]
    space = raw[0].action_space
    if not hasattr(raw[0], "data") or not isinstance(space, gymnasium.spaces.Box) \
            or not (np.all(space.low == -1.0) and np.all(space.high == 1.0)):
        raise UserInputError(f"env {env_id!r} is not a MuJoCo env with actions in [-1, 1] (bounds {space}): expected "
                             f"Hopper-v5, HalfCheetah-v5 or Walker2d-v5")
    return raw, horizon


class EnvGroup:
    """A few Gymnasium MuJoCo envs stepped one after another, each reset with its own seed first.

    ``step(actions [n,A], active [n])`` returns, per env: the simulator state before the step (``qpos``,
    ``qvel``), ``next_obs`` (the observation the step reached), ``reward``, ``terminated``, ``ended``
    (terminated or the time limit) and ``obs`` (the next policy input: the reset observation where ``ended``).
    Inactive envs are not stepped (their rows are zeros).
    """

    def __init__(self, env_id: str, seeds: list[int], max_episode_steps: int | None = None):
        self.envs, self.horizon = make_envs(env_id, len(seeds), max_episode_steps)
        self.seeds = seeds
        self.t = np.zeros(len(seeds), np.int64)  # [n] steps into the running episode
        e = self.envs[0]
        self.dims = {"obs": e.observation_space.shape[0], "act": e.action_space.shape[0], "nq": e.model.nq,
                     "nv": e.model.nv}

    def describe(self) -> tuple[int, dict[str, int]]:
        """``(horizon, dims)``: what the parent of a worker-held group needs to size its arrays."""
        return self.horizon, self.dims

    def reset(self) -> np.ndarray:
        self.t[:] = 0
        return np.stack([e.reset(seed=s)[0] for e, s in zip(self.envs, self.seeds)]).astype(np.float32)  # [n,O]

    def step(self, actions: np.ndarray, active: np.ndarray | None = None) -> dict[str, np.ndarray]:
        n, (O, _, nq, nv) = len(self.envs), self.dims.values()
        out = {"obs": np.zeros((n, O), np.float32), "next_obs": np.zeros((n, O), np.float32),
               "qpos": np.zeros((n, nq), np.float32), "qvel": np.zeros((n, nv), np.float32),
               "reward": np.zeros(n, np.float32), "terminated": np.zeros(n, bool), "ended": np.zeros(n, bool)}
        ob, nx, qp, qv, rw, te, en = out.values()
        for i, env in enumerate(self.envs):
            if active is not None and not active[i]:
                continue
            qp[i], qv[i] = env.data.qpos, env.data.qvel
            o2, rw[i], te[i], _, _ = env.step(actions[i])
            nx[i] = o2
            self.t[i] += 1
            if te[i] or self.t[i] == self.horizon:
                en[i], self.t[i] = True, 0
                o2 = env.reset()[0]
            ob[i] = o2
        return out

    def close(self) -> None:
        for e in self.envs:
            e.close()


class BatchedEnvs:
    """``num_envs`` Gymnasium MuJoCo envs (env i seeded ``seed + i``) split over ``workers`` processes, stepped in
    lockstep: the data do not depend on ``workers`` (1 steps them in this process). MuJoCo's step is most of the
    cost, so worker processes are what makes collection use more than one core."""

    def __init__(self, env_id: str, num_envs: int, seed: int, workers: int = 1, max_episode_steps: int | None = None):
        workers = max(1, min(int(workers), num_envs))
        bounds = np.linspace(0, num_envs, workers + 1).round().astype(int)
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        seeds = [[int(seed) + i for i in range(s.start, s.stop)] for s in self.slices]
        args = [(env_id, s, max_episode_steps) for s in seeds]
        # worker processes forked where possible: a spawned worker re-imports the caller's main script, which breaks
        # scripts without a ``__main__`` guard; the workers run no torch code, so the parent's thread pool is no matter
        self.pool = (LocalWorkers(EnvGroup, args) if workers == 1 else
                     WorkerPool(EnvGroup, args, start_method="fork", name=f"{env_id} collector"))
        try:
            self.horizon, dims = self.pool.call_all("describe")[0]
        except BaseException:
            self.close()
            raise
        self.num_envs, self.obs_dim, self.action_dim = num_envs, dims["obs"], dims["act"]
        self.nq, self.nv = dims["nq"], dims["nv"]

    def reset(self) -> np.ndarray:
        return np.concatenate(self.pool.call_all("reset"))  # [N,O]

    def step(self, actions: np.ndarray, active: np.ndarray | None = None) -> dict[str, np.ndarray]:
        parts = self.pool.call_all("step", [(actions[s], None if active is None else active[s]) for s in self.slices])
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}  # [N,...] each

    def close(self) -> None:
        self.pool.close()


def default_workers() -> int:
    """One worker process per core (the envs' MuJoCo steps dominate), or 1 (in-process) on a single core."""
    return max(1, min(os.cpu_count() or 1, 8))


def collect(env_id: str, policy: SamplingActor | None, n_transitions: int, seed: int, num_envs: int = 32, *,
            workers: int | None = None, max_episode_steps: int | None = None,
            progress: Callable[[int], object] | None = None) -> dict[str, np.ndarray]:
    """``n_transitions`` D4RL-layout rows of ``policy`` (an actor with ``sample(obs, gen)``; None: uniform random).

    Actions are sampled (not the mean) with a generator seeded by ``seed``, one batched forward pass over the
    ``num_envs`` envs per step; the policy acts in ``[-1, 1]^A``, which are these envs' bounds. Episodes are
    appended whole in the order they end; the last one is cut at ``n_transitions`` rows. ``workers`` processes
    step the envs (default: one per core); the rows do not depend on it. ``progress(k)``: k rows were added.
    """
    if n_transitions < 1 or num_envs < 1:
        raise UserInputError(f"collect {n_transitions} transitions with {num_envs} envs: expected positive numbers")
    envs = BatchedEnvs(env_id, num_envs, seed, default_workers() if workers is None else workers, max_episode_steps)
    try:
        N, S, H, O, A = num_envs, int(n_transitions), envs.horizon, envs.obs_dim, envs.action_dim
        obs = envs.reset()  # [N,O]
        act_fn = _sampler(policy, A)
        gen = torch.Generator().manual_seed(int(seed))
        dims = {"observations": O, "next_observations": O, "actions": A, "rewards": 0, "infos/action_log_probs": 0,
                "infos/qpos": envs.nq, "infos/qvel": envs.nv}
        out = {k: np.zeros((S, d) if d else S, np.float32) for k, d in dims.items()}  # [S,...]
        out["terminals"], out["timeouts"] = np.zeros(S, bool), np.zeros(S, bool)  # [S]
        # [N,H,...] running episodes
        ep = {k: np.zeros((N, H, d) if d else (N, H), np.float32) for k, d in dims.items()}
        rows = np.arange(N)
        t = np.zeros(N, np.int64)  # [N] steps into each running episode
        filled = 0
        with torch.no_grad(), _one_thread():
            while filled < S:
                a, logp = act_fn(torch.from_numpy(obs), gen)  # [N,A], [N]
                a, logp = a.numpy(), logp.numpy()
                r = envs.step(a)
                for key, value in (("observations", obs), ("next_observations", r["next_obs"]), ("actions", a),
                                   ("rewards", r["reward"]), ("infos/action_log_probs", logp),
                                   ("infos/qpos", r["qpos"]), ("infos/qvel", r["qvel"])):
                    ep[key][rows, t] = value
                t += 1
                for i in np.flatnonzero(r["ended"]):  # append finished episodes whole, in env order
                    m = min(int(t[i]), S - filled)
                    for key in dims:
                        out[key][filled:filled + m] = ep[key][i, :m]
                    if m == t[i]:
                        out["terminals" if r["terminated"][i] else "timeouts"][filled + m - 1] = True
                    filled += m
                    if progress is not None:
                        progress(m)
                    if filled == S:
                        break
                t[r["ended"]] = 0
                obs = r["obs"]
    finally:
        envs.close()
    return out


def episode_returns(env_id: str, policy: SamplingActor | None, episodes: int, seed: int, *,
                    workers: int | None = None, max_episode_steps: int | None = None) -> np.ndarray:
    """Undiscounted returns ``[episodes]`` of one episode per env (env i reset with ``seed + i``), actions sampled."""
    envs = BatchedEnvs(env_id, episodes, seed, default_workers() if workers is None else workers, max_episode_steps)
    try:
        obs = envs.reset()  # [N,O]
        act_fn = _sampler(policy, envs.action_dim)
        gen = torch.Generator().manual_seed(int(seed))
        returns = np.zeros(episodes)  # [N]
        live = np.ones(episodes, bool)  # [N] envs still in their first episode
        with torch.no_grad(), _one_thread():
            while live.any():
                a = act_fn(torch.from_numpy(obs), gen)[0].numpy()  # [N,A]
                r = envs.step(a, live)
                returns += np.where(live, r["reward"], 0.0)
                live &= ~r["ended"]
                obs = r["obs"]
    finally:
        envs.close()
    return returns


# -- assembling levels ---------------------------------------------------------------------------------------------
def episode_ends(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Exclusive end row of every complete episode ``[K]``."""
    return np.flatnonzero(np.asarray(arrays["terminals"]) | np.asarray(arrays["timeouts"])) + 1


def complete_returns(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Returns ``[K]`` of the complete episodes (a trailing cut episode is left out)."""
    ends = episode_ends(arrays)
    if ends.size == 0:
        return np.zeros(0)
    sums = np.concatenate([[0.0], np.cumsum(np.asarray(arrays["rewards"], np.float64))])  # [S+1]
    return np.diff(sums[np.concatenate([[0], ends])])


def stitch(first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``first`` cut after its last complete episode, then all of ``second`` (D4RL's medium-expert)."""
    ends = episode_ends(first)
    cut = int(ends[-1]) if ends.size else 0
    keys = [k for k in first if k in second]
    return {k: np.concatenate([np.asarray(first[k])[:cut], np.asarray(second[k])]) for k in keys}


def replay_rows(replay: Mapping[str, Any], steps: int, num_envs: int = 1,
                source: str = "replay") -> dict[str, np.ndarray]:
    """The first ``steps`` transitions of a saved ``ReplayBuffer.state_dict()`` as D4RL-layout rows.

    One env: rows in insertion order (episodes are contiguous; a last unfinished episode stays, unflagged).
    ``num_envs > 1`` interleaves envs row by row; their complete episodes are then ordered by the step they ended
    (ties by env) and the unfinished ones dropped, so episodes stay contiguous.
    """
    if int(replay["added"]) > int(replay["capacity"]):
        raise UserInputError(f"{source}: the replay buffer wrapped ({replay['added']} transitions into capacity "
                             f"{replay['capacity']}), so its first rows are gone: expected a run whose --buffer-size "
                             f"holds every transition")
    if int(replay["size"]) < steps:
        raise UserInputError(f"{source}: the replay buffer holds {replay['size']} transitions: expected at least "
                             f"{steps} (the medium snapshot's env step)")
    rows = {name: replay[key][:steps].numpy() for key, name in _REPLAY_KEYS.items()}
    if num_envs == 1:
        return rows
    T = steps // num_envs
    ends = []  # (end iteration, env, first iteration)
    for j in range(num_envs):
        done = np.flatnonzero(rows["terminals"][j:T * num_envs:num_envs] | rows["timeouts"][j:T * num_envs:num_envs])
        starts = np.concatenate([[0], done[:-1] + 1])
        ends += [(int(d), j, int(s)) for d, s in zip(done, starts)]
    order = (np.concatenate([np.arange(s, d + 1) * num_envs + j for d, j, s in sorted(ends)]) if ends
             else np.zeros(0, int))
    return {k: v[order] for k, v in rows.items()}


# -- the generator ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One dataset to produce: its level, file, what makes it and the request its reuse is checked against."""

    task: str
    level: str
    path: Path
    request: dict
    inputs: dict
    reuse: bool = False
    """The file at ``path`` already holds this request's data (set by ``plan`` unless ``force``)."""


def _versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import ctrl_rl

    out = {"ctrl_rl": ctrl_rl.__version__}
    for name in ("gymnasium", "mujoco", "torch", "numpy", "h5py", *extra):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    return out


def _ref_scores(task: str, manifest: Mapping[str, Any]) -> dict:
    refs = B.local_references(manifest).get(task)
    if refs is not None:
        return {"random": refs.random, "expert": refs.expert,
                "source": f"local v5 references ({B.TASK_ENVS[task]}: uniform random and expert SAC policy, "
                          f"{refs.episodes} episodes each, ctrl_rl behaviour manifest)"}
    ref = D4RL_REFERENCES[task]
    return {"random": ref.random, "expert": ref.expert, "source": D4RL_SOURCE}


def _read_record(path: Path) -> DatasetMeta | None:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            text = f.attrs.get("ctrl_rl")
        return None if text is None else DatasetMeta.from_json(str(text), str(path))
    except (OSError, UserInputError):
        return None


def _policy_of(path: Path) -> str:
    """The policy recorded in a dataset file this module made (a part of a medium-expert dataset)."""
    meta = _read_record(path)
    if meta is None:
        raise UserInputError(f"{path} has no readable ctrl_rl record: expected the dataset file this command made")
    return meta.policy


def _merge_local_references(refs: Mapping[str, Any]) -> None:
    """Write the manifest's references into the local reference file (``--refs local``), keeping other tasks'."""
    try:
        merged = {**load_local_references().scores, **refs}
    except UserInputError:  # no file yet (or an unreadable one, which this replaces)
        merged = dict(refs)
    save_local_references(merged, source="local v5 references (uniform random and expert SAC policy, episodes "
                                         "per task as listed; ctrl_rl behaviour manifest)")


def _reusable(job: Job) -> bool:
    """True if ``job.path`` holds this request's data; refuses a file made by another request."""
    if not job.path.exists():
        return False
    meta = _read_record(job.path)
    old = None if meta is None else meta.extra.get("request")
    if old == job.request:
        return True
    diff = "its ctrl_rl record is unreadable" if old is None else next(
        (f"{k}={old.get(k)!r} instead of {v!r}" for k, v in job.request.items() if old.get(k) != v),
        "another request")
    raise UserInputError(f"{job.path} already exists and was made differently ({diff}): expected --force to "
                         f"regenerate it, or --out PATH for a separate file")


def plan(env_id: str, level: str, steps: int = 1_000_000, seed: int = 0, num_envs: int = 32, out: str | None = None,
         force: bool = False, from_run: str | None = None) -> list[Job]:
    """Check every input and list the datasets to produce, before anything is written (or generated): the
    output files and the local reference file must be writable."""
    task = B.task_of(env_id)
    if env_id != B.TASK_ENVS[task]:
        raise UserInputError(f"env {env_id!r}: expected the Gymnasium id {B.TASK_ENVS[task]!r}")
    levels = list(LEVELS) if level == "all" else [level]
    if level not in LEVELS and level != "all":
        raise UserInputError(f"unknown level {level!r}{did_you_mean(level, [*LEVELS, 'all'])}: expected one of "
                             f"{', '.join(LEVELS)} or all")
    for flag, value in (("--steps", steps), ("--num-envs", num_envs)):
        if value < 1:
            raise UserInputError(f"invalid {flag} {value}: expected a positive integer")
    if from_run is not None and "medium-replay" not in levels:
        raise UserInputError("--from-run applies to --level medium-replay (or all): "
                             f"expected no --from-run for {level}")
    out_dir, out_file = data_dir(), None
    if out is not None:
        p = Path(out).expanduser()
        if level == "all" or p.is_dir() or not p.suffix:
            out_dir = p
        else:
            out_dir, out_file = p.parent, p
    manifest = B.load_manifest()
    policies = {}
    for lvl in B.POLICY_LEVELS:
        if any(lv in (lvl, "medium-expert") or (lvl == "medium" and lv == "medium-replay") for lv in levels):
            path = B.behaviour_path(task, lvl)
            B.load_behaviour(path)  # refuses a missing or malformed file now
            policies[lvl] = {"path": str(path), "sha256": file_sha256(path)}
    base = {"steps": int(steps), "seed": int(seed), "num_envs": int(num_envs)}
    jobs = []
    for lvl in levels:
        path = out_file if out_file is not None else out_dir / f"{dataset_name(task, lvl)}.hdf5"
        inputs: dict[str, Any] = {}
        if lvl == "random":
            request = dict(base)
        elif lvl in B.POLICY_LEVELS:
            request = {**base, "policy_sha256": policies[lvl]["sha256"]}
            inputs["policy"] = policies[lvl]["path"]
        elif lvl == "medium-expert":
            request = {"medium": {**base, "policy_sha256": policies["medium"]["sha256"]},
                       "expert": {**base, "policy_sha256": policies["expert"]["sha256"]}}
            inputs["parts"] = [Job(task, p, out_dir / f"{dataset_name(task, p)}.hdf5", request[p],
                                   {"policy": policies[p]["path"]}) for p in B.POLICY_LEVELS]
        else:
            entry = manifest["tasks"].get(task, {})
            step = entry.get("medium", {}).get("checkpoint_step")
            if step is None:
                raise UserInputError(f"the behaviour manifest has no medium checkpoint step for {task}: expected "
                                     f"experiments/data/export_behaviour.py to have recorded it")
            request = {"env_steps": int(step), "policy_sha256": policies["medium"]["sha256"]}
            training = entry.get("training", {})
            inputs.update(policy=policies["medium"]["path"], training=training)
            if from_run is None and (not training.get("run") or not training.get("algo")):
                raise UserInputError(f"the behaviour manifest has no training config for {task}: expected --from-run "
                                     f"RUN_DIR (the behaviour-training run, trained with --save-replay)")
        jobs.append(Job(task, lvl, path, request, inputs))
    if not force:
        for job in jobs:  # refuses a file another request made
            if "parts" in job.inputs:
                job.inputs["parts"] = [dataclasses.replace(p, reuse=_reusable(p)) for p in job.inputs["parts"]]
        jobs = [dataclasses.replace(job, reuse=_reusable(job)) for job in jobs]
    _check_outputs(jobs, out, manifest)
    for job in jobs:
        if job.level == "medium-replay" and from_run is not None:
            job.inputs["rows"], job.inputs["run"] = _run_replay(from_run, task, job.request["env_steps"],
                                                                job.inputs["policy"])
    return jobs


def _check_outputs(jobs: list[Job], out: str | None, manifest: Mapping[str, Any]) -> None:
    """Refuse an output that cannot be written (every file ``run_jobs`` will write, and the local reference file
    it updates), so that a bad ``--out`` fails before the generation work, with nothing written."""
    what = f"--out {out}" if out is not None else f"the dataset cache (${DATA_DIR_ENV})"
    for job in jobs:
        if not job.reuse:
            for j in (*job.inputs.get("parts", ()), job):
                if not j.reuse:
                    check_writable(j.path, what)
    if B.local_references(manifest):
        ref = default_local_references_path()
        check_writable(ref, f"the local reference file {ref} (${LOCAL_REFS_ENV})")


def _run_replay(run_dir: str, task: str, step: int, medium_policy: str) -> tuple[dict, str]:
    """The first ``step`` replay rows of a SAC run with --save-replay; refuses a run that did not make the medium
    policy (when its snapshot at that step is still there)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise UserInputError(f"--from-run {run_dir!r} is not a directory: expected the run directory of the "
                             f"behaviour-training SAC run")
    path = find_checkpoint(d)
    ck = load_checkpoint(path, expect_algo="sac")
    run = ck["config"]["run"]
    if B.task_of(str(run["env"])) != task:
        raise UserInputError(f"--from-run {run_dir!r} trained on {run['env']!r}: expected a {B.TASK_ENVS[task]} run")
    if ck.get("replay") is None:
        raise UserInputError(f"--from-run {run_dir!r} has no replay buffer in {path.name}: expected a run trained with "
                             f"--save-replay")
    snap = d / "checkpoints" / f"step_{step:09d}.pt"
    if snap.is_file():
        actor, _ = B.load_behaviour(medium_policy)
        state = load_checkpoint(snap, expect_algo="sac")["algo_state"]["actor"]
        if any(not torch.equal(v.float(), state[k].float()) for k, v in actor.state_dict().items()):
            raise UserInputError(f"--from-run {run_dir!r}: its snapshot at step {step} is not the medium behaviour "
                                 f"policy: expected the run the medium policy was exported from")
    return replay_rows(ck["replay"], step, int(run["num_envs"]), f"--from-run {run_dir}"), str(d)


RERUN_THREADS = 1
"""Torch threads of the medium-replay re-run. Fixed, not governed (``core.perf.ThreadGovernor`` follows the machine's
load): the float rounding of every update depends on the thread count, and the re-run's rows on every update, so
only a fixed count makes a regeneration on the same machine give the same file. Two governed regenerations of
hopper-medium-replay-v5 on 2-core AMD EPYC machines, one beside another job (mostly one thread) and one alone (two),
gave 920 episodes with mean return 660 and 1,527 with mean return 348 (experiments/wsrl_study/README.md). The file
records the count and the CPU model (``threads``, ``cpu``)."""


def _rerun_replay(training: Mapping[str, Any], step: int, progress: bool) -> dict:
    """Re-run the recorded seeded training for ``step`` env steps with --save-replay; its first ``step`` rows.

    The one place where data generation drives a training loop (``ctrl_rl.learn.offpolicy.train_offpolicy``)."""
    # the manifest records the training config as it was written (loop settings may sit in the algorithm config)
    _, base, cfg = parse_saved({"algo": "sac", "run": dict(training["run"]), "config": dict(training["algo"])},
                               "manifest training")
    with tempfile.TemporaryDirectory(prefix="ctrl_rl-medium-replay-") as tmp:
        assert base.loop is not None  # parse_saved builds the run's loop config
        loop = dataclasses.replace(base.loop, save_replay=True, keep_every=0)
        run = dataclasses.replace(base, total_steps=step, run_dir=tmp, resume=None, progress=progress, loop=loop,
                                  threads=RERUN_THREADS)
        train_offpolicy(run, "sac", cfg, Path(tmp))
        ck = load_checkpoint(Path(tmp) / "checkpoints" / "latest.pt", expect_algo="sac")
        return replay_rows(ck["replay"], step, run.num_envs, "re-run of the behaviour training")


def _bar(enabled: bool, total: int, desc: str):
    """A tqdm bar on a terminal; when the output is a pipe or a file, a plain line every 30 s instead."""
    return progress_bar(enabled, total, 0, desc)


def _collect_level(job: Job, progress: bool, workers: int | None) -> tuple[dict, str, dict]:
    r = job.request
    env_id = B.TASK_ENVS[job.task]
    actor, record = (None, None) if job.level == "random" else B.load_behaviour(job.inputs["policy"])
    bar = _bar(progress, r["steps"], dataset_name(job.task, job.level))
    try:
        rows = collect(env_id, actor, r["steps"], r["seed"], r["num_envs"], workers=workers,
                       progress=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.close()
    if record is None:
        return rows, "uniform random actions in [-1, 1]^A", {}
    src = record["source"]
    return rows, f"{record['path']} (SAC snapshot at step {src['checkpoint_step']} of `{src['run_command']}`)", src


def _write(job: Job, rows: dict, policy: str, extra: dict, seed: int | None, seconds: float, manifest: dict,
           versions: dict) -> None:
    """Write atomically: into a temporary directory next to the target, then one rename (nothing half-written)."""
    returns = complete_returns(rows)
    meta = DatasetMeta(env_id=B.TASK_ENVS[job.task], level=job.level, policy=policy, seed=seed, versions=versions,
                       ref_scores=_ref_scores(job.task, manifest),
                       extra={"steps": int(len(rows["rewards"])), "episodes": int(returns.size),
                              "generation_seconds": round(seconds, 1), "max_episode_steps": 1000,
                              "request": job.request, **extra})
    job.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{job.path.name}.", dir=job.path.parent))
    try:
        written = write_dataset(tmp / job.path.name, rows, meta)
        os.replace(written, job.path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summary(job: Job, seconds: float, reused: bool) -> dict:
    import h5py

    rows: dict[str, np.ndarray] = {}
    with h5py.File(job.path, "r") as f:
        for k in ("rewards", "terminals", "timeouts"):
            dataset = f[k]
            assert isinstance(dataset, h5py.Dataset)  # write_dataset writes every row array as a dataset
            rows[k] = dataset[()]
        meta = DatasetMeta.from_json(str(f.attrs["ctrl_rl"]), str(job.path))
    returns = complete_returns(rows)
    mean = float(returns.mean()) if returns.size else float("nan")
    assert meta.ref_scores is not None  # _write records them in every file this module makes
    score, source = normalized_score_from(meta.ref_scores, mean)
    return {"dataset": dataset_name(job.task, job.level), "path": str(job.path),
            "transitions": int(len(rows["rewards"])), "episodes": int(returns.size), "return_mean": round(mean, 3),
            "normalized_score": round(float(score), 2), "score_reference": source, "seconds": round(seconds, 1),
            "reused": reused}


def run_jobs(jobs: list[Job], progress: bool = True, workers: int | None = None) -> Iterator[dict]:
    """Produce every planned dataset (reusing files the same request made; ``plan(force=True)`` never reuses)
    and yield its summary line: path, transitions, complete episodes, their mean return and normalized score."""
    manifest = B.load_manifest()
    refs = B.local_references(manifest)
    if refs:
        _merge_local_references(refs)
    versions = _versions()
    done: set[Path] = set()  # made by this call: a medium-expert part is not made twice

    def make(job: Job) -> bool:
        """Produce ``job`` unless its file can be used as it is; True if it was reused."""
        t0 = time.time()
        if job.reuse or job.path in done:
            return True
        if job.level in ("random", *B.POLICY_LEVELS):
            rows, policy, src = _collect_level(job, progress, workers)
            extra = {"num_envs": job.request["num_envs"], "behaviour": src, "actions": "sampled from the policy"}
            _write(job, rows, policy, extra, job.request["seed"], time.time() - t0, manifest, versions)
        elif job.level == "medium-expert":
            parts = []
            for part in job.inputs["parts"]:
                make(part)
                parts.append(part)
                done.add(part.path)
            rows = stitch(*(_read_rows(p.path) for p in parts))
            policy = " then ".join(f"{p.level}: {_policy_of(p.path)}" for p in parts)
            _write(job, rows, policy, {"parts": [str(p.path) for p in parts]}, job.request["medium"]["seed"],
                   time.time() - t0, manifest, versions)
        else:
            step = job.request["env_steps"]
            rows = job.inputs.get("rows")
            origin = f"replay buffer of {job.inputs['run']}" if rows is not None else "re-run of the recorded training"
            if rows is None:
                rows = _rerun_replay(job.inputs["training"], step, progress)
            training = job.inputs["training"]
            policy = (f"replay of the behaviour-training run up to the medium snapshot (step {step}) of "
                      f"`{training.get('command', '?')}`; {origin}")
            extra = {"source": origin, "train_seed": training.get("seed")}
            if "run" not in job.inputs:  # a re-run: its rows depend on the machine and the thread count
                extra.update(threads=RERUN_THREADS, cpu=cpu_model())
            _write(job, rows, policy, extra, training.get("seed"), time.time() - t0, manifest,
                   _versions(("envpool",)))
        done.add(job.path)
        return False

    for job in jobs:
        t0 = time.time()
        reused = make(job)
        yield _summary(job, time.time() - t0, reused)


def _read_rows(path: Path) -> dict[str, np.ndarray]:
    import h5py

    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def generate(env_id: str, level: str, steps: int = 1_000_000, seed: int = 0, num_envs: int = 32,
             out: str | None = None, force: bool = False, from_run: str | None = None,
             progress: bool = True, workers: int | None = None) -> list[dict]:
    """``ctrl-rl data generate`` as a function: plan (every check first), then produce; one summary per dataset."""
    return list(run_jobs(plan(env_id, level, steps, seed, num_envs, out, force, from_run), progress, workers))


__all__ = ["LEVELS", "collect", "complete_returns", "episode_returns", "generate", "plan", "replay_rows", "run_jobs",
           "stitch"]
