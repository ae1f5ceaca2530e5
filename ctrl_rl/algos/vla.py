"""VLA fine-tuning: a vision-language backbone with LoRA adapters and an action head, trained by behaviour cloning
(``bc``), hierarchical advantage-weighted BC (``habc``) or PPO on action chunks with an SFT anchor (``rl``).

The model (``vla.policy.VLAPolicy``): camera images, the instruction and proprioception in, a chunk of H actions
out through one of three heads (``tokens`` OpenVLA, ``regression`` OpenVLA-OFT, ``flow`` pi0). Adapters: peft
LoRA of rank ``lora_rank`` on the language model's ``lora_targets`` (optionally the vision tower too), the base
frozen; ``lora_rank 0`` fine-tunes every weight instead.

Methods (shape letters: B batch, H chunk, A action dim, C critic-state dim):

- ``bc``: ``L = head loss(chunk | images, instruction, proprio)`` on demonstration frames.
- ``habc`` (Fang, Huang et al. 2026, docs/algorithms/vla.md#habc; the implementable form there is UNVERIFIED and is what
  is built): two critics on the dataset's critic state (``vla.data``), a viability head ``V_via`` (sigmoid,
  cross-entropy to the episode's success label, autonomous frames only) and an efficiency head ``V_eff``
  (regressed on successful episodes to the discounted cost-to-go ``-c (1 - gamma^(k+1)) / (1 - gamma)``, k frames
  left). With ``s'`` the next frame (on an episode's last frame ``V_via(s') =`` its success label and
  ``V_eff(s') = 0``):

      A_via = gamma V_via(s') - V_via(s)          A_eff = -c + gamma V_eff(s') - V_eff(s)
      g = sigmoid((V_via(s) - tau_g) / T_g)       A = (1 - g) A_via + g A_eff
      w = min(exp(A / beta), w_max)                L_actor = head loss weighted by w (per sample)

  Frames a human executed (an ``intervention`` flag) get w = 1 and never train the critics on their episode's
  outcome (intervention-aware credit). The critics train on every batch; w = 1 during ``habc_warmup`` updates.
- ``rl`` (RLinf-Co, docs/algorithms/vla.md#rl): PPO where one action is a whole chunk executed open-loop for
  ``execute_steps`` env steps (reward: the discounted sum inside the chunk; discount gamma^steps between
  chunks), clipped ratio of the head's chunk likelihood (tokens: the bins' categorical; regression: a diagonal
  Gaussian with a learned log-std; flow: the Gaussian transitions of a noisy Euler chain with ``flow_sigma``),
  GAE, a value function on the env's full ``state`` part (asymmetric: privileged state in simulation), and
  ``L = L_PPO + sft_coef * L_SFT(demonstration batch)`` (RLinf's example weight 0.2). The value function then
  makes ``value_epochs`` passes over the rollout; for the first ``critic_warmup`` updates only it trains, so a
  policy loaded from BC is not moved by the advantages of an unfitted critic. With ``advantage group``
  (GRPO-style, as SimpleVLA-RL uses for VLAs; docs/algorithms/vla.md#group-relative-advantages) there is no critic:
  blocks of ``group_size``
  envs replay the same episode, and every chunk of an episode gets its return minus the block's mean return. It
  removes the variance between placements, which a critic on 64x64 pixels or a few state dims fits poorly.
  ``sil_coef > 0`` adds self-imitation (after Oh et al. 2018's SIL, with the episode's success as the filter in
  place of ``(R - V)+``): ``+ sil_coef * head loss`` on a batch of chunks from the policy's own successful
  episodes in every PPO minibatch, and ``sil_steps`` imitation-only steps per update after the passes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.nets import mlp
from ctrl_rl.core.returns import gae, group_relative_advantages
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.vla.adapters import apply_lora, trainable_fraction
from ctrl_rl.vla.policy import VLAPolicy, decode_language

DROID_PROPRIO = "0:7,13"
"""The manipulation envs' ``state`` columns of DROID's ``observation.state``: 7 joint positions and the gripper."""


def parse_columns(text: str) -> tuple[int, ...]:
    """``"0:7,13"`` -> (0, 1, 2, 3, 4, 5, 6, 13): comma-separated indices and half-open ranges."""
    out: list[int] = []
    try:
        for item in text.split(","):
            a, sep, b = item.strip().partition(":")
            out += list(range(int(a), int(b))) if sep else [int(a)]
    except ValueError:
        raise UserInputError(f"invalid --proprio-columns {text!r}: "
                             "expected indices and ranges such as 0:7,13") from None
    if not out or min(out) < 0:
        raise UserInputError(f"invalid --proprio-columns {text!r}: expected non-negative indices such as 0:7,13")
    return tuple(out)


@dataclass(frozen=True)
class VLAConfig:
    """VLA model, adapter and fine-tuning hyperparameters (module docstring)."""

    backbone: str = "smolvlm-tiny"
    """A tiny config (smolvlm-tiny, idefics3-tiny, paligemma-tiny, qwen2.5-vl-tiny: random weights, for tests and
    CPU) or a directory holding a transformers model saved with save_pretrained (and its tokenizer)."""
    head: Literal["tokens", "regression", "flow"] = "regression"
    """Action head: OpenVLA tokens, OpenVLA-OFT L1 regression or a pi0 flow-matching expert."""
    method: Literal["bc", "habc", "rl"] = "bc"
    """Fine-tuning method: behaviour cloning, HABC, or PPO on chunks with an SFT anchor."""
    chunk: int = 8
    """H: actions per chunk."""
    execute_steps: int = 0
    """Actions of a chunk executed before the next is predicted (0: the whole chunk)."""
    lora_rank: int = 8
    """LoRA rank (0: no adapter, every weight is trained)."""
    lora_alpha: float = 16.0
    """LoRA scaling alpha (the update is scaled by alpha / rank)."""
    lora_targets: str = "q_proj,k_proj,v_proj,o_proj"
    """Comma-separated module names (last name component) LoRA adapts inside the language model."""
    lora_vision: bool = False
    """Also adapt the same module names in the vision tower."""
    freeze_backbone: bool = False
    """Train only what sits outside the backbone: the action head, its query tokens and the proprioception
    projection (the vision tower, the language model and any LoRA adapters stay as loaded)."""
    lr: float = 3e-4
    """AdamW learning rate of the adapters, heads and projections."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    bf16: bool = False
    """Hold the backbone in bfloat16 (heads stay float32)."""
    gradient_checkpointing: bool = False
    """Recompute the backbone's activations in the backward pass (less memory, more time)."""
    max_text_len: int = 16
    """Prompt tokens kept (the prompt is OpenVLA's question around the instruction)."""
    proprio_columns: str = DROID_PROPRIO
    """Columns of the env's ``state`` part that are the dataset's ``observation.state``, as indices and half-open
    ranges (the manipulation tasks: 7 joint positions + gripper)."""
    flow_steps: int = 10
    """Euler steps of the flow head."""
    init_log_std: float = -1.5
    """Initial log standard deviation of the regression head's Gaussian (rl), in normalised action units."""
    habc_gamma: float = 0.99
    """HABC critics' discount."""
    habc_beta: float = 0.05
    """HABC temperature of exp(A / beta)."""
    habc_max_weight: float = 20.0
    """HABC weight clip w_max."""
    habc_gate_threshold: float = 0.5
    """tau_g: viability above which the gate shifts to efficiency."""
    habc_gate_temperature: float = 0.1
    """T_g: the gate's sigmoid temperature."""
    habc_step_cost: float = 0.01
    """c: the efficiency head's per-step cost."""
    habc_warmup: int = 100
    """Updates with w = 1 while the critics start."""
    critic_lr: float = 1e-3
    """Adam learning rate of the HABC critics and of the RL value function."""
    critic_hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of the critics."""
    advantage: Literal["gae", "group"] = "gae"
    """RL advantages: ``gae`` from the value function over chunks; ``group`` from episode returns against the
    mean of ``group_size`` envs that replay the same episode (no critic; a rollout must hold whole episodes)."""
    group_size: int = 4
    """Envs per group with ``--advantage group`` (they share placements: the env's ``group_size`` option)."""
    rl_gamma: float = 0.99
    """PPO discount per env step."""
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
    """RL updates at the start that train only the value function: the policy loaded by ``--init`` acts unchanged
    until its advantages come from a fitted critic rather than a random one."""
    ent_coef: float = 0.0
    """Entropy bonus (regression head only; the others have no closed form)."""
    sft_coef: float = 0.2
    """beta of the SFT anchor on demonstrations during RL."""
    sil_coef: float = 0.0
    """Weight of self-imitation during RL: the head's imitation loss on chunks of the policy's own successful
    episodes (a FIFO of ``sil_capacity`` chunks; 0: off). A fresh batch of them joins every PPO minibatch."""
    sil_steps: int = 0
    """Imitation-only steps per update after the PPO passes (Oh et al.'s M SIL updates per iteration): each on a
    fresh batch of own successes (weight ``sil_coef``) and of demonstrations (weight ``sft_coef``); no KL stop."""
    sil_capacity: int = 10000
    """Chunks the self-imitation buffer keeps (the oldest leave first)."""
    flow_sigma: float = 0.1
    """Noise of the flow chain's Euler steps during RL (its likelihood)."""

    def __post_init__(self) -> None:
        check_fields(self)
        parse_columns(self.proprio_columns)
        for name in ("chunk", "flow_steps", "max_text_len", "ppo_minibatches", "value_epochs", "group_size",
                     "sil_capacity"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: "
                                     "expected a positive integer")
        for name in ("critic_warmup", "sil_steps", "ppo_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: expected a "
                                     "non-negative integer")
        if self.lora_rank < 0 or not 0 <= self.execute_steps <= self.chunk:
            raise UserInputError(f"invalid --lora-rank {self.lora_rank} or --execute-steps {self.execute_steps}: "
                                 f"expected "
                                 f"a rank >= 0 and 0 <= execute steps <= --chunk {self.chunk}")
        if not self.sil_coef >= 0:
            raise UserInputError(f"invalid --sil-coef {self.sil_coef!r}: expected a non-negative number (0: off)")
        if self.method == "rl" and self.ppo_epochs == 0 and not (self.sil_coef > 0 and self.sil_steps > 0):
            raise UserInputError(f"invalid --ppo-epochs 0 with --sil-coef {self.sil_coef} and --sil-steps "
                                 f"{self.sil_steps}: expected both positive, since without policy-gradient passes "
                                 "only the self-imitation steps train the policy")
        if not self.target_kl >= 0:
            raise UserInputError(f"invalid --target-kl {self.target_kl!r}: expected a non-negative number (0: off)")
        if self.habc_beta <= 0 or self.habc_gate_temperature <= 0 or self.flow_sigma < 0:
            raise UserInputError("invalid --habc-beta, --habc-gate-temperature or --flow-sigma: expected positive "
                                 "temperatures and a non-negative sigma")

    def unused_flags(self) -> list[str]:
        """The flags set away from their defaults that this ``method`` never reads (``--method bc --sil-coef 1``)."""
        default = VLAConfig()
        return [f"--{n.replace('_', '-')}" for n in _UNUSED_BY[self.method] if getattr(self, n) != getattr(default, n)]


_HABC_ONLY = ("habc_gamma", "habc_beta", "habc_max_weight", "habc_gate_threshold", "habc_gate_temperature",
              "habc_step_cost", "habc_warmup")
_RL_ONLY = ("init_log_std", "advantage", "group_size", "rl_gamma", "gae_lambda", "clip_ratio", "ppo_epochs",
            "ppo_minibatches", "target_kl", "value_epochs", "critic_warmup", "ent_coef", "sft_coef", "sil_coef",
            "sil_steps", "sil_capacity", "flow_sigma")
_UNUSED_BY = {"bc": _HABC_ONLY + _RL_ONLY + ("critic_lr", "critic_hidden"), "habc": _RL_ONLY, "rl": _HABC_ONLY}


def _tokenizer(name: str):
    from pathlib import Path

    from ctrl_rl.vla.tokenizer import load_tokenizer, tiny_tokenizer  # transformers: imported when a VLA is built

    return load_tokenizer(name) if Path(name).is_dir() else tiny_tokenizer()


class VLA:
    """The VLA agent: the policy, its adapters and optimizer, the HABC critics or the RL value function."""

    def __init__(self, config: VLAConfig, spec: EnvSpec, device: torch.device, generator: torch.Generator):
        c = self.config = config
        self.device, self.gen, self.spec = torch.device(device), generator, spec
        parts = {p.name: p for p in spec.parts}
        self.cameras = tuple(n.removeprefix("image/") for n in parts if n.startswith("image/"))
        if not self.cameras or "language" not in parts or "state" not in parts:
            raise UserInputError(f"env {spec.env_id!r} has observation parts {sorted(parts)}: "
                                 f"a VLA needs camera images, "
                                 "an instruction and a state (manip tasks: cameras=..., language=true)")
        O = parts["state"].shape[0]
        self.columns = parse_columns(c.proprio_columns)
        if max(self.columns) >= O:
            raise UserInputError(f"--proprio-columns {c.proprio_columns} exceed the {O} columns of the env's state")
        self.image_hw = tuple(parts[f"image/{self.cameras[0]}"].shape[1:])
        self.A = spec.action_dim
        from ctrl_rl.vla.backbones import build_backbone  # transformers: imported when a VLA is built

        backbone = build_backbone(c.backbone, dtype=torch.bfloat16 if c.bf16 else torch.float32)
        self.policy = VLAPolicy(backbone, _tokenizer(c.backbone), c.head, c.chunk, self.A, len(self.columns),
                                self.cameras, c.max_text_len, c.flow_steps, c.init_log_std)
        if c.lora_rank > 0:
            apply_lora(self.policy.backbone, c.lora_rank, c.lora_alpha, c.lora_targets, c.lora_vision)
        if c.freeze_backbone:
            self.policy.backbone.requires_grad_(False)
        if c.gradient_checkpointing:
            self.policy.backbone.enable_gradient_checkpointing()
        self.policy.to(self.device)
        self.opt = torch.optim.AdamW([p for p in self.policy.parameters() if p.requires_grad], lr=c.lr,
                                     weight_decay=c.weight_decay)
        self.critic_via = self.critic_eff = self.value = None
        self.updates = 0
        if c.method == "rl":
            self.value = mlp(O, c.critic_hidden, 1).to(self.device)
            self.value_opt = torch.optim.Adam(self.value.parameters(), lr=c.critic_lr)
        self._left = None  # acting state: actions left in each env's chunk

    # ----- shared -----

    @property
    def execute(self) -> int:
        return self.config.execute_steps or self.config.chunk

    def trainable_fraction(self) -> float:
        return trainable_fraction(self.policy)

    def proprio(self, state: torch.Tensor) -> torch.Tensor:
        return state[:, list(self.columns)]  # [B,P]

    def prefix_from_obs(self, obs: dict):
        ids, mask = self.policy.text(decode_language(obs["language"]))
        images = {k: v for k, v in obs.items() if k.startswith("image/")}
        return self.policy.prefix(images, ids, mask, self.proprio(obs["state"].float()))

    def prefix_from_batch(self, batch: dict, instructions: list[str]):
        ids, mask = self.policy.text([instructions[int(i)] for i in batch["task_index"]])
        return self.policy.prefix(batch["images"], ids, mask, batch["proprio"])

    def set_statistics(self, proprio: torch.Tensor, actions: torch.Tensor) -> None:
        self.policy.set_statistics(proprio.to(self.device), actions.to(self.device))

    def _step(self, loss: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_([p for p in self.policy.parameters() if p.requires_grad],
                                        self.config.max_grad_norm)
        self.opt.step()
        return norm

    # ----- bc / habc -----

    def habc_weights(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Fit the two critics on ``batch`` (one Adam step) and return the actor weights ``w [B]``."""
        c = self.config
        if "success" not in batch:
            raise UserInputError("--method habc needs episode outcomes: expected an is_episode_successful feature "
                                 "(or another success key) in the dataset")
        if self.critic_via is None:
            self.habc_weights_init(batch["critic_state"].shape[1])
        s, s2 = batch["critic_state"], batch["next_critic_state"]  # [B,C]
        ok, last, auto = batch["success"].float(), batch["last"], ~batch["intervention"]  # [B]
        logit = self.critic_via(s).squeeze(-1)  # [B]
        v_eff = self.critic_eff(s).squeeze(-1)  # [B]
        k = batch["steps_to_end"].float()  # [B]
        g = c.habc_gamma
        cost_to_go = -c.habc_step_cost * (1 - g ** (k + 1)) / (1 - g)  # [B]
        a = auto.float()
        loss_via = (F.binary_cross_entropy_with_logits(logit, ok, reduction="none") * a).sum() / a.sum().clamp_min(1)
        m = a * ok
        loss_eff = (((v_eff - cost_to_go) ** 2) * m).sum() / m.sum().clamp_min(1)
        self.critic_opt.zero_grad(set_to_none=True)
        (loss_via + loss_eff).backward()
        self.critic_opt.step()
        with torch.no_grad():
            v = torch.sigmoid(self.critic_via(s).squeeze(-1))  # [B]
            v2 = torch.where(last, ok, torch.sigmoid(self.critic_via(s2).squeeze(-1)))  # [B]
            e, e2 = self.critic_eff(s).squeeze(-1), torch.where(last, 0.0, self.critic_eff(s2).squeeze(-1))
            a_via = g * v2 - v
            a_eff = -c.habc_step_cost + g * e2 - e
            gate = torch.sigmoid((v - c.habc_gate_threshold) / c.habc_gate_temperature)
            adv = (1 - gate) * a_via + gate * a_eff  # [B]
            w = torch.exp(adv / c.habc_beta).clamp(max=c.habc_max_weight)
            w = torch.where(auto, w, torch.ones_like(w))
            if self.updates < c.habc_warmup:
                w = torch.ones_like(w)
        return w, {"loss/viability": loss_via.detach(), "loss/efficiency": loss_eff.detach(),
                   "stats/gate": gate.mean(), "stats/weight_mean": w.mean(), "stats/weight_max": w.max()}

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One update: a demonstration batch (bc, habc) or a rollout with a demonstration batch (rl)."""
        self.policy.train()
        if "rollout" in batch:
            return self.update_rl(batch["rollout"], batch["demos"], batch["instructions"], batch.get("own"),
                                  batch.get("sample_demos"))
        info = {}
        w = None
        if self.config.method == "habc":
            w, info = self.habc_weights(batch)
        prefix = self.prefix_from_batch(batch, batch["instructions"])
        loss = self.policy.loss(prefix, batch["chunk"], w, self.gen)
        norm = self._step(loss)
        self.updates += 1
        return {"loss/actor": loss.detach(), "stats/grad_norm": norm.detach(), **info}

    # ----- rl -----

    @torch.no_grad()
    def sample_chunk(self, obs: dict) -> tuple[torch.Tensor, object, torch.Tensor, torch.Tensor]:
        """Normalised chunk ``[N,H,A]``, what its likelihood needs, its log-probability ``[N]`` and ``V(state)``."""
        self.policy.eval()
        x, stored, logp = self.policy.sample(self.prefix_from_obs(obs), self.gen, False, self.config.flow_sigma)
        return x, stored, logp, self.value(obs["state"].float()).squeeze(-1)

    @torch.no_grad()
    def state_value(self, state: torch.Tensor) -> torch.Tensor:
        return self.value(state.float()).squeeze(-1)  # [N]

    def reset_exploration(self) -> None:
        """The regression head's Gaussian noise back to ``init_log_std`` (after ``--init`` from an imitation run)."""
        if self.config.head == "regression":
            with torch.no_grad():
                self.policy.head.log_std.fill_(self.config.init_log_std)

    def to_actions(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised chunk -> env actions ``[N,H,A]`` (clipped to the env's [-1, 1])."""
        return self.policy.normalizer.unnormalize(x).clamp(-1, 1)

    def update_rl(self, ro: dict, demos: dict, instructions: list[str], own=None, sample_demos=None
                  ) -> dict[str, torch.Tensor]:
        """PPO epochs over the rollout ``ro`` (rows S = T*N) with the SFT anchor on ``demos`` (and with
        ``sil_coef > 0`` self-imitation on ``own(n)``, a batch of the policy's successful chunks or None while
        there are none), then ``sil_steps`` imitation-only steps (fresh demonstrations from ``sample_demos(n)``
        when given), then the value function's epochs; during the first ``critic_warmup`` updates only the value
        function trains."""
        c = self.config
        own = own if c.sil_coef > 0 else None
        adv = ro["advantage"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)  # [S]
        S = adv.shape[0]
        out: dict[str, torch.Tensor] = {}
        if self.updates >= c.critic_warmup:
            stats, stop = [], False
            for idx in self._minibatches(S, c.ppo_epochs, adv.device):
                obs = {k: v[idx] for k, v in ro["obs"].items()}
                prefix = self.prefix_from_obs(obs)
                logp = self.policy.log_prob(prefix, _index(ro["stored"], idx), c.flow_sigma)  # [b]
                ratio = torch.exp(logp - ro["log_prob"][idx])
                a = adv[idx]
                l_pg = -torch.min(ratio * a, ratio.clamp(1 - c.clip_ratio, 1 + c.clip_ratio) * a).mean()
                l_sft = self.policy.loss(self.prefix_from_batch(demos, instructions), demos["chunk"], None, self.gen)
                loss = l_pg + c.sft_coef * l_sft
                l_sil = self._own_loss(own, demos["chunk"].shape[0], adv.device)
                loss = loss + c.sil_coef * l_sil
                ent = torch.zeros((), device=adv.device)
                if c.ent_coef > 0 and c.head == "regression":
                    ent = self.policy.head.entropy()
                    loss = loss - c.ent_coef * ent
                with torch.no_grad():
                    kl = ((ratio - 1) - torch.log(ratio)).mean()
                    clip = ((ratio - 1).abs() > c.clip_ratio).float().mean()
                stop = c.target_kl > 0 and float(kl) > 1.5 * c.target_kl  # then this minibatch's step is not taken
                norm = torch.zeros((), device=adv.device) if stop else self._step(loss)
                stats.append(torch.stack([l_pg.detach(), l_sft.detach(), kl, clip, norm.detach(), ent.detach(),
                                          l_sil.detach()]))
                if stop:
                    break
            keys = ("loss/policy", "loss/sft", "stats/approx_kl", "stats/clip_frac", "stats/grad_norm", "stats/entropy",
                    "loss/self_imitation")
            if stats:  # none with ppo_epochs 0
                out.update(zip(keys, torch.stack(stats).mean(0)))
            out["stats/policy_steps"] = torch.tensor(float(len(stats) - stop))
            losses = []
            for _ in range(c.sil_steps if own is not None else 0):
                d = demos if sample_demos is None else sample_demos(demos["chunk"].shape[0])
                l_own = self._own_loss(own, d["chunk"].shape[0], adv.device)
                l_sft = self.policy.loss(self.prefix_from_batch(d, instructions), d["chunk"], None, self.gen)
                self._step(c.sil_coef * l_own + c.sft_coef * l_sft)
                losses.append(l_own.detach())
            if losses:
                out["loss/self_imitation_steps"] = torch.stack(losses).mean()
        self.updates += 1
        if c.advantage == "group":
            return out
        state, ret = ro["obs"]["state"].float(), ro["return"]  # [S,O], [S]
        with torch.no_grad():  # on this rollout before fitting it: how well the critic predicts fresh returns
            explained = 1 - (ret - self.value(state).squeeze(-1)).var() / ret.var().clamp_min(1e-8)
        losses = []
        for idx in self._minibatches(S, c.value_epochs, adv.device):
            l_v = 0.5 * ((self.value(state[idx]).squeeze(-1) - ret[idx]) ** 2).mean()
            self.value_opt.zero_grad(set_to_none=True)
            l_v.backward()
            self.value_opt.step()
            losses.append(l_v.detach())
        return {**out, "loss/value": torch.stack(losses).mean(), "stats/value_explained_var": explained}

    def _own_loss(self, own, n: int, device) -> torch.Tensor:
        """The head's imitation loss on ``own(n)``, a batch of the policy's successful chunks (0 while none)."""
        mine = None if own is None else own(n)
        if mine is None:
            return torch.zeros((), device=device)
        return self.policy.loss(self.prefix_from_obs(mine["obs"]), mine["chunk"], None, self.gen)

    def _minibatches(self, S: int, epochs: int, device):
        """Row indices of ``ppo_minibatches`` minibatches per epoch, a fresh permutation of ``S`` rows each epoch
        (drawn lazily, so a stop part-way draws no more)."""
        for _ in range(epochs):
            yield from torch.randperm(S, generator=self.gen, device=device).chunk(self.config.ppo_minibatches)

    def advantages(self, ro: dict, last_value: torch.Tensor) -> None:
        """GAE over chunks (discount gamma^execute_steps), or group-relative episode returns; adds ``advantage``
        (and for GAE ``return``) to ``ro`` ([T,N] -> [S])."""
        c = self.config
        raw = ro.pop("raw_reward")  # [T,N] undiscounted reward of each chunk's steps in its episode
        if c.advantage == "group":
            try:
                adv = group_relative_advantages(raw, ro.pop("ended"), c.group_size)
            except ValueError as e:
                raise UserInputError(f"--advantage group cannot pair the episodes of a rollout ({e}): expected "
                                     "episodes of one fixed length that end together "
                                     "(no terminate_on_success)") from None
            ro["advantage"] = adv.flatten()
            del ro["value"], ro["reward"]
            return
        value = ro.pop("value")  # [T,N]
        next_value = torch.cat([value[1:], last_value[None]])  # [T,N]
        ended = ro.pop("ended")  # [T,N] bool: truncation already bootstrapped inside the reward
        adv, ret = gae(ro.pop("reward"), value, next_value, ended, ended, c.rl_gamma ** self.execute, c.gae_lambda)
        ro["advantage"], ro["return"] = adv.flatten(), ret.flatten()

    # ----- acting (evaluation, deployment in Python) -----

    def reset_state(self, n: int) -> None:
        self._queue = torch.zeros(n, self.config.chunk, self.A, device=self.device)  # [N,H,A]
        self._left = torch.zeros(n, dtype=torch.long, device=self.device)  # [N]

    def observe(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        self._left[done.to(self._left.device)] = 0  # a new episode plans afresh

    @torch.no_grad()
    def act(self, obs: dict, deterministic: bool = False) -> torch.Tensor:
        """The next action of each env's current chunk ``[N,A]``; envs whose chunk is used up plan a new one."""
        N = obs["state"].shape[0]
        if self._left is None or self._left.shape[0] != N:
            self.reset_state(N)
        self.policy.eval()
        need = (self._left == 0).nonzero().squeeze(-1)  # [n]
        if need.numel():
            sub = {k: v[need] for k, v in obs.items()}
            x, _, _ = self.policy.sample(self.prefix_from_obs(sub), self.gen, deterministic, self.config.flow_sigma)
            self._queue[need] = self.to_actions(x)
            self._left[need] = self.execute
        i = self.execute - self._left  # [N] position in the chunk
        a = self._queue[torch.arange(N, device=self.device), i]  # [N,A]
        self._left -= 1
        return a

    def exportable(self) -> nn.Module:
        from ctrl_rl.vla.export import ChunkPolicy

        return ChunkPolicy(copy.deepcopy(self.policy), self.columns, self.execute).eval()

    # ----- state -----

    def state_dict(self) -> dict:
        out = {"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "updates": self.updates}
        if self.value is not None:
            out.update(value=self.value.state_dict(), value_opt=self.value_opt.state_dict())
        if self.critic_via is not None:
            out.update(critic_via=self.critic_via.state_dict(), critic_eff=self.critic_eff.state_dict(),
                       critic_opt=self.critic_opt.state_dict())
        return out

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])
        self.updates = state["updates"]
        if self.value is not None and "value" in state:
            self.value.load_state_dict(state["value"])
            self.value_opt.load_state_dict(state["value_opt"])
        if "critic_via" in state:
            C = state["critic_via"]["0.weight"].shape[1]
            self.habc_weights_init(C)
            self.critic_via.load_state_dict(state["critic_via"])
            self.critic_eff.load_state_dict(state["critic_eff"])
            self.critic_opt.load_state_dict(state["critic_opt"])

    def habc_weights_init(self, C: int) -> None:
        c = self.config
        self.critic_via = mlp(C, c.critic_hidden, 1, "relu").to(self.device)
        self.critic_eff = mlp(C, c.critic_hidden, 1, "relu").to(self.device)
        self.critic_opt = torch.optim.Adam([*self.critic_via.parameters(), *self.critic_eff.parameters()],
                                           lr=c.critic_lr)

    def parameters_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.policy.parameters() if p.requires_grad)


def _index(stored, idx):
    return stored[idx] if isinstance(stored, torch.Tensor) else None


register(AlgoEntry(
    "vla", VLAConfig, VLA, regime="vla-finetuning",
    summary="VLA fine-tuning: VLM backbone + LoRA + tokens/regression/flow action head, by BC, HABC or chunked PPO",
    requires_dataset=True,
    run_defaults={"total_steps": 2000, "num_envs": 4, "log_every": 20, "checkpoint_every": 200, "eval_every": 0,
                  "eval_episodes": 10}))
