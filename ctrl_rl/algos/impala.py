"""IMPALA: the V-trace actor-critic of the actor-learner architecture.

Paper: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures". Actors step their envs with the last weights they received (behaviour policy mu, a few learner
updates old) and send T-step segments with mu's log-probs; the learner corrects for the lag with V-trace
(``core.returns.vtrace``). For a segment with ``log_rho = log pi(a|x) - log mu(a|x)``:

    vs, A    = vtrace(log_rho, r, V(x), V(x'), ...)          (targets; no gradient)
    L_policy = -mean(A * log pi(a|x))
    L_value  = 0.5 * mean((vs - V(x))^2)
    L        = L_policy + vf_coef * L_value - ent_coef * entropy

With ``kappa > 0`` the policy-gradient advantage is DoMo-AC's (``core.returns.domo_advantage``; the ``domo_ac``
entry, algos/domo_ac.py); ``kappa = 0`` is this file's IMPALA exactly.

Defaults follow the paper's Atari/DMLab setting where it applies to small control tasks: discount 0.99,
rho_bar = c_bar = 1, value cost 0.5, entropy cost 0.01, global gradient-norm clip 40, RMSProp (decay 0.99,
epsilon 0.01, momentum 0). The paper's learning rate (~6e-4 with linear decay, batch 32 x unroll 20) is for its
deep ResNet; the MLP default here is 6e-4 without decay. Networks are PPO's actor-critic (``algos.ppo``:
Gaussian or categorical head, observation normaliser, image encoder), so exports and evaluation are PPO's.

Deliberate choices:
- ``V(x')`` is the critic on the state each step reached (``final_obs``: the pre-reset observation where an
  episode ended), so truncation bootstraps from the final observation and termination from nothing.
- The observation normaliser is frozen during an update and updated from the segment afterwards (as PPO).
- The learner takes whole segments from several actors per update (``--segments-per-update`` in the loop).

Shape letters: T unroll, N envs of a batch (actors x envs per actor), S = T*N, A action dim.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ctrl_rl.algos.ppo import ActorCritic, ActorCriticFields, deterministic_policy
from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.nets import RunningNorm
from ctrl_rl.core.obs import Obs, obs_map
from ctrl_rl.core.returns import domo_advantage, vtrace
from ctrl_rl.core.types import Rollout
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec


@dataclass(frozen=True)
class IMPALAConfig(ActorCriticFields):
    """V-trace actor-critic hyperparameters (module docstring for sources); the network fields are PPO's."""

    lr: float = 6e-4
    """Learning rate."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """RMSProp as the paper (decay 0.99, epsilon 0.01), or Adam (epsilon 1e-5)."""
    gamma: float = 0.99
    """Discount factor."""
    trace_lambda: float = 1.0
    """lambda of the V-trace evaluation traces ``c = lambda * min(c_bar, ratio)`` (1: the paper's V-trace;
    ``--lambda`` on the command line)."""
    kappa: float = 0.0
    """DoMo-AC's improvement lookahead (0: IMPALA's one-step policy gradient; algos/domo_ac.py)."""
    rho_bar: float = 1.0
    """Truncation of the importance weights in the value targets."""
    c_bar: float = 1.0
    """Truncation of the trace coefficients."""
    pg_rho_bar: float = 1.0
    """Truncation of the importance weight of the policy gradient."""
    vf_coef: float = 0.5
    """Weight of the value loss (the paper's baseline cost)."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip (<= 0 disables)."""

    def __post_init__(self) -> None:
        check_fields(self)
        checks = {"lr": self.lr > 0, "gamma": 0 <= self.gamma <= 1, "trace_lambda": 0 <= self.trace_lambda <= 1,
                  "kappa": 0 <= self.kappa <= 1, "rho_bar": self.rho_bar > 0, "c_bar": self.c_bar > 0,
                  "pg_rho_bar": self.pg_rho_bar > 0, "vf_coef": self.vf_coef >= 0, "ent_coef": self.ent_coef >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {type(self).__name__} setting {name}={getattr(self, name)!r}")
        _ = self.encoder


def vtrace_losses(cfg: IMPALAConfig, logp: torch.Tensor, entropy: torch.Tensor, value: torch.Tensor,
                  behaviour_logp: torch.Tensor, next_value: torch.Tensor, batch: Rollout
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one segment batch (module docstring); all ``[T,N]`` except the scalar outputs."""
    done = batch.terminated | batch.truncated  # [T,N]
    log_rho = logp.detach() - behaviour_logp  # [T,N]
    vs, adv = vtrace(log_rho, batch.reward, value.detach(), next_value, batch.terminated, done, cfg.gamma,
                     cfg.rho_bar, cfg.c_bar, cfg.pg_rho_bar, cfg.trace_lambda)
    if cfg.kappa > 0:
        adv = domo_advantage(log_rho, batch.reward, value.detach(), next_value, vs, batch.terminated, done,
                             cfg.gamma, cfg.kappa, cfg.pg_rho_bar, cfg.c_bar)
    policy_loss = -(adv * logp).mean()
    value_loss = 0.5 * (vs - value).square().mean()
    ent = entropy.mean()
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * ent
    with torch.no_grad():
        ratio = log_rho.exp()
        parts = {"loss/policy": policy_loss.detach(), "loss/value": value_loss.detach(), "stats/entropy": ent.detach(),
                 "stats/rho_mean": ratio.mean(), "stats/rho_clipped": (ratio > cfg.rho_bar).float().mean(),
                 "stats/value_mean": value.detach().mean(), "stats/adv_mean": adv.mean()}
    return loss, parts


class IMPALA:
    """Owns the actor-critic and its optimizer; actors hold copies of the acting part (``policy_state``)."""

    name = "impala"

    def __init__(self, config: IMPALAConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None):
        self.config, self.spec, self.device = config, spec, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        self.ac = ActorCritic(config, spec).to(self.device)  # a privileged part reaches neither network
        if spec.privileged_parts:  # what the policy reads, and so what its export takes in
            self.spec = spec.with_parts(self.ac.actor_parts)
        self.params = [p for p in self.ac.parameters() if p.requires_grad]
        if config.optimizer == "rmsprop":
            self.opt = torch.optim.RMSprop(self.params, lr=config.lr, alpha=0.99, eps=0.01)
        else:
            self.opt = torch.optim.Adam(self.params, lr=config.lr, eps=1e-5)

    # -- acting (actors) ----------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Behaviour action and its log-prob for ``[N,...]`` observations."""
        return self.ac.sample(obs, self.gen)

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        return deterministic_policy(self.ac)(obs) if deterministic else self.sample(obs)[0]

    def exportable(self) -> nn.Module:
        return deterministic_policy(copy.deepcopy(self.ac)).eval()

    def policy_state(self) -> dict[str, torch.Tensor]:
        """What an actor needs to act as the learner does now (network weights and normaliser statistics)."""
        return {k: v.detach().clone() for k, v in self.ac.state_dict().items()}

    def load_policy_state(self, state: dict[str, torch.Tensor]) -> None:
        self.ac.load_state_dict(state)

    # -- learning -----------------------------------------------------------------------------------------
    def update(self, batch: Rollout) -> dict[str, torch.Tensor]:
        """One gradient step on a batch of segments ``[T,N]`` (several actors' segments side by side)."""
        c = self.config
        T, N = batch.reward.shape
        flat = obs_map(lambda v: v.flatten(0, 1), batch.obs)  # [S,...]
        action = batch.action.flatten(0, 1)  # [S,A] or [S]
        feats = self.ac.features(flat)  # [S,F]
        logp, entropy = self.ac.log_prob_entropy(feats, action)  # [S] each
        value = self.ac.critic(feats).squeeze(-1)  # [S]
        with torch.no_grad():
            next_value = self.ac.value(obs_map(lambda v: v.flatten(0, 1), batch.final_obs)).view(T, N)  # [T,N]
        loss, info = vtrace_losses(c, logp.view(T, N), entropy.view(T, N), value.view(T, N), batch.logp, next_value,
                                   batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params,
                                                   c.max_grad_norm if c.max_grad_norm > 0 else float("inf"))
        self.opt.step()
        if isinstance(self.ac.norm, RunningNorm):
            obs = batch.obs  # a tensor exactly when the spec is flat
            state = obs if isinstance(obs, torch.Tensor) else obs.get("state")
            if state is not None:
                self.ac.norm.update(state.flatten(0, 1))
        return {**info, "stats/grad_norm": grad_norm.detach()}

    # -- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"ac": self.ac.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.ac.load_state_dict(state["ac"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])

    def parameters_finite(self) -> bool:
        return bool(torch.stack([p.detach().isfinite().all() for p in self.params]).all())


register(AlgoEntry(
    "impala", IMPALAConfig, IMPALA, regime="actor-learner",
    summary="IMPALA: V-trace actor-critic; actors in-process, in worker processes or on Ray (--backend)",
    continuous_only=False,
    run_defaults={"total_steps": 200_000, "num_envs": 8, "log_every": 10, "checkpoint_every": 100}))
