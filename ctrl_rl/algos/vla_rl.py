"""VLA RL: PPO where one action is a whole chunk, with an SFT anchor on demonstrations and optional self-imitation
(RLinf-Co, Shi, Chen et al.; docs/algorithms/vla.md#rl has the equations, defaults and what the experiments say).

A chunk is executed open-loop for ``execute`` env steps (the ``chunk-rollouts`` loop, ``vla.rollouts``); its reward
is the discounted sum inside it and the discount between chunks is ``gamma ** execute``. The clipped ratio is of the
head's chunk likelihood (tokens: the bins' categorical; regression: a diagonal Gaussian with a learned log-std
starting at ``init_log_std``; flow: the Gaussian transitions of a noisy Euler chain with ``flow_sigma``).
Advantages: GAE over chunks with a value function on the env's full ``state`` part (asymmetric: privileged state in
simulation), or with ``advantage group`` (GRPO-style, as SimpleVLA-RL uses for VLAs) every chunk's episode return
minus the mean of its block of ``group_size`` envs, which replay the same episode. Per PPO minibatch:

    L = L_PPO(rollout) + sft_coef * l_head(demonstrations) + sil_coef * l_head(own successful chunks)

Self-imitation (``sil_coef > 0``, after Oh et al. 2018 with the episode's success as the filter in place of
``(R - V)+``) also adds ``sil_steps`` imitation-only steps after the passes. For the first ``critic_warmup`` updates
only the value function trains, so a policy loaded from BC is not moved by an unfitted critic's advantages.

``update`` takes ``{"rollout": ChunkCollector.collect(), "demos": ..., "own": ...}``: ``demos`` holds
``batches_per_update()["demos"]`` demonstration batches stacked (the anchor, then one per imitation-only step),
``own`` as many batches of own successful chunks as ``batches_per_update()["own"]`` says (one per PPO minibatch,
then one per imitation-only step), or None while there are none. Shape letters: S = T*N rollout rows, B batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.vla_bc import VLA_INIT_FROM, VLA_RUN_DEFAULTS
from ctrl_rl.core.nets import mlp
from ctrl_rl.core.obs import Obs
from ctrl_rl.core.returns import gae, group_relative_advantages
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.vla.data import split_rows
from ctrl_rl.vla.heads import RegressionHead
from ctrl_rl.vla.model import SHAPE_FIELDS, VLAModel, VLAModelConfig


@dataclass(frozen=True)
class VLARLConfig(VLAModelConfig):
    """The VLA model's fields (``VLAModelConfig``) and PPO on chunks with the SFT anchor and self-imitation."""

    init_log_std: float = -1.5
    """Log standard deviation of the regression head's Gaussian at the start and after ``--init`` (normalised
    action units; imitation never trains it)."""
    flow_sigma: float = 0.1
    """Noise of the flow chain's Euler steps (its likelihood)."""
    advantage: Literal["gae", "group"] = "gae"
    """``gae`` from the value function over chunks; ``group`` from episode returns against the mean of
    ``group_size`` envs that replay the same episode (the critic is then not trained; a rollout must hold whole
    episodes)."""
    group_size: int = 4
    """Envs per group with ``--advantage group`` (they share placements: the env's ``group_size`` option)."""
    gamma: float = 0.99
    """Discount per env step."""
    gae_lambda: float = 0.95
    """GAE lambda over chunks."""
    clip_ratio: float = 0.2
    """PPO ratio clip."""
    ppo_epochs: int = 2
    """Passes over a rollout per update (0: no policy-gradient passes; with ``sil_steps`` the policy then learns
    only by imitating its own successes beside the demonstrations, a success-filtered BC)."""
    ppo_minibatches: int = 2
    """Minibatches per pass."""
    target_kl: float = 0.0
    """Stop an update's policy passes at the first minibatch whose approximate KL to the rollout policy exceeds
    1.5 x this (0: off; full fine-tuning of a chunk likelihood over H x A dims moves it fast)."""
    value_epochs: int = 4
    """Passes of the value function over a rollout per update (the same minibatches; it is a small MLP)."""
    critic_warmup: int = 0
    """Updates at the start that train only the value function: the policy loaded by ``--init`` acts unchanged
    until its advantages come from a fitted critic rather than a random one."""
    ent_coef: float = 0.0
    """Entropy bonus (regression head only; the others have no closed form)."""
    sft_coef: float = 0.2
    """beta of the SFT anchor on demonstrations (RLinf-Co's example weight)."""
    sil_coef: float = 0.0
    """Weight of self-imitation: the head's imitation loss on chunks of the policy's own successful episodes (a
    FIFO of ``sil_capacity`` chunks; 0: off). A fresh batch of them joins every PPO minibatch."""
    sil_steps: int = 0
    """Imitation-only steps per update after the PPO passes (Oh et al.'s M SIL updates per iteration): each on a
    fresh batch of own successes (weight ``sil_coef``) and of demonstrations (weight ``sft_coef``); no KL stop."""
    sil_capacity: int = 10000
    """Chunks the self-imitation buffer keeps (the oldest leave first)."""
    critic_lr: float = 1e-3
    """Adam learning rate of the value function."""
    critic_hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of the value function."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("ppo_minibatches", "value_epochs", "group_size", "sil_capacity"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: "
                                     "expected a positive integer")
        for name in ("critic_warmup", "sil_steps", "ppo_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: expected a "
                                     "non-negative integer")
        if not self.sil_coef >= 0:
            raise UserInputError(f"invalid --sil-coef {self.sil_coef!r}: expected a non-negative number (0: off)")
        if self.sil_steps > 0 and self.sil_coef == 0:
            raise UserInputError(f"invalid --sil-steps {self.sil_steps} with --sil-coef 0: expected a positive "
                                 "--sil-coef, since the imitation-only steps are part of self-imitation")
        if self.ppo_epochs == 0 and not (self.sil_coef > 0 and self.sil_steps > 0):
            raise UserInputError(f"invalid --ppo-epochs 0 with --sil-coef {self.sil_coef} and --sil-steps "
                                 f"{self.sil_steps}: expected both positive, since without policy-gradient passes "
                                 "only the self-imitation steps train the policy")
        if not self.target_kl >= 0:
            raise UserInputError(f"invalid --target-kl {self.target_kl!r}: expected a non-negative number (0: off)")
        if not self.flow_sigma > 0:
            raise UserInputError(f"invalid --flow-sigma {self.flow_sigma!r}: expected a positive noise (the flow "
                                 "chain's likelihood needs it)")


class VLARL:
    """A ``VLAModel`` trained by PPO on chunks (module docstring), with its value function."""

    def __init__(self, config: VLARLConfig, spec: EnvSpec, device: torch.device, generator: torch.Generator):
        c = self.config = config
        self.spec, self.gen = spec, generator
        self.model = VLAModel(c, spec, device, init_log_std=c.init_log_std)
        O = next(p for p in spec.parts if p.name == "state").shape[0]
        self.value = mlp(O, c.critic_hidden, 1).to(self.model.device)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=c.critic_lr)
        self.updates = 0

    # ----- what the chunk-rollouts loop reads (vla.rollouts.ChunkLearner) -----

    @property
    def execute(self) -> int:
        return self.model.execute

    @property
    def discount(self) -> float:
        return self.config.gamma

    @property
    def episode_groups(self) -> int | None:
        return self.config.group_size if self.config.advantage == "group" else None

    @property
    def success_capacity(self) -> int | None:
        return self.config.sil_capacity if self.config.sil_coef > 0 else None

    def _imitation_steps(self) -> int:
        return self.config.sil_steps if self.config.sil_coef > 0 else 0

    def batches_per_update(self) -> dict[str, int]:
        c, k = self.config, self._imitation_steps()
        return {"demos": 1 + k, "own": c.ppo_epochs * c.ppo_minibatches + k if c.sil_coef > 0 else 0}

    @torch.no_grad()
    def sample_chunk(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        self.model.policy.eval()
        x, stored, logp = self.model.policy.sample(self.model.prefix_from_obs(obs), self.gen, False,
                                                   self.config.flow_sigma)
        assert logp is not None  # a sampled chunk (flow_sigma > 0) has a likelihood
        return x, stored, logp, self.state_value(obs["state"])

    @torch.no_grad()
    def state_value(self, state: torch.Tensor) -> torch.Tensor:
        return self.value(state.float()).squeeze(-1)  # [N]

    def to_actions(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.to_actions(x)

    def start_from(self, policy_state: dict[str, Any]) -> None:
        """Another run's policy; the regression head's noise back to ``init_log_std`` (imitation never trains it)."""
        self.model.policy.load_state_dict(policy_state)
        head = self.model.policy.head
        if isinstance(head, RegressionHead):
            with torch.no_grad():
                head.log_std.fill_(self.config.init_log_std)

    # ----- update -----

    def advantages(self, ro: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(advantage [S], return [S])`` of a rollout: GAE over chunks (the return is the value target), or
        group-relative episode returns (no return: the critic is not trained)."""
        c = self.config
        if c.advantage == "group":
            try:
                adv = group_relative_advantages(ro["raw_reward"], ro["ended"], c.group_size)  # [T,N]
            except ValueError as e:
                raise UserInputError(f"--advantage group cannot pair the episodes of a rollout ({e}): expected "
                                     "episodes of one fixed length that end together "
                                     "(no terminate_on_success)") from None
            return adv.flatten(), None
        value = ro["value"]  # [T,N]
        next_value = torch.cat([value[1:], ro["last_value"][None]])  # [T,N]
        ended = ro["ended"]  # [T,N] bool: truncation already bootstrapped inside the reward
        adv, ret = gae(ro["reward"], value, next_value, ended, ended, c.gamma ** self.execute, c.gae_lambda)
        return adv.flatten(), ret.flatten()

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """PPO passes over the rollout with the SFT anchor (and self-imitation), the imitation-only steps, then the
        value function's passes; during the first ``critic_warmup`` updates only the value function trains."""
        c = self.config
        ro = batch["rollout"]
        adv, ret = self.advantages(ro)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)  # [S]
        demos = split_rows(batch["demos"], 1 + self._imitation_steps())
        own = batch.get("own")
        own_parts = None if own is None else split_rows(own, self.batches_per_update()["own"])
        self.model.policy.train()
        out: dict[str, torch.Tensor] = {}
        if self.updates >= c.critic_warmup:
            out.update(self._ppo(ro, adv, demos[0], own_parts))
            out.update(self._imitate(demos[1:], own_parts))
        self.updates += 1
        if ret is not None:
            out.update(self._fit_value(ro["obs"]["state"].float(), ret))
        return out

    def _ppo(self, ro: dict, adv: torch.Tensor, demos: dict, own_parts: list[dict] | None) -> dict[str, torch.Tensor]:
        c, policy = self.config, self.model.policy
        stats, stop = [], False
        for i, idx in enumerate(self._minibatches(adv.shape[0], c.ppo_epochs, adv.device)):
            obs = {k: v[idx] for k, v in ro["obs"].items()}
            logp = policy.log_prob(self.model.prefix_from_obs(obs), _index(ro["stored"], idx), c.flow_sigma)  # [b]
            ratio = torch.exp(logp - ro["log_prob"][idx])
            a = adv[idx]
            l_pg = -torch.min(ratio * a, ratio.clamp(1 - c.clip_ratio, 1 + c.clip_ratio) * a).mean()
            l_sft = self.model.imitation_loss(demos, None, self.gen)
            l_sil = self._own_loss(None if own_parts is None else own_parts[i], adv.device)
            loss = l_pg + c.sft_coef * l_sft + c.sil_coef * l_sil
            ent = torch.zeros((), device=adv.device)
            if c.ent_coef > 0 and isinstance(policy.head, RegressionHead):
                ent = policy.head.entropy()
                loss = loss - c.ent_coef * ent
            with torch.no_grad():
                kl = ((ratio - 1) - torch.log(ratio)).mean()
                clip = ((ratio - 1).abs() > c.clip_ratio).float().mean()
            stop = c.target_kl > 0 and float(kl) > 1.5 * c.target_kl  # then this minibatch's step is not taken
            norm = torch.zeros((), device=adv.device) if stop else self.model.step(loss)
            stats.append(torch.stack([l_pg.detach(), l_sft.detach(), kl, clip, norm.detach(), ent.detach(),
                                      l_sil.detach()]))
            if stop:
                break
        keys = ("loss/policy", "loss/sft", "stats/approx_kl", "stats/clip_frac", "stats/grad_norm", "stats/entropy",
                "loss/self_imitation")
        out: dict[str, torch.Tensor] = dict(zip(keys, torch.stack(stats).mean(0))) if stats else {}  # none: 0 epochs
        out["stats/policy_steps"] = torch.tensor(float(len(stats) - stop))
        return out

    def _imitate(self, demos: list[dict], own_parts: list[dict] | None) -> dict[str, torch.Tensor]:
        """The imitation-only steps: own successes (weight ``sil_coef``) and demonstrations (``sft_coef``)."""
        c = self.config
        if own_parts is None or not demos:
            return {}
        P = c.ppo_epochs * c.ppo_minibatches
        losses = []
        for j, d in enumerate(demos):
            l_own = self._own_loss(own_parts[P + j], d["chunk"].device)
            l_sft = self.model.imitation_loss(d, None, self.gen)
            self.model.step(c.sil_coef * l_own + c.sft_coef * l_sft)
            losses.append(l_own.detach())
        return {"loss/self_imitation_steps": torch.stack(losses).mean()}

    def _own_loss(self, mine: dict | None, device) -> torch.Tensor:
        """The head's imitation loss on a batch of the policy's own successful chunks (0 without one)."""
        if mine is None:
            return torch.zeros((), device=device)
        return self.model.policy.loss(self.model.prefix_from_obs(mine["obs"]), mine["chunk"], None, self.gen)

    def _fit_value(self, state: torch.Tensor, ret: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():  # on this rollout before fitting it: how well the critic predicts fresh returns
            explained = 1 - (ret - self.value(state).squeeze(-1)).var() / ret.var().clamp_min(1e-8)
        losses = []
        for idx in self._minibatches(ret.shape[0], self.config.value_epochs, ret.device):
            l_v = 0.5 * ((self.value(state[idx]).squeeze(-1) - ret[idx]) ** 2).mean()
            self.value_opt.zero_grad(set_to_none=True)
            l_v.backward()
            self.value_opt.step()
            losses.append(l_v.detach())
        return {"loss/value": torch.stack(losses).mean(), "stats/value_explained_var": explained}

    def _minibatches(self, S: int, epochs: int, device):
        """Row indices of ``ppo_minibatches`` minibatches per epoch, a fresh permutation of ``S`` rows each epoch
        (drawn lazily, so a stop part-way draws no more)."""
        for _ in range(epochs):
            yield from torch.randperm(S, generator=self.gen, device=device).chunk(self.config.ppo_minibatches)

    # ----- acting (evaluation, deployment in Python) -----

    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        return self.model.act(obs, deterministic, self.gen, self.config.flow_sigma)

    def reset_state(self, n: int) -> None:
        self.model.reset_state(n)

    def observe(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        self.model.observe(reward, done)

    def exportable(self) -> nn.Module:
        return self.model.exportable()

    def parameters_finite(self) -> bool:
        return self.model.parameters_finite()

    # ----- state -----

    def state_dict(self) -> dict[str, Any]:
        return {**self.model.state_dict(), "updates": self.updates, "value": self.value.state_dict(),
                "value_opt": self.value_opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)
        self.updates = state["updates"]
        self.value.load_state_dict(state["value"])
        self.value_opt.load_state_dict(state["value_opt"])


def _index(stored, idx):
    return stored[idx] if isinstance(stored, torch.Tensor) else None


register(AlgoEntry(
    "vla_rl", VLARLConfig, VLARL, regime="chunk-rollouts",
    summary="VLA RL: PPO on action chunks in a simulator with an SFT anchor on demonstrations and self-imitation",
    requires_dataset=True, init_from=VLA_INIT_FROM, init_fields=SHAPE_FIELDS,
    run_defaults={**VLA_RUN_DEFAULTS, "num_envs": 4}))
