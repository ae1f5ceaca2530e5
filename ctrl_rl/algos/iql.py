"""Implicit Q-Learning (IQL): expectile value, twin-Q TD on V(s'), advantage-weighted regression actor.

Paper: Kostrikov, Nair, Levine 2022 ("Offline RL with Implicit Q-Learning", ICLR). Settings verified in the
official code ikostrikov/implicit_q_learning @ 09d7002 (``configs/mujoco_config.py``, ``learner.py``,
``critic.py``, ``actor.py``, ``policy.py``, ``value_net.py``, ``common.py``, ``dataset_utils.py``,
``train_offline.py``). Per batch (s, a, r, s', terminated), in the code's order:

    L_V  = mean expectile_loss(min_i Qbar_i(s, a) - V(s), tau)        (target critics), |tau - 1(d < 0)| d^2
    w    = min(exp(beta (min_i Qbar_i(s, a) - V(s))), 100)            (V after its step; no gradient)
    L_pi = -mean w log pi(a|s)                                        (AWR on the dataset action)
    y    = r + gamma (1 - terminated) V(s')                           (V after its step)
    L_Q  = sum_i mean_B (Q_i(s, a) - y)^2,   Qbar <- Polyak(Q, tau_polyak)

What the code does for MuJoCo locomotion, and this file with it: twin Q (min); 256x256 ReLU MLPs for actor,
value and each critic, orthogonal init with gain sqrt 2 (output layers too); Adam 3e-4 for all, the actor's
learning rate on a cosine decay to 0 over the run's 1M steps (``opt_decay_schedule="cosine"``); no dropout
(``dropout_rate=None``; 0.1 in the kitchen/adroit configs); the policy is a plain Gaussian (NOT tanh-squashed,
``tanh_squash_distribution=False``) whose mean is ``tanh(mu(s))``, with a state-independent log-std parameter
(``state_dependent_std=False``, initialised to 0) clipped to [-5, 2]; dataset actions clipped to +-(1 - 1e-5);
sampled actions are clipped to [-1, 1]; evaluation uses the mean ``tanh(mu(s))`` (temperature 0).
The code also rescales locomotion rewards by 1000 / (max - min episode return) of the dataset
(``train_offline.normalize``; antmaze: r - 1): that is data preparation for the loop, given here as
``locomotion_reward_scale``.

Deviations: the critics are ctrl_rl's EnsembleMLP (nn.Linear-style init instead of orthogonal); dropout (when
set) draws its masks from the agent's generator.

Shape letters: E critics, B batch, O obs dim, A action dim.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.distributions import normal_log_prob
from ctrl_rl.core.nets import Activation, EnsembleMLP, mlp
from ctrl_rl.core.obs import Obs
from ctrl_rl.core.policies import DeterministicPolicy
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.seeds import SeedLayout
from ctrl_rl.core.types import Transition
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class IQLConfig:
    """IQL hyperparameters (defaults: the official code's MuJoCo locomotion settings)."""

    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the policy (code: hidden_dims (256, 256))."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each Q network."""
    value_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the value network."""
    activation: Activation = "relu"
    """Hidden activation of every network."""
    num_critics: int = 2
    """Q ensemble size; the min over all members is used (code: DoubleCritic)."""
    expectile: float = 0.7
    """tau of the expectile value loss (code mujoco_config 0.7; antmaze 0.9)."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights exp(beta A) (code ``temperature`` 3.0; antmaze 10)."""
    weight_clip: float = 100.0
    """Upper clip of exp(beta A) (code: 100)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    value_lr: float = 3e-4
    cosine_steps: int | None = 1_000_000
    """Actor learning rate follows lr * (1 + cos(pi min(t, T) / T)) / 2 over T actor updates (code: cosine decay
    over max_steps = 1M); None keeps it constant. Set it to the run's number of updates."""
    dropout: float = 0.0
    """Dropout after every hidden layer of the actor (code: None for MuJoCo, 0.1 kitchen/adroit)."""
    log_std_min: float = -5.0
    """Lower clip of the state-independent log-std (code: log_std_min=-5)."""
    log_std_max: float = 2.0
    """Upper clip of the state-independent log-std (code: LOG_STD_MAX 2)."""
    action_clip: float = 1 - 1e-5
    """Dataset actions are clipped to +-this (code: clip_to_eps, eps 1e-5)."""

    def __post_init__(self) -> None:
        if not 0 < self.expectile < 1 or self.beta < 0 or self.weight_clip <= 0:
            raise ValueError("invalid IQL setting: expected 0 < expectile < 1, beta >= 0, weight_clip > 0")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1 or not 0 <= self.dropout < 1:
            raise ValueError("invalid IQL setting: expected 0 < tau <= 1, 0 <= gamma <= 1, 0 <= dropout < 1")
        check_fields(self)
        if self.num_critics < 1 or (self.cosine_steps is not None and self.cosine_steps < 1):
            raise ValueError("invalid IQL setting: expected num_critics >= 1, cosine_steps >= 1 or None")
        if not self.log_std_min < self.log_std_max or not 0 < self.action_clip <= 1:
            raise ValueError("invalid IQL setting: expected log_std_min < log_std_max and 0 < action_clip <= 1")


# ----- pure functions -----

def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """Elementwise asymmetric square ``|tau - 1(diff < 0)| diff^2`` (weight tau where diff > 0, else 1 - tau)."""
    return torch.where(diff > 0, tau, 1 - tau) * diff.square()


def awr_weights(adv: torch.Tensor, beta: float, clip: float) -> torch.Tensor:
    """Advantage weights ``min(exp(beta adv), clip)``."""
    return torch.exp(beta * adv).clamp(max=clip)


def locomotion_reward_scale(episode_returns: torch.Tensor) -> float:
    """IQL's locomotion reward scale, ``1000 / (max - min)`` of the dataset's episode returns (``[K]``)."""
    return 1000.0 / float(episode_returns.max() - episode_returns.min())


def cosine_factor(step: int, total: int | None) -> float:
    """Cosine decay from 1 to 0 over ``total`` steps, then 0 (optax.cosine_decay_schedule with alpha 0)."""
    return 1.0 if total is None else 0.5 * (1 + math.cos(math.pi * min(step, total) / total))


# ----- networks -----

class GaussianActor(nn.Module):
    """Gaussian policy with mean ``tanh(mu(s))`` and a state-independent clipped log-std (not tanh-squashed)."""

    def __init__(self, cfg: IQLConfig, spec: EnvSpec):
        super().__init__()
        self.net = mlp(spec.obs_dim, cfg.actor_hidden, spec.action_dim, cfg.activation, out_gain=math.sqrt(2))
        self.log_std = nn.Parameter(torch.zeros(spec.action_dim))  # [A]
        self.dropout, self.lo, self.hi = cfg.dropout, cfg.log_std_min, cfg.log_std_max

    def forward(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs
        for i, layer in enumerate(self.net):
            x = layer(x)
            if self.training and self.dropout > 0 and i < len(self.net) - 1 and not isinstance(layer, nn.Linear):
                keep = torch.rand(x.shape, generator=generator, device=x.device) >= self.dropout  # [B,h]
                x = x * keep / (1 - self.dropout)
        return torch.tanh(x), self.log_std.clamp(self.lo, self.hi).expand_as(x)  # [B,A] each

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return normal_log_prob(action, *self(obs, generator))  # [B]

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)[0]


class IQL:
    """Owns actor, value net, Q ensemble, target Q ensemble and their optimizers."""

    name = "iql"

    def __init__(self, config: IQLConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None):
        if not spec.is_flat:
            raise UserInputError(f"IQL takes flat state observations: env {spec.env_id!r} has the parts "
                                 f"{[q.name for q in spec.parts]} "
                                 "(expected a state-vector env; PPO and SAC learn from images)")
        if spec.discrete:
            raise ValueError(f"IQL needs continuous actions; {spec.env_id} has discrete actions")
        self.config, self.spec, self.device = config, spec, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        c = config
        self.actor = GaussianActor(c, spec).to(self.device)
        self.value = mlp(spec.obs_dim, c.value_hidden, 1, c.activation, out_gain=math.sqrt(2)).to(self.device)
        self.critic = EnsembleMLP(c.num_critics, spec.obs_dim + spec.action_dim, c.critic_hidden, 1,
                                  c.activation).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.actor_lr, fused=True)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=c.value_lr, fused=True)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr, fused=True)
        self.actor_sched = torch.optim.lr_scheduler.LambdaLR(self.actor_opt, lambda t: cosine_factor(t, c.cosine_steps))
        self._tgt, self._src = list(self.critic_target.parameters()), list(self.critic.parameters())

    def q(self, net: EnsembleMLP, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return net(torch.cat([obs, action], -1)).squeeze(-1)  # [*S,E,B]

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        """``tanh(mu(s))`` or a Gaussian sample clipped to [-1, 1] (the code's sample_actions)."""
        self.actor.eval()
        try:
            mean, log_std = self.actor(obs)  # [B,A] each
        finally:
            self.actor.train()
        if deterministic:
            return mean
        eps = torch.randn(mean.shape, generator=self.gen, device=mean.device, dtype=mean.dtype)  # [B,A]
        return (mean + eps * log_std.exp()).clamp(-1, 1)

    def exportable(self) -> nn.Module:
        """Deterministic policy ``tanh(mu(s))`` in [-1, 1] on a copy of the actor in evaluation mode."""
        return DeterministicPolicy(copy.deepcopy(self.actor)).eval()

    def _step(self, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # a seed-batched update's [S] losses: each seed's gradient is its own loss's
        opt.step()

    def update(self, batch: Transition) -> dict[str, torch.Tensor]:
        """Value, actor, critic steps (in the code's order) and the Polyak target update.
        Returns device tensors (no host sync).

        Dimensions count from the end, so the same code trains S seeds at once (``core.seeds``): every batch
        tensor may carry a leading ``[S]`` (written ``[*S,...]`` below) and every info value then holds one
        figure per seed."""
        c = self.config
        obs, next_obs = batch.obs, batch.next_obs
        assert isinstance(obs, torch.Tensor) and isinstance(next_obs, torch.Tensor)  # IQL takes flat observations
        lead, B = obs.shape[:-2], obs.shape[-2]
        assert batch.action.shape[:-1] == (*lead, B) and batch.reward.shape == (*lead, B), \
            "expected obs [*S,B,O], action [*S,B,A], reward [*S,B]"
        action = batch.action.clamp(-c.action_clip, c.action_clip)  # [*S,B,A]
        with torch.no_grad():
            q_t = self.q(self.critic_target, obs, action).min(-2).values  # [*S,B]
        v = self.value(obs).squeeze(-1)  # [*S,B]
        value_loss = expectile_loss(q_t - v, c.expectile).mean(-1)  # [*S]
        self._step(self.value_opt, value_loss)

        with torch.no_grad():
            v_new, v_next = self.value(torch.cat([obs, next_obs], -2)).squeeze(-1).split(B, -1)  # [*S,B] each
            adv = q_t - v_new  # [*S,B]
            w = awr_weights(adv, c.beta, c.weight_clip)  # [*S,B]
            y = batch.reward + c.gamma * (~batch.terminated).to(batch.reward.dtype) * v_next  # [*S,B]
        actor_loss = -(w * self.actor.log_prob(obs, action, self.gen)).mean(-1)  # [*S]
        actor_lr = self.actor_opt.param_groups[0]["lr"]  # the rate of this step (a Python float: no sync)
        self._step(self.actor_opt, actor_loss)
        self.actor_sched.step()

        q = self.q(self.critic, obs, action)  # [*S,E,B]
        critic_loss = (q - y.unsqueeze(-2)).square().mean(-1).sum(-1)  # [*S]
        self._step(self.critic_opt, critic_loss)
        polyak_(self._tgt, self._src, c.tau)

        info = {"loss/value": value_loss.detach(), "loss/actor": actor_loss.detach(),
                "loss/critic": critic_loss.detach(),
                "stats/v_mean": v.detach().mean(-1), "stats/q_mean": q.detach().mean((-2, -1)),
                "stats/adv_mean": adv.mean(-1), "stats/weight_mean": w.mean(-1),
                "stats/actor_lr": torch.tensor(actor_lr, device=self.device)}
        return info

    def parameters_finite(self) -> bool:
        params = [*self.actor.parameters(), *self.value.parameters(), *self.critic.parameters()]
        return bool(torch.stack([p.detach().isfinite().all() for p in params]).all())

    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "value": self.value.state_dict(), "critic": self.critic.state_dict(),
                "critic_target": self.critic_target.state_dict(), "actor_opt": self.actor_opt.state_dict(),
                "value_opt": self.value_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "actor_sched": self.actor_sched.state_dict(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.value.load_state_dict(state["value"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        # deep copies: torch's Optimizer.load_state_dict keeps references to the given state tensors
        self.actor_opt.load_state_dict(copy.deepcopy(state["actor_opt"]))
        self.value_opt.load_state_dict(copy.deepcopy(state["value_opt"]))
        self.critic_opt.load_state_dict(copy.deepcopy(state["critic_opt"]))
        self.actor_sched.load_state_dict(state["actor_sched"])
        self.gen.set_state(state["gen"])


def _prepare_iql(dataset, buffer, config: IQLConfig) -> tuple[object, dict]:
    """Locomotion reward scale: rewards x 1000 / (max - min episode return), as the official code does."""
    scale = locomotion_reward_scale(dataset.episode_returns())
    buffer.reward.mul_(scale)
    return buffer, {"reward_scale": scale}


register(AlgoEntry(
    "iql", IQLConfig, IQL, regime="offline",
    summary="Implicit Q-Learning, offline (--dataset): expectile value, advantage-weighted actor",
    run_defaults={"total_steps": 1_000_000, "log_every": 1000, "checkpoint_every": 50_000, "eval_every": 50_000},
    loop_defaults={"batch_size": 256, "clip_actions": 1 - 1e-5}, prepare_offline=_prepare_iql, requires_dataset=True,
    seed_layout=SeedLayout(("actor", "value", "critic", "critic_target"),
                           each=("actor_opt", "value_opt", "critic_opt", "actor_sched"), lists=("_tgt", "_src"),
                           refuse=lambda c: "--dropout above 0 (its masks come from each seed's generator)"
                           if c.dropout > 0 else None)))
