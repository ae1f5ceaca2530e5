"""The actor-learner loop (IMPALA, DoMo-AC): actors collect with the weights they have, the learner corrects.

    actors (K x num_envs envs, weights version v) --segments [T, num_envs] + mu log-probs--> learner
    learner: batch ``segments_per_update`` segments side by side -> ``algo.update`` -> every ``broadcast_every``
    updates the new weights (version = updates done) go to the actors.

The policy lag of a segment is the learner's update count when it is used minus the version it was collected
with; the mean and maximum per update are logged (``actors/lag_mean``, ``actors/lag_max``), and segments beyond
``--max-policy-lag`` are counted (``actors/lag_over``) and reported once on stderr.

Backends, one interface (``segments(n)``, ``broadcast(weights, version)``, ``alive``, ``state_dict``, ``close``):

- ``inprocess``: the actors are objects in the learner's process, asked in turn. Deterministic: a resumed run
  equals an uninterrupted one (actors' envs, generators and weights are in the checkpoint). With
  ``broadcast_every 1`` every segment is collected with the latest weights (lag 0).
- ``process``: one ``torch.multiprocessing`` worker per actor (spawn), collecting without pause into a bounded
  queue; weights travel through shared-memory tensors under a lock. Segments arrive in whatever order the
  actors finish, so runs are not bit-reproducible; a resume restarts the actors from the saved weights with
  fresh episodes.
- ``ray``: one Ray actor per actor (``ray.init`` locally, or ``--ray-address`` of a cluster); the learner keeps
  one collection in flight per actor and takes whichever finishes first (``ray.wait``).

Faults: an actor that dies (worker exit, Ray actor error) is logged once and dropped; the learner goes on with
the rest. When none is left, or none delivered a segment within ``--actor-timeout`` seconds, the run stops with
``ActorsLost`` (exit 1 from the CLI) and the last checkpoint stays.
"""

from __future__ import annotations

import io
import logging
import math
import os
import queue
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.obs import obs_cat, obs_map, obs_to
from ctrl_rl.core.protocols import ActorWeights, Algorithm, OnPolicySampling
from ctrl_rl.core.types import Rollout
from ctrl_rl.core.workers import stop_processes
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.config import ActorLearnerLoopConfig, RunConfig, ensure_loop
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainResult, build_env, load_state, probe_spec
from ctrl_rl.storage.rollout import RolloutStorage

FAULT_ENV = "CTRL_RL_ACTOR_FAULT"
"""Fault injection for tests: ``"RANK:SEGMENTS"`` makes worker or Ray actor RANK (``*``: every actor) exit after
sending SEGMENTS segments."""


def _fault_after(rank: int) -> int | None:
    """Segments after which actor ``rank`` is to crash (``FAULT_ENV``), or None."""
    fault = os.environ.get(FAULT_ENV, "")
    if not fault:
        return None
    who, n = fault.split(":")
    return int(n) if who in ("*", str(rank)) else None


@runtime_checkable
class ActorLearnerAlgorithm(Algorithm, OnPolicySampling, ActorWeights, Protocol):
    """What the actor-learner loop needs of an algorithm: the contract, sampled actions with their log-probabilities
    (the actors) and the policy weights the learner sends them."""


def make_algorithm(algo_name: str, cfg, spec, device: torch.device, gen: torch.Generator) -> ActorLearnerAlgorithm:
    """The registry entry's algorithm, checked to have what this loop needs (``ActorLearnerAlgorithm``)."""
    algo = registry.get(algo_name).make(cfg, spec, device, gen)
    if not isinstance(algo, ActorLearnerAlgorithm):
        raise TypeError(f"{algo_name} runs in the actor-learner loop but has no sample, policy_state and "
                        "load_policy_state")
    return algo


class ActorsLost(RuntimeError):
    """Every actor is gone (or silent past the timeout); the last checkpoint is kept."""


@dataclass
class Collected:
    """One actor's segment: ``[T, num_envs]`` on the CPU, the weights' version, finished episodes."""

    segment: Rollout
    version: int
    actor: int
    returns: list[float]
    lengths: list[int]


def clone_rollout(r: Rollout) -> Rollout:
    c = lambda v: v.detach().clone().cpu()  # noqa: E731
    return Rollout(obs_map(c, r.obs), c(r.action), c(r.logp), c(r.reward), c(r.terminated), c(r.truncated),
                   obs_map(c, r.final_obs))


def cat_segments(segs: list[Rollout]) -> Rollout:
    """Segments of one unroll length side by side: ``[T, sum of N]``."""
    cat = lambda xs: torch.cat(xs, 1)  # noqa: E731
    return Rollout(obs_cat([s.obs for s in segs], 1), cat([s.action for s in segs]), cat([s.logp for s in segs]),
                   cat([s.reward for s in segs]), cat([s.terminated for s in segs]), cat([s.truncated for s in segs]),
                   obs_cat([s.final_obs for s in segs], 1))


class Actor:
    """One actor: ``num_envs`` envs, its own copy of the policy (built through the registry) and generator."""

    def __init__(self, algo_name: str, cfg, run: RunConfig, rank: int):
        loop = run.loop
        assert isinstance(loop, ActorLearnerLoopConfig)  # the actor-learner regime's loop config (ensure_loop)
        self.rank = rank
        self.seed = run.seed + 1_000_003 * (rank + 1)
        self.env = build_env(run, run.num_envs, self.seed, getattr(cfg, "gamma", 0.99))
        self.gen = torch.Generator().manual_seed(self.seed)
        self.policy = make_algorithm(algo_name, cfg, self.env.spec, torch.device("cpu"), self.gen)
        self.storage = RolloutStorage(loop.unroll, run.num_envs, self.env.spec, torch.device("cpu"))
        self.obs = self.env.reset(seed=self.seed)
        self.version = -1

    def set_weights(self, state: dict, version: int) -> None:
        self.policy.load_policy_state(state)
        self.version = version

    @torch.no_grad()
    def collect(self) -> Collected:
        T = self.storage.T
        returns, lengths = [], []
        for t in range(T):
            action, logp = self.policy.sample(self.obs)  # [N,A], [N]
            out = self.env.step(action)
            self.storage.add(t, self.obs, action, logp, out)
            done = out.info["episode_done"]
            if bool(done.any()):
                returns += out.info["episode_return"][done].tolist()
                lengths += out.info["episode_length"][done].tolist()
            self.obs = out.obs
        return Collected(clone_rollout(self.storage.rollout()), self.version, self.rank, returns, lengths)

    def state_dict(self) -> dict:
        return {"env": self.env.state_dict(), "obs": obs_map(lambda v: v.clone(), self.obs),
                "gen": self.gen.get_state(), "version": self.version, "policy": self.policy.policy_state()}

    def load_state_dict(self, state: dict) -> None:
        self.env.load_state_dict(state["env"])
        self.obs = state["obs"]
        self.gen.set_state(state["gen"])
        self.set_weights(state["policy"], state["version"])

    def close(self) -> None:
        self.env.close()


# ------------------------------------------------------------------------------------------------ backends
class InProcessBackend:
    def __init__(self, algo_name: str, cfg, run: RunConfig):
        loop = run.loop
        assert isinstance(loop, ActorLearnerLoopConfig)  # the actor-learner regime's loop config (ensure_loop)
        self.actors = [Actor(algo_name, cfg, run, k) for k in range(loop.actors)]
        self.next = 0
        self.lost: list[str] = []

    @property
    def alive(self) -> int:
        return len(self.actors)

    def broadcast(self, state: dict, version: int) -> None:
        for a in self.actors:
            a.set_weights(state, version)

    def segments(self, n: int) -> list[Collected]:
        out = []
        for _ in range(n):
            out.append(self.actors[self.next].collect())
            self.next = (self.next + 1) % len(self.actors)
        return out

    def state_dict(self) -> dict:
        return {"actors": [a.state_dict() for a in self.actors], "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        if len(state["actors"]) != len(self.actors):
            raise UserInputError(f"the checkpoint has {len(state['actors'])} actors and this run {len(self.actors)}: "
                                 "expected the same --actors to resume the in-process backend")
        for a, s in zip(self.actors, state["actors"]):
            a.load_state_dict(s)
        self.next = state["next"]

    def close(self) -> None:
        for a in self.actors:
            a.close()


def _pack(item: Collected) -> bytes:
    """A segment as bytes: sent through the pipe whole, so it stays readable after its sender died (tensors in
    a torch queue are handed over as shared-memory handles that the receiver fetches from the live sender)."""
    buf = io.BytesIO()
    torch.save(item, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Collected:
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker_main(rank: int, algo_name: str, cfg, run: RunConfig, shared: dict, version, lock, out_q, stop) -> None:
    """A worker process's loop: refresh weights when the version moved, collect, send; until ``stop``."""
    torch.set_num_threads(1)
    import ctrl_rl.algos  # noqa: F401  (registers the algorithms in the spawned interpreter)

    die_after = _fault_after(rank)
    actor = Actor(algo_name, cfg, run, rank)
    sent = 0
    try:
        while True:
            if die_after is not None and sent >= die_after:  # before the stop test: the crash always happens
                out_q.close()
                out_q.join_thread()  # the segments sent so far are delivered; then the crash
                os._exit(3)  # abrupt, as a segfault or an OOM kill would be
            if stop.is_set():
                break
            if version.value != actor.version:
                with lock:
                    v = version.value
                    state = {k: t.clone() for k, t in shared.items()}
                actor.set_weights(state, v)
            item = _pack(actor.collect())
            while not stop.is_set():
                try:
                    out_q.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue
            sent += 1
    finally:
        actor.close()


class _Unresumable:
    """A backend whose actors cannot be saved (other processes): a resume restarts them from the learner's weights
    with fresh episodes."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ProcessBackend(_Unresumable):
    def __init__(self, algo_name: str, cfg, run: RunConfig, weights: dict):
        import torch.multiprocessing as mp

        loop = run.loop
        assert isinstance(loop, ActorLearnerLoopConfig)  # the actor-learner regime's loop config (ensure_loop)
        ctx = mp.get_context("spawn")
        K = loop.actors
        self.shared = {k: v.detach().clone().cpu().share_memory_() for k, v in weights.items()}
        self.version = ctx.Value("q", -1)
        self.lock = ctx.Lock()
        self.queue = ctx.Queue(maxsize=2 * K)
        self.stop = ctx.Event()
        self.timeout = loop.actor_timeout
        self.procs = [ctx.Process(target=_worker_main, args=(k, algo_name, cfg, run, self.shared, self.version,
                                                              self.lock, self.queue, self.stop), daemon=True)
                      for k in range(K)]
        for p in self.procs:
            p.start()
        self.dead: set[int] = set()
        self.lost: list[str] = []

    @property
    def alive(self) -> int:
        return len(self.procs) - len(self.dead)

    def broadcast(self, state: dict, version: int) -> None:
        with self.lock:
            for k, t in state.items():
                self.shared[k].copy_(t)
            self.version.value = version

    def _check(self) -> None:
        self._report_exits()
        if self.alive == 0:
            raise ActorsLost(f"all {len(self.procs)} actors are gone ({'; '.join(self.lost)}); the last checkpoint "
                             "is kept")

    def _report_exits(self) -> None:
        for k, p in enumerate(self.procs):
            if k not in self.dead and not p.is_alive():
                self.dead.add(k)
                msg = f"actor {k} exited with code {p.exitcode}; going on with {self.alive} actor(s)"
                self.lost.append(msg)
                print(f"ctrl-rl: {msg}", file=sys.stderr, flush=True)

    def segments(self, n: int) -> list[Collected]:
        out, waited = [], 0.0
        while len(out) < n:
            try:
                out.append(_unpack(self.queue.get(timeout=1.0)))
                waited = 0.0
            except queue.Empty:
                waited += 1.0
                self._check()
                if waited >= self.timeout:
                    raise ActorsLost(f"no segment from any of the {self.alive} live actors in {self.timeout:.0f} s "
                                     "(--actor-timeout); the last checkpoint is kept") from None
        self._check()
        return out

    def close(self) -> None:
        self._report_exits()
        self.stop.set()
        try:  # drain so that workers blocked on a full queue can see the stop
            while True:
                self.queue.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass
        stop_processes(self.procs, timeout=10)
        for k, p in enumerate(self.procs):  # lost after the last update: reported, not silently joined
            if k not in self.dead and p.exitcode not in (0, None, -signal.SIGTERM):
                print(f"ctrl-rl: actor {k} exited with code {p.exitcode} before the run ended", file=sys.stderr,
                      flush=True)


class RayBackend(_Unresumable):
    def __init__(self, algo_name: str, cfg, run: RunConfig):
        loop = run.loop
        assert isinstance(loop, ActorLearnerLoopConfig)  # the actor-learner regime's loop config (ensure_loop)
        try:
            import ray
            from ray.exceptions import RayActorError, RayTaskError
        except ImportError:
            raise UserInputError("--backend ray needs the ray package: expected it installed "
                                 "(pip install 'ctrl-rl[ray]')") from None
        self.ray = ray
        self.actor_errors = (RayActorError, RayTaskError)
        if not ray.is_initialized():
            kw: dict[str, Any] = ({"address": loop.ray_address} if loop.ray_address
                                  else {"num_cpus": max(2, loop.actors)})
            # logging.ERROR: what ray makes of "ERROR" (its init is typed for the int level)
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, **kw)
        remote_actor = ray.remote(num_cpus=0.5)(_RayActor)
        self.actors = {k: remote_actor.remote(algo_name, cfg, run, k) for k in range(loop.actors)}
        self.pending: dict = {}
        self.timeout = loop.actor_timeout
        self.lost: list[str] = []
        self.weights_ref = None

    @property
    def alive(self) -> int:
        return len(self.actors)

    def broadcast(self, state: dict, version: int) -> None:
        self.weights_ref = self.ray.put(state)
        for _k, a in self.actors.items():
            a.set_weights.remote(self.weights_ref, version)

    def _drop(self, k: int, why: str) -> None:
        self.actors.pop(k, None)
        msg = f"actor {k} failed ({why}); going on with {len(self.actors)} actor(s)"
        self.lost.append(msg)
        print(f"ctrl-rl: {msg}", file=sys.stderr, flush=True)
        if not self.actors:
            raise ActorsLost(f"all actors are gone ({'; '.join(self.lost)}); the last checkpoint is kept")

    def segments(self, n: int) -> list[Collected]:
        ray = self.ray
        out = []
        while len(out) < n:
            for k, a in self.actors.items():
                if k not in self.pending.values():
                    self.pending[a.collect.remote()] = k
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=self.timeout)
            if not ready:
                raise ActorsLost(f"no segment from any of the {len(self.actors)} actors in {self.timeout:.0f} s "
                                 "(--actor-timeout); the last checkpoint is kept")
            ref = ready[0]
            k = self.pending.pop(ref)
            try:
                out.append(ray.get(ref))
            except self.actor_errors as e:
                self._drop(k, type(e).__name__)
        return out

    def close(self) -> None:
        for a in self.actors.values():
            # ray types a handle as ActorProxy (ActorHandle | type[_RayActor]), which its own kill() does not accept
            self.ray.kill(a)  # pyright: ignore[reportArgumentType]
        self.actors.clear()


class _RayActor:
    """The Ray actor: an ``Actor`` plus the fault-injection hook of the worker processes."""

    def __init__(self, algo_name: str, cfg, run: RunConfig, rank: int):
        torch.set_num_threads(1)
        import ctrl_rl.algos  # noqa: F401

        self.actor = Actor(algo_name, cfg, run, rank)
        self.die_after = _fault_after(rank)
        self.sent = 0

    def set_weights(self, state: dict, version: int) -> None:
        self.actor.set_weights(state, version)

    def collect(self) -> Collected:
        if self.die_after is not None and self.sent >= self.die_after:
            os._exit(3)
        self.sent += 1
        return self.actor.collect()


def make_backend(algo_name: str, cfg, run: RunConfig, weights: dict):
    loop = run.loop
    assert isinstance(loop, ActorLearnerLoopConfig)  # the actor-learner regime's loop config (ensure_loop)
    kind = loop.backend
    if kind == "inprocess":
        return InProcessBackend(algo_name, cfg, run)
    if kind == "process":
        return ProcessBackend(algo_name, cfg, run, weights)
    return RayBackend(algo_name, cfg, run)


# ------------------------------------------------------------------------------------------------ the loop
def train_actor_learner(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
                        max_iterations: int | None = None) -> TrainResult:
    """Train an actor-learner algorithm (module docstring); ``max_iterations`` stops after that many updates."""
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    with RunContext(algo_name, run, cfg, run_dir, resume) as ctx:
        gen = ctx.seed(run.seed)
        spec = probe_spec(run)
        algo = make_algorithm(algo_name, cfg, spec, ctx.device, gen)
        update, step, last_return, lag_over = 0, 0, float("nan"), 0
        if ctx.checkpoint is not None:
            load_state(algo, ctx.checkpoint["algo_state"], "networks", ctx.ck_dir / "latest.pt")
            c = ctx.counters
            update, step, last_return, lag_over = c["update"], c["step"], c["last_return"], c.get("lag_over", 0)
        backend = make_backend(algo_name, cfg, run, algo.policy_state())
        try:
            if ctx.checkpoint is not None and ctx.checkpoint.get("actors"):
                backend.load_state_dict(ctx.checkpoint["actors"])
                ctx.restore_rng()
            else:
                backend.broadcast(algo.policy_state(), update)
                if ctx.checkpoint is not None:
                    ctx.restore_rng()
            return _run(ctx, run, algo, backend, update, step, last_return, lag_over, max_iterations)
        finally:
            backend.close()


def _run(ctx: RunContext, run: RunConfig, algo: ActorLearnerAlgorithm, backend, update: int, step: int,
         last_return: float, lag_over: int, max_iterations: int | None) -> TrainResult:
    loop = run.loop
    assert isinstance(loop, ActorLearnerLoopConfig)  # train_actor_learner ran ensure_loop
    per_update = loop.segments_per_update * loop.unroll * run.num_envs
    updates = math.ceil(run.total_steps / per_update)
    ctx.start(updates * per_update, step, f"{ctx.algo_name} {run.env} ({loop.backend}, {loop.actors} actors)")
    rets: list[float] = []
    lens: list[int] = []
    lags: list[int] = []
    warned = False
    t_log, step_log, done_now = time.time(), step, 0

    def checkpoint() -> None:
        ctx.save({"algo_state": algo.state_dict(), "actors": backend.state_dict()},
                 {"update": update, "step": step, "last_return": last_return, "lag_over": lag_over})

    while update < updates and (max_iterations is None or done_now < max_iterations):
        got = backend.segments(loop.segments_per_update)
        batch = cat_segments([g.segment for g in got])
        dev = lambda x: x.to(ctx.device)  # noqa: E731
        batch = Rollout(obs_to(batch.obs, ctx.device), dev(batch.action), dev(batch.logp), dev(batch.reward),
                        dev(batch.terminated), dev(batch.truncated), obs_to(batch.final_obs, ctx.device))
        lag = [update - g.version for g in got]
        lags += lag
        over = sum(x > loop.max_policy_lag for x in lag)
        if over:
            lag_over += over
            if not warned:
                warned = True
                print(f"ctrl-rl: policy lag {max(lag)} updates exceeds --max-policy-lag {loop.max_policy_lag} "
                      f"at update {update} (counted in actors/lag_over; the segments are still used)",
                      file=sys.stderr, flush=True)
        for g in got:
            rets += g.returns
            lens += g.lengths
        info = ctx.floats(algo.update(batch))
        update += 1
        done_now += 1
        step += per_update
        ctx.check_finite(info, algo, f"step {step} (update {update})")
        if update % loop.broadcast_every == 0:
            backend.broadcast(algo.policy_state(), update)
        postfix = None
        if update % run.log_every == 0 or update == updates:
            if rets:
                last_return = sum(rets) / len(rets)
            now = time.time()
            sps = (step - step_log) / max(now - t_log, 1e-9)
            t_log, step_log = now, step
            ctx.log({"step": step, "wall_time": round(ctx.wall_time(), 3), "update": update,
                     "episode_return": (sum(rets) / len(rets)) if rets else None,
                     "episode_length": (sum(lens) / len(lens)) if lens else None, "episodes": len(rets),
                     "sps": round(sps, 1), "actors/alive": backend.alive, "actors/lag_mean": sum(lags) / len(lags),
                     "actors/lag_max": max(lags), "actors/lag_over": lag_over, **info})
            rets, lens, lags = [], [], []
            postfix = f"sps={sps:,.0f} return={'-' if math.isnan(last_return) else f'{last_return:.1f}'}"
        ctx.advance(per_update, postfix)
        if update % run.checkpoint_every == 0 or update == updates:
            checkpoint()
    if done_now and update % run.checkpoint_every != 0 and update != updates:
        checkpoint()
    return TrainResult(ctx.run_dir, step, update, last_return, ctx.wall_time(), algo)


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_actor_learner(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "actor-learner", ActorLearnerLoopConfig, _train,
    summary="actors (in-process, processes, Ray) -> segments with behaviour log-probs -> update(segments)"))
