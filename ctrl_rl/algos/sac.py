"""Soft Actor-Critic with a batched critic ensemble (REDQ-style target subset).

Papers: Haarnoja et al. 2018 ("Soft Actor-Critic", automatic temperature in the 2018 applications paper);
Chen et al. 2021 (REDQ: N critics, a random subset of M for the target). ALGORITHMS.md §0.1.

Losses for a batch (s, a, r, s', terminated):

    a' ~ pi(.|s'),  Q_t = min_{i in random subset of size M} Qbar_i(s', a')
    y  = r + gamma * (1 - terminated) * (Q_t - [backup_entropy] * alpha * log pi(a'|s'))
    L_Q     = mean_i mean_batch (Q_i(s, a) - y)^2          (every member regresses to the same y)
    L_pi    = mean_batch (alpha * log pi(a|s) - Qagg(s, a)),  a ~ pi(.|s),  Qagg = min or mean over members
    L_alpha = -mean_batch (log_alpha * (log pi(a|s) + H_target))

Only true terminations stop the bootstrap: a truncated transition's ``next_obs`` is the final
observation of its episode (the protocol's ``final_obs``) and is bootstrapped like any other.
Target critics move by Polyak averaging with a fused in-place lerp. N=2, M=2 is classic SAC.

Shape letters: E critic members, B batch, O obs dim, A action dim.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ctrl_rl.core.nets import Activation, EnsembleMLP, mlp
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters (defaults: the SAC paper's MuJoCo settings)."""

    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the policy network."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each critic."""
    activation: Activation = "relu"
    """Hidden activation of actor and critics."""
    num_critics: int = 2
    """N: critic ensemble size (computed in one batched call)."""
    target_subset: int = 2
    """M: critics drawn at random for the min in the target (M = N: clipped double-Q over all)."""
    layer_norm: bool = False
    """LayerNorm after every hidden layer of the critics."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_alpha: float = 1.0
    """Initial temperature."""
    learn_alpha: bool = True
    """Tune the temperature towards target_entropy (False: keep init_alpha)."""
    target_entropy: float | None = None
    """Target policy entropy (None: -|A|)."""
    backup_entropy: bool = True
    """Subtract alpha * log pi(a'|s') inside the TD target."""
    actor_q: Literal["min", "mean"] = "min"
    """How the actor aggregates the critic ensemble."""

    def __post_init__(self) -> None:
        if not 1 <= self.target_subset <= self.num_critics:
            raise ValueError(f"invalid SAC setting target_subset={self.target_subset}: expected 1..num_critics={self.num_critics}")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1 or self.init_alpha <= 0:
            raise ValueError("invalid SAC setting: expected 0 < tau <= 1, 0 <= gamma <= 1, init_alpha > 0")


def tanh_normal_sample(mean: torch.Tensor, log_std: torch.Tensor, generator: torch.Generator | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised tanh-Gaussian sample ``[B,A]`` and its log-density ``[B]`` (change of variables)."""
    eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)  # [B,A]
    u = mean + eps * log_std.exp()  # [B,A]
    log_n = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)  # [B]
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|
    log_det = (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)  # [B]
    return torch.tanh(u), log_n - log_det


def td_target(q_next: torch.Tensor, subset: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor,
              next_logp: torch.Tensor, alpha: torch.Tensor, gamma: float, backup_entropy: bool) -> torch.Tensor:
    """``q_next [E,B]`` of the target critics at (s', a'); ``subset [M]`` member indices -> ``y [B]``."""
    q_t = q_next.index_select(0, subset).min(0).values  # [B]
    if backup_entropy:
        q_t = q_t - alpha * next_logp
    return reward + gamma * (~terminated).to(reward.dtype) * q_t


class Actor(nn.Module):
    def __init__(self, cfg: SACConfig, spec: EnvSpec):
        super().__init__()
        self.net = mlp(spec.obs_dim, cfg.actor_hidden, 2 * spec.action_dim, cfg.activation)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, -1)  # [B,A] each
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)


class DeterministicActor(nn.Module):
    """Exported policy: observation -> tanh(mean), the agent's action space [-1, 1]."""

    def __init__(self, actor: Actor):
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.actor(obs)[0])


class SAC:
    """Owns actor, critic ensemble, target critics, temperature and their optimizers."""

    name = "sac"

    def __init__(self, config: SACConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None):
        if spec.discrete:
            raise ValueError(f"SAC needs continuous actions; {spec.env_id} has discrete actions")
        self.config, self.spec, self.device = config, spec, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        c = config
        self.actor = Actor(c, spec).to(self.device)
        self.critic = EnsembleMLP(c.num_critics, spec.obs_dim + spec.action_dim, c.critic_hidden, 1, c.activation,
                                  c.layer_norm).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(c.init_alpha), device=self.device, requires_grad=c.learn_alpha)
        self.target_entropy = float(-spec.action_dim if c.target_entropy is None else c.target_entropy)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=c.alpha_lr) if c.learn_alpha else None
        self._tgt = list(self.critic_target.parameters())
        self._src = list(self.critic.parameters())

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def q(self, net: EnsembleMLP, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return net(torch.cat([obs, action], -1)).squeeze(-1)  # [E,B]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        mean, log_std = self.actor(obs)
        if deterministic:
            return torch.tanh(mean)
        return tanh_normal_sample(mean, log_std, self.gen)[0]

    def exportable(self) -> nn.Module:
        return DeterministicActor(self.actor)

    def update_critic(self, batch: Transition) -> dict[str, torch.Tensor]:
        c = self.config
        with torch.no_grad():
            next_a, next_logp = tanh_normal_sample(*self.actor(batch.next_obs), self.gen)  # [B,A], [B]
            q_next = self.q(self.critic_target, batch.next_obs, next_a)  # [E,B]
            subset = torch.randperm(c.num_critics, generator=self.gen, device=self.device)[: c.target_subset]  # [M]
            y = td_target(q_next, subset, batch.reward, batch.terminated, next_logp, self.alpha, c.gamma,
                          c.backup_entropy)  # [B]
        q = self.q(self.critic, batch.obs, batch.action)  # [E,B]
        loss = (q - y).square().mean()
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        polyak_(self._tgt, self._src, c.tau)
        return {"loss/critic": loss.detach(), "stats/q_mean": q.detach().mean(), "stats/target_mean": y.mean()}

    def update_actor(self, batch: Transition) -> dict[str, torch.Tensor]:
        c = self.config
        a, logp = tanh_normal_sample(*self.actor(batch.obs), self.gen)  # [B,A], [B]
        q = self.q(self.critic, batch.obs, a)  # [E,B]
        q_agg = q.min(0).values if c.actor_q == "min" else q.mean(0)  # [B]
        loss = (self.alpha * logp - q_agg).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_opt.step()
        out = {"loss/actor": loss.detach(), "stats/entropy": -logp.detach().mean(), "stats/alpha": self.alpha}
        if self.alpha_opt is not None:
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_opt.step()
            out["loss/alpha"] = alpha_loss.detach()
        return out

    def update(self, batch: Transition) -> dict[str, float]:
        """One critic step (with the target update) and one actor/temperature step; one host sync."""
        info = {**self.update_critic(batch), **self.update_actor(batch)}
        vals = torch.stack([v.float() for v in info.values()]).tolist()
        return dict(zip(info.keys(), vals))

    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "critic_target": self.critic_target.state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "alpha_opt": self.alpha_opt.state_dict() if self.alpha_opt else None, "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        # deep copies: torch's Optimizer.load_state_dict keeps references to the given state tensors
        self.actor_opt.load_state_dict(copy.deepcopy(state["actor_opt"]))
        self.critic_opt.load_state_dict(copy.deepcopy(state["critic_opt"]))
        if self.alpha_opt is not None and state["alpha_opt"] is not None:
            self.alpha_opt.load_state_dict(copy.deepcopy(state["alpha_opt"]))
        self.gen.set_state(state["gen"])
