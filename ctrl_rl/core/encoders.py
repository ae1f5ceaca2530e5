"""Observation encoders: an ``Obs`` batch (``ctrl_rl.core.obs``) -> features ``[B,F]`` for the MLP heads.

``make_encoder(parts, cfg)`` builds one ``Encoder`` per observation layout:

- flat observations (the single float32 ``state`` part): a pass-through. ``forward`` returns the very
  tensor it was given (``[B,O]``; a multi-dim state is flattened, a view), so vector envs pay nothing
  and their networks and checkpoints are the ones they had before encoders existed;
- vector parts (``state`` and any other non-image, non-language name): flattened as they are, cast to
  float32;
- image parts (``image/<camera>``, uint8 ``[C,H,W]``): the DrQ / SAC-AE convolutional encoder (Yarats
  et al. 2021, "Image Augmentation Is All You Need", and 2019, "Improving Sample Efficiency in
  Model-Free RL from Images"): ``x / 255``, a 3x3 conv with stride ``cnn_stride`` (DrQ: 2), ``cnn_layers - 1``
  3x3 convs with stride 1 (ReLU after each, no padding), flatten, Linear to ``image_features``, LayerNorm, tanh, with
  DrQ's initialisation (orthogonal Linear weights; delta-orthogonal convs: only the kernel's centre tap
  is set, orthogonal with ReLU gain). Each camera has its own CNN;
- language parts: int64 token ids ``[L]`` go through an embedding (``token_vocab`` x ``token_dim``)
  and a mean over the non-padding tokens (id 0 is padding, as in the BERT and T5 vocabularies); a
  float32 instruction embedding ``[D]`` passes through;
- fusion: the features of all parts concatenated in the order of ``parts``.

``random_shift`` is DrQ's augmentation (pad by replicating the border, crop back at a random offset);
the algorithm applies it to image parts before the encoder, so the encoder itself stays deterministic.

Shape letters: B batch, C channels, H height, W width, L tokens, F features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from ctrl_rl.core.obs import Obs, ObsPart, is_flat
from ctrl_rl.errors import UserInputError


@dataclass(frozen=True)
class EncoderConfig:
    """How observation parts other than a flat state are encoded (see the module docstring)."""

    cnn_channels: int = 32
    """Channels of every conv layer (DrQ and SAC-AE: 32)."""
    cnn_layers: int = 4
    """Conv layers per camera: one with stride 2, the rest with stride 1 (DrQ and SAC-AE: 4; 2 is much
    cheaper on CPU for small, simple scenes such as ``torch:PointMassPixels``)."""
    cnn_stride: int = 2
    """Stride of the first conv layer (DrQ and SAC-AE: 2). 1 keeps every cell of a small grid: MinAtar's reference
    agents (Young & Tian 2019, the package's examples) read the 10x10 grid with one 3x3 conv of 16 channels at
    stride 1 (``--cnn-channels 16 --cnn-layers 1 --cnn-stride 1``)."""
    image_features: int = 50
    """Output size of each camera's Linear + LayerNorm + tanh (DrQ and SAC-AE: 50)."""
    token_vocab: int = 0
    """Vocabulary size for int64 language token ids (the tokenizer's); required when such a part exists."""
    token_dim: int = 64
    """Embedding size of a language token; also the feature size of a token-id part."""

    def __post_init__(self):
        for name in ("cnn_channels", "cnn_layers", "cnn_stride", "image_features", "token_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EncoderConfig.{name} must be a positive integer, got {getattr(self, name)!r}.")
        if int(self.token_vocab) < 0:
            raise ValueError(f"EncoderConfig.token_vocab must be >= 0, got {self.token_vocab!r}.")


class _HasEncoderFields(Protocol):
    """The flat fields an ``EncoderFields`` config declares (as dataclass fields of its own)."""

    @property
    def cnn_channels(self) -> int: ...
    @property
    def cnn_layers(self) -> int: ...
    @property
    def cnn_stride(self) -> int: ...
    @property
    def image_features(self) -> int: ...


class EncoderFields:
    """Mixin for an algorithm config with the flat fields ``cnn_channels``, ``cnn_layers``, ``cnn_stride`` and
    ``image_features``: ``encoder`` builds the ``EncoderConfig`` from them. The fields stay flat, rather than
    a nested ``EncoderConfig``, because the CLI checks flags against a config's own fields."""

    @property
    def encoder(self: _HasEncoderFields) -> EncoderConfig:
        """The observation encoder's settings (``make_encoder``)."""
        return EncoderConfig(cnn_channels=self.cnn_channels, cnn_layers=self.cnn_layers, cnn_stride=self.cnn_stride,
                             image_features=self.image_features)


# ---- augmentation ----------------------------------------------------------------------------------


def shift_images(images: torch.Tensor, shifts: torch.Tensor, pad: int) -> torch.Tensor:
    """Each image padded by ``pad`` border-replicated pixels, then cropped back at offset ``shifts``.

    Args:
        images: ``[B,C,H,W]``, any dtype (uint8 stays uint8; values are only moved, never mixed).
        shifts: ``[B,2]`` integer (row, column) offsets of the crop into the padded image, in
            ``[0, 2*pad]``; ``(pad, pad)`` gives the image back unchanged.
        pad: border width.

    Returns:
        ``[B,C,H,W]``: ``out[b, c, i, j] = images[b, c, clip(i + dy - pad, 0, H-1), clip(j + dx - pad, 0, W-1)]``
        with ``(dy, dx) = shifts[b]``. Clamping the source index is exactly replicate padding, so no
        padded copy is made.
    """
    B, C, H, W = images.shape
    dev = images.device
    rows = (torch.arange(H, device=dev) + (shifts[:, 0:1] - pad)).clamp_(0, H - 1)  # [B,H]
    cols = (torch.arange(W, device=dev) + (shifts[:, 1:2] - pad)).clamp_(0, W - 1)  # [B,W]
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)  # [B,1,1,1]
    c = torch.arange(C, device=dev).view(1, C, 1, 1)  # [1,C,1,1]
    return images[b, c, rows.view(B, 1, H, 1), cols.view(B, 1, 1, W)]  # [B,C,H,W]


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ random shift: replicate-pad by ``pad``, crop back to ``H x W`` at a per-sample random offset.

    Args:
        images: ``[B,C,H,W]`` uint8 or float.
        pad: border width (DrQ: 4 for 84x84 images).
        generator: source of the offsets; it must live on ``images.device``.

    Returns:
        ``[B,C,H,W]``, same dtype. Offsets are integers, uniform in ``[0, 2*pad]`` per axis and sample
        (DrQ's integer crop; DrQ-v2's bilinear ``grid_sample`` at pixel-aligned shifts is the same map).
    """
    if pad < 0:
        raise ValueError(f"random_shift pad must be >= 0, got {pad}.")
    shifts = torch.randint(0, 2 * pad + 1, (images.shape[0], 2), generator=generator, device=images.device)  # [B,2]
    return shift_images(images, shifts, pad)


def random_shift_obs(obs: Obs, pad: int, generator: torch.Generator | None = None) -> Obs:
    """``random_shift`` applied to every image part of ``obs`` (each camera its own offsets); other parts
    and flat observations are returned as they are."""
    if isinstance(obs, torch.Tensor):
        return obs
    return {k: random_shift(v, pad, generator) if k.startswith("image/") else v for k, v in obs.items()}


# ---- per-part encoders -----------------------------------------------------------------------------


class ImageEncoder(nn.Module):
    """DrQ / SAC-AE conv encoder for one camera: ``[B,C,H,W]`` (uint8 0..255 or float 0..1) -> ``[B,F]``."""

    def __init__(self, part: ObsPart, cfg: EncoderConfig):
        super().__init__()
        if len(part.shape) != 3:
            raise ValueError(f"image part {part.name!r} has shape {list(part.shape)}, expected [C,H,W].")
        C, H, W = part.shape
        ch, layers, stride = int(cfg.cnn_channels), int(cfg.cnn_layers), int(cfg.cnn_stride)
        first = (min(H, W) - 3) // stride + 1  # pixels a side after the first conv (< 1: it does not fit)
        h, w = (H - 3) // stride + 1 - 2 * (layers - 1), (W - 3) // stride + 1 - 2 * (layers - 1)  # after the convs
        if h < 1 or w < 1:  # a user's setting (--cnn-layers) against an env's image size: say what fits
            fits = (first - 1) // 2 + 1 if first >= 1 else 0  # the most layers that leave one pixel a side
            hint = f", or --cnn-layers {fits} or fewer for this image" if fits >= 1 else ""
            need = stride * (2 * layers - 2) + 3  # the smallest side that leaves one pixel after the convs
            raise UserInputError(f"image part {part.name!r} of size {H}x{W} is too small for {layers} conv layers "
                                 f"(first stride {stride}): expected at least {need} pixels a side{hint}.")
        convs: list[nn.Module] = [nn.Conv2d(C, ch, 3, stride=stride), nn.ReLU()]
        for _ in range(layers - 1):
            convs += [nn.Conv2d(ch, ch, 3, stride=1), nn.ReLU()]
        self.convs = nn.Sequential(*convs)
        self.head = nn.Sequential(nn.Linear(ch * h * w, cfg.image_features), nn.LayerNorm(cfg.image_features),
                                  nn.Tanh())
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):  # delta-orthogonal: the centre tap carries an orthogonal map
                    m.weight.zero_()
                    nn.init.orthogonal_(m.weight[:, :, 1, 1], nn.init.calculate_gain("relu"))
                    assert m.bias is not None  # every conv here is built with bias=True
                    m.bias.zero_()
                elif isinstance(m, nn.Linear):
                    nn.init.orthogonal_(m.weight)
                    m.bias.zero_()
        self.scale = 1.0 / 255.0 if part.dtype == torch.uint8 else 1.0
        self.out_dim = int(cfg.image_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() * self.scale  # [B,C,H,W] in [0,1]
        return self.head(self.convs(x).flatten(1))  # [B,F]


class TokenEncoder(nn.Module):
    """Token ids ``[B,L]`` int64 -> mean of the embeddings of the non-padding (id != 0) tokens ``[B,D]``."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.out_dim = int(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embed(ids)  # [B,L,D]; padding rows are zero
        count = (ids != 0).sum(1, keepdim=True).clamp_(min=1)  # [B,1]
        return e.sum(1) / count  # [B,D]


class VectorEncoder(nn.Module):
    """A vector part as it is: ``[B,*shape]`` -> ``[B,numel]`` float32."""

    def __init__(self, part: ObsPart):
        super().__init__()
        self.out_dim = part.numel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).float()  # [B,numel]; no copy for float32 input


class Encoder(nn.Module):
    """An ``Obs`` batch -> features ``[B,out_dim]``: one sub-encoder per part, concatenated in part order.

    Built by ``make_encoder``. For flat observations it has no sub-encoders and ``forward`` returns its
    input (flattened to ``[B,O]`` only when the state has several dims). A ``keyed`` encoder always reads a
    dict of parts, even of the single ``state`` part (a network that reads some of an env's parts, e.g. the
    actor of an asymmetric actor-critic); parts of the dict it was not built for are left alone. Built for the
    single ``state`` part, it also takes that part as a plain tensor (the input of such a policy's export).
    """

    def __init__(self, parts: Sequence[ObsPart], cfg: EncoderConfig, keyed: bool = False):
        super().__init__()
        self.parts = tuple(parts)
        if not self.parts:
            raise ValueError("an encoder needs at least one observation part.")
        self.passthrough = is_flat(self.parts) and not keyed
        self.keyed_state = is_flat(self.parts) and keyed  # reads {"state": ...}, or the state part as a tensor
        self.flatten_state = self.passthrough and len(self.parts[0].shape) != 1
        self.names = [p.name for p in self.parts]
        # nn.ModuleDict keys may not contain "."; part names use "/" (image/top), which is allowed.
        encoders = {} if self.passthrough else {p.name: _part_encoder(p, cfg) for p in self.parts}
        self.encoders = nn.ModuleDict(encoders)
        self.part_dims = {k: int(m.out_dim) for k, m in encoders.items()}  # features of each part
        self.out_dim = self.parts[0].numel if self.passthrough else sum(m.out_dim for m in encoders.values())

    def forward(self, obs: Obs, names: Sequence[str] | None = None) -> torch.Tensor:
        """Features of every part (``names`` None), or of the parts ``names`` only, concatenated in that order
        (a subset of the parts the encoder was built for; not for a pass-through encoder)."""
        if self.passthrough:  # flat state: no op at all
            assert isinstance(obs, torch.Tensor)  # a flat spec (is_flat) means plain-tensor observations
            return obs.flatten(1) if self.flatten_state else obs  # [B,O]
        if isinstance(obs, torch.Tensor) and self.keyed_state:
            obs = {"state": obs}  # the export of a policy that reads the state part alone passes it as a tensor
        assert not isinstance(obs, torch.Tensor)  # several parts, or a non-flat one: a dict of parts
        feats = list(self.part_features(obs, self.names if names is None else names).values())  # [B,F_k] each
        return feats[0] if len(feats) == 1 else torch.cat(feats, dim=-1)  # [B,F]

    def part_features(self, obs: dict[str, torch.Tensor], names: Sequence[str]) -> dict[str, torch.Tensor]:
        """``{name: [B,F_name]}``: each part's own features, for a caller that concatenates several subsets of
        them (an asymmetric actor-critic's actor and critic) without encoding a part twice."""
        return {k: self.encoders[k](obs[k]) for k in names}

    def out_dim_of(self, names: Sequence[str]) -> int:
        """Features of the parts ``names`` together (``forward(obs, names)``'s width)."""
        return sum(self.part_dims[k] for k in names)


def _part_encoder(part: ObsPart, cfg: EncoderConfig) -> ImageEncoder | TokenEncoder | VectorEncoder:
    if part.kind == "image":
        if part.dtype != torch.uint8 and not part.dtype.is_floating_point:
            raise ValueError(f"image part {part.name!r} has dtype {part.dtype}, "
                             "expected torch.uint8 (or float in [0,1]).")
        return ImageEncoder(part, cfg)
    if part.kind == "language" and not part.dtype.is_floating_point:
        if len(part.shape) != 1:
            raise ValueError(f"language part {part.name!r} has shape {list(part.shape)}, expected token ids [L].")
        if cfg.token_vocab < 1:
            raise ValueError(f"language part {part.name!r} holds token ids: set EncoderConfig.token_vocab to the "
                             f"tokenizer's vocabulary size.")
        return TokenEncoder(cfg.token_vocab, cfg.token_dim)
    return VectorEncoder(part)  # vector parts and float language embeddings pass through


def make_encoder(parts: Sequence[ObsPart], cfg: EncoderConfig = EncoderConfig(), keyed: bool = False) -> Encoder:
    """The encoder of observations made of ``parts`` (``spec.parts``, or some of them with ``keyed``: dicts of parts
    in, even for the single ``state`` part); see the module docstring and ``Encoder``."""
    return Encoder(parts, cfg, keyed)
