"""Chunk rollouts: what an algorithm trained on action chunks in a simulator offers (``ChunkLearner``), the
collector that steps envs one chunk at a time, and the buffer of the policy's own successful chunks.

``ChunkCollector.collect()`` returns a rollout of ``T`` chunks per env (rows S = T*N, time-major):

- ``obs`` (each part ``[S,...]``), ``stored`` (what the chunk's likelihood needs, or None), ``log_prob [S]``,
  ``actions [S,H,A]`` (env units, as executed);
- ``value [T,N]`` (``V(state)`` when the chunk was planned) and ``last_value [N]`` (after the last chunk);
- ``reward [T,N]``: the discounted sum of the chunk's rewards inside its episode, ``sum_h discount^h r_h``, plus
  ``discount^(h+1) V(final state)`` where the episode hit its time limit inside the chunk (truncation bootstraps,
  termination does not);
- ``raw_reward [T,N]``: the undiscounted sum inside the episode, no bootstrap (group-relative returns);
- ``ended [T,N]``: the episode ended inside the chunk; ``succeeded [S]``: the chunk belongs to an episode that
  began and ended successfully inside this rollout.

Inside a chunk an episode may end: the rest of that chunk's actions then step the env's next episode (the
batched env resets itself) and their rewards are not counted; the next chunk starts from whatever observation
that left. Advantages are the algorithm's (``update``), as PPO's GAE is.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol, runtime_checkable

import torch

from ctrl_rl.core.protocols import Algorithm
from ctrl_rl.core.returns import successful_episode_steps


@runtime_checkable
class ChunkLearner(Algorithm, Protocol):
    """An algorithm (``core.protocols.Algorithm``) with what the chunk-rollouts loop needs beyond it."""

    @property
    def execute(self) -> int:
        """Env steps each chunk is played for before the next is planned."""
        ...

    @property
    def discount(self) -> float:
        """Discount per env step (inside a chunk; ``discount ** execute`` between chunks)."""
        ...

    @property
    def episode_groups(self) -> int | None:
        """Envs per block that must replay the same episodes (group-relative advantages), or None."""
        ...

    @property
    def success_capacity(self) -> int | None:
        """Chunks of the policy's own successful episodes to keep for self-imitation, or None (none kept)."""
        ...

    def batches_per_update(self) -> dict[str, int]:
        """Batches of the loop's batch size each update reads beside the rollout: ``demos`` (demonstrations) and
        ``own`` (the policy's own successful chunks; 0: none)."""
        ...

    def sample_chunk(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """A normalised chunk ``[N,H,A]``, what its likelihood needs, its log-probability ``[N]`` and ``V [N]``."""
        ...

    def to_actions(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised chunk -> env actions ``[N,H,A]``."""
        ...

    def state_value(self, state: torch.Tensor) -> torch.Tensor:
        """``V(state)`` ``[N]`` of the env's full state part ``[N,O]``."""
        ...


def _state(obs) -> torch.Tensor:
    return obs["state"] if isinstance(obs, dict) else obs


def _cat(items: list):
    return torch.cat(items) if isinstance(items[0], torch.Tensor) else None


class ChunkCollector:
    """Steps ``env`` with the learner's chunks; ``collect()`` returns a rollout of ``chunks`` chunks per env (module
    docstring). ``stats()`` reports env steps and the mean return and success of the last ``RECENT`` finished
    episodes (the sampling policy's)."""

    RECENT = 32

    def __init__(self, env, learner: ChunkLearner, chunks: int, seed: int):
        self.env, self.learner, self.T = env, learner, chunks
        self.obs = env.reset(seed=seed)
        self.fresh = torch.ones(env.num_envs, dtype=torch.bool, device=_state(self.obs).device)  # [N] episode begins
        self.env_steps = 0
        self.returns: deque[float] = deque(maxlen=self.RECENT)
        self.successes: deque[float] = deque(maxlen=self.RECENT)

    @torch.no_grad()
    def collect(self) -> dict:
        learner, env = self.learner, self.env
        N, E, g = env.num_envs, learner.execute, learner.discount
        obs_l, stored_l, logp_l, value_l, reward_l, raw_l, ended_l, won_l, act_l = [], [], [], [], [], [], [], [], []
        for _ in range(self.T):
            x, stored, logp, value = learner.sample_chunk(self.obs)  # [N,H,A], -, [N], [N]
            actions = learner.to_actions(x)  # [N,H,A]
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
                    R += torch.where(cut, disc * g * learner.state_value(_state(out.final_obs)), torch.zeros_like(r))
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
        ended = torch.stack(ended_l)  # [T,N]
        ro = {"obs": {k: torch.cat([o[k] for o in obs_l]) for k in obs_l[0]}, "stored": _cat(stored_l),
              "log_prob": torch.cat(logp_l), "value": torch.stack(value_l), "reward": torch.stack(reward_l),
              "raw_reward": torch.stack(raw_l), "ended": ended, "actions": torch.cat(act_l),
              "last_value": learner.state_value(_state(self.obs)),
              "succeeded": successful_episode_steps(ended, torch.stack(won_l), self.fresh).flatten()}
        self.fresh = ended[-1].clone()
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
        out: dict[str, float] = {"env_steps": self.env_steps}
        if self.returns:
            out["episode_return"] = sum(self.returns) / len(self.returns)
        if self.successes:
            out["success_rate"] = sum(self.successes) / len(self.successes)
        return out


class SuccessBuffer:
    """The chunks of the policy's own successful episodes (observation and executed env-unit chunk), a FIFO of
    ``capacity`` rows for self-imitation; ``sample(n)`` draws a batch with ``gen`` (None while empty)."""

    def __init__(self, capacity: int, gen: torch.Generator):
        self.capacity, self.gen = capacity, gen
        self.obs: dict[str, torch.Tensor] = {}
        self.chunk: torch.Tensor | None = None  # [R,H,A]
        self.added = 0

    def __len__(self) -> int:
        return 0 if self.chunk is None else self.chunk.shape[0]

    def add(self, ro: dict) -> None:
        keep = ro["succeeded"]  # [S]
        if not bool(keep.any()):
            return
        obs = {k: v[keep] for k, v in ro["obs"].items()}
        chunk = ro["actions"][keep]  # [s,H,A]
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
        return {"obs": {k: v[rows] for k, v in self.obs.items()}, "chunk": self.chunk[rows]}  # [n,...], [n,H,A]
