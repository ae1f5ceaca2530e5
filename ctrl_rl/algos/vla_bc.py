"""VLA behaviour cloning: the policy's own imitation loss on demonstration frames, optionally weighted per sample.

The model (``vla.model.VLAModel``): camera images, the instruction and proprioception in, a chunk of H actions out
through one of three heads (``tokens`` OpenVLA, ``regression`` OpenVLA-OFT, ``flow`` pi0), peft LoRA on the
language model (``lora_rank 0`` fine-tunes every weight). One update on a batch of demonstration frames
(``vla.data.Demos.batch``, drawn by the ``demonstrations`` loop):

    L = sum_b w_b l_head(chunk_b | images_b, instruction_b, proprio_b) / sum_b w_b

with ``w = 1`` for plain BC (``vla_bc``) or the weights of a ``vla.habc.SampleWeighting`` passed in (HABC:
``algos/vla_habc.py``). The losses and defaults are on docs/algorithms/vla.md#bc.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.core.obs import Obs
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.vla.habc import SampleWeighting
from ctrl_rl.vla.model import SHAPE_FIELDS, VLAModel, VLAModelConfig


class VLABC:
    """Behaviour cloning of a ``VLAModel``, each frame weighted by ``weighting`` (None: all equal)."""

    def __init__(self, config: VLAModelConfig, spec: EnvSpec, device: torch.device, generator: torch.Generator,
                 weighting: SampleWeighting | None = None):
        self.config, self.spec, self.gen = config, spec, generator
        self.model = VLAModel(config, spec, device)
        self.weighting = weighting
        self.updates = 0

    def update(self, batch: dict) -> dict[str, torch.Tensor]:
        """One AdamW step on a demonstration batch (``vla.data.Demos.batch`` on the device)."""
        self.model.policy.train()
        w, info = (None, {}) if self.weighting is None else self.weighting.weights(batch)  # [B]
        loss = self.model.imitation_loss(batch, w, self.gen)
        norm = self.model.step(loss)
        self.updates += 1
        return {"loss/actor": loss.detach(), "stats/grad_norm": norm.detach(), **info}

    def start_from(self, policy_state: dict[str, Any]) -> None:
        self.model.policy.load_state_dict(policy_state)

    # ----- acting (evaluation, deployment in Python) -----

    def act(self, obs: Obs, deterministic: bool = False) -> torch.Tensor:
        return self.model.act(obs, deterministic, self.gen)

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
        out = {**self.model.state_dict(), "updates": self.updates}
        if self.weighting is not None:
            out["weighting"] = self.weighting.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)
        self.updates = state["updates"]
        if self.weighting is not None:
            self.weighting.load_state_dict(state["weighting"])


VLA_RUN_DEFAULTS = {"total_steps": 2000, "log_every": 20, "checkpoint_every": 200, "eval_every": 0,
                    "eval_episodes": 10}
"""Run settings the VLA entries start from: ``--total-steps`` counts updates."""
VLA_INIT_FROM = ("vla_bc", "vla_habc", "vla_rl")
"""The runs whose policy a VLA run may start from (``--init``): each has a ``VLAModel`` policy."""

register(AlgoEntry(
    "vla_bc", VLAModelConfig, VLABC, regime="demonstrations",
    summary="VLA behaviour cloning: VLM backbone + LoRA + tokens/regression/flow action head on demonstrations",
    requires_dataset=True, init_from=VLA_INIT_FROM, init_fields=SHAPE_FIELDS, run_defaults=VLA_RUN_DEFAULTS))
