"""Batched wrappers: episode statistics, action rescaling, observation normalization, reward scaling.

Each wrapper is itself a BatchedEnv and forwards ``state_dict``/``load_state_dict`` to the env it wraps,
so checkpoints hold normalizer statistics and (for torch-native simulators) the full simulator state.
Observations are passed through as they come (``Obs``: a tensor, or a dict of parts for envs with
images), except by ``ObsNormalize``, which normalizes the float ``state`` part only.
Shape letters: N envs, O obs dim, A action dim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import torch

from ctrl_rl.core.nets import RunningNorm
from ctrl_rl.core.obs import Obs
from ctrl_rl.envs.protocol import AsyncEnv, BatchedEnv, EnvSpec, StatefulEnv, StepOut


class Wrapper:
    """Forwards everything to ``env``; a subclass changes actions in ``act`` and step results in ``out``.

    With those two hooks a wrapper serves both the synchronous ``step`` and the split
    ``step_async``/``step_wait`` pair that pipelined collection uses (present when the wrapped
    simulator has it, e.g. envpool).
    """

    def __init__(self, env: BatchedEnv):
        self.env = env
        self.num_envs = env.num_envs
        self.spec = env.spec
        self.device = env.device

    def reset(self, seed: int | None = None) -> Obs:
        return self.env.reset(seed)

    def act(self, action: torch.Tensor) -> torch.Tensor:
        return action

    def out(self, out: StepOut) -> StepOut:
        return out

    def step(self, action: torch.Tensor) -> StepOut:
        return self.out(self.env.step(self.act(action)))

    @property
    def supports_async(self) -> bool:
        return isinstance(self.unwrapped(), AsyncEnv)

    # Callers check ``supports_async`` first: the env has the split step (a Wrapper, or the simulator itself).
    def step_async(self, action: torch.Tensor) -> None:
        cast(AsyncEnv, self.env).step_async(self.act(action))

    def step_wait(self) -> StepOut:
        return self.out(cast(AsyncEnv, self.env).step_wait())

    def close(self) -> None:
        self.env.close()

    def own_state(self) -> dict:
        return {}

    def load_own_state(self, state: dict) -> None:
        pass

    def state_dict(self) -> dict:
        inner = self.env.state_dict() if isinstance(self.env, StatefulEnv) else {}
        return {"own": self.own_state(), "inner": inner}

    def load_state_dict(self, state: dict) -> None:
        self.load_own_state(state["own"])
        if isinstance(self.env, StatefulEnv):
            self.env.load_state_dict(state["inner"])

    def unwrapped(self) -> BatchedEnv:
        env = self.env
        while isinstance(env, Wrapper):
            env = env.env
        return env


class EpisodeStats(Wrapper):
    """Tracks per-env undiscounted return and length on the device.

    Adds to ``info``: ``episode_return [N]`` and ``episode_length [N]`` (values of the episode that just
    ended, zero elsewhere) and ``episode_done [N]`` bool. For an env that reports ``info["success"]`` per step
    (the manipulation tasks) also ``episode_success [N]``: the episode that just ended succeeded at some step.
    Put it innermost so it sees raw rewards.
    """

    def __init__(self, env: BatchedEnv):
        super().__init__(env)
        self.ret = torch.zeros(self.num_envs, device=self.device)  # [N]
        self.len = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # [N]
        self.succ = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)  # [N]

    def reset(self, seed: int | None = None) -> Obs:
        self.ret.zero_()
        self.len.zero_()
        self.succ.zero_()
        return self.env.reset(seed)

    def out(self, out: StepOut) -> StepOut:
        # Runs once per env step: scalar fill values and in-place resets keep it at 7 small ops.
        done = out.terminated | out.truncated  # [N]
        self.ret += out.reward
        self.len += 1
        out.info["episode_return"] = torch.where(done, self.ret, 0.0)  # [N]
        out.info["episode_length"] = torch.where(done, self.len, 0)  # [N]
        out.info["episode_done"] = done
        self.ret.masked_fill_(done, 0.0)
        self.len.masked_fill_(done, 0)
        if "success" in out.info:
            self.succ |= out.info["success"].to(self.device, torch.bool)
            out.info["episode_success"] = done & self.succ  # [N]
            self.succ.masked_fill_(done, False)
        return out

    def own_state(self) -> dict:
        return {"ret": self.ret.clone(), "len": self.len.clone(), "succ": self.succ.clone()}

    def load_own_state(self, state: dict) -> None:
        self.ret.copy_(state["ret"])
        self.len.copy_(state["len"])
        if "succ" in state:  # checkpoints from before success tracking have none: no episode had succeeded
            self.succ.copy_(state["succ"])


def rescaled_spec(spec: EnvSpec) -> EnvSpec:
    """The spec ``ActionRescale`` gives an env of ``spec``: bounds ``[-1, 1]`` where finite, infinite ones kept;
    a discrete spec unchanged. With ``spec_of`` it gives a training env's spec without building the env."""
    if spec.discrete:
        return spec
    finite = [math.isfinite(lo) and math.isfinite(hi) for lo, hi in zip(spec.action_low, spec.action_high)]
    return dataclasses.replace(spec, action_low=tuple(-1.0 if f else float("-inf") for f in finite),
                               action_high=tuple(1.0 if f else float("inf") for f in finite))


def action_affine(spec: EnvSpec, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(finite, scale, bias)``, each ``[A]``, of the map from the agent's [-1, 1] to ``spec``'s bounds:
    ``a_env = a * scale + bias`` where both bounds are finite (``finite``), ``scale`` 1 and ``bias`` 0 elsewhere.
    ``ActionRescale`` applies it; ``storage.datasets.to_agent_units`` inverts it for dataset actions."""
    low = torch.tensor(spec.action_low, dtype=dtype, device=device)  # [A]
    high = torch.tensor(spec.action_high, dtype=dtype, device=device)  # [A]
    finite = torch.isfinite(low) & torch.isfinite(high)
    return (finite, torch.where(finite, (high - low) / 2, torch.ones_like(low)),
            torch.where(finite, (high + low) / 2, torch.zeros_like(low)))


class ActionRescale(Wrapper):
    """The agent acts in ``[-1, 1]^A``; actions are clipped there and mapped affinely to the env's bounds.

    Dimensions with infinite bounds are passed through unchanged (clipped to nothing).
    """

    def __init__(self, env: BatchedEnv):
        super().__init__(env)
        if env.spec.discrete:
            raise ValueError("ActionRescale applies to continuous action spaces only")
        self._finite, self._scale, self._bias = action_affine(env.spec, torch.float32, self.device)  # [A] each
        self._all_finite = bool(self._finite.all())  # the usual case: one clamp, no per-dim select per step
        self.spec = rescaled_spec(env.spec)
        assert len(self.spec.action_low) == env.spec.action_dim

    def act(self, action: torch.Tensor) -> torch.Tensor:
        a = action.clamp(-1.0, 1.0)  # [N,A]
        if not self._all_finite:
            a = torch.where(self._finite, a, action)  # [N,A]
        return a * self._scale + self._bias


class ObsNormalize(Wrapper):
    """Running mean/std observation normalization at the env level (statistics saved with checkpoints).

    PPO normalizes inside its policy instead (so exports fold it in); this wrapper serves loops and
    algorithms that want normalized observations from the env itself. ``final_obs`` is normalized with
    the same statistics as ``obs``. For an env with several observation parts only the float ``state``
    part is normalized (images and language pass through); an env without one is refused.
    """

    def __init__(self, env: BatchedEnv, clip: float = 10.0, update: bool = True):
        super().__init__(env)
        spec = env.spec
        self._flat = spec.is_flat
        if not self._flat and not any(p.name == "state" and p.dtype.is_floating_point for p in spec.parts):
            raise ValueError(f"ObsNormalize normalizes the float 'state' observation part, but {spec.env_id} has "
                             f"only the parts {[p.name for p in spec.parts]}.")
        self.norm = RunningNorm(spec.obs_shape, clip=clip).to(self.device)  # obs_shape is the state part's
        self.update = update

    def _apply(self, obs: Obs) -> Obs:
        if isinstance(obs, torch.Tensor):  # the usual case (a flat env): the observation is the state tensor
            return self.norm(obs)
        return {**obs, "state": self.norm(obs["state"])}  # a new dict: the env's own dict is left as it was

    @staticmethod
    def _state(obs: Obs) -> torch.Tensor:
        return obs if isinstance(obs, torch.Tensor) else obs["state"]

    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed)
        if self.update:
            self.norm.update(self._state(obs))
        return self._apply(obs)

    def out(self, out: StepOut) -> StepOut:
        if self.update:
            self.norm.update(self._state(out.obs))
        out.final_obs = self._apply(out.final_obs)
        out.obs = self._apply(out.obs)
        return out

    def own_state(self) -> dict:
        return {k: v.clone() for k, v in self.norm.state_dict().items()}

    def load_own_state(self, state: dict) -> None:
        self.norm.load_state_dict(state)


class RewardScale(Wrapper):
    """Divides rewards by the running std of the discounted return (as in PPO's common reward scaling).

    The discounted return accumulator restarts at every episode end; ``gamma`` should match the learner's.
    """

    def __init__(self, env: BatchedEnv, gamma: float = 0.99, clip: float = 10.0, eps: float = 1e-8):
        super().__init__(env)
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.acc = torch.zeros(self.num_envs, device=self.device)  # [N]
        self.norm = RunningNorm((), clip=float("inf")).to(self.device)
        self._n = torch.tensor(float(self.num_envs), dtype=torch.float64, device=self.device)  # batch count

    def out(self, out: StepOut) -> StepOut:
        # Runs once per env step, so in place and without temporaries; the same arithmetic as
        # ``acc = acc * gamma + r`` followed by ``RunningNorm.update(acc)``, bit for bit.
        self.acc.mul_(self.gamma).add_(out.reward)  # [N]
        self.norm.merge(self.acc.mean(0), self.acc.var(0, unbiased=False), self._n)
        self.acc.masked_fill_(out.terminated | out.truncated, 0.0)
        var = cast(torch.Tensor, self.norm.var)  # a buffer; RunningNorm (core/nets.py) does not declare its type
        out.reward = (out.reward * torch.rsqrt(var + self.eps)).clamp_(-self.clip, self.clip)  # [N]
        return out

    def own_state(self) -> dict:
        return {"acc": self.acc.clone(), **{k: v.clone() for k, v in self.norm.state_dict().items()}}

    def load_own_state(self, state: dict) -> None:
        self.acc = state["acc"].clone().to(self.device)
        self.norm.load_state_dict({k: v for k, v in state.items() if k != "acc"})
