"""What every VLA algorithm owns: the model's config, the policy built from it for an env, its optimiser, the
inputs from env observations or demonstration batches, and the chunk queue that acts.

``VLAModelConfig`` holds the fields every VLA algorithm reads (backbone, head, chunk, adapters, optimiser, image
and text inputs); it is behaviour cloning's whole config, and HABC's and RL's configs extend it once
(``algos/vla_habc.py``, ``algos/vla_rl.py``). ``VLAModel`` is built from it and the env's spec: the policy
(``vla.policy.VLAPolicy``) with LoRA applied (``vla.adapters``), AdamW over its trainable parameters, and acting
by chunks (each env plans a chunk and plays its first ``execute`` actions open-loop; an ended episode plans
afresh). An algorithm composes one ``VLAModel`` and adds its own loss (``algos/vla_bc.py``, ``algos/vla_rl.py``).

Shape letters: B batch, N envs, H chunk, A action dim, P proprio dim, O the env's state dim.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import nn

from ctrl_rl.core.obs import Obs
from ctrl_rl.core.protocols import Algorithm
from ctrl_rl.core.validate import check_fields
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.vla.adapters import apply_lora, trainable_fraction
from ctrl_rl.vla.data import Demos, load_demos
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
class VLAModelConfig:
    """The VLA model, its adapters and its optimiser: every field is read by every VLA algorithm (module
    docstring; the losses are on docs/algorithms/vla.md)."""

    backbone: str = "smolvlm-tiny"
    """A tiny config (smolvlm-tiny, smolvlm-small, idefics3-tiny, paligemma-tiny, qwen2.5-vl-tiny: random weights, for
    tests and CPU) or a directory holding a transformers model saved with save_pretrained (and its tokenizer)."""
    head: Literal["tokens", "regression", "flow"] = "regression"
    """Action head: OpenVLA tokens, OpenVLA-OFT L1 regression or a pi0 flow-matching expert."""
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

    def __post_init__(self) -> None:
        check_fields(self)
        parse_columns(self.proprio_columns)
        for name in ("chunk", "flow_steps", "max_text_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserInputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: "
                                     "expected a positive integer")
        if self.lora_rank < 0 or not 0 <= self.execute_steps <= self.chunk:
            raise UserInputError(f"invalid --lora-rank {self.lora_rank} or --execute-steps {self.execute_steps}: "
                                 f"expected a rank >= 0 and 0 <= execute steps <= --chunk {self.chunk}")


SHAPE_FIELDS = ("backbone", "head", "chunk", "lora_rank", "lora_alpha", "lora_targets", "lora_vision",
                "max_text_len", "proprio_columns", "flow_steps")
"""The ``VLAModelConfig`` fields that fix the policy's parameters (and what LoRA adds to them): a run started
from another run's policy (``--init``) takes them from that run's config (``AlgoEntry.init_fields``)."""


def _tokenizer(name: str):
    from ctrl_rl.vla.tokenizer import load_tokenizer, tiny_tokenizer  # transformers: imported when a VLA is built

    return load_tokenizer(name) if Path(name).is_dir() else tiny_tokenizer()


class VLAModel:
    """The policy of ``config`` for ``spec`` (camera images, an instruction and a state), with its AdamW, its
    inputs and its acting state (module docstring). ``init_log_std`` starts the regression head's Gaussian, which
    only RL reads."""

    def __init__(self, config: VLAModelConfig, spec: EnvSpec, device: torch.device, init_log_std: float = -2.0):
        c = self.config = config
        self.device, self.spec = torch.device(device), spec
        parts = {p.name: p for p in spec.parts}
        self.cameras = tuple(n.removeprefix("image/") for n in parts if n.startswith("image/"))
        if not self.cameras or "language" not in parts or "state" not in parts:
            raise UserInputError(f"env {spec.env_id!r} has observation parts {sorted(parts)}: a VLA needs camera "
                                 "images, an instruction and a state (manip tasks: cameras=..., language=true)")
        O = parts["state"].shape[0]
        self.columns = parse_columns(c.proprio_columns)
        if max(self.columns) >= O:
            raise UserInputError(f"--proprio-columns {c.proprio_columns} exceed the {O} columns of the env's state")
        self.image_hw: tuple[int, int] = tuple(parts[f"image/{self.cameras[0]}"].shape[1:])  # type: ignore[assignment]
        self.A = spec.action_dim
        self.execute = c.execute_steps or c.chunk
        """Env steps each chunk is played for before the next is planned."""
        from ctrl_rl.vla.backbones import build_backbone  # transformers: imported when a VLA is built

        backbone = build_backbone(c.backbone, dtype=torch.bfloat16 if c.bf16 else torch.float32)
        self.policy = VLAPolicy(backbone, _tokenizer(c.backbone), c.head, c.chunk, self.A, len(self.columns),
                                self.cameras, c.max_text_len, c.flow_steps, init_log_std)
        if c.lora_rank > 0:
            apply_lora(self.policy.backbone, c.lora_rank, c.lora_alpha, c.lora_targets, c.lora_vision)
        if c.freeze_backbone:
            self.policy.backbone.requires_grad_(False)
        if c.gradient_checkpointing:
            self.policy.backbone.enable_gradient_checkpointing()
        self.policy.to(self.device)
        self.opt = torch.optim.AdamW(self.trainable(), lr=c.lr, weight_decay=c.weight_decay)
        self._queue: torch.Tensor | None = None  # [N,H,A] each env's current chunk, env units
        self._left: torch.Tensor | None = None  # [N] actions left to play of it

    # ----- data -----

    def load_demos(self, path: str, action_space: str, action_key: str | None, state_key: str) -> Demos:
        """The demonstrations at ``path`` for this model's cameras, image size, chunk and proprioception (a
        dataset whose proprioception has another width than ``proprio_columns`` picks is refused)."""
        demos = load_demos(path, self.cameras, self.image_hw, self.config.chunk, self.A, action_space, action_key,
                           state_key=state_key)
        if demos.proprio.shape[1] != len(self.columns):
            raise UserInputError(f"the dataset's proprioception {state_key!r} has {demos.proprio.shape[1]} dims but "
                                 f"--proprio-columns {self.config.proprio_columns} picks {len(self.columns)} columns "
                                 "of the env's state: expected the same width")
        return demos

    def set_statistics(self, proprio: torch.Tensor, actions: torch.Tensor) -> None:
        """Proprio mean/std and action quantiles from the demonstrations (``[S,P]``, ``[S,A]``)."""
        self.policy.set_statistics(proprio.to(self.device), actions.to(self.device))

    def prefix_from_obs(self, obs: dict[str, torch.Tensor]):
        """Env observations (cameras, ``language`` bytes, ``state [N,O]``) -> the policy's prefix."""
        ids, mask = self.policy.text(decode_language(obs["language"]))
        images = {k: v for k, v in obs.items() if k.startswith("image/")}
        return self.policy.prefix(images, ids, mask, obs["state"].float()[:, list(self.columns)])  # proprio [N,P]

    def prefix_from_batch(self, batch: dict):
        """A demonstration batch (``vla.data.Demos.batch``) -> the policy's prefix."""
        ids, mask = self.policy.text([batch["instructions"][int(i)] for i in batch["task_index"]])
        return self.policy.prefix(batch["images"], ids, mask, batch["proprio"])

    # ----- training -----

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def trainable_fraction(self) -> float:
        return trainable_fraction(self.policy)

    def imitation_loss(self, batch: dict, weights: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
        """The head's loss of a demonstration batch's chunks ``[B,H,A]`` (per-sample ``weights [B]`` or None)."""
        return self.policy.loss(self.prefix_from_batch(batch), batch["chunk"], weights, gen)

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        """One AdamW step on ``loss`` with the gradient-norm clip; returns the norm before clipping."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(self.trainable(), self.config.max_grad_norm)
        self.opt.step()
        return norm

    # ----- acting -----

    def to_actions(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised chunk -> env actions ``[N,H,A]`` (clipped to the agent's [-1, 1])."""
        return self.policy.normalizer.unnormalize(x).clamp(-1, 1)

    def reset_state(self, n: int) -> None:
        self._queue = torch.zeros(n, self.config.chunk, self.A, device=self.device)  # [N,H,A]
        self._left = torch.zeros(n, dtype=torch.long, device=self.device)  # [N]

    def observe(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        if self._left is not None:
            self._left[done.to(self._left.device)] = 0  # a new episode plans afresh

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool, gen: torch.Generator, sigma: float = 0.0) -> torch.Tensor:
        """The next action of each env's current chunk ``[N,A]``; envs whose chunk is used up plan a new one
        (``sigma``: the flow head's chain noise when sampling; 0 integrates from random noise)."""
        assert isinstance(obs, dict), "a VLA acts on observation parts (cameras, language, state)"
        N = obs["state"].shape[0]
        if self._left is None or self._queue is None or self._left.shape[0] != N:
            self.reset_state(N)
        assert self._left is not None and self._queue is not None
        self.policy.eval()
        need = (self._left == 0).nonzero().squeeze(-1)  # [n]
        if need.numel():
            sub = {k: v[need] for k, v in obs.items()}
            x, _, _ = self.policy.sample(self.prefix_from_obs(sub), gen, deterministic, sigma)
            self._queue[need] = self.to_actions(x)
            self._left[need] = self.execute
        i = self.execute - self._left  # [N] position in the chunk
        a = self._queue[torch.arange(N, device=self.device), i]  # [N,A]
        self._left -= 1
        return a

    def exportable(self) -> nn.Module:
        from ctrl_rl.vla.export import ChunkPolicy

        return ChunkPolicy(copy.deepcopy(self.policy), self.columns, self.execute).eval()

    def parameters_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.trainable())

    # ----- state -----

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])


@runtime_checkable
class DemonstrationLearner(Algorithm, Protocol):
    """An algorithm (``core.protocols.Algorithm``) with what the demonstrations loops need beyond it: its ``VLAModel``
    (cameras, chunk and proprioception the demonstrations are read for; their statistics) and a start from another
    run's policy weights (``--init``)."""

    model: VLAModel

    def start_from(self, policy_state: dict[str, Any]) -> None:
        """Load another run's policy weights (its ``state_dict()["policy"]``); optimiser and counters start fresh."""
        ...
