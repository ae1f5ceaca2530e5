"""Observation encoders and DrQ's random shift."""

import pytest
import torch

from ctrl_rl.core.encoders import EncoderConfig, make_encoder, random_shift, random_shift_obs, shift_images
from ctrl_rl.core.obs import ObsPart, parts_from_shape

SMALL = EncoderConfig(cnn_channels=8, cnn_layers=2, image_features=16, token_vocab=10, token_dim=4)


def test_flat_state_passes_through_untouched():
    enc = make_encoder(parts_from_shape((5,)), SMALL)
    obs = torch.randn(7, 5)
    assert enc(obs) is obs  # the very tensor: no op, no copy
    assert enc.out_dim == 5 and len(list(enc.parameters())) == 0
    grid = make_encoder(parts_from_shape((2, 3)), SMALL)
    out = grid(torch.arange(12.0).view(2, 2, 3))
    assert grid.out_dim == 6 and out.shape == (2, 6) and out[1].tolist() == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]


def test_parts_are_encoded_and_concatenated_in_part_order():
    parts = (
        ObsPart("image/top", (3, 16, 16), torch.uint8),
        ObsPart("state", (2,), torch.float32),
        ObsPart("language", (3,), torch.int64),
        ObsPart("language/embedding", (5,), torch.float32),
    )
    enc = make_encoder(parts, SMALL)
    assert enc.out_dim == 16 + 2 + 4 + 5
    g = torch.Generator().manual_seed(0)
    obs = {
        "language/embedding": torch.randn(4, 5, generator=g),  # dict order differs from part order on purpose
        "state": torch.randn(4, 2, generator=g),
        "image/top": torch.randint(0, 256, (4, 3, 16, 16), generator=g, dtype=torch.uint8),
        "language": torch.tensor([[3, 0, 0], [3, 5, 0], [0, 0, 0], [1, 2, 3]]),
    }
    out = enc(obs)
    assert out.shape == (4, enc.out_dim) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.equal(out[:, 16:18], obs["state"]) and torch.equal(out[:, 22:], obs["language/embedding"])
    emb = enc.encoders["language"].embed.weight
    tokens = out[:, 18:22]
    torch.testing.assert_close(tokens[0], emb[3])  # padding (id 0) is left out of the mean
    torch.testing.assert_close(tokens[1], (emb[3] + emb[5]) / 2)
    assert torch.equal(tokens[2], torch.zeros(4))  # all padding: zero features, no division by zero
    img = out[:, :16]
    assert (img.abs() <= 1).all() and img.std() > 0  # tanh output, not constant
    out.sum().backward()
    conv = enc.encoders["image/top"].convs[0].weight
    assert conv.grad is not None and conv.grad.abs().sum() > 0


def test_uint8_images_are_scaled_to_unit_range():
    part = ObsPart("image/top", (3, 12, 12), torch.uint8)
    enc = make_encoder((part,), SMALL)
    fenc = make_encoder((ObsPart("image/top", (3, 12, 12), torch.float32),), SMALL)
    fenc.load_state_dict(enc.state_dict())
    x = torch.randint(0, 256, (2, 3, 12, 12), dtype=torch.uint8)
    torch.testing.assert_close(enc({"image/top": x}), fenc({"image/top": x.float() / 255}))


def test_encoder_refuses_parts_it_cannot_encode():
    with pytest.raises(ValueError, match="token_vocab"):
        make_encoder((ObsPart("language", (8,), torch.int64),), EncoderConfig())
    with pytest.raises(ValueError, match="too small"):
        make_encoder((ObsPart("image/top", (3, 8, 8), torch.uint8),), EncoderConfig(cnn_layers=4))
    with pytest.raises(ValueError, match=r"\[C,H,W\]"):
        make_encoder((ObsPart("image/top", (64, 64), torch.uint8),), EncoderConfig())
    with pytest.raises(ValueError, match="cnn_layers"):
        EncoderConfig(cnn_layers=0)


def test_shift_images_matches_hand_made_crops():
    img = torch.arange(1, 10, dtype=torch.uint8).view(1, 1, 3, 3).expand(3, 2, 3, 3)  # [B,C,3,3], rows 123/456/789
    shifts = torch.tensor([[0, 0], [2, 1], [1, 1]])  # (row, col) offsets into the 1-pixel replicate-padded 5x5
    out = shift_images(img, shifts, pad=1)
    assert out.dtype == torch.uint8 and out.shape == (3, 2, 3, 3)
    # padded image: row -1 and row 3 replicate rows 0 and 2; col -1 and col 3 replicate cols 0 and 2
    assert out[0, 0].tolist() == [[1, 1, 2], [1, 1, 2], [4, 4, 5]]  # crop at the top-left corner
    assert out[1, 1].tolist() == [[4, 5, 6], [7, 8, 9], [7, 8, 9]]  # one row down, columns unshifted
    assert torch.equal(out[2], img[2])  # (pad, pad) is the identity


def test_random_shift_is_seeded_per_sample_and_keeps_dtype():
    g = torch.Generator().manual_seed(0)
    imgs = torch.randint(0, 256, (64, 3, 10, 10), generator=g, dtype=torch.uint8)
    out = random_shift(imgs, 2, torch.Generator().manual_seed(5))
    shifts = torch.randint(0, 5, (64, 2), generator=torch.Generator().manual_seed(5))  # the same draws
    assert out.dtype == torch.uint8 and torch.equal(out, shift_images(imgs, shifts, 2))
    assert len({tuple(s) for s in shifts.tolist()}) > 10  # per-sample offsets, not one for the batch
    same = (shifts == 2).all(1)
    assert torch.equal(out[same], imgs[same]) and not torch.equal(out[~same], imgs[~same])
    floats = random_shift(imgs.float(), 2, torch.Generator().manual_seed(5))
    assert torch.equal(floats, out.float())
    obs = {"image/top": imgs, "state": torch.randn(64, 2)}
    shifted = random_shift_obs(obs, 2, torch.Generator().manual_seed(5))
    assert torch.equal(shifted["image/top"], out) and shifted["state"] is obs["state"]
    flat = torch.randn(4, 3)
    assert random_shift_obs(flat, 2) is flat
