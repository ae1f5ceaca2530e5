"""NeuBay's collector: imagined continuations of real histories under one posterior sample of the model.

Paper: Ni et al. 2025, "Long-Horizon Model-Based Offline RL Without Conservatism"
(docs/algorithms/neubay.md#imagined-continuations;
code twni2016/neubay, ``experience/collector.py`` and ``experience/world_buffer.py``).

Shape letters: S dataset rows, K trajectories, P parallel rollouts, H imagined steps, W warm-up rows,
O obs dim, A action dim, I = O + A + 1 agent input dim.

The agent reads histories: its input at step t is ``x_t = concat(obs_t, a_{t-1}, r_{t-1})`` with zeros at the
first step of an episode (``agent_inputs``, ``prefix_inputs``). One ``HistoryCollector.collect(agent)``:

1. draws P histories: a trajectory and a time t, uniformly over every (trajectory, t) with
   ``t = 0 .. L`` (L its length; the paper's ``start_from_s0=False``); the history is the trajectory's first
   t transitions, and ``t = L`` is the whole trajectory (nothing is imagined after it);
2. runs the agent's recurrent actor over each prefix ``x_0 .. x_t`` (``agent.warm_up``) for its hidden state,
   and samples the first action from it;
3. steps a ``ModelEnv`` in episode member mode: each rollout gets ONE elite for its whole length (the
   posterior sample, docs/algorithms/neubay.md); next state and reward are sampled from that member's Gaussian; no
   reward penalty (docs/algorithms/neubay.md); ``terminated`` from the task's termination function; ``truncated`` at
   the first
   step whose epistemic uncertainty exceeds ``u_max`` or when the time counted from the trajectory's start
   (t + imagined steps) reaches ``horizon``. A rollout stops at its first terminated or truncated step; all
   rollouts move in lock step until every one has stopped (one host sync per step);
4. returns one tape per rollout (``storage.tapes.TapeBatch``): the history's real rows (``real=True``)
   followed by the imagined rows (``real=False``).

``u_max`` is ``uncertainty_threshold``: the ``q``-quantile of the epistemic figure over every (obs, action)
row of the offline data (default q = 1: the maximum), computed once in chunks.

Real rows: the dataset's stored ``next_observations`` are used (not the following row, docs/algorithms/neubay.md); a
trajectory
is cut to ``horizon`` rows and its last row counts as truncated unless it terminated (the paper's
``get_history_dataset``); a row without a known next observation is dropped unless it terminated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.offline import OfflineDataset
from ctrl_rl.storage.tapes import TapeBatch
from ctrl_rl.world_models.model_env import ModelEnv, TerminationFn
from ctrl_rl.world_models.protocol import DynamicsModel

WARMUP_CHUNK = 65_536  # rows of history run through the actor's encoder at once


def agent_inputs(obs: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor) -> torch.Tensor:
    """``x = concat(obs [N,O], prev_action [N,A], prev_reward [N]) -> [N,I]``."""
    return torch.cat([obs, prev_action, prev_reward.unsqueeze(-1)], -1)


def prefix_inputs(obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Inputs ``[T,I]`` of consecutive rows: row t gets the previous row's action and reward, zeros where ``first``."""
    keep = (~first).unsqueeze(-1).to(obs.dtype)  # [T,1]
    prev_a = torch.cat([torch.zeros_like(action[:1]), action[:-1]]) * keep  # [T,A]
    prev_r = torch.cat([torch.zeros_like(reward[:1]), reward[:-1]]) * keep.squeeze(-1)  # [T]
    return agent_inputs(obs, prev_a, prev_r)


@runtime_checkable
class HistoryAgent(Protocol):
    """What the collector needs of a recurrent agent (``algos.neubay.NeuBay`` has it; the model-based loop's tapes
    collector checks it with ``isinstance``)."""

    def warm_up(self, inputs: torch.Tensor, start: torch.Tensor,
                last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor encoder over the concatenated prefixes ``inputs [W,I]`` (``start [W]`` marks where each begins)
        -> ``(hidden [P,...], features [P,F])`` at the rows ``last [P]`` (each prefix's final row)."""
        ...

    def advance(self, inputs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One recurrent step: ``inputs [P,I]``, ``hidden [P,...]`` -> ``(hidden, features [P,F])``."""
        ...

    def sample_action(self, features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A stochastic action ``[P,A]`` in [-1, 1] from features ``[P,F]``."""
        ...


@dataclass
class Trajectories:
    """Whole offline trajectories on the training device; trajectory k is rows ``offsets[k]:offsets[k+1]``."""

    obs: torch.Tensor  # [S,O]
    action: torch.Tensor  # [S,A]
    reward: torch.Tensor  # [S]
    next_obs: torch.Tensor  # [S,O]
    terminated: torch.Tensor  # [S] bool
    truncated: torch.Tensor  # [S] bool; the last row of a trajectory is terminated or truncated
    offsets: torch.Tensor  # [K+1] int64
    lengths: torch.Tensor  # [K] int64, each >= 1

    @property
    def num_rows(self) -> int:
        return self.reward.shape[0]


def trajectories_from_dataset(ds: OfflineDataset, horizon: int, device: torch.device | str) -> Trajectories:
    """The dataset's episodes (a trajectory view) as NeuBay's history source (module docstring: what is cut)."""
    if not isinstance(ds.obs, torch.Tensor) or not isinstance(ds.next_obs, torch.Tensor) or ds.action.dim() != 2:
        raise UserInputError(f"dataset {ds.metadata.get('source', '?')} has observation parts or discrete actions: "
                             "expected flat float observations and continuous actions for history rollouts")
    S = len(ds)
    ep = ds.episode_ids()  # [S]
    pos = torch.arange(S) - ds.episode_offsets[:-1][ep]  # [S] step inside its episode
    keep = (ds.next_obs_valid | ds.terminated) & (pos < horizon)  # [S]
    rows = keep.nonzero().squeeze(1)  # [S']
    counts = torch.bincount(ep[rows], minlength=ds.num_episodes)  # [K0]
    lengths = counts[counts > 0]  # [K]
    if rows.numel() == 0:
        raise UserInputError(f"dataset {ds.metadata.get('source', '?')} has no usable transitions: expected whole "
                             "trajectories with their next observations")
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])  # [K+1]
    terminated = ds.terminated[rows].clone()
    truncated = ds.truncated[rows].clone()
    last = offsets[1:] - 1  # [K]
    truncated[last] = ~terminated[last]  # every trajectory ends terminated or truncated
    dev = torch.device(device)
    f32 = lambda x: x.to(dev, torch.float32)  # noqa: E731
    return Trajectories(f32(ds.obs[rows]), f32(ds.action[rows]), f32(ds.reward[rows]), f32(ds.next_obs[rows]),
                        terminated.to(dev), truncated.to(dev), offsets.to(dev), lengths.to(dev))


@torch.no_grad()
def uncertainty_threshold(model: DynamicsModel, obs: torch.Tensor, action: torch.Tensor, quantile: float,
                          chunk: int = WARMUP_CHUNK) -> tuple[float, dict[str, float]]:
    """``u_max``: the ``quantile`` (1.0 = max) of the epistemic figure over the rows ``obs [S,O]``, ``action [S,A]``,
    in chunks of ``chunk`` rows, and summary figures of its distribution (to log)."""
    if not 0.0 <= quantile <= 1.0:
        raise UserInputError(f"invalid uncertainty quantile {quantile!r}: expected a fraction in [0, 1]")
    member = model.elites[:1].to(obs.device)  # [1]: the figure is over the elites, whichever member predicts
    parts = []
    for s in range(0, obs.shape[0], chunk):
        o, a = obs[s:s + chunk], action[s:s + chunk]  # [C,O], [C,A]
        step = model.predict(o, a, member.expand(o.shape[0]), sample=False)
        parts.append(step.uncertainty["epistemic"].float())  # [C]
    u = torch.cat(parts)  # [S]
    if not bool(torch.isfinite(u).all()):
        raise UserInputError("the dynamics model's epistemic uncertainty is NaN/inf on the offline data: expected a "
                             "finite model (check its fit)")
    srt = u.sort().values  # [S]
    pos = quantile * (srt.numel() - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    u_max = float(srt[lo] + (srt[hi] - srt[lo]) * (pos - lo))  # linear interpolation (torch.quantile's rule)
    stats = {"data_epistemic_mean": float(u.mean()), "data_epistemic_median": float(srt[(srt.numel() - 1) // 2]),
             "data_epistemic_max": float(srt[-1])}
    return u_max, stats


class HistoryCollector:
    """One collection = P history-conditioned rollouts in the model (module docstring).

    Args:
        model: the dynamics ensemble (``protocol.DynamicsModel``); its elites are the posterior samples.
        data: the offline trajectories (``trajectories_from_dataset``).
        termination_fn: the task's ``(obs, act, next_obs) -> [P] bool``; None uses the model's termination head.
        horizon: the env's time limit, counted from each trajectory's start.
        u_max: truncate at the first step whose epistemic uncertainty exceeds it (None: never).
        parallel: P rollouts per collection (NeuBay 100).
        base_env_id: the real env's id (names the model env in messages).
        seed: seed of the collector's generator (histories, members, model noise, actions).
    """

    def __init__(self, model: DynamicsModel, data: Trajectories, termination_fn: TerminationFn | None, horizon: int,
                 u_max: float | None, parallel: int, base_env_id: str, seed: int = 0):
        if not isinstance(horizon, int) or horizon < 1 or not isinstance(parallel, int) or parallel < 1:
            raise UserInputError(f"history collector horizon {horizon!r} and parallel rollouts {parallel!r} are "
                                 "invalid: "
                                 "expected positive integers")
        self.model, self.data, self.termination_fn = model, data, termination_fn
        self.horizon, self.u_max, self.parallel, self.base_env_id = horizon, u_max, parallel, base_env_id
        self.device = data.obs.device
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(int(seed))
        self.cum = (data.lengths + 1).cumsum(0)  # [K] every trajectory offers t = 0 .. L

    def sample_histories(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(trajectory [n], t [n])`` uniformly over every (trajectory, t in 0..L)."""
        g = torch.randint(int(self.cum[-1]), (n,), generator=self.gen, device=self.device)  # [n]
        k = torch.searchsorted(self.cum, g, right=True)  # [n]
        t = g - (self.cum[k] - (self.data.lengths[k] + 1))  # [n]
        return k, t

    def _warm_up(self, agent: HistoryAgent, k: torch.Tensor, t: torch.Tensor):
        """Prefix inputs x_0..x_t of every history through the actor; returns (hidden, features, obs_t [P,O])."""
        d = self.data
        n = t + 1  # [P] inputs per prefix
        P = n.shape[0]
        p_of = torch.repeat_interleave(torch.arange(P, device=self.device), n)  # [W]
        j = torch.arange(p_of.shape[0], device=self.device) - (n.cumsum(0) - n)[p_of]  # [W] step in its prefix
        row = d.offsets[k][p_of] + j  # [W] dataset row of step j
        at_end = j == d.lengths[k][p_of]  # [W] t = L: the state after the last transition
        prev = (row - 1).clamp(min=0)  # [W]
        obs = torch.where(at_end.unsqueeze(1), d.next_obs[prev], d.obs[row.clamp(max=d.num_rows - 1)])  # [W,O]
        start = j == 0  # [W]
        keep = (~start).to(obs.dtype)  # [W]
        x = agent_inputs(obs, d.action[prev] * keep.unsqueeze(1), d.reward[prev] * keep)  # [W,I]
        last = n.cumsum(0) - 1  # [P]
        hidden, feats = [], []
        sizes, lo, r0 = n.tolist(), 0, 0
        while lo < P:  # whole prefixes per chunk of at most WARMUP_CHUNK rows (or one longer prefix)
            hi, r1 = lo + 1, r0 + sizes[lo]
            while hi < P and r1 + sizes[hi] - r0 <= WARMUP_CHUNK:
                r1 += sizes[hi]
                hi += 1
            h, f = agent.warm_up(x[r0:r1], start[r0:r1], last[lo:hi] - r0)
            hidden.append(h)
            feats.append(f)
            lo, r0 = hi, r1
        return torch.cat(hidden), torch.cat(feats), obs[last]

    @torch.no_grad()
    def collect(self, agent: HistoryAgent) -> tuple[TapeBatch, dict[str, float]]:
        """P tapes (history + imagined continuation) and the collection's statistics (plain floats)."""
        d, P, dev = self.data, self.parallel, self.device
        k, t = self.sample_histories(P)  # [P], [P]
        L = d.lengths[k]  # [P]
        hidden, feats, start_obs = self._warm_up(agent, k, t)  # [P,...], [P,F], [P,O]
        action = agent.sample_action(feats, self.gen)  # [P,A]
        A = action.shape[1]
        seed = int(torch.randint(2**62, (1,), generator=self.gen, device=dev))
        env = ModelEnv(self.model, None, P, (-1.0,) * A, (1.0,) * A, self.base_env_id, self.termination_fn,
                       member_mode="episode", horizon=None, truncate_above=self.u_max,
                       start_sampler=lambda n, g: start_obs, device=dev, seed=seed)
        obs = start_obs  # [P,O]
        alive = t < L  # [P]: t = L is a whole trajectory, nothing to imagine
        elapsed = t.clone()  # [P] steps since the trajectory's start
        rec: dict[str, list[torch.Tensor]] = {f: [] for f in ("obs", "action", "reward", "next_obs", "terminated",
                                                              "truncated", "alive", "by_unc", "by_time", "epistemic")}
        members = env.members.clone()  # [P] the posterior sample of every rollout
        n_alive = int(alive.sum())
        for _ in range(self.horizon):
            if n_alive == 0:
                break
            out = env.step(action)
            next_obs = out.final_obs
            assert isinstance(next_obs, torch.Tensor)  # ModelEnv's observations are flat [P,O]
            time_up = (elapsed + 1 >= self.horizon) & ~out.terminated  # [P]
            truncated = out.truncated | time_up  # [P]
            for f, v in (("obs", obs), ("action", action), ("reward", out.reward), ("next_obs", next_obs),
                         ("terminated", out.terminated), ("truncated", truncated), ("alive", alive),
                         ("by_unc", out.truncated), ("by_time", time_up & ~out.truncated),
                         ("epistemic", out.info.get("epistemic", torch.zeros_like(out.reward)))):
                rec[f].append(v)
            alive = alive & ~(out.terminated | truncated)  # [P]
            elapsed = elapsed + 1
            obs = next_obs
            hidden, feats = agent.advance(agent_inputs(obs, action, out.reward), hidden)
            action = agent.sample_action(feats, self.gen)  # [P,A]
            n_alive = int(alive.sum())  # host sync
        tapes = self._tapes(k, t, {f: torch.stack(v) if v else None for f, v in rec.items()})
        return tapes, self._stats(t, L, rec, members)

    def _tapes(self, k: torch.Tensor, t: torch.Tensor, rec: dict) -> TapeBatch:
        """History rows then imagined rows of every rollout, rollout after rollout."""
        d, P, dev = self.data, t.shape[0], self.device
        mask = rec["alive"].T if rec["alive"] is not None else torch.zeros(P, 0, dtype=torch.bool, device=dev)  # [P,H]
        imagined = mask.sum(1)  # [P]
        length = t + imagined  # [P] tape lengths (>= 1: a whole trajectory, or at least one imagined step)
        off = length.cumsum(0) - length  # [P]
        R = int(length.sum())
        O, A = d.obs.shape[1], d.action.shape[1]
        out = {"obs": torch.zeros(R, O, device=dev), "action": torch.zeros(R, A, device=dev),
               "reward": torch.zeros(R, device=dev), "next_obs": torch.zeros(R, O, device=dev)}
        out.update({f: torch.zeros(R, dtype=torch.bool, device=dev)
                    for f in ("terminated", "truncated", "real", "first")})
        hp = torch.repeat_interleave(torch.arange(P, device=dev), t)  # [Rh] rollout of every history row
        hj = torch.arange(hp.shape[0], device=dev) - (t.cumsum(0) - t)[hp]  # [Rh] step inside the history
        src, dst = d.offsets[k][hp] + hj, off[hp] + hj  # [Rh]
        for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
            out[f][dst] = getattr(d, f)[src]
        out["real"][dst] = True
        if rec["alive"] is not None:
            ip, ih = mask.nonzero(as_tuple=True)  # [Ri] rollout-major, time-ordered inside each rollout
            dst = off[ip] + t[ip] + ih  # [Ri]
            for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
                out[f][dst] = rec[f][ih, ip]
        out["first"][off] = True
        return TapeBatch(**out, num_tapes=P)

    def _stats(self, t: torch.Tensor, L: torch.Tensor, rec: dict, members: torch.Tensor) -> dict[str, float]:
        P = t.shape[0]
        if rec["alive"]:
            alive = torch.stack(rec["alive"])  # [H,P]
            w = alive.float()
            steps = w.sum(0)  # [P] imagined steps per rollout
            n_img = w.sum().clamp(min=1)
            figs = [steps.mean(), steps.max(), (torch.stack(rec["reward"]) * w).sum() / n_img,
                    (torch.stack(rec["epistemic"]) * w).sum() / n_img,
                    torch.where(alive, torch.stack(rec["epistemic"]), -torch.inf).max(),
                    (torch.stack(rec["terminated"]) & alive).sum().float(),
                    (torch.stack(rec["by_unc"]) & alive).sum().float(),
                    (torch.stack(rec["by_time"]) & alive).sum().float(), w.sum()]
        else:
            figs = [torch.zeros(())] * 9  # no rollout had a step to imagine
        figs += [t.float().mean(), (t >= L).sum().float(), members.unique().numel() * torch.ones(())]
        vals = torch.stack([f.to(t.device).float() for f in figs]).tolist()  # one host sync
        keys = ("imagined_length_mean", "imagined_length_max", "imagined_reward_mean", "epistemic_mean",
                "epistemic_max", "terminated", "truncated_uncertainty", "truncated_horizon", "imagined_transitions",
                "history_length_mean", "whole_trajectories", "members_used")
        stats = {f"rollout/{k}": v for k, v in zip(keys, vals)}
        stats["rollout/tapes"] = float(P)
        stats["rollout/transitions"] = stats["rollout/imagined_transitions"] + float(t.sum())
        if self.u_max is not None:
            stats["rollout/u_max"] = float(self.u_max)
        return stats

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])


__all__ = ["HistoryAgent", "HistoryCollector", "Trajectories", "agent_inputs", "prefix_inputs",
           "trajectories_from_dataset", "uncertainty_threshold"]
