"""The VLA fine-tuning loop: demonstrations (LeRobot layout) -> ``update``, and for RL envs stepped one action
chunk at a time; evaluated in ``--env`` by success rate.

One step is one update for every method (``--total-steps`` counts updates; RL's metrics add ``env_steps``):

- ``bc`` / ``habc``: a batch of ``--batch-size`` demonstration frames (with their chunks, outcomes and critic
  states, ``vla.data.load_demos``) -> ``update``;
- ``rl``: ``--rollout-chunks`` chunks in each of ``--num-envs`` envs (``ChunkCollector``) -> GAE over chunks (or,
  with ``--advantage group``, episode returns against their group's mean: the training env then gets
  ``group_size=G`` so each block of G envs replays the same episodes, and a rollout must hold whole episodes) ->
  ``update`` with the rollout and a demonstration batch for the SFT anchor. ``--init RUN`` starts from another VLA
  run's policy (a BC run); the demonstrations' action statistics are then the initial run's. With
  ``--sil-coef`` the chunks of the noisy policy's own successful episodes (whole episodes inside one rollout) go
  to a ``SuccessBuffer``, and a batch of them joins every PPO minibatch (self-imitation).

A ``manip:`` env id without ``cameras=``, ``image_size=`` or ``language=`` gets the loop's ``--cameras``,
``--image-size`` and ``language=true`` (the resolved id is saved, so evaluation and export see the same
observation). Inside a chunk an episode may end: the rest of that chunk's actions then step the env's next
episode (the batched env resets itself) and their rewards are not counted; the next chunk starts from whatever
observation that left. Truncation is bootstrapped from the final observation's value inside the chunk reward.
The env state is not checkpointed: an RL run resumes its weights, optimizer and counters, and resets its envs
(and empties its self-imitation buffer).
"""

from __future__ import annotations

import dataclasses
import sys
from collections import deque
from pathlib import Path

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.returns import successful_episode_steps
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import RunConfig, VLALoopConfig, ensure_loop
from ctrl_rl.learn.evaluate import find_checkpoint
from ctrl_rl.learn.offline import env_spec, run_updates
from ctrl_rl.learn.regimes import Regime, register_regime
from ctrl_rl.learn.runtime import RunContext, TrainResult, build_env, load_state
from ctrl_rl.vla.data import load_demos


def complete_env_id(env: str, cameras: str, image_size: str) -> str:
    """A ``manip:`` id with the cameras, image size and instruction a VLA needs added where the id has none."""
    if not env.startswith("manip:"):
        return env
    have = {kv.split("=", 1)[0] for kv in env.split(",")[1:]}
    extra = [f"{k}={v}" for k, v in (("cameras", cameras), ("image_size", image_size), ("language", "true"))
             if k not in have]
    return ",".join([env, *extra])


def grouped_env_id(env: str, group_size: int, execute: int, rollout_chunks: int, episode_steps: int | None) -> str:
    """The training env's id for group-relative advantages: ``group_size`` envs per block replay the same episodes
    (the env refuses a number of envs the group size does not divide), and a rollout holds whole episodes. Raises
    ``UserInputError`` naming the setting that prevents it."""
    if not env.startswith("manip:"):
        raise UserInputError(f"--advantage group needs envs that replay an episode per group: expected a manip: env, "
                             f"got {env!r}")
    if not episode_steps or episode_steps % execute or (rollout_chunks * execute) % episode_steps:
        raise UserInputError(f"--advantage group needs rollouts of whole episodes: expected the episode length "
                             f"({episode_steps} steps) a multiple of the {execute} steps executed per chunk and "
                             f"--rollout-chunks x {execute} a multiple of the episode length, got --rollout-chunks "
                             f"{rollout_chunks}")
    return f"{env},group_size={group_size}"


class ChunkCollector:
    """Steps ``env`` with the agent's chunks; ``collect()`` returns a rollout of ``T`` chunks per env. ``stats()``
    reports the mean return and success of the last ``RECENT`` finished episodes (the noisy training policy)."""

    RECENT = 32

    def __init__(self, env, algo, chunks: int, seed: int):
        self.env, self.algo, self.T = env, algo, chunks
        self.obs = env.reset(seed=seed)
        self.fresh = torch.ones(env.num_envs, dtype=torch.bool, device=_state(self.obs).device)  # [N] episode begins
        self.env_steps = 0
        self.returns: deque[float] = deque(maxlen=self.RECENT)
        self.successes: deque[float] = deque(maxlen=self.RECENT)

    @torch.no_grad()
    def collect(self) -> dict:
        algo, env = self.algo, self.env
        N, E, g = env.num_envs, algo.execute, algo.config.rl_gamma
        obs_l, stored_l, logp_l, value_l, reward_l, raw_l, ended_l, won_l, act_l = [], [], [], [], [], [], [], [], []
        for _ in range(self.T):
            x, stored, logp, value = algo.sample_chunk(self.obs)  # [N,H,A], -, [N], [N]
            actions = algo.to_actions(x)  # [N,H,A]
            obs_l.append(self.obs)
            act_l.append(actions)
            stored_l.append(stored)
            logp_l.append(logp)
            value_l.append(value)
            R = torch.zeros(N, device=value.device)  # [N]
            raw = torch.zeros(N, device=value.device)  # [N] undiscounted, no bootstrap
            disc = torch.ones(N, device=value.device)  # [N]
            alive = torch.ones(N, dtype=torch.bool, device=value.device)  # [N]
            won = torch.zeros(N, dtype=torch.bool, device=value.device)  # [N] the episode ended here successfully
            for h in range(E):
                out = env.step(actions[:, h])
                r, term, trunc = out.reward.float(), out.terminated, out.truncated
                R += torch.where(alive, disc * r, torch.zeros_like(r))
                raw += torch.where(alive, r, torch.zeros_like(r))
                cut = alive & trunc & ~term  # time limit: bootstrap from the final observation's value
                if bool(cut.any()):
                    R += torch.where(cut, disc * g * algo.state_value(_state(out.final_obs)), torch.zeros_like(r))
                disc = disc * g
                if "episode_success" in out.info:
                    won |= alive & out.info["episode_success"].to(won.device)
                alive = alive & ~(term | trunc)
                self._episodes(out)
                self.obs = out.obs
            self.env_steps += N * E
            reward_l.append(R)
            raw_l.append(raw)
            ended_l.append(~alive)
            won_l.append(won)
        last_value = algo.state_value(_state(self.obs))
        ro = {"obs": {k: torch.cat([o[k] for o in obs_l]) for k in obs_l[0]}, "stored": _cat(stored_l),
              "log_prob": torch.cat(logp_l), "value": torch.stack(value_l), "reward": torch.stack(reward_l),
              "raw_reward": torch.stack(raw_l), "ended": torch.stack(ended_l), "actions": torch.cat(act_l),
              "succeeded": successful_episode_steps(torch.stack(ended_l), torch.stack(won_l), self.fresh).flatten()}
        self.fresh = ro["ended"][-1].clone()
        algo.advantages(ro, last_value)
        return ro

    def _episodes(self, out) -> None:
        info = out.info
        if "episode_done" not in info:
            return
        d = info["episode_done"].cpu()
        if bool(d.any()):
            self.returns.extend(info["episode_return"].cpu()[d].float().tolist())
            if "episode_success" in info:
                self.successes.extend(info["episode_success"].cpu()[d].float().tolist())

    def stats(self) -> dict:
        out = {"env_steps": self.env_steps}
        if self.returns:
            out["episode_return"] = sum(self.returns) / len(self.returns)
        if self.successes:
            out["success_rate"] = sum(self.successes) / len(self.successes)
        return out


def _state(obs) -> torch.Tensor:
    return obs["state"] if isinstance(obs, dict) else obs


def _cat(items: list):
    return torch.cat(items) if isinstance(items[0], torch.Tensor) else None


class SuccessBuffer:
    """The chunks of the policy's own successful episodes (observation and executed env-unit chunk), a FIFO of
    ``capacity`` rows for self-imitation; ``sample(n)`` draws a batch with the agent's generator (None while empty)."""

    def __init__(self, capacity: int, gen: torch.Generator):
        self.capacity, self.gen = capacity, gen
        self.obs: dict[str, torch.Tensor] | None = None
        self.chunk: torch.Tensor | None = None  # [R,H,A]
        self.added = 0

    def __len__(self) -> int:
        return 0 if self.chunk is None else self.chunk.shape[0]

    def add(self, ro: dict) -> None:
        keep = ro["succeeded"]  # [S]
        if not bool(keep.any()):
            return
        obs = {k: v[keep] for k, v in ro["obs"].items()}
        chunk = ro["actions"][keep]
        self.added += int(keep.sum())
        if self.chunk is not None:
            obs = {k: torch.cat([self.obs[k], v]) for k, v in obs.items()}
            chunk = torch.cat([self.chunk, chunk])
        self.obs = {k: v[-self.capacity:] for k, v in obs.items()}
        self.chunk = chunk[-self.capacity:]

    def sample(self, n: int) -> dict | None:
        if self.chunk is None:
            return None
        rows = torch.randint(0, len(self), (n,), generator=self.gen, device=self.gen.device).to(self.chunk.device)
        return {"obs": {k: v[rows] for k, v in self.obs.items()}, "chunk": self.chunk[rows]}


class _Sampler:
    """Random demonstration batches on the device, drawn with the agent's generator."""

    def __init__(self, demos, device, gen):
        self.demos, self.device, self.gen = demos, device, gen

    def __call__(self, n: int) -> dict:
        rows = torch.randint(0, self.demos.num_frames, (n,), generator=self.gen, device=self.gen.device).cpu()
        b = self.demos.batch(rows)
        out = {k: (v.to(self.device) if isinstance(v, torch.Tensor) else {i: t.to(self.device) for i, t in v.items()})
               for k, v in b.items()}
        out["instructions"] = self.demos.instructions
        return out


def train_vla(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool = False,
              max_iterations: int | None = None) -> TrainResult:
    entry = registry.get(algo_name)
    run = ensure_loop(entry, run)
    loop = run.loop
    if run.dataset is None:
        raise UserInputError(f"`ctrl-rl train {algo_name}` needs --dataset DIR: expected demonstrations in the LeRobot "
                             "layout (ctrl-rl data generate --env manip:Lift --level scripted --format lerobot)")
    run = dataclasses.replace(run, env=complete_env_id(run.env, loop.cameras, loop.image_size))
    unused = cfg.unused_flags()
    if unused and not resume:
        print(f"ctrl-rl: note: --method {cfg.method} does not use {', '.join(unused)}; they are recorded in the run's "
              "config but change nothing", file=sys.stderr)
    with RunContext(algo_name, run, cfg, run_dir, resume, single_thread=True) as ctx:
        spec = env_spec(run, algo_name, True)
        action_space = spec.action_space_name or ""  # the robot's action space the env's actions are (EnvSpec)
        gen = ctx.seed(run.seed)
        algo = entry.make(cfg, spec, ctx.device, gen)
        demos = load_demos(run.dataset, algo.cameras, algo.image_hw, cfg.chunk, spec.action_dim, action_space,
                           loop.action_key, state_key=loop.state_key)
        if demos.proprio.shape[1] != len(algo.columns):
            raise UserInputError(f"the dataset's proprioception {loop.state_key!r} has {demos.proprio.shape[1]} "
                                 f"dims but --proprio-columns {cfg.proprio_columns} picks {len(algo.columns)} "
                                 "columns of the env's state: expected the same width")
        step, last_return = 0, float("nan")
        if ctx.checkpoint is not None:
            load_state(algo, ctx.checkpoint["algo_state"], "networks", ctx.ck_dir / "latest.pt")
            ctx.restore_rng()
            step, last_return = ctx.counters["step"], ctx.counters["last_return"]
        elif loop.init is not None:
            ck_path = find_checkpoint(loop.init)
            ck = load_checkpoint(ck_path)
            if ck.get("algo") != algo_name:
                raise UserInputError(f"--init {loop.init!r} holds a {ck.get('algo')!r} run: expected a {algo_name} run")
            load_state(algo.policy, ck["algo_state"]["policy"], "the initial policy", ck_path)
            algo.reset_exploration()  # imitation never trains the RL noise: it starts at this run's --init-log-std
        else:
            algo.set_statistics(demos.proprio, demos.action)
        sample = _Sampler(demos, ctx.device, gen)
        collector = own = None
        if cfg.method == "rl":
            env_run = run
            if cfg.advantage == "group":
                env_run = dataclasses.replace(run, env=grouped_env_id(
                    run.env, cfg.group_size, algo.execute, loop.rollout_chunks, spec.max_episode_steps))
            env = build_env(env_run, run.num_envs, run.seed)
            collector = ChunkCollector(env, algo, loop.rollout_chunks, run.seed)
            own = SuccessBuffer(cfg.sil_capacity, gen) if cfg.sil_coef > 0 else None
        static = {"stats/trainable_fraction": torch.tensor(algo.trainable_fraction()),
                  "stats/demo_frames": torch.tensor(float(demos.num_frames))}
        ctx.start(run.total_steps, step, f"{algo_name} {cfg.method} {Path(run.dataset).name}", unit="upd")

        def update() -> dict:
            if collector is None:
                return {**algo.update(sample(loop.batch_size)), **static}
            ro = collector.collect()
            demo = sample(loop.batch_size)
            batch = {"rollout": ro, "demos": demo, "instructions": demos.instructions}
            counts = collector.stats()
            if own is not None:
                own.add(ro)
                batch["own"], batch["sample_demos"] = own.sample, sample
                counts["stats/self_imitation_added"] = own.added  # chunks ever added (the FIFO drops the oldest)
                counts["stats/self_imitation_held"] = len(own)
            info = algo.update(batch)
            return {**info, **static, **{k: torch.tensor(float(v)) for k, v in counts.items()}}

        try:
            return run_updates(ctx, algo, update, step, last_return, {}, max_iterations)
        finally:
            if collector is not None:
                collector.env.close()


def _train(run: RunConfig, algo_name: str, cfg, run_dir: Path, resume: bool, max_iterations: int | None,
           dist_info) -> TrainResult:
    return train_vla(run, algo_name, cfg, run_dir, resume, max_iterations)


register_regime(Regime(
    "vla-finetuning", VLALoopConfig, _train,
    summary="LeRobot demonstrations (and chunk rollouts in a simulator) -> update of a VLA model"))
