"""A vision-language-action policy: camera images, an instruction and proprioception in, an action chunk out.

Shape letters: B batch, K cameras, Lt instruction tokens, Lp prefix length, D the language model's width,
H chunk length, A action dim, P proprio dim, M = H*A action tokens.

The sequence the language model reads (built from embeddings, ``backbones.Backbone``):

    [image tokens of camera 1 .. K] [instruction tokens, right-padded to Lt and masked] [proprio token]

The proprio token is a linear projection of the standardised joint positions and gripper. Then, per head:

- ``tokens`` (OpenVLA): the M action tokens follow, one per (step, dim) in row-major order, each one of the 256
  bins of the normalised action mapped to the last 256 ids of the vocabulary; trained by teacher forcing with
  cross-entropy, sampled autoregressively (KV cache) with temperature 0 (argmax) or 1.
- ``regression`` (OpenVLA-OFT): H learned query embeddings follow; the language model's outputs at those positions
  go through an MLP to the chunk; L1 loss; for RL a diagonal Gaussian around it.
- ``flow`` (pi0): the same H query outputs condition a flow-matching action expert (``heads.FlowHead``), integrated
  with Euler steps from noise; for RL its noisy chain gives the likelihood.

Actions are normalised per dimension by their 1% / 99% dataset quantiles (``heads.ActionNormalizer``); the
policy's output is the normalised chunk in [-1, 1] and ``unnormalize`` gives env actions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ctrl_rl.vla.heads import (
    ActionNormalizer,
    FlowHead,
    RegressionHead,
    TokenBins,
    sample_bins,
    token_log_prob,
    token_loss,
)

if TYPE_CHECKING:
    from ctrl_rl.vla.backbones import Backbone

HEADS = ("tokens", "regression", "flow")
PROMPT = "What action should the robot take to {}?"
"""OpenVLA's prompt around the instruction."""


def decode_language(ids: torch.Tensor) -> list[str]:
    """The manipulation envs' ``language`` part (UTF-8 bytes + 1, 0-padded, int64 ``[B,L]``) -> strings."""
    rows = ids.detach().cpu().tolist()
    return [bytes(b - 1 for b in row if b > 0).decode("utf-8", errors="replace") for row in rows]


class VLAPolicy(nn.Module):
    """The VLA model (module docstring). Build with a backbone and tokenizer; ``set_statistics`` before training."""

    state_mean: torch.Tensor  # [P] buffer
    state_std: torch.Tensor  # [P] buffer

    def __init__(self, backbone: Backbone, tokenizer, head: str, chunk: int, action_dim: int, proprio_dim: int,
                 cameras: tuple[str, ...], max_text_len: int = 16, flow_steps: int = 10, init_log_std: float = -2.0):
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}: expected one of {HEADS}")
        self.backbone, self.tokenizer, self.head_kind = backbone, tokenizer, head
        self.H, self.A, self.P, self.cameras, self.max_text_len = (chunk, action_dim, proprio_dim, tuple(cameras),
                                                                   max_text_len)
        D = backbone.hidden_size
        self.state_proj = nn.Linear(proprio_dim, D)
        self.register_buffer("state_mean", torch.zeros(proprio_dim))
        self.register_buffer("state_std", torch.ones(proprio_dim))
        self.normalizer = ActionNormalizer(action_dim)
        self.bins = TokenBins(backbone.vocab_size)
        if head == "tokens":
            self.head = None
        else:
            self.queries = nn.Parameter(torch.randn(chunk, D) * 0.02)  # [H,D]
            self.head = (RegressionHead(D, action_dim, chunk, init_log_std=init_log_std) if head == "regression"
                         else FlowHead(D, action_dim, chunk, steps=flow_steps))
        self._text_cache: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    # ----- inputs -----

    def set_statistics(self, proprio: torch.Tensor, actions: torch.Tensor) -> None:
        """Proprio mean/std and action quantiles from the demonstrations (``[S,P]``, ``[S,A]``)."""
        self.state_mean.copy_(proprio.mean(0))
        self.state_std.copy_(proprio.std(0).clamp_min(1e-3))
        self.normalizer.fit(actions)

    def text(self, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Instruction strings -> prompt token ids and mask ``[B,Lt]`` on the policy's device (cached per batch)."""
        key = tuple(instructions)
        hit = self._text_cache.get(key)
        if hit is None:
            from ctrl_rl.vla.tokenizer import encode_instructions

            if len(self._text_cache) > 256:
                self._text_cache.clear()
            ids, mask = encode_instructions(self.tokenizer, [PROMPT.format(s.strip().rstrip(".").lower())
                                                             for s in instructions], self.max_text_len)
            hit = (ids.to(self.state_mean.device), mask.to(self.state_mean.device))
            self._text_cache[key] = hit
        return hit

    def prefix(self, images: dict[str, torch.Tensor], text_ids: torch.Tensor, text_mask: torch.Tensor,
               proprio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``images`` uint8 ``[B,3,h,w]`` per camera, prompt ``[B,Lt]``, proprio ``[B,P]`` -> embeddings
        ``[B,Lp,D]`` and attention mask ``[B,Lp]``."""
        B = proprio.shape[0]
        assert proprio.shape[1:] == (self.P,), f"proprio has shape {tuple(proprio.shape)}, expected [B,{self.P}]"
        bb = self.backbone
        img = [bb.image_embeds(images[f"image/{c}"].float() / 255.0) for c in self.cameras]  # K x [B,n,D]
        txt = bb.embed_tokens(text_ids)  # [B,Lt,D]
        st = self.state_proj((proprio - self.state_mean) / self.state_std)[:, None].to(txt.dtype)  # [B,1,D]
        embeds = torch.cat([*(x.to(txt.dtype) for x in img), txt, st], 1)  # [B,Lp,D]
        ones = torch.ones(B, sum(x.shape[1] for x in img), dtype=text_mask.dtype, device=text_mask.device)
        mask = torch.cat([ones, text_mask, text_mask.new_ones(B, 1)], 1)  # [B,Lp]
        return embeds, mask

    def _queries(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The language model's outputs at the H query positions appended to the prefix: ``[B,H,D]`` float32."""
        B = embeds.shape[0]
        q = self.queries.to(embeds.dtype).expand(B, -1, -1)  # [B,H,D]
        hidden, _ = self.backbone.decode(torch.cat([embeds, q], 1), torch.cat([mask, mask.new_ones(B, self.H)], 1))
        return hidden[:, -self.H:].float()  # [B,H,D]

    def _token_logits(self, embeds: torch.Tensor, mask: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
        """Teacher-forced bin logits ``[B,M,256]`` of the action bins ``[B,M]`` after the prefix."""
        B, Lp = mask.shape
        ids = self.bins.to_ids(bins)  # [B,M]
        act = self.backbone.embed_tokens(ids[:, :-1]).to(embeds.dtype)  # [B,M-1,D]
        hidden, _ = self.backbone.decode(torch.cat([embeds, act], 1),
                                         torch.cat([mask, mask.new_ones(B, ids.shape[1] - 1)], 1))
        return self.bins.bin_logits(self.backbone.logits(hidden[:, Lp - 1:]).float())  # [B,M,256]

    # ----- training -----

    def loss(self, prefix: tuple[torch.Tensor, torch.Tensor], chunk: torch.Tensor, weights: torch.Tensor | None,
             gen: torch.Generator | None) -> torch.Tensor:
        """The head's imitation loss of the env-unit chunk ``[B,H,A]`` (per-sample ``weights`` [B] or None)."""
        x = self.normalizer.normalize(chunk)  # [B,H,A]
        embeds, mask = prefix
        if self.head_kind == "tokens":
            bins = self.bins.encode(x)  # [B,M]
            return token_loss(self._token_logits(embeds, mask, bins), bins, weights)
        cond = self._queries(embeds, mask)  # [B,H,D]
        if isinstance(self.head, RegressionHead):
            return self.head.loss(cond, x, weights)
        assert isinstance(self.head, FlowHead)  # the one head kind left ("flow")
        return self.head.loss(cond, x, gen, weights)

    # ----- acting -----

    @torch.no_grad()
    def _decode_tokens(self, embeds, mask, gen, temperature: float) -> torch.Tensor:
        """Autoregressive bins ``[B,M]`` with the KV cache."""
        B = embeds.shape[0]
        M = self.H * self.A
        hidden, past = self.backbone.decode(embeds, mask, use_cache=True)
        out = []
        for m in range(M):
            logits = self.bins.bin_logits(self.backbone.logits(hidden[:, -1:]).float())[:, 0]  # [B,256]
            b = sample_bins(logits, gen, temperature)  # [B]
            out.append(b)
            if m == M - 1:
                break
            mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
            e = self.backbone.embed_tokens(self.bins.to_ids(b[:, None])).to(embeds.dtype)  # [B,1,D]
            hidden, past = self.backbone.decode(e, mask, past_key_values=past, use_cache=True)
        return torch.stack(out, 1)  # [B,M]

    def sample(self, prefix, gen: torch.Generator | None, deterministic: bool, sigma: float = 0.0
               ) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
        """A normalised chunk ``[B,H,A]``, what its log-probability needs (tokens: bins; regression: the unclipped
        sample; flow: the noisy chain of noise ``sigma``) and that log-probability ``[B]`` (None when deterministic,
        and for the flow head with ``sigma`` 0: then the chain starts from random noise and has no noise of its own,
        plain flow-matching sampling with no likelihood)."""
        embeds, mask = prefix
        if self.head_kind == "tokens":
            bins = self._decode_tokens(embeds, mask, gen, 0.0 if deterministic else 1.0)  # [B,M]
            x = self.bins.decode(bins, self.H, self.A)  # [B,H,A]
            logp = None if deterministic else self.log_prob(prefix, bins)
            return x, bins, logp
        cond = self._queries(embeds, mask)  # [B,H,D]
        if isinstance(self.head, RegressionHead):
            x = self.head.sample(cond, gen, deterministic)  # [B,H,A]
            return x.clamp(-1, 1), x, (None if deterministic else self.head.log_prob(cond, x))
        assert isinstance(self.head, FlowHead)  # the one head kind left ("flow")
        if deterministic:  # the flow's deterministic mode: integrate from zero noise (the export does the same)
            noise = torch.zeros(cond.shape[0], self.H, self.A, dtype=cond.dtype, device=cond.device)
            return self.head.sample(cond, gen, noise=noise).clamp(-1, 1), None, None
        if sigma == 0:
            return self.head.sample(cond, gen).clamp(-1, 1), None, None
        x, chain, logp = self.head.sample_chain(cond, gen, sigma)
        return x.clamp(-1, 1), chain, logp

    def log_prob(self, prefix, stored, sigma: float = 0.0) -> torch.Tensor:
        """``[B]`` log-probability of what ``sample`` stored, under the current parameters (with gradient)."""
        embeds, mask = prefix
        if self.head_kind == "tokens":
            return token_log_prob(self._token_logits(embeds, mask, stored), stored)
        cond = self._queries(embeds, mask)
        if isinstance(self.head, RegressionHead):
            return self.head.log_prob(cond, stored)
        assert isinstance(self.head, FlowHead)  # the one head kind left ("flow")
        return self.head.chain_log_prob(cond, stored, sigma)
