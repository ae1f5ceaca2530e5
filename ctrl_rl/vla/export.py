"""The graph a VLA exports: env-form observation parts in, the deterministic action chunk out.

Inputs (``deploy/export.py`` names them ``state``, ``image.<cam>``, ``language``): the env's ``state`` ``[B,O]``
(the proprio columns are taken inside), the cameras uint8 ``[B,3,h,w]``, and the prompt as token ids ``[B,Lt]``
(``language_input()``: the tokenizer is not a graph op, so the runtime tokenises the instruction with the
exported ``tokenizer.json`` and the prompt template; padding is the tokenizer's pad id and is masked inside).
Output: the chunk ``[B,H,A]`` in the agent's [-1, 1] action space (the export wrapper rescales it to the env's
bounds). The tokens head decodes greedily without a KV cache (the graph unrolls its H*A steps); the flow head
integrates from zero noise, its deterministic mode; LoRA adapters are merged into the base weights first.
"""

from __future__ import annotations

import torch
from torch import nn

from ctrl_rl.vla.adapters import merge_lora
from ctrl_rl.vla.heads import FlowHead, RegressionHead
from ctrl_rl.vla.policy import PROMPT, VLAPolicy


class ChunkPolicy(nn.Module):
    columns: torch.Tensor  # [P] int64 buffer: the proprio columns of the env's state

    def __init__(self, policy: VLAPolicy, proprio_columns: tuple[int, ...], execute_steps: int):
        super().__init__()
        self.execute_steps = execute_steps
        merge_lora(policy)
        self.policy = policy
        self.register_buffer("columns", torch.tensor(proprio_columns, dtype=torch.long), persistent=False)
        self.chunk = policy.H
        self.pad_id = int(policy.tokenizer.pad_token_id)
        # the tokens head unrolls H*A decoder passes: onnxscript's graph optimiser takes ~20 min on that graph
        # (bench/vla.py), so the export skips it; onnxruntime still optimises the graph when it loads it
        self.onnx_optimize = policy.head_kind != "tokens"

    def language_input(self) -> dict:
        """How the runtime builds the ``language`` input from an instruction string."""
        return {"tokenizer": "tokenizer.json", "prompt": PROMPT, "max_length": self.policy.max_text_len,
                "pad_id": self.pad_id, "lowercase": True}

    def save_tokenizer(self, directory) -> None:
        self.policy.tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))

    def forward(self, obs: dict) -> torch.Tensor:
        p = self.policy
        ids = obs["language"]  # [B,Lt]
        mask = (ids != self.pad_id).long()  # [B,Lt]
        images = {k: v for k, v in obs.items() if k.startswith("image/")}
        embeds, amask = p.prefix(images, ids, mask, obs["state"].float().index_select(1, self.columns))
        if p.head_kind == "tokens":
            B = embeds.shape[0]
            M = p.H * p.A
            bins = []
            seq, smask = embeds, amask
            for _ in range(M):
                hidden, _ = p.backbone.decode(seq, smask)
                b = p.bins.bin_logits(p.backbone.logits(hidden[:, -1:]).float())[:, 0].argmax(-1)  # [B]
                bins.append(b)
                e = p.backbone.embed_tokens(p.bins.to_ids(b[:, None])).to(seq.dtype)  # [B,1,D]
                seq, smask = torch.cat([seq, e], 1), torch.cat([smask, smask.new_ones(B, 1)], 1)
            x = p.bins.decode(torch.stack(bins, 1), p.H, p.A)
        elif isinstance(p.head, RegressionHead):
            x = p.head(p._queries(embeds, amask))
        else:
            assert isinstance(p.head, FlowHead)  # the one head kind left ("flow")
            cond = p._queries(embeds, amask)
            x = p.head.sample(cond, None, noise=torch.zeros(cond.shape[0], p.H, p.A, dtype=cond.dtype,
                                                            device=cond.device))
        return p.normalizer.unnormalize(x.clamp(-1, 1)).clamp(-1, 1)  # [B,H,A]
