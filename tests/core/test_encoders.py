"""Observation encoders and DrQ's random shift."""

import pytest
import torch

from ctrl_rl.core.encoders import (
    Encoder,
    EncoderConfig,
    ImageEncoder,
    make_encoder,
    random_shift,
    random_shift_obs,
    shift_images,
)
from ctrl_rl.core.obs import ObsPart, parts_from_shape
from ctrl_rl.errors import UserInputError

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


# ---- the first conv's stride (cnn_stride) ------------------------------------------------------------

GRID = ObsPart("image/grid", (4, 10, 10), torch.uint8)  # a MinAtar Breakout grid


def cnn_layers(enc: Encoder, name: str) -> tuple[list[torch.nn.Conv2d], torch.nn.Linear]:
    """The convs and the Linear of the CNN that reads part ``name``."""
    cnn = enc.encoders[name]
    assert isinstance(cnn, ImageEncoder)
    linear = cnn.head[0]
    assert isinstance(linear, torch.nn.Linear)
    return [m for m in cnn.convs if isinstance(m, torch.nn.Conv2d)], linear


def test_default_first_conv_keeps_drqs_stride_2():
    from ctrl_rl.algos.impala import IMPALAConfig
    from ctrl_rl.algos.ppo import PPOConfig
    from ctrl_rl.algos.sac import SACConfig

    assert EncoderConfig().cnn_stride == 2
    for cfg in (PPOConfig(), IMPALAConfig(), SACConfig()):  # every config's encoder is the default one
        assert cfg.encoder == EncoderConfig()
    convs, linear = cnn_layers(make_encoder((ObsPart("image/top", (3, 16, 16), torch.uint8),), SMALL), "image/top")
    assert [m.stride for m in convs] == [(2, 2), (1, 1)]
    assert linear.in_features == 8 * 5 * 5  # 16 -> 7 (stride 2) -> 5


def test_stride_1_single_conv_is_minatars_reference_network():
    cfg = EncoderConfig(cnn_channels=16, cnn_layers=1, cnn_stride=1, image_features=128)
    enc = make_encoder((GRID,), cfg)
    convs, linear = cnn_layers(enc, "image/grid")
    assert len(convs) == 1 and convs[0].weight.shape == (16, 4, 3, 3) and convs[0].stride == (1, 1)
    assert linear.in_features == 16 * 8 * 8 and linear.out_features == 128  # 10 -> 8, no padding
    x = torch.randint(0, 2, (5, 4, 10, 10), dtype=torch.uint8) * 255
    out = enc({"image/grid": x})
    assert out.shape == (5, 128) and enc.out_dim == 128 and torch.isfinite(out).all()


def test_stride_sets_how_many_layers_fit_and_the_sentence_says_so():
    # stride 1: 10 -> 8 -> 6 -> 4 -> 2, so four layers fit a 10x10 grid and five do not
    assert cnn_layers(make_encoder((GRID,), EncoderConfig(cnn_layers=4, cnn_stride=1)), "image/grid")[1].in_features \
        == 32 * 2 * 2
    with pytest.raises(UserInputError, match=r"10x10 is too small for 5 conv layers \(first stride 1\): expected at "
                       r"least 11 pixels a side, or --cnn-layers 4 or fewer"):
        make_encoder((GRID,), EncoderConfig(cnn_layers=5, cnn_stride=1))
    # stride 3: 10 -> 3 -> 1, so two layers fit and three do not
    with pytest.raises(UserInputError, match=r"too small for 3 conv layers \(first stride 3\): expected at least 15 "
                       r"pixels a side, or --cnn-layers 2 or fewer"):
        make_encoder((GRID,), EncoderConfig(cnn_layers=3, cnn_stride=3))


def test_a_bad_stride_is_refused():
    with pytest.raises(ValueError, match="cnn_stride must be a positive integer, got 0"):
        EncoderConfig(cnn_stride=0)


def test_cli_flag_builds_the_stride_and_refuses_a_bad_value_in_one_sentence(tmp_path, capsys):
    import json
    import subprocess
    import sys

    from ctrl_rl.cli import main
    from ctrl_rl.learn.checkpoint import load_checkpoint

    d = tmp_path / "run"
    flags = ["--env", "torch:PointMassPixels,image_size=16", "--num-envs", "4", "--rollout-steps", "4",
             "--minibatch-size", "16", "--epochs", "1", "--total-steps", "16", "--threads", "1", "--no-progress",
             "--cnn-channels", "16", "--cnn-layers", "1", "--image-features", "8"]
    assert main(["train", "ppo", *flags, "--cnn-stride", "1", "--run-dir", str(d)]) == 0, capsys.readouterr().err
    assert json.loads((d / "config.json").read_text())["config"]["cnn_stride"] == 1
    weights = load_checkpoint(d / "checkpoints" / "latest.pt")["algo_state"]["ac"]
    conv = [v for k, v in weights.items() if k.endswith("convs.0.weight")]
    head = [v for k, v in weights.items() if k.endswith("head.0.weight")]
    assert conv[0].shape == (16, 3, 3, 3) and head[0].shape == (8, 16 * 14 * 14)  # stride 1: 16 -> 14
    bad = tmp_path / "bad"
    r = subprocess.run([sys.executable, "-m", "ctrl_rl", "train", "ppo", *flags, "--cnn-stride", "0", "--run-dir",
                        str(bad)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctrl-rl: error: ") and "cnn_stride" in lines[0], r.stderr
    assert not bad.exists()
