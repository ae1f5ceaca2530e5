"""Conservative Q-Learning (CQL) and Cal-QL as WSRL pre-trains them, on SAC's networks.

Papers: Kumar et al. 2020 ("Conservative Q-Learning for Offline RL"); Nakamoto et al. 2023 ("Cal-QL");
Zhou et al. 2025 (WSRL), whose code (zhouzypaul/wsrl @ 891ee35, ``wsrl/agents/cql.py``,
``experiments/configs/{cql,sac,train,ensemble}_config.py``) this follows. docs/algorithms/cql.md.

Per batch (s, a, r, s', terminated), a clipped to +-action_clip, M = target_subset critics drawn once:

    TD:   a'_k ~ pi(.|s'), k = 1..Kt (Kt = K with max_target_backup, else 1)
          y = r + gamma (1 - terminated) max_k [min_{i in M} Qbar_i(s', a'_k) - [backup_entropy] alpha log pi(a'_k|s')]
          L_TD = mean_i mean_B (Q_i(s, a) - y)^2                              (all E critics)
    CQL:  30 = 3K actions per state s, [uniform U[-1,1]^A | pi(.|s) | pi(.|s')], all evaluated at s,
          log density [A log 0.5 | log pi(.|s) | log pi(.|s')]
          Cal-QL: Q_i(s, a_pi) <- max(Q_i(s, a_pi), G_mc(s)) for the 2K policy samples (not the uniform ones)
          ood_i = logsumexp_k (Q_i(s, a_k) - log density_k)                  (importance sampling)
                  [no IS: logsumexp over the 3K samples and Q_i(s, a) minus log(3K + 1)]
          diff_i = ood_i - Q_i(s, a),  i in the same M critics as the TD target
          L_Q = L_TD + alpha_cql mean(diff)                   (fixed)
              = L_TD + lambda (mean(diff) - target_gap)       (lagrange; lambda = softplus(raw), detached here)
          L_lambda = -lambda (mean(diff).detach() - target_gap)   (lambda grows while the gap is exceeded)
    Actor, temperature: SAC's steps (ctrl_rl.algos.sac), actor on the min over all E critics.

Why composition: CQL *has* a SAC (``self.sac``) that owns actor, critic ensemble, targets, temperature and their
optimizers; CQL adds only its critic step and the Lagrange multiplier. ``state_dict()`` is SAC's plus two keys,
so a CQL checkpoint loads into ``SAC`` unchanged (WSRL's point, docs/algorithms/wsrl.md) without a subclass overriding
SAC's steps.
``actor``, ``critic``, ``critic_target``, ``log_alpha`` and ``gen`` are the SAC's own objects.

Cal-QL batches carry the Monte-Carlo return-to-go: ``MCTransition`` (a Transition with ``mc_return [B]``), with
``mc_return`` from ``dataset_mc_returns(dataset, gamma)``, which is aligned with ``to_replay(dataset)``'s rows
(gather it with the same indices: ``buf.sample_indices`` then ``buf.gather`` and ``mc[idx]``).

Deliberate deviations from WSRL's code: (1) the CQL term uses the same M critics as the TD target, drawn without
replacement (the code draws a second, independent subset with ``randint``, i.e. with replacement); (2) only those
M critics are evaluated on the 3K samples and only M target critics on the Kt next actions, through
``ensemble_forward`` (the code evaluates all E and discards E - M: same values, 5x the work at E = 10);
(3) steps are sequential as in ctrl_rl's SAC (critic, then actor on the updated critic, then temperature on the
actor's log pi(.|s)); the code computes all losses from the pre-update parameters and tunes the temperature on
log pi(.|s'); (4) the Lagrange loss reuses the critic step's diff instead of re-sampling; (5) the log-std clamp
is SAC's [-5, 2] (the code clips std to [1e-5, 10]) and EnsembleMLP layers start with nn.Linear's init (the code:
orthogonal sqrt 2); ``final_hidden_scale`` multiplies the initial weights (and the critics' biases) of the last
hidden layer, the code's ``kernel_scale_final`` (near no-op under LayerNorm); (6) cql_clip_diff (+-inf in every
WSRL config) and cql_temp (1.0) are not settings.

``--seeds`` (``core.seeds``): the update counts dimensions from the end, so the same code trains S seeds at once;
every batch tensor may carry a leading ``[S]`` (written ``[*S,...]``), each seed draws its subset and samples from
its own generator, and every info value then holds one figure per seed.

Shape letters: S seeds, E critics, M subset, B batch, K samples per kind, O obs dim, A action dim.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.algos.sac import SAC, SEED_LAYOUT, SACConfig
from ctrl_rl.algos.wsrl import WSRL_SAC
from ctrl_rl.core.distributions import tanh_normal_sample
from ctrl_rl.core.nets import EnsembleLinear, EnsembleMLP
from ctrl_rl.core.obs import Obs
from ctrl_rl.core.returns import polyak_
from ctrl_rl.core.seeds import SeedLayout, rand, randperm, select_members
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.offline import OfflineDataset


@dataclass(frozen=True)
class CQLConfig(SACConfig):
    """CQL/Cal-QL hyperparameters: SAC's fields plus CQL's. ``ctrl-rl train cql|calql`` starts from WSRL's
    locomotion pre-training (``locomotion_cql`` with ``--use_redq``, docs/algorithms/cql.md#defaults): SAC's fields from
    ``WSRL_SAC`` (10 critics, subset 2, LayerNorm, ...), set by the registry entries below
    (``registry.get("cql").default_config()``); the class defaults of the CQL fields are WSRL's."""

    alpha_cql: float = 5.0
    """Fixed CQL weight (WSRL locomotion ``cql_alpha`` 5.0); unused with ``lagrange``."""
    lagrange: bool = False
    """Tune the CQL weight as a Lagrange multiplier towards ``target_gap`` (WSRL ``cql_autotune_alpha``; antmaze)."""
    target_gap: float = 1.0
    """Lagrange: allowed mean(ood - Q_data) (WSRL default 1.0; antmaze 0.8)."""
    lagrange_lr: float = 3e-4
    """Lagrange multiplier Adam learning rate (WSRL 3e-4)."""
    lagrange_init: float = 1.0
    """Initial multiplier, softplus-parameterised (WSRL ``cql_alpha_lagrange_init`` 1.0)."""
    num_cql_samples: int = 10
    """K: actions of each kind (uniform, pi(s), pi(s')) per state; also the max-backup samples (WSRL 10)."""
    importance_sampling: bool = True
    """Subtract the log sampling densities inside the logsumexp (WSRL ``cql_importance_sample`` True)."""
    max_target_backup: bool = True
    """Target: max over K next actions of the subset-min (WSRL ``cql_max_target_backup`` True)."""
    calql: bool = False
    """Cal-QL: lower-bound the policy samples' Q by the Monte-Carlo return (batches must be MCTransition)."""
    action_clip: float = 0.99999
    """Batch actions are clipped to +-this inside tanh's open range (WSRL ``--clip_action``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.crossq or self.actor_batch_renorm:
            raise ValueError("invalid CQL setting: crossq / actor_batch_renorm are not supported "
                             "(CQL uses target critics)")
        if self.edac_eta != 0 or self.critic_reduction != "mean":
            raise ValueError("invalid CQL setting: edac_eta and critic_reduction shape SAC's critic loss, and CQL has "
                             "its own: expected edac_eta 0 and critic_reduction 'mean'")
        if self.update_order != "critic_first":
            raise UserInputError(f"invalid --update-order {self.update_order!r} for CQL: its update runs the critic "
                                 "step first (expected 'critic_first')")
        if self.num_cql_samples < 1:
            raise ValueError("invalid CQL setting: expected num_cql_samples >= 1")
        if self.lagrange_init <= 0 or self.alpha_cql < 0 or not 0 < self.action_clip <= 1:
            raise ValueError("invalid CQL setting: expected lagrange_init > 0, alpha_cql >= 0, 0 < action_clip <= 1")

    def sac_config(self, **overrides) -> SACConfig:
        """The SACConfig with this config's SAC fields (the networks a CQL checkpoint loads into), plus overrides."""
        names = SACConfig.__dataclass_fields__.keys()
        return SACConfig(**{**{k: getattr(self, k) for k in names}, **overrides})


@dataclass
class MCTransition(Transition):
    """Transitions with the Monte-Carlo return-to-go of their state (Cal-QL)."""

    mc_return: torch.Tensor  # [B] discounted return-to-go from obs in the dataset trajectory


# ----- pure functions -----

def discounted_returns_to_go(reward: torch.Tensor, episode_offsets: torch.Tensor, gamma: float,
                             sparse_negative_reward: float | None = None) -> torch.Tensor:
    """``G_t = r_t + gamma G_{t+1}`` within each episode ``offsets[k]:offsets[k+1]``, ``G = 0`` after its last row.

    ``reward [S]``, ``episode_offsets [K+1]`` -> ``[S]`` float32 (accumulated in float64). An episode ends at a
    termination or at its last stored row; a time-limited (truncated) episode has no bootstrap value here, so its
    tail is summed as stored, exactly as WSRL/Cal-QL's ``calc_return_to_go`` (masks zero only at terminals, and the
    trajectory ends where the data ends). ``sparse_negative_reward``: an episode whose rewards all equal it gets
    ``r_neg / (1 - gamma)`` everywhere (the code's rule for all-failure sparse episodes). Load-time helper (loop).
    """
    r = reward.double().tolist()
    ends = set(episode_offsets[1:].tolist())
    out = [0.0] * len(r)
    g = 0.0
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gamma * (0.0 if t + 1 in ends else g)
        out[t] = g
    G = torch.tensor(out, dtype=torch.float64)  # [S]
    if sparse_negative_reward is not None:
        lengths = episode_offsets.diff()  # [K]
        ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)  # [S]
        fails = torch.zeros(lengths.numel(), dtype=torch.long).index_add_(0, ids,
                                                                         (reward != sparse_negative_reward).long())
        G = torch.where(fails[ids] == 0, torch.full_like(G, sparse_negative_reward / (1 - gamma)), G)
    return G.float()


def dataset_mc_returns(dataset: OfflineDataset, gamma: float,
                       sparse_negative_reward: float | None = None) -> torch.Tensor:
    """Returns-to-go of the rows ``to_replay(dataset)`` keeps (rows with a known next observation), in its order:
    computed over the kept rows of each episode, as WSRL computes them over d4rl.qlearning_dataset's rows."""
    keep = dataset.next_obs_valid  # [S]
    counts = torch.zeros(dataset.num_episodes, dtype=torch.long).index_add_(
        0, dataset.episode_ids()[keep], torch.ones(int(keep.sum()), dtype=torch.long))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])  # [K+1]
    return discounted_returns_to_go(dataset.reward[keep], offsets, gamma, sparse_negative_reward)


def _member_affine(bias: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``baddbmm`` of ``[*S,M,1,out]``, ``[*S,M,B,in]``, ``[*S,M,in,out]`` -> ``[*S,M,B,out]``: seed-batched, one
    ``baddbmm`` over S*M, except a single member at width 1, which alone takes the matrix-vector path (one call per
    seed, ``core.seeds``)."""
    if h.dim() == 3:
        return torch.baddbmm(bias, h, weight)  # [M,B,out]
    if h.shape[1] == 1 and weight.shape[-1] == 1:
        return torch.stack([torch.baddbmm(b, x, w) for b, x, w in zip(bias, h, weight)])  # [S,1,B,1]
    y = torch.baddbmm(bias.flatten(0, 1), h.flatten(0, 1), weight.flatten(0, 1))  # [S*M,B,out]
    return y.view(*h.shape[:2], *y.shape[1:])  # [S,M,B,out]


def ensemble_forward(net: EnsembleMLP, x: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """``net(x)[members]`` computed for those members only: ``x [*S,B,in]``, ``members [*S,M]`` -> ``[*S,M,B,out]``
    (gradients reach the stacked parameters through index_select). Mirrors EnsembleMLP.forward without
    BatchRenorm."""
    assert net.renorms is None, "ensemble_forward does not support BatchRenorm critics"
    M, last = members.shape[-1], len(net.layers) - 1
    h = x.unsqueeze(-3).expand(*x.shape[:-2], M, *x.shape[-2:])  # [*S,M,B,in]
    for i, module in enumerate(net.layers):
        layer = cast(EnsembleLinear, module)  # an EnsembleMLP's layers (ModuleList items are typed Module)
        h = _member_affine(select_members(layer.bias, members), h, select_members(layer.weight, members))  # [*S,M,B,h]
        if i < last:
            if net.norm_scale is not None and net.norm_shift is not None:  # both set together (layer_norm)
                h = nn.functional.layer_norm(h, h.shape[-1:]) * select_members(net.norm_scale[i], members) \
                    + select_members(net.norm_shift[i], members)
            h = net.act(h)
    return h


def calql_lower_bound(q_samples: torch.Tensor, mc_return: torch.Tensor, num_random: int) -> torch.Tensor:
    """``q_samples [*S,M,B,N]`` ordered [uniform | policy samples], ``mc_return [*S,B]``: ``max(Q, G_mc)`` on the
    policy samples (the last ``N - num_random``), the uniform ones untouched (WSRL
    ``calql_bound_random_actions=False``)."""
    bound = mc_return.unsqueeze(-1).expand(*mc_return.shape, q_samples.shape[-1]).clone()  # [*S,B,N]
    bound[..., :num_random] = -math.inf
    return torch.maximum(q_samples, bound.unsqueeze(-3))


def cql_regularizer(q_samples: torch.Tensor, q_data: torch.Tensor, log_density: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """CQL's ``(diff [*S,M,B], ood [*S,M,B])`` from ``q_samples [*S,M,B,N]``, ``q_data [*S,M,B]`` and
    ``log_density [*S,B,N]``.

    With ``log_density`` (importance sampling): ``ood = logsumexp_n (Q_n - log q_n)``; without:
    ``ood = logsumexp over the N samples and Q_data, minus log(N + 1)``. ``diff = ood - Q_data``.
    """
    if log_density is not None:
        ood = torch.logsumexp(q_samples - log_density.unsqueeze(-3), -1)  # [*S,M,B]
    else:
        vals = torch.cat([q_samples, q_data.unsqueeze(-1)], -1)  # [*S,M,B,N+1]
        ood = torch.logsumexp(vals, -1) - math.log(vals.shape[-1])  # [*S,M,B]
    return ood - q_data, ood


def max_backup_target(q_next: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor, next_logp: torch.Tensor,
                      alpha: torch.Tensor, gamma: float, backup_entropy: bool) -> torch.Tensor:
    """``q_next [*S,M,B,Kt]`` of the subset target critics at Kt next actions, ``reward [*S,B]``, ``terminated
    [*S,B]``, ``next_logp [*S,B,Kt]``, ``alpha [*S]`` -> ``y [*S,B]``: SAC's target (``core.losses.td_target``) per
    sample with the subset-min, ``r + gamma (1 - terminated) (min_M Q - [backup_entropy] alpha log pi)``, then the
    max over samples (y is increasing in the backed-up value, so max_k y_k is r + gamma max_k Q_k)."""
    q_t = q_next.min(-3).values  # [*S,B,Kt]
    if backup_entropy:
        q_t = q_t - alpha[..., None, None] * next_logp
    y = reward.unsqueeze(-1) + gamma * (~terminated).to(reward.dtype).unsqueeze(-1) * q_t  # [*S,B,Kt]
    return y.max(-1).values


# ----- networks -----

class CQL:
    """CQL / Cal-QL: owns a SAC (actor, critics, targets, temperature) and the CQL Lagrange multiplier."""

    name = "cql"  # "calql" on instances with config.calql

    def __init__(self, config: CQLConfig, spec: EnvSpec, device: torch.device | str = "cpu",
                 generator: torch.Generator | None = None):
        if not isinstance(config, CQLConfig):
            raise TypeError(f"CQL needs a CQLConfig, got {type(config).__name__}")
        if not spec.is_flat:
            raise UserInputError(f"CQL takes flat state observations: env {spec.env_id!r} has the parts "
                                 f"{[q.name for q in spec.parts]} "
                                 "(expected a state-vector env; PPO and SAC learn from images)")
        if spec.discrete:
            raise ValueError(f"CQL needs continuous actions; {spec.env_id} has discrete actions")
        self.config, self.spec = config, spec
        self.name = "calql" if config.calql else "cql"
        self.sac = SAC(config, spec, device, generator)
        s = self.sac
        self.device, self.gen = s.device, s.gen
        assert s.critic_target is not None  # a target network: CQL rejects crossq
        self.actor, self.critic, self.critic_target, self.log_alpha = s.actor, s.critic, s.critic_target, s.log_alpha
        self._tgt, self._src = list(self.critic_target.parameters()), list(self.critic.parameters())
        self._log_q_uniform = spec.action_dim * math.log(0.5)
        self.lagrange_raw = self.lagrange_opt = None
        self._alpha_cql = torch.tensor(config.alpha_cql, device=self.device)
        if config.lagrange:  # softplus(raw) = init
            raw = math.log(math.expm1(config.lagrange_init))
            self.lagrange_raw = torch.tensor(raw, device=self.device, requires_grad=True)
            self.lagrange_opt = torch.optim.Adam([self.lagrange_raw], lr=config.lagrange_lr)
        if config.compile:
            self.update_critic = torch.compile(self.update_critic)

    @property
    def alpha(self) -> torch.Tensor:
        return self.sac.alpha

    @property
    def cql_weight(self) -> torch.Tensor:
        """The CQL weight: softplus(raw multiplier) with ``lagrange``, else ``alpha_cql`` (detached)."""
        if self.lagrange_raw is None:
            return self._alpha_cql
        return nn.functional.softplus(self.lagrange_raw.detach())

    def q(self, net: EnsembleMLP, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.sac.q(net, obs, action)  # [*S,E,B]

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        return self.sac.act(obs, deterministic)

    def exportable(self) -> nn.Module:
        return self.sac.exportable()

    def critic_losses(self, batch: Transition) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """Critic loss ``[*S]``, info and the detached mean CQL diff ``[*S]``. Random draws, in order: the subset
        (randperm), one Gaussian draw ``[B,2K+Kt,A]`` for [pi(s) K | pi(s') K | target pi(s') Kt], then uniform
        ``[B,K,A]``."""
        c = self.config
        obs, next_obs = batch.obs, batch.next_obs
        assert isinstance(obs, torch.Tensor) and isinstance(next_obs, torch.Tensor)  # CQL takes flat observations
        lead, (B, A), O = batch.action.shape[:-2], batch.action.shape[-2:], obs.shape[-1]
        assert obs.shape[:-1] == (*lead, B) and batch.reward.shape == (*lead, B), \
            "expected obs [*S,B,O], action [*S,B,A], reward [*S,B]"
        K, Kt = c.num_cql_samples, (c.num_cql_samples if c.max_target_backup else 1)
        action = batch.action.clamp(-c.action_clip, c.action_clip)  # [*S,B,A]
        subset = randperm(c.num_critics, self.gen, self.device)[..., : c.target_subset]  # [*S,M]
        with torch.no_grad():
            mean, log_std = self.actor(torch.cat([obs, next_obs], -2))  # [*S,2B,A] each

            def per_sample(t: torch.Tensor) -> torch.Tensor:  # [*S,2B,A] -> [*S,B,2K+Kt,A]: pi(s) K | pi(s') K + Kt
                return torch.cat([t[..., :B, None, :].expand(*lead, B, K, A),
                                  t[..., B:, None, :].expand(*lead, B, K + Kt, A)], -2)

            # [*S,B,2K+Kt,A], [*S,B,2K+Kt]
            a_pi, logp_pi = tanh_normal_sample(per_sample(mean), per_sample(log_std), self.gen)
            a_rand = rand((*lead, B, K, A), self.gen, self.device) * 2 - 1  # [*S,B,K,A]
            a_t, logp_t = a_pi[..., 2 * K:, :], logp_pi[..., 2 * K:]  # [*S,B,Kt,A], [*S,B,Kt]
            nxt = torch.cat([next_obs[..., None, :].expand(*lead, B, Kt, O), a_t], -1).reshape(*lead, B * Kt, -1)
            q_next = ensemble_forward(self.critic_target, nxt, subset).view(*lead, -1, B, Kt)  # [*S,M,B,Kt]
            y = max_backup_target(q_next, batch.reward, batch.terminated, logp_t, self.alpha, c.gamma,
                                  c.backup_entropy)  # [*S,B]
        q = self.q(self.critic, obs, action)  # [*S,E,B]
        td = (q - y.unsqueeze(-2)).square().mean((-2, -1))  # [*S]
        samples = torch.cat([a_rand, a_pi[..., : 2 * K, :]], -2)  # [*S,B,3K,A]: uniform | pi(s) | pi(s')
        x = torch.cat([obs[..., None, :].expand(*lead, B, 3 * K, O), samples], -1).reshape(*lead, B * 3 * K, -1)
        q_samples = ensemble_forward(self.critic, x, subset).view(*lead, -1, B, 3 * K)  # [*S,M,B,3K]
        info = {}
        if c.calql:
            mc = getattr(batch, "mc_return", None)
            if mc is None or mc.shape != (*lead, B):
                raise ValueError("Cal-QL needs batches with mc_return [B] (MCTransition; see dataset_mc_returns)")
            info["stats/calql_bound_rate"] = (q_samples[..., K:].detach() < mc[..., None, :, None]).float().mean(
                (-3, -2, -1))
            q_samples = calql_lower_bound(q_samples, mc, K)
        log_density = None
        if c.importance_sampling:
            uniform = torch.full((*lead, B, K), self._log_q_uniform, device=self.device)  # [*S,B,K]
            log_density = torch.cat([uniform, logp_pi[..., : 2 * K]], -1)  # [*S,B,3K]
        diff, ood = cql_regularizer(q_samples, select_members(q, subset), log_density)  # [*S,M,B] each
        diff_mean = diff.mean((-2, -1))  # [*S]
        weight = self.cql_weight  # [] (fixed) or [*S] (lagrange)
        cql = diff_mean - c.target_gap if c.lagrange else diff_mean
        loss = td + weight * cql  # [*S]
        info.update({"loss/critic": loss.detach(), "loss/td": td.detach(), "loss/cql": cql.detach(),
                     "stats/q_mean": q.detach().mean((-2, -1)), "stats/target_mean": y.mean(-1),
                     "stats/cql_ood": ood.detach().mean((-2, -1)), "stats/cql_diff": diff_mean.detach(),
                     "stats/cql_weight": weight})
        return loss, info, diff_mean.detach()

    def update_critic(self, batch: Transition) -> dict[str, torch.Tensor]:
        """One critic step (TD + CQL), the Polyak target update and, with ``lagrange``, one multiplier step."""
        loss, info, diff_mean = self.critic_losses(batch)
        self.sac.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # a seed-batched update's [S] losses: each seed's gradient is its own loss's
        self.sac.critic_opt.step()
        polyak_(self._tgt, self._src, self.config.tau)
        self.sac.critic_updates += 1
        if self.lagrange_opt is not None and self.lagrange_raw is not None:  # both set together (lagrange)
            lag_loss = -nn.functional.softplus(self.lagrange_raw) * (diff_mean - self.config.target_gap)  # [*S]
            self.lagrange_opt.zero_grad(set_to_none=True)
            lag_loss.sum().backward()
            self.lagrange_opt.step()
            info["loss/cql_lagrange"] = lag_loss.detach()
        return info

    def update(self, batch: Transition) -> dict[str, torch.Tensor]:
        """One CQL critic step and, every ``policy_delay`` critic steps, SAC's actor and temperature steps.
        Returns device tensors (no host sync)."""
        info = self.update_critic(batch)
        if self.sac.critic_updates % self.config.policy_delay == 0:
            info.update(self.sac.update_actor(batch))
        return info

    def parameters_finite(self) -> bool:
        ok = self.sac.parameters_finite()
        return ok and (self.lagrange_raw is None or bool(self.lagrange_raw.isfinite()))

    def state_dict(self) -> dict:
        """SAC's state (loadable by ``SAC.load_state_dict``) plus the Lagrange multiplier and its optimizer."""
        return {**self.sac.state_dict(),
                "cql_lagrange": self.lagrange_raw.detach().clone() if self.lagrange_raw is not None else None,
                "cql_lagrange_opt": self.lagrange_opt.state_dict() if self.lagrange_opt is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.sac.load_state_dict(state)
        if self.lagrange_raw is not None and self.lagrange_opt is not None and state.get("cql_lagrange") is not None:
            with torch.no_grad():
                self.lagrange_raw.copy_(state["cql_lagrange"])
            # deep copy: torch's Optimizer.load_state_dict keeps references to the given state tensors
            self.lagrange_opt.load_state_dict(copy.deepcopy(state["cql_lagrange_opt"]))


class MCSampler:
    """Draws Cal-QL batches: the buffer's transitions with the Monte-Carlo return-to-go of each row."""

    def __init__(self, buffer, mc_return: torch.Tensor):
        self.buffer, self.mc_return = buffer, mc_return  # mc_return [S] aligned with the buffer's rows

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> MCTransition:
        idx = self.buffer.sample_indices(batch_size, generator)  # [B]
        b = self.buffer.gather(idx)
        return MCTransition(b.obs, b.action, b.reward, b.next_obs, b.terminated, b.truncated, self.mc_return[idx])


def _prepare_calql(dataset: OfflineDataset, buffer, config: CQLConfig) -> tuple[MCSampler, dict]:
    return MCSampler(buffer, dataset_mc_returns(dataset, config.gamma).to(buffer.device)), {}


_OFFLINE_RUN = {"total_steps": 250_000, "log_every": 1000, "checkpoint_every": 25_000, "eval_every": 25_000}

# --seeds (core.seeds): CQL's aliases of its SAC's objects and the multiplier; the SAC by SAC's own layout
_SEED_LAYOUT = SeedLayout(("actor", "critic", "critic_target"), each=("lagrange_opt",), lists=("_tgt", "_src"),
                          tensors=("lagrange_raw", "log_alpha"), parts=(("sac", SEED_LAYOUT),),
                          refuse=lambda c: "--compile (each seed's compiled steps are its own)" if c.compile else None)

register(AlgoEntry(
    "cql", CQLConfig, CQL, regime="offline",
    summary="Conservative Q-Learning, offline (--dataset), WSRL's pre-training settings; loads into SAC",
    config_defaults=WSRL_SAC, run_defaults=_OFFLINE_RUN, loop_defaults={"clip_actions": 0.99999},
    requires_dataset=True, seed_layout=_SEED_LAYOUT))

register(AlgoEntry(
    "calql", CQLConfig, CQL, regime="offline",
    summary="Cal-QL: CQL with the Monte-Carlo return as a lower bound, offline (--dataset)",
    config_defaults={**WSRL_SAC, "calql": True}, run_defaults=_OFFLINE_RUN, loop_defaults={"clip_actions": 0.99999},
    prepare_offline=_prepare_calql, requires_dataset=True, seed_layout=_SEED_LAYOUT))
