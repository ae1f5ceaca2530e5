"""Batched probabilistic dynamics ensemble: RAVL's (MBPO's) model by default, NeuBay's by configuration.

Papers: Sims et al. 2024 (RAVL, docs/algorithms/dynamics.md#defaults, code anyasims/edge-of-reach
``dynamics_training/``);
Ni et al. 2025 (NeuBay docs/algorithms/dynamics.md, code twni2016/neubay ``offline_world/``); the model family of PETS
(Chua et al.
2018) and MBPO (Janner et al. 2019). Every one of the E members is a Gaussian MLP over the standardised
targets y = (s' - s, r), and all members run in one batched matmul per layer (``[E,in,out]`` weights):

    x        = [clip((s - mu_s) / sd_s, +-10), clip((a - mu_a) / sd_a, +-10)]          (input statistics)
    h_{l+1}  = act(W_l h_l + b_l)          NeuBay blocks (layer_norm): act(LN(W_l h_l + b_l)) (+ h_l: residual)
    mu, raw  = W_out h + b_out             (one output layer; its last column is the termination logit if learned)
    logvar   = learned bounds (RAVL):  lo + softplus(hi - softplus(hi - raw) - lo), hi / lo per member, init 0.5 / -10
               fixed bounds (NeuBay):  2 * softclamp(raw, -5, 0.25)  (the head is log sigma)
    y_n      = (y - mu_y) / sd_y            (target statistics);   next-obs mean = s + mu_y[:O] + sd_y[:O] mu[:O]

Loss of a batch in which every member has its own rows (``loss``), summed over members:

    L = sum_e mean_{rows, dims}(logvar + (y_n - mu)^2 exp(-logvar))      (Gaussian NLL without constant)
        + 0.01 * sum_e (sum hi_e - sum lo_e)                             (learned bounds only)
        + sum_e mean_rows BCE(logit, terminated)                         (learn_termination only)

Weight decay is per linear layer, on weights only, through Adam's coupled ``weight_decay`` in per-layer parameter
groups (``make_optimizer``), exactly as RAVL's code does it; that equals adding wd/2 ||W||^2 to L.

``fit`` trains as RAVL's ``train_dynamics_model.py``: holdout split, statistics from the training split, per-member
bootstrap resample, epochs of per-member minibatches, per-member best weights on a > ``improvement`` relative drop
of holdout MSE, stop after ``patience`` epochs in which no member improved once ``min_epochs`` are done (before
that: lr x ``lr_decay`` once, then go on), restore the best weights, elites = lowest holdout MSE. A learned
termination head is kept with the weights that holdout MSE chose; it does not take part in the stopping rule.
Every variant starts from RAVL's initialisation (truncated normal, std 1 / (2 sqrt(in)), zero biases).

Deliberate deviations. From RAVL: the rows of a terminated episode's last step keep the state it ended in
(``learn.model_based.dataset_arrays``; RAVL's code fits on ``d4rl.qlearning_dataset``, which puts the next episode's
start there, so its model learns a teleport where the data falls); targets are standardised and holdout MSE
(hence elites) is measured on the standardised targets, so every output dim weighs the same (NeuBay's choice;
RAVL: raw targets); each member keeps
its own bootstrap resample (RAVL's code reassigns the E resamples among the members every epoch); one (hi, lo)
pair per member instead of one shared pair, so that restoring a member's best weights restores all of it; one
output layer instead of separate mean and logvar heads (the same function; RAVL decays both heads by 1e-4); the
best weights are restored also when ``max_epochs`` ends training (RAVL's code only on early stop). From NeuBay:
its NLL is half of ours plus a constant; its AdamW decay is decoupled, ours coupled; it standardises s' with the
statistics of s (ours: s' - s with its own), so epistemic figures differ in scale; no residual in its blocks
(``residual`` is off by default); Equinox's uniform initialisation. NeuBay's model is about
``DynamicsConfig(members=128, elites=100, layer_norm=True, activation="leaky_relu", weight_decay=(5e-5,) * 5,
max_holdout=1000, min_epochs=0, max_epochs=None, bootstrap=False, logvar_bounds="fixed")``.

Shape letters: E members, K elites, M members run, S dataset rows, N training rows, H holdout rows, B rows,
O obs dim, A action dim, I = O + A inputs, D = O + 1 outputs.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ctrl_rl.core.nets import EnsembleLinear
from ctrl_rl.core.validate import check_fields
from ctrl_rl.errors import UserInputError
from ctrl_rl.world_models.protocol import UNCERTAINTIES, ModelStep

INPUT_CLIP = 10.0
LOGVAR_PENALTY = 0.01
LOG_SIGMA_BOUNDS = (-5.0, 0.25)  # NeuBay's soft clamp of log sigma
_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "relu": F.relu, "leaky_relu": F.leaky_relu, "tanh": torch.tanh, "elu": F.elu}


@dataclass(frozen=True)
class DynamicsConfig:
    """Dynamics ensemble hyperparameters (defaults: RAVL's code, ``train_dynamics_model.py`` and ``net.py``)."""

    members: int = 7
    """E: members trained (RAVL 7; NeuBay 128)."""
    elites: int = 5
    """K: members with the lowest holdout MSE used by ``predict`` (RAVL 5; NeuBay 100)."""
    hidden: tuple[int, ...] = (200, 200, 200, 200)
    """Hidden widths of every member (RAVL and NeuBay: 4 x 200)."""
    activation: Literal["silu", "relu", "leaky_relu", "tanh", "elu"] = "silu"
    """Hidden activation (RAVL SiLU; NeuBay leaky ReLU, slope 0.01)."""
    layer_norm: bool = False
    """NeuBay's blocks: LayerNorm (per-member affine) between each hidden linear layer and its activation."""
    residual: bool = False
    """Add each hidden block's input to its output where the widths match (not in NeuBay's or RAVL's code)."""
    weight_decay: tuple[float, ...] = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
    """L2 coefficient of each linear layer's weights, the output layer last: len(hidden) + 1 values (RAVL)."""
    lr: float = 1e-3
    """Adam learning rate (RAVL and NeuBay 1e-3)."""
    batch_size: int = 256
    """Rows per member per gradient step (RAVL and NeuBay 256)."""
    holdout_ratio: float = 0.2
    """Fraction of the data held out for early stopping and elite selection (RAVL and NeuBay 0.2)."""
    max_holdout: int | None = None
    """Cap on holdout rows (None: no cap, RAVL; NeuBay 1000)."""
    patience: int = 5
    """Stop after this many epochs in which no member improved (RAVL and NeuBay 5)."""
    improvement: float = 0.01
    """A member improves when its holdout MSE drops by more than this fraction of its best (RAVL, NeuBay 1%)."""
    min_epochs: int = 350
    """No early stop before this epoch; a stall before it decays the lr once instead (RAVL 350; NeuBay 0)."""
    max_epochs: int | None = 2000
    """Epoch cap (RAVL 2000; None: until early stop, NeuBay's default)."""
    lr_decay: float = 0.3
    """Factor applied once to the lr when the holdout MSE stalls before min_epochs (RAVL: StepLR gamma 0.3)."""
    bootstrap: bool = True
    """Each member trains on its own bootstrap resample (RAVL); False: on its own permutation of all rows (NeuBay)."""
    logvar_bounds: Literal["learned", "fixed"] = "learned"
    """'learned': PETS/RAVL soft bounds with learned hi/lo (init 0.5/-10, penalty 0.01 (sum hi - sum lo));
    'fixed': NeuBay's log sigma soft-clamped to [-5, 0.25]."""
    learn_termination: bool = False
    """Train a Bernoulli termination logit per member with BCE on ``terminated`` (neither paper: they use
    hand-written termination functions)."""
    predict_chunk: int | None = None
    """Rows per chunk in ``predict`` and holdout evaluation (memory ~ 4 bytes x members run x rows x max(hidden)).
    None: 8192 member-rows per chunk on CPU (activations stay in cache; experiments/world_models/)
    and 2^18 on other devices (~200 MB per 200-wide activation)."""

    def __post_init__(self) -> None:
        try:
            check_fields(self)
        except ValueError as e:
            raise UserInputError(str(e)) from None
        hints = typing.get_type_hints(DynamicsConfig)
        for f in dataclasses.fields(self):
            v, tp = getattr(self, f.name), hints[f.name]
            if typing.get_origin(tp) is Literal and v not in typing.get_args(tp):
                _invalid(f.name, v, f"one of {list(typing.get_args(tp))}")
            if tp is bool and not isinstance(v, bool):
                _invalid(f.name, v, "True or False")
            is_int = tp is int or (typing.get_origin(tp) in (typing.Union, types.UnionType)
                                   and int in typing.get_args(tp))
            if is_int and v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                _invalid(f.name, v, "an integer")
        if self.members < 1:
            _invalid("members", self.members, "a positive number of ensemble members")
        if not 1 <= self.elites <= self.members:
            _invalid("elites", self.elites, f"1 <= elites <= members = {self.members}")
        if len(self.weight_decay) != len(self.hidden) + 1:
            raise UserInputError(f"DynamicsConfig.weight_decay has {len(self.weight_decay)} values: expected one per "
                                 f"linear layer, {len(self.hidden) + 1} for hidden={self.hidden} "
                                 "(output layer included)")
        if any(not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 for w in self.weight_decay):
            _invalid("weight_decay", self.weight_decay, "finite coefficients >= 0")
        for name in ("batch_size", "patience", "predict_chunk"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                _invalid(name, getattr(self, name), "a positive integer")
        if not 0 < self.holdout_ratio < 1:
            _invalid("holdout_ratio", self.holdout_ratio, "a fraction strictly between 0 and 1")
        if self.max_holdout is not None and self.max_holdout < 1:
            _invalid("max_holdout", self.max_holdout, "None (no cap) or a positive number of rows")
        if self.improvement < 0 or self.min_epochs < 0:
            _invalid("improvement" if self.improvement < 0 else "min_epochs",
                     self.improvement if self.improvement < 0 else self.min_epochs, "a value >= 0")
        if self.max_epochs is not None and self.max_epochs < max(1, self.min_epochs):
            _invalid("max_epochs", self.max_epochs, f"None or at least max(1, min_epochs = {self.min_epochs})")
        if not 0 < self.lr_decay <= 1:
            _invalid("lr_decay", self.lr_decay, "a factor in (0, 1]")


def _invalid(name: str, value, expected: str) -> typing.NoReturn:
    raise UserInputError(f"invalid DynamicsConfig.{name}={value!r}: expected {expected}")


def soft_clamp(x: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float) -> torch.Tensor:
    """PETS' smooth clamp of ``x`` into (lo, hi): ``lo + softplus((hi - softplus(hi - x)) - lo)``
    (gradient everywhere)."""
    x = hi - F.softplus(hi - x)
    return lo + F.softplus(x - lo)


class EnsembleDynamics(nn.Module):
    """E Gaussian MLPs over (s' - s, r) with stacked parameters; ``predict`` implements ``protocol.DynamicsModel``."""

    # buffers (register_buffer in __init__)
    obs_mean: torch.Tensor  # [O]
    obs_std: torch.Tensor  # [O]
    act_mean: torch.Tensor  # [A]
    act_std: torch.Tensor  # [A]
    target_mean: torch.Tensor  # [D]
    target_std: torch.Tensor  # [D]
    elite_ids: torch.Tensor  # [K] int64
    holdout_mse: torch.Tensor  # [E]

    def __init__(self, obs_dim: int, act_dim: int, cfg: DynamicsConfig = DynamicsConfig()):
        super().__init__()
        self.obs_dim, self.act_dim, self.cfg = obs_dim, act_dim, cfg
        E, D = cfg.members, obs_dim + 1
        self.out_dim = D
        dims = (obs_dim + act_dim, *cfg.hidden, 2 * D + int(cfg.learn_termination))
        self.layers = nn.ModuleList(EnsembleLinear(E, a, b) for a, b in zip(dims[:-1], dims[1:]))
        with torch.no_grad():  # RAVL's init: truncated normal (+-2 std), std 1 / (2 sqrt(in)), zero biases
            for layer in self.linears():
                std = 1 / (2 * math.sqrt(layer.weight.shape[1]))
                nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
                layer.bias.zero_()
        self.ln_scale = (nn.ParameterList(nn.Parameter(torch.ones(E, 1, h)) for h in cfg.hidden)
                         if cfg.layer_norm else None)
        self.ln_shift = (nn.ParameterList(nn.Parameter(torch.zeros(E, 1, h)) for h in cfg.hidden)
                         if cfg.layer_norm else None)
        learned = cfg.logvar_bounds == "learned"
        self.max_logvar = nn.Parameter(torch.full((E, 1, D), 0.5)) if learned else None  # [E,1,D]
        self.min_logvar = nn.Parameter(torch.full((E, 1, D), -10.0)) if learned else None  # [E,1,D]
        for name, n in (("obs", obs_dim), ("act", act_dim), ("target", D)):
            self.register_buffer(f"{name}_mean", torch.zeros(n))
            self.register_buffer(f"{name}_std", torch.ones(n))
        self.register_buffer("elite_ids", torch.arange(cfg.elites, dtype=torch.int64))  # [K]
        self.register_buffer("holdout_mse", torch.full((E,), math.inf))  # [E] of the kept weights (set by fit)
        self._act = _ACT[cfg.activation]

    def linears(self) -> list[EnsembleLinear]:
        """``self.layers`` typed: every entry is an ``EnsembleLinear`` (built so in ``__init__``)."""
        return [typing.cast(EnsembleLinear, layer) for layer in self.layers]  # ModuleList yields nn.Module

    # ----- the protocol's properties, saving -----

    @property
    def elites(self) -> torch.Tensor:
        return self.elite_ids

    @property
    def num_members(self) -> int:
        return self.cfg.members

    def meta(self) -> dict:
        """What ``from_meta`` needs to build an empty model that this model's ``state_dict`` loads into."""
        return {"obs_dim": self.obs_dim, "act_dim": self.act_dim, "config": dataclasses.asdict(self.cfg)}

    @classmethod
    def from_meta(cls, meta: dict) -> EnsembleDynamics:
        # JSON turns tuples to lists
        cfg: dict[str, typing.Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["config"].items()}
        return cls(meta["obs_dim"], meta["act_dim"], DynamicsConfig(**cfg))

    # ----- standardisation -----

    def inputs(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """Standardised, clipped network input ``[..., I]`` from ``obs [..., O]`` and ``act [..., A]``."""
        o = ((obs - self.obs_mean) / self.obs_std).clamp(-INPUT_CLIP, INPUT_CLIP)
        a = ((act - self.act_mean) / self.act_std).clamp(-INPUT_CLIP, INPUT_CLIP)
        return torch.cat([o, a], -1)  # [...,I]

    def targets(self, obs: torch.Tensor, next_obs: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
        """Standardised targets ``[..., D]``: (next_obs - obs, reward)."""
        y = torch.cat([next_obs - obs, reward.unsqueeze(-1)], -1)  # [...,D]
        return (y - self.target_mean) / self.target_std

    @torch.no_grad()
    def set_statistics(self, obs: torch.Tensor, act: torch.Tensor, next_obs: torch.Tensor,
                       reward: torch.Tensor) -> None:
        """Input and target mean/std from these rows (population std; a std below 1e-12 becomes 1)."""
        y = torch.cat([next_obs - obs, reward.unsqueeze(-1)], -1)  # [N,D]
        for name, x in (("obs", obs), ("act", act), ("target", y)):
            std = x.std(0, unbiased=False)
            getattr(self, f"{name}_mean").copy_(x.mean(0))
            getattr(self, f"{name}_std").copy_(torch.where(std < 1e-12, torch.ones_like(std), std))

    # ----- networks -----

    def forward(self, obs: torch.Tensor, act: torch.Tensor):
        """``obs [B,O]``, ``act [B,A]`` (shared by all members) or ``[E,B,*]`` (one batch per member) ->
        standardised ``(mean [E,B,D], logvar [E,B,D], termination logit [E,B] or None)``."""
        assert obs.shape[-1] == self.obs_dim and act.shape[-1] == self.act_dim and obs.shape[:-1] == act.shape[:-1]
        assert obs.dim() == 2 or (obs.dim() == 3 and obs.shape[0] == self.cfg.members), obs.shape
        return self.run(self.inputs(obs, act))

    def run(self, x: torch.Tensor, ids: torch.Tensor | None = None):
        """Standardised inputs ``x [B,I]`` (shared) or ``[M,B,I]`` through all members (``ids`` None) or the members
        ``ids [M]``; returns ``(mean [M,B,D], logvar [M,B,D], logit [M,B] or None)``."""
        M = self.cfg.members if ids is None else ids.shape[0]
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(M, *x.shape)  # [M,B,I] (a view)
        last = len(self.layers) - 1
        for j, layer in enumerate(self.linears()):
            w, b = (layer.weight, layer.bias) if ids is None else (layer.weight[ids], layer.bias[ids])
            h = torch.baddbmm(b, x, w)  # [M,B,out]
            if j < last:
                if self.ln_scale is not None and self.ln_shift is not None:  # both or neither (cfg.layer_norm)
                    scale, shift = self.ln_scale[j], self.ln_shift[j]  # [E,1,h]
                    if ids is not None:
                        scale, shift = scale[ids], shift[ids]
                    h = F.layer_norm(h, h.shape[-1:]) * scale + shift
                h = self._act(h)
                if self.cfg.residual and h.shape == x.shape:
                    h = h + x
            x = h
        hi, lo = self.max_logvar, self.min_logvar
        if hi is not None and lo is not None and ids is not None:  # both or neither (cfg.logvar_bounds)
            hi, lo = hi[ids], lo[ids]
        return self._heads(x, hi, lo)

    def _heads(self, out: torch.Tensor, hi: torch.Tensor | None, lo: torch.Tensor | None):
        D = self.out_dim
        mean, raw = out[..., :D], out[..., D:2 * D]  # [...,D]
        if hi is not None and lo is not None:  # learned bounds (both given, or neither)
            logvar = soft_clamp(raw, lo, hi)
        else:
            logvar = 2 * soft_clamp(raw, *LOG_SIGMA_BOUNDS)
        return mean, logvar, (out[..., 2 * D] if self.cfg.learn_termination else None)

    def loss(self, x: torch.Tensor, y: torch.Tensor, terminated: torch.Tensor | None = None):
        """Training loss (module docstring) of standardised inputs ``x [E,B,I]`` (or ``[B,I]``, shared) and targets
        ``y [E,B,D]`` (or ``[B,D]``); ``terminated [E,B]`` or ``[B]`` bool trains the termination head. Returns the
        scalar and ``{"nll": [E], "bce": [E] (when trained)}``. Weight decay is the optimizer's (``make_optimizer``)."""
        mean, logvar, logit = self.run(x)  # [E,B,D]
        nll = (logvar + (y - mean).square() * torch.exp(-logvar)).mean((-2, -1))  # [E]
        total, parts = nll.sum(), {"nll": nll.detach()}
        if self.max_logvar is not None and self.min_logvar is not None:
            total = total + LOGVAR_PENALTY * (self.max_logvar.sum() - self.min_logvar.sum())
        if logit is not None and terminated is not None:
            bce = F.binary_cross_entropy_with_logits(logit, terminated.to(logit.dtype).expand_as(logit),
                                                     reduction="none").mean(-1)  # [E]
            total, parts["bce"] = total + bce.sum(), bce.detach()
        return total, parts

    # ----- prediction -----

    def chunk_rows(self, members: int, device: torch.device) -> int:
        """Rows per chunk when ``members`` members run on ``device`` (``DynamicsConfig.predict_chunk``)."""
        if self.cfg.predict_chunk is not None:
            return self.cfg.predict_chunk
        return max(1, (8192 if device.type == "cpu" else 1 << 18) // members)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor, act: torch.Tensor, members: torch.Tensor | None = None, sample: bool = True,
                generator: torch.Generator | None = None) -> ModelStep:
        """``protocol.DynamicsModel.predict``: each row from member ``members[b]`` (None: a random elite per row),
        sampled from its Gaussian (``sample``) or its mean; uncertainty over the elites (``protocol``), aleatoric in
        the env's units (MOPO's), epistemic and total_var on the standardised targets."""
        B, O, dev = obs.shape[0], self.obs_dim, obs.device
        assert obs.shape == (B, O) and act.shape == (B, self.act_dim), (obs.shape, act.shape)
        E, K = self.cfg.members, self.elite_ids.shape[0]
        if members is None:
            ids, elite_rows = self.elite_ids, None  # run the elites only
            pos = torch.randint(K, (B,), generator=generator, device=dev)  # [B] position in ids
        else:
            assert members.shape == (B,), members.shape
            pos_of = torch.full((E,), -1, dtype=torch.int64, device=dev)
            pos_of[self.elite_ids] = torch.arange(K, device=dev)
            pos = pos_of[members]  # [B]
            if bool((pos < 0).any()):  # a non-elite member asked for (one host sync): run every member
                ids, elite_rows, pos = None, self.elite_ids, members
            else:
                ids, elite_rows = self.elite_ids, None
        x = self.inputs(obs, act)  # [B,I]
        y, term, unc = [], [], {k: [] for k in UNCERTAINTIES}
        C = self.chunk_rows(E if ids is None else K, x.device)
        for s in range(0, B, C):
            xc, pc = x[s:s + C], pos[s:s + C]  # [C,I], [C]
            mean, logvar, logit = self.run(xc, ids)  # [M,C,D]
            rows = torch.arange(xc.shape[0], device=dev)
            m, lv = mean[pc, rows], logvar[pc, rows]  # [C,D]
            if sample:
                m = m + torch.randn(m.shape, generator=generator, device=dev, dtype=m.dtype) * (0.5 * lv).exp()
            y.append(m)
            if logit is not None:
                term.append(logit[pc, rows] > 0)  # [C]
            me, var = (mean, logvar.exp()) if elite_rows is None else (mean[elite_rows], logvar[elite_rows].exp())
            epi = me.var(0, unbiased=False)  # [C,D]
            unc["aleatoric"].append((var * self.target_std.square()).sum(-1).sqrt().amax(0))  # [C]
            unc["epistemic"].append(epi.mean(-1).sqrt())
            unc["total_var"].append((epi + var.mean(0)).mean(-1))
        y = torch.cat(y) * self.target_std + self.target_mean  # [B,D]
        return ModelStep(obs + y[:, :O], y[:, O], torch.cat(term) if term else None,
                         {k: torch.cat(v) for k, v in unc.items()})


def member_forward(model: EnsembleDynamics, i: int, obs: torch.Tensor, act: torch.Tensor):
    """Member ``i`` alone on ``obs [B,O]``, ``act [B,A]``, from its slices of the stacked weights with plain matmuls:
    the reference the batched ``forward`` is tested against. Returns
    ``(mean [B,D], logvar [B,D], logit [B] | None)``."""
    x = model.inputs(obs, act)  # [B,I]
    last = len(model.layers) - 1
    for j, layer in enumerate(model.linears()):
        h = x @ layer.weight[i] + layer.bias[i, 0]  # [B,out]
        if j < last:
            if model.ln_scale is not None and model.ln_shift is not None:
                h = F.layer_norm(h, h.shape[-1:], model.ln_scale[j][i, 0], model.ln_shift[j][i, 0])
            h = model._act(h)
            if model.cfg.residual and h.shape == x.shape:
                h = h + x
        x = h
    hi = None if model.max_logvar is None else model.max_logvar[i]
    return model._heads(x, hi, None if model.min_logvar is None else model.min_logvar[i])


def make_optimizer(model: EnsembleDynamics, lr: float | None = None) -> torch.optim.Adam:
    """Adam with one parameter group per linear layer's weights (that layer's ``weight_decay``) and one without
    decay for biases, LayerNorm affines and logvar bounds (RAVL's parameter groups)."""
    weights = [layer.weight for layer in model.linears()]
    rest = [p for p in model.parameters() if all(p is not w for w in weights)]
    groups = [{"params": [w], "weight_decay": wd} for w, wd in zip(weights, model.cfg.weight_decay)]
    return torch.optim.Adam([*groups, {"params": rest, "weight_decay": 0.0}], lr=lr or model.cfg.lr,
                            fused=weights[0].device.type in ("cpu", "cuda"))


def _check_data(model: EnsembleDynamics, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The data on the model's device as float32 (``terminated`` bool), with its shapes and values checked."""
    dev = model.elite_ids.device
    need = ["obs", "act", "next_obs", "reward"] + (["terminated"] if model.cfg.learn_termination else [])
    missing = [k for k in need if k not in data]
    if missing:
        raise UserInputError(f"dynamics data has no {missing[0]!r}: expected tensors {need}")
    S = data["obs"].shape[0]
    shapes = {"obs": (S, model.obs_dim), "act": (S, model.act_dim), "next_obs": (S, model.obs_dim), "reward": (S,),
              "terminated": (S,)}
    out = {}
    for k in need + (["terminated"] if "terminated" in data and "terminated" not in need else []):
        t = data[k]
        if tuple(t.shape) != shapes[k]:
            raise UserInputError(f"dynamics data {k!r} has shape {tuple(t.shape)}: expected {shapes[k]}")
        t = t.to(dev, torch.bool if k == "terminated" else torch.float32)
        if k != "terminated" and not bool(torch.isfinite(t).all()):
            raise UserInputError(f"dynamics data {k!r} holds NaN or infinite values: expected finite numbers")
        out[k] = t
    if S < 2:
        raise UserInputError(f"dynamics data has {S} rows: expected at least 2 (training and holdout)")
    return out


@torch.no_grad()
def evaluate(model: EnsembleDynamics, x: torch.Tensor, y: torch.Tensor, terminated: torch.Tensor | None = None
             ) -> dict[str, torch.Tensor]:
    """Per-member holdout figures on standardised ``x [H,I]``, ``y [H,D]``: ``mse [E]``, ``nll [E]`` (the loss's
    NLL), ``within [E,D]`` (fraction of targets within one predicted std; 0.683 if calibrated), ``term_acc [E]``."""
    E, H, D = model.cfg.members, x.shape[0], model.out_dim
    acc = {"mse": x.new_zeros(E), "nll": x.new_zeros(E), "within": x.new_zeros(E, D), "term_acc": x.new_zeros(E)}
    C = model.chunk_rows(E, x.device)
    for s in range(0, H, C):
        mean, logvar, logit = model.run(x[s:s + C])  # [E,C,D]
        sq = (y[s:s + C] - mean).square()  # [E,C,D]
        acc["mse"] += sq.sum((1, 2))
        acc["nll"] += (logvar + sq * torch.exp(-logvar)).sum((1, 2))
        acc["within"] += (sq <= logvar.exp()).sum(1)
        if logit is not None and terminated is not None:
            acc["term_acc"] += ((logit > 0) == terminated[s:s + C]).sum(1)
    return {"mse": acc["mse"] / (H * D), "nll": acc["nll"] / (H * D), "within": acc["within"] / H,
            "term_acc": acc["term_acc"] / H}


_CHUNK = 1 << 24  # elements per temporary of the index tables (64 MB of float32 keys)


def _chunked_rows(E: int, N: int, make: Callable[[int, int], torch.Tensor], dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """An [E,N] table of ``dtype`` filled by ``make(e0, e1)`` (rows e0..e1-1, [e1-e0,N]) a few member rows at a
    time, so that the temporaries stay near ``_CHUNK`` elements. The rows come from the generator in the same order
    as one [E,N] call would draw them (CPU generators fill row-major)."""
    out = torch.empty((E, N), dtype=dtype, device=device)
    step = max(1, _CHUNK // max(N, 1))
    for e0 in range(0, E, step):
        e1 = min(E, e0 + step)
        out[e0:e1] = make(e0, e1)
    return out


def _member_orders(boot: torch.Tensor | None, E: int, N: int, generator: torch.Generator | None, dev: torch.device,
                   dtype: torch.dtype) -> torch.Tensor:
    """A random permutation of each member's rows (of its bootstrap resample ``boot`` [E,N] when given): [E,N]."""
    def make(e0: int, e1: int) -> torch.Tensor:
        order = torch.rand(e1 - e0, N, generator=generator, device=dev).argsort(1)  # [e,N] int64
        return boot[e0:e1].long().gather(1, order) if boot is not None else order

    return _chunked_rows(E, N, make, dtype, dev)


def holdout_split(cfg: DynamicsConfig, rows: int, generator: torch.Generator | None, device: torch.device | str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``fit``'s split of ``rows`` rows: (holdout [H], training [N]) indices, one permutation from ``generator``."""
    n_hold = max(1, min(int(cfg.holdout_ratio * rows), cfg.max_holdout or rows, rows - 1))
    perm = torch.randperm(rows, generator=generator, device=device)  # [S]
    return perm[:n_hold], perm[n_hold:]


def fit(model: EnsembleDynamics, data: dict[str, torch.Tensor], generator: torch.Generator | None = None,
        progress: Callable[[int, dict], None] | None = None, resume: dict | None = None,
        checkpoint: Callable[[dict], None] | None = None) -> list[dict]:
    """Train ``model`` on ``data`` (obs [S,O], act [S,A], next_obs [S,O], reward [S], terminated [S] bool, optional
    unless ``learn_termination``) with the settings of ``model.cfg``, on the model's device, drawing every random
    number from ``generator`` (on that device). Calls ``progress(epoch, metrics)`` after every epoch and returns the
    list of those metric dicts (plain floats; one host sync per epoch). Leaves the best weights and the elites set.

    Resumable by epoch: ``checkpoint(state)`` is called after every epoch with the fit's state (weights, best
    weights, optimizer, counters, the generator's state at the start of the fit and now); ``fit(..., resume=state)``
    on the same data and a model built the same way continues from that epoch exactly (the split and bootstrap
    resamples are drawn again from the start state, then the generator is set to the epoch's)."""
    cfg, dev = model.cfg, model.elite_ids.device
    d = _check_data(model, data)
    S, E = d["obs"].shape[0], cfg.members
    if (resume is not None or checkpoint is not None) and generator is None:
        raise ValueError("a resumable fit needs an explicit generator: its state is part of the checkpoint")
    gen_start = generator.get_state() if generator is not None else None
    if resume is not None:
        assert generator is not None
        generator.set_state(resume["gen_start"])
    hold, train = holdout_split(cfg, S, generator, dev)  # [H], [N]
    model.set_statistics(d["obs"][train], d["act"][train], d["next_obs"][train], d["reward"][train])
    with torch.no_grad():
        x_all = model.inputs(d["obs"], d["act"])  # [S,I]
        y_all = model.targets(d["obs"], d["next_obs"], d["reward"])  # [S,D]
    term = d.get("terminated") if cfg.learn_termination else None  # [S] or None
    x_tr, y_tr, x_ho, y_ho = x_all[train], y_all[train], x_all[hold], y_all[hold]
    t_tr, t_ho = (term[train], term[hold]) if term is not None else (None, None)
    N = x_tr.shape[0]
    # [E,N] index tables: 128 members x 1M rows in int32 is 0.5 GB
    idx_dtype = torch.int32 if N < 2**31 else torch.int64
    boot = _chunked_rows(E, N, lambda e0, e1: torch.randint(N, (e1 - e0, N), generator=generator, device=dev),
                         idx_dtype, dev) if cfg.bootstrap else None  # [E,N] the bootstrap resample of each member
    opt = make_optimizer(model)
    params = list(model.parameters())  # every parameter has the member axis first
    best_params = [p.detach().clone() for p in params]
    best = torch.full((E,), math.inf, device=dev)  # [E] best holdout MSE so far
    history: list[dict] = []
    since, decayed, epoch = 0, False, 0
    if resume is not None:
        assert generator is not None
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        with torch.no_grad():
            for bp, saved in zip(best_params, resume["best_params"]):
                bp.copy_(saved)
        best.copy_(resume["best"])
        since, decayed, epoch = int(resume["since"]), bool(resume["decayed"]), int(resume["epoch"])
        history = list(resume["history"])
        generator.set_state(resume["gen"])
    stopped = bool(resume is not None and resume.get("stopped"))
    while not stopped and (cfg.max_epochs is None or epoch < cfg.max_epochs):
        epoch += 1
        idx = _member_orders(boot, E, N, generator, dev, idx_dtype)  # [E,N] this epoch's order of each member's rows
        total, steps = torch.zeros((), device=dev), 0
        for s in range(0, N, cfg.batch_size):
            ib = idx[:, s:s + cfg.batch_size]  # [E,B]
            loss, _ = model.loss(x_tr[ib], y_tr[ib], t_tr[ib] if t_tr is not None else None)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
        train_loss = float(total) / steps
        if not math.isfinite(train_loss):
            raise UserInputError(f"the dynamics model's training loss became {train_loss} at epoch {epoch}: expected "
                                 f"finite values; check the data for extreme values or lower DynamicsConfig.lr")
        ev = evaluate(model, x_ho, y_ho, t_ho)
        improved = ev["mse"] < best * (1 - cfg.improvement)  # [E] (relative drop > improvement)
        with torch.no_grad():
            for p, bp in zip(params, best_params):
                bp[improved] = p[improved]
        best = torch.where(improved, ev["mse"], best)
        n_improved = int(improved.sum())
        since = 0 if n_improved else since + 1
        within = ev["within"].mean(0)  # [D]
        m = {"epoch": epoch, "train_loss": train_loss, "holdout_mse": float(ev["mse"].mean()),
             "holdout_mse_elites": float(ev["mse"].sort().values[:cfg.elites].mean()),
             "holdout_mse_best": float(best.sort().values[:cfg.elites].mean()), "holdout_nll": float(ev["nll"].mean()),
             "calibration": float(within.mean()), "calibration_dims": within.tolist(),
             "members_improved": n_improved, "lr": opt.param_groups[0]["lr"]}
        if term is not None:
            m["holdout_term_acc"] = float(ev["term_acc"].mean())
        history.append(m)
        if progress is not None:
            progress(epoch, m)
        if since >= cfg.patience:
            if epoch >= cfg.min_epochs:
                stopped = True
            elif not decayed:  # RAVL: a stall before min_epochs lowers the lr once, then training goes on
                for g in opt.param_groups:
                    g["lr"] *= cfg.lr_decay
                decayed, since = True, 0
        if checkpoint is not None:
            assert generator is not None and gen_start is not None
            checkpoint({"epoch": epoch, "since": since, "decayed": decayed, "stopped": stopped, "best": best.clone(),
                        "best_params": [bp.clone() for bp in best_params], "model": model.state_dict(),
                        "optimizer": opt.state_dict(), "history": list(history), "gen_start": gen_start,
                        "gen": generator.get_state()})
    with torch.no_grad():
        for p, bp in zip(params, best_params):
            p.copy_(bp)
        model.holdout_mse.copy_(best)
        model.elite_ids.copy_(best.argsort()[:cfg.elites])
    return history
