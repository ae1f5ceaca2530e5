"""Vision-language backbones from transformers behind one adapter: images -> embeddings, embeddings -> hidden states.

The caller builds each input sequence itself from embeddings (image embeddings, ``embed_tokens`` of the
instruction, action embeddings) and runs ``decode`` on it. The VLMs' own forward, which scatters image
features into placeholder token positions (``masked_scatter``, data-dependent counts), is never used: it
does not export to ONNX and it ties the sequence layout to the processor's prompt format.

    images [B,3,h,w] in [0,1] --image_embeds--> [B,T,D]      (T = tokens_per_image)
    ids [B,L]                 --embed_tokens--> [B,L,D]
    embeds [B,L,D], mask [B,L_past+L] --decode--> hidden [B,L,D] (+ cache) --logits--> [B,L,V]

Id layout (V = ``vocab_size``; constants in ``ctrl_rl.vla.tokenizer``): ids [V - 256, V) are left free for
the caller's 256 action bins; the tiny configs put their special ids (image V-257, video V-258, vision start
V-259, vision end V-260) in [V - 264, V - 256); the tokenizer stays below V - 264. Pad/bos/eos are 0/1/2 in
the tiny text configs, as in the tiny tokenizer; ``nn.Embedding(padding_idx=0)`` keeps row 0 at zero with no
gradient (it is only ever a masked position). LoRA: ``peft.get_peft_model(backbone.vlm,
LoraConfig(target_modules=backbone.lora_target()))`` aims at the language model's q_proj/v_proj
(``lora_target`` restricts ``language_model_pattern`` to the named modules; peft full-matches the regex
against ``vlm.named_modules()`` names).

Conventions of transformers 5.23 this adapter relies on, with the test (tests/vla/test_backbones.py) that
checks each:

- Attribute paths inside ``*ForConditionalGeneration`` (``vlm``), looked up on every call, never cached, so
  that peft's in-place LoRA injection and ``merge_and_unload`` (both replace ``nn.Linear`` modules) are seen:

  ====================  =========================  ===========================  ===========================
  kind                  language model             vision tower                 connector / projector
  ====================  =========================  ===========================  ===========================
  smolvlm, idefics3     ``model.text_model``       ``model.vision_model``       ``model.connector``
  paligemma             ``model.language_model``   ``model.vision_tower``       ``model.multi_modal_projector``
  qwen2_5_vl            ``model.language_model``   ``model.visual``             ``model.visual.merger``
  ====================  =========================  ===========================  ===========================

  and ``vlm.lm_head`` for the LM head (test_lora_through_peft_is_used_by_decode_and_survives_merge, which
  also replaces ``backbone.vlm`` by the ``PeftModel``: it is unwrapped).
- The language model (Llama / Gemma / Qwen2.5-VL text) takes ``inputs_embeds``, a 2-D ``attention_mask``
  covering cached + new positions, ``past_key_values`` (a ``DynamicCache``, extended in place) and
  ``use_cache``; with no ``position_ids`` it uses
  ``arange(L) + cache length`` (Qwen2.5-VL: the same positions in all three mrope sections, i.e. plain text
  positions), and it applies its final norm (test_decode_is_causal_and_honours_padding,
  test_kv_cache_step_equals_full_forward).
- Image features are what each model's ``get_image_features`` computes, with the same modules, but called
  directly: SmolVLM/Idefics3 ``vision_model(pixel_values) -> connector`` (pixel shuffle by ``scale_factor``,
  then a linear); ``get_image_features`` itself is skipped because it *drops* images whose normalised pixels
  are all zero (a uniform mid-grey camera frame) and builds its patch mask from pixel values. PaliGemma
  ``vision_tower(pixel_values).last_hidden_state -> multi_modal_projector``; in 5.23 the image features are
  not rescaled (older versions divided them by sqrt(D)) (test_image_embeds_match_the_vlms_own_image_features).
- Gemma (PaliGemma) scales token embeddings by sqrt(D) inside its embedding module
  (``GemmaTextScaledWordEmbedding``), so ``embed_tokens`` returns scaled embeddings and ``decode`` applies
  no further scaling, exactly as in PaliGemma's own forward (text embeddings scaled, image features not).
- PaliGemma sets ``text_config.use_bidirectional_attention = True`` when unset, which makes every Gemma
  attention module ``is_causal = False``; when the language model is called directly with no padding, the
  causal mask is skipped for SDPA and attention silently becomes bidirectional (PaliGemma's prefix-LM mask
  is built in ``PaliGemmaModel.forward``, bypassed here). ``build_backbone`` sets it to ``False`` for tiny
  configs and loaded directories, giving plain causal attention; no ``token_type_ids`` are involved
  (test_decode_is_causal_and_honours_padding, test_paligemma_directory_without_the_attention_flag_loads_causal).
  PaliGemma counts positions from 1 and this adapter from 0; RoPE depends only on position differences,
  so the two are the same model. A Gemma-2 text config's ``final_logit_softcapping`` is applied in ``logits``.
- Qwen2.5-VL's vision tower takes flattened patches ``[num_patches, 3 * temporal_patch_size * patch**2]``
  in the order of ``Qwen2VLImageProcessor.patchify``: (merge-block row, merge-block column, row in block,
  column in block), each patch (channel, frame, y, x) with the single image repeated over the
  ``temporal_patch_size`` frames, and ``grid_thw = (1, h/patch, w/patch)``. Its forward computes window
  indices and per-image attention splits with ``.tolist()`` (not exportable, one image at a time), so
  ``image_embeds`` runs the same submodules (``patch_embed``, ``rotary_pos_emb``, each block's
  ``norm1``/``attn.qkv``/``attn.proj``/``norm2``/``mlp``, ``merger``) batched over images, with the window
  permutation and window mask precomputed from transformers' own ``vision_utils`` helpers for the fixed image
  size. It matches ``get_image_features`` to float rounding, and its patches equal the processor's
  (test_qwen_windowed_vision_matches_upstream_with_several_windows). Qwen2.5-VL's image size is not in its
  config (the processor resizes dynamically): this adapter uses ``2 * vision_config.window_size`` (224 for
  the released models, 32 for the tiny one).
- ``activation_checkpointing_enable`` (5.23's name; ``gradient_checkpointing_enable`` is its deprecated alias)
  flags every ``GradientCheckpointingLayer`` (non-reentrant ``torch.utils.checkpoint``); the batched Qwen
  vision blocks honour the same flag (test_gradient_checkpointing_recomputes_and_gives_the_same_gradients).
- ``save_pretrained`` writes ``config.json`` + ``model.safetensors``; ``from_pretrained(local_files_only=True)``
  reloads them (test_save_then_build_from_directory_reproduces_outputs).

Normalisation (the processors' defaults): SmolVLM, Idefics3, PaliGemma (SigLIP) mean = std = 0.5;
Qwen2.5-VL the CLIP mean/std. Resizing is bilinear without antialiasing (exportable), not the processors'
PIL/Lanczos/bicubic resize: pretrained weights see slightly different pixels than in their training.

Shape letters: B batch, T tokens per image, L sequence, D hidden, V vocabulary, S patches per image.
"""

from __future__ import annotations

import functools
import glob
import inspect
import json
import os
import re
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import (
    GemmaConfig,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3VisionConfig,
    LlamaConfig,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PreTrainedModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    SiglipVisionConfig,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMVisionConfig,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
    Qwen2_5_VLVisionBlock,
    apply_rotary_pos_emb_vision,
)
from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

from ctrl_rl.errors import UserInputError
from ctrl_rl.vla.tokenizer import ACTION_BINS, BACKBONE_SPECIAL_IDS

TINY_BACKBONES = ("smolvlm-tiny", "idefics3-tiny", "paligemma-tiny", "qwen2.5-vl-tiny", "smolvlm-small")
"""Configs built offline with random weights; ``smolvlm-small`` (hidden 64, 4 heads, 64x64 images: 16 tokens per
image, ~0.4M parameters) is for learning checks on CPU where the tiny ones see too little of the image."""

_SIGLIP_MEAN = _SIGLIP_STD = (0.5, 0.5, 0.5)
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_PREFIX = r"(?:.*\.)?"  # module names may sit under a wrapper (peft's "base_model.model.")


@dataclass(frozen=True)
class _Layout:
    """Where one model type keeps its parts (attribute paths from the ``*ForConditionalGeneration`` root)."""

    cls: type[PreTrainedModel]
    text: str
    vision: str
    connector: str
    vision_modules: str  # regex alternatives under ``model.`` for vision tower + connector
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


_LAYOUTS = {
    "smolvlm": _Layout(SmolVLMForConditionalGeneration, "model.text_model", "model.vision_model",
                       "model.connector", "vision_model|connector", _SIGLIP_MEAN, _SIGLIP_STD),
    "idefics3": _Layout(Idefics3ForConditionalGeneration, "model.text_model", "model.vision_model",
                        "model.connector", "vision_model|connector", _SIGLIP_MEAN, _SIGLIP_STD),
    "paligemma": _Layout(PaliGemmaForConditionalGeneration, "model.language_model", "model.vision_tower",
                         "model.multi_modal_projector", "vision_tower|multi_modal_projector", _SIGLIP_MEAN,
                         _SIGLIP_STD),
    "qwen2_5_vl": _Layout(Qwen2_5_VLForConditionalGeneration, "model.language_model", "model.visual",
                          "model.visual.merger", "visual", _CLIP_MEAN, _CLIP_STD),
}  # fmt: skip


def _lookup(root: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        root = getattr(root, name)
    return root


@functools.cache
def _cache_name(cls: type) -> str:
    """The name of a language model's KV-cache argument and output: ``cache`` since transformers 5.24 renamed
    ``past_key_values`` (looked up once per class, not on every decoding step)."""
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


class Backbone(nn.Module):
    """A transformers VLM (``vlm``) seen as: image embeddings, token embeddings, a causal decoder and an LM head.

    ``Backbone(vlm)`` wraps any supported ``*ForConditionalGeneration`` model; ``build_backbone`` makes one.
    """

    # buffers (register_buffer, not persistent): the processor's mean/std [1,3,1,1]; Qwen2.5-VL's window layout
    _mean: torch.Tensor
    _std: torch.Tensor
    _qwen_perm: torch.Tensor  # [S]
    _qwen_unperm: torch.Tensor  # [T]
    _qwen_window_mask: torch.Tensor  # [S,S] bool
    _qwen_positions: torch.Tensor  # [S,2]

    def __init__(self, vlm: PreTrainedModel):
        super().__init__()
        kind = vlm.config.model_type
        if kind not in _LAYOUTS:
            raise UserInputError(f"unsupported backbone model_type {kind!r}: expected one of {tuple(_LAYOUTS)}")
        self.kind = kind
        self.vlm = vlm
        cfg, vcfg, tcfg = vlm.config, vlm.config.vision_config, vlm.config.get_text_config()
        layout = _LAYOUTS[kind]
        self.hidden_size = int(tcfg.hidden_size)
        self.vocab_size = int(tcfg.vocab_size)
        grid = None
        if kind == "qwen2_5_vl":
            self.image_size = 2 * int(vcfg.window_size)
            merge = int(vcfg.spatial_merge_size)
            side = self.image_size // int(vcfg.patch_size)
            self.tokens_per_image = (side // merge) ** 2
            grid = torch.tensor([[1, side, side]])
        else:
            self.image_size = int(vcfg.image_size)
            side = self.image_size // int(vcfg.patch_size)
            scale = int(cfg.scale_factor) if kind in ("smolvlm", "idefics3") else 1
            self.tokens_per_image = side * side // (scale * scale)
        self.language_model_pattern = _PREFIX + layout.text.replace(".", r"\.") + r"\..+"
        self.vision_pattern = _PREFIX + rf"model\.(?:{layout.vision_modules})\..+"
        self.register_buffer("_mean", torch.tensor(layout.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_std", torch.tensor(layout.std).view(1, 3, 1, 1), persistent=False)
        if grid is not None:
            self._init_qwen_windows(grid)

    # ----------------------------------------------------------------------------------------------- parts
    def _hf(self) -> PreTrainedModel:
        """The transformers model, also when ``vlm`` was replaced by a peft wrapper around it."""
        vlm = self.vlm
        if not isinstance(vlm, PreTrainedModel) and hasattr(vlm, "get_base_model"):
            vlm = vlm.get_base_model()
        return vlm

    def _part(self, which: str) -> nn.Module:
        return _lookup(self._hf(), getattr(_LAYOUTS[self.kind], which))

    def _qwen_visual(self) -> Qwen2_5_VisionTransformerPretrainedModel:
        """Qwen2.5-VL's vision tower, typed (``_part`` knows only ``nn.Module``)."""
        return cast(Qwen2_5_VisionTransformerPretrainedModel, self._part("vision"))  # _LAYOUTS["qwen2_5_vl"]

    def lora_target(self, modules: tuple[str, ...] = ("q_proj", "v_proj"), *, vision: bool = False) -> str:
        """A peft ``target_modules`` regex: the named ``modules`` inside the language model (or the vision side)."""
        base = self.vision_pattern if vision else self.language_model_pattern
        return rf"(?={base}$).*\.(?:{'|'.join(map(re.escape, modules))})"

    # ------------------------------------------------------------------------------------------------ images
    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B,3,h,w] in [0,1] (any h, w) -> [B, tokens_per_image, D], after the connector/projector.

        Resized (bilinear, no antialiasing) to ``image_size`` squared and normalised with the processor's
        mean/std, then the vision tower and connector the VLM's own ``get_image_features`` uses.
        """
        assert images.ndim == 4 and images.shape[1] == 3, f"expected images [B,3,h,w], got {tuple(images.shape)}"
        assert images.is_floating_point(), f"expected float images in [0,1], got {images.dtype}"
        size = self.image_size
        x = images.to(self._mean.dtype)
        if tuple(x.shape[-2:]) != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
        x = (x - self._mean) / self._std  # [B,3,size,size]
        x = x.to(self._hf().dtype)
        if self.kind == "qwen2_5_vl":
            return self._qwen_image_embeds(x)
        # SmolVLM/Idefics3: no patch_attention_mask means every patch is real (the image is not padded).
        feats = self._part("vision")(pixel_values=x).last_hidden_state  # [B,S,Dv]
        return self._part("connector")(feats)  # [B,T,D]

    def _init_qwen_windows(self, grid: torch.Tensor) -> None:
        """Precompute Qwen2.5-VL's window permutation, window mask and rotary positions for one image grid."""
        vcfg = self._hf().config.vision_config
        merge, unit = int(vcfg.spatial_merge_size), int(vcfg.spatial_merge_size) ** 2
        window_index, cu_windows = get_vision_window_index(
            grid, spatial_merge_size=merge, window_size=int(vcfg.window_size), patch_size=int(vcfg.patch_size)
        )  # [S/unit], [windows+1]
        num = int(grid.prod())
        perm = (window_index[:, None] * unit + torch.arange(unit)).reshape(-1)  # [S] patch order for windows
        window_of = torch.bucketize(torch.arange(num), cu_windows[1:].long(), right=True)  # [S]
        self.register_buffer("_qwen_perm", perm, persistent=False)
        self.register_buffer("_qwen_unperm", torch.argsort(window_index), persistent=False)  # [T]
        self.register_buffer("_qwen_window_mask", window_of[:, None] == window_of[None, :], persistent=False)
        positions = get_vision_position_ids(grid, merge)  # [S,2] (row, col), block-major
        self.register_buffer("_qwen_positions", positions[perm], persistent=False)

    def _patchify_qwen(self, x: torch.Tensor) -> torch.Tensor:
        """[B,3,H,W] -> flattened patches [B*S, 3*tp*p*p] in Qwen2VLImageProcessor.patchify's order."""
        vcfg = self._hf().config.vision_config
        p, m, tp = int(vcfg.patch_size), int(vcfg.spatial_merge_size), int(vcfg.temporal_patch_size)
        b, c, h, w = x.shape
        gh, gw = h // p, w // p
        x = x.reshape(b, c, gh // m, m, p, gw // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)  # [B,gh/m,gw/m,m,m,C,p,p]
        x = x.unsqueeze(6).expand(b, gh // m, gw // m, m, m, c, tp, p, p)  # [B,gh/m,gw/m,m,m,C,tp,p,p]
        return x.reshape(b * gh * gw, c * tp * p * p)

    def _qwen_image_embeds(self, x: torch.Tensor) -> torch.Tensor:
        visual = self._qwen_visual()
        b = x.shape[0]
        patches = self._patchify_qwen(x)  # [B*S, 3*tp*p*p]
        h = visual.patch_embed(patches)  # [B*S, Dv]
        h = h.view(b, -1, h.shape[-1])[:, self._qwen_perm]  # [B,S,Dv] in window order
        cos, sin = visual.rotary_pos_emb(h, self._qwen_positions)  # [S,hd] each
        full = set(visual.fullatt_block_indexes)
        for i, module in enumerate(visual.blocks):
            block = cast(Qwen2_5_VLVisionBlock, module)  # nn.ModuleList yields nn.Module
            mask = None if i in full else self._qwen_window_mask  # [S,S] bool or None
            if block.gradient_checkpointing and block.training:
                h = checkpoint(_qwen_block, block, h, cos, sin, mask, use_reentrant=False)
            else:
                h = _qwen_block(block, h, cos, sin, mask)
        merged = visual.merger(h)  # [B*T, D] (the merger flattens merge units)
        return merged.view(b, self.tokens_per_image, -1)[:, self._qwen_unperm]  # [B,T,D]

    # -------------------------------------------------------------------------------------------- language
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B,L] -> the language model's input embeddings [B,L,D] (Gemma: already scaled by sqrt(D))."""
        assert ids.ndim == 2, f"expected ids [B,L], got {tuple(ids.shape)}"
        return _lookup(self._part("text"), "embed_tokens")(ids)  # [B,L,D]

    def decode(
        self,
        embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: Any = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Causal language model on ``embeds`` [B,L,D] -> (last hidden state [B,L,D], cache or None).

        ``attention_mask`` [B, L_past + L] is 1 on real positions and 0 on padding, cached positions included.
        Positions are ``arange`` over the whole sequence (cache included), padding counted. A given
        ``past_key_values`` is extended in place and returned; ``use_cache=True`` starts a new one.
        """
        assert embeds.ndim == 3 and embeds.shape[-1] == self.hidden_size, (
            f"expected embeds [B,L,{self.hidden_size}], got {tuple(embeds.shape)}"
        )
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        assert attention_mask.shape == (embeds.shape[0], past + embeds.shape[1]), (
            f"expected attention_mask [B, L_past + L] = {(embeds.shape[0], past + embeds.shape[1])}, "
            f"got {tuple(attention_mask.shape)}"
        )
        use_cache = use_cache or past_key_values is not None
        text = self._part("text")
        key = _cache_name(type(text))
        out = text(inputs_embeds=embeds, attention_mask=attention_mask, use_cache=use_cache, return_dict=True,
                   **{key: past_key_values})
        return out.last_hidden_state, (out[key] if use_cache else None)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [B,L,D] -> logits [B,L,V] (the LM head; Gemma-2 style softcapping when configured)."""
        hf = self._hf()
        out = hf.lm_head(hidden)  # [B,L,V]
        cap = getattr(hf.config.get_text_config(), "final_logit_softcapping", None)
        if cap is not None:
            out = torch.tanh(out / cap) * cap
        return out

    # -------------------------------------------------------------------------------------------- training
    def enable_gradient_checkpointing(self) -> None:
        """Recompute each transformer block's activations in the backward pass (vision and language blocks)."""
        self._hf().activation_checkpointing_enable()

    def save(self, directory: str | os.PathLike) -> None:
        """Write the VLM with ``save_pretrained`` (config.json + safetensors) for ``build_backbone(directory)``."""
        hf = self._hf()
        if any(hasattr(m, "base_layer") for m in hf.modules()):
            raise ValueError(
                "the backbone carries unmerged LoRA adapters: call merge_and_unload() on the peft model before "
                "save(), or save the adapters alone with PeftModel.save_pretrained"
            )
        hf.save_pretrained(os.fspath(directory))


def _qwen_block(block: Qwen2_5_VLVisionBlock, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: Any) -> torch.Tensor:
    """One Qwen2.5-VL vision block on [B,S,Dv], images batched (upstream packs them into one sequence)."""
    attn = block.attn
    b, s, _ = h.shape
    qkv = attn.qkv(block.norm1(h)).view(b, s, 3, attn.num_heads, -1)  # [B,S,3,heads,hd]
    q, k, v = qkv.unbind(2)  # [B,S,heads,hd] each
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=attn.scaling
    )  # [B,heads,S,hd]
    h = h + attn.proj(o.transpose(1, 2).reshape(b, s, -1))
    return h + block.mlp(block.norm2(h))


# ---------------------------------------------------------------------------------------------------- building
_TINY_KINDS = dict(zip(TINY_BACKBONES, ("smolvlm", "idefics3", "paligemma", "qwen2_5_vl", "smolvlm")))


def _special_ids(vocab_size: int) -> dict[str, int]:
    top = vocab_size - ACTION_BINS  # first action-bin id
    return {"image": top - 1, "video": top - 2, "vision_start": top - 3, "vision_end": top - 4}


class _TinyText(TypedDict):
    """Keyword arguments of a tiny language model's config (Llama, Gemma, Qwen2.5-VL text)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    pad_token_id: int
    bos_token_id: int
    eos_token_id: int


class _TinyVision(TypedDict):
    """Keyword arguments of a tiny vision tower's config (SmolVLM, Idefics3, SigLIP)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int


def _tiny_config(name: str, vocab_size: int):
    ids = _special_ids(vocab_size)
    width, heads, side = (64, 4, 64) if name == "smolvlm-small" else (32, 2, 32)
    text = _TinyText(vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                     num_attention_heads=heads, num_key_value_heads=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = _TinyVision(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=heads,
                         image_size=side, patch_size=8)  # fmt: skip
    # pad_token_id of SmolVLMConfig / Idefics3Config: an extra keyword their __post_init__ reads (the configs take
    # extra keywords through strict(accept_kwargs=True)); their dataclass_transform signature does not list it
    if name in ("smolvlm-tiny", "smolvlm-small"):
        return SmolVLMConfig(vision_config=SmolVLMVisionConfig(**vision), text_config=LlamaConfig(**text),
                             scale_factor=2, image_token_id=ids["image"],
                             pad_token_id=0)  # pyright: ignore[reportCallIssue]
    if name == "idefics3-tiny":
        return Idefics3Config(vision_config=Idefics3VisionConfig(**vision), text_config=LlamaConfig(**text),
                              scale_factor=2, image_token_id=ids["image"],
                              pad_token_id=0)  # pyright: ignore[reportCallIssue]
    if name == "paligemma-tiny":
        text_config = GemmaConfig(**text, head_dim=16, use_bidirectional_attention=False)
        return PaliGemmaConfig(vision_config=SiglipVisionConfig(**vision, vision_use_head=False).to_dict(),
                               text_config=text_config.to_dict(), image_token_index=ids["image"],
                               projection_dim=32, hidden_size=32, vocab_size=vocab_size)
    # qwen2.5-vl-tiny: 32x32 images (= 2 x window_size), 4x4 patches of 8, merged 2x2 -> 4 tokens; block 0
    # attends within windows of 2x2 patches (one merged token), block 1 over the whole image.
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4}
    return Qwen2_5_VLConfig(
        text_config={**text, "rope_parameters": rope},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=8, spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                           fullatt_block_indexes=[1]),
        image_token_id=ids["image"], video_token_id=ids["video"], vision_start_token_id=ids["vision_start"],
        vision_end_token_id=ids["vision_end"],
    )  # fmt: skip


def _load_dir(directory: str, dtype: torch.dtype) -> PreTrainedModel:
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise UserInputError(
            f"backbone directory {directory} has no config.json: expected a transformers model directory "
            "written by save_pretrained"
        )
    weights = glob.glob(os.path.join(directory, "*.safetensors")) + glob.glob(
        os.path.join(directory, "pytorch_model*.bin")
    )
    if not weights:
        raise UserInputError(
            f"backbone directory {directory} has no weights: expected *.safetensors or pytorch_model*.bin "
            "files written by save_pretrained"
        )
    try:
        with open(config_path) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise UserInputError(f"backbone config {config_path} is not a readable JSON object: {e}") from None
    if model_type not in _LAYOUTS:
        raise UserInputError(
            f"backbone directory {directory} holds model_type {model_type!r}: expected one of {tuple(_LAYOUTS)}"
        )
    cls = _LAYOUTS[model_type].cls
    assert cls.config_class is not None  # every class in _LAYOUTS names its config class
    config = cls.config_class.from_pretrained(directory, local_files_only=True)
    if model_type == "paligemma":
        config.text_config.use_bidirectional_attention = False  # plain causal attention (module docstring)
    return cls.from_pretrained(directory, config=config, local_files_only=True, dtype=dtype)


def build_backbone(name_or_dir: str | os.PathLike, *, vocab_size: int = 1024, dtype=torch.float32) -> Backbone:
    """A tiny backbone by name (random weights from the global torch RNG), or a model saved in a directory.

    Tiny configs: language model hidden 32, 2 layers, 2 heads, 1 KV head, MLP 64, text vocabulary
    ``vocab_size``; vision tower hidden 32, 2 layers, 32x32 images in 8x8 patches. Tokens per image:
    SmolVLM / Idefics3 4 (pixel shuffle 2), PaliGemma 16, Qwen2.5-VL 4 (2x2 merge).
    A directory is loaded with the matching ``*ForConditionalGeneration.from_pretrained`` offline;
    ``vocab_size`` is then the saved model's and the argument is ignored.
    """
    name = os.fspath(name_or_dir)
    if name in TINY_BACKBONES:
        minimum = ACTION_BINS + BACKBONE_SPECIAL_IDS + 1
        if vocab_size < minimum:
            raise UserInputError(
                f"vocab_size must be at least {minimum} (256 action bins, 8 special ids), got {vocab_size}"
            )
        vlm = _LAYOUTS[_TINY_KINDS[name]].cls(_tiny_config(name, vocab_size))
        # PreTrainedModel.to is decorated with functools.wraps(nn.Module.to), which typeshed types as a plain
        # callable attribute (``self`` not bound), so the dtype lands on ``self``
        vlm = vlm.to(dtype)  # pyright: ignore[reportArgumentType]
    elif os.path.isdir(name):
        vlm = _load_dir(name, dtype)
    else:
        raise UserInputError(
            f"unknown backbone {name!r}: expected one of {TINY_BACKBONES} or a directory with a saved model"
        )
    return Backbone(vlm)
