"""Observation parts and the helpers that work on flat tensors and dicts of parts alike."""

import pytest
import torch

from ctrl_rl.core.obs import (
    ObsPart,
    is_flat,
    obs_batch_size,
    obs_cat,
    obs_clone,
    obs_equal,
    obs_index,
    obs_isfinite,
    obs_map,
    obs_to,
    obs_where,
    parts_from_shape,
    state_shape,
)
from ctrl_rl.envs.protocol import EnvSpec

IMAGE = ObsPart("image/top", (3, 4, 4), torch.uint8)
STATE = ObsPart("state", (2,), torch.float32)


def _dict_obs(n: int, start: int = 0) -> dict[str, torch.Tensor]:
    rows = torch.arange(start, start + n)  # [N] row ids as values
    return {"image/top": rows.view(n, 1, 1, 1).expand(n, 3, 4, 4).to(torch.uint8).clone(),
            "state": torch.stack([rows.float(), -rows.float()], 1)}


def test_obs_part_numel_kind_and_validation():
    assert IMAGE.numel == 48 and IMAGE.kind == "image" and STATE.kind == "vector"
    assert ObsPart("language", (7,), torch.int64).kind == "language"
    assert ObsPart("language/goal", (384,), torch.float32).kind == "language"
    assert ObsPart("imagery", (2,), torch.float32).kind == "vector"  # only "image/<camera>" is an image
    assert ObsPart("x", [3, 2], torch.float32).shape == (3, 2)  # normalised to a tuple, so parts hash and compare
    with pytest.raises(ValueError, match="positive sizes"):
        ObsPart("x", (0,), torch.float32)
    with pytest.raises(ValueError, match="torch.dtype"):
        ObsPart("x", (1,), "float32")


def test_flat_parts_and_state_shape():
    assert parts_from_shape((5,)) == (ObsPart("state", (5,), torch.float32),)
    assert is_flat(parts_from_shape((5,))) and not is_flat((IMAGE, STATE)) and not is_flat((IMAGE,))
    assert not is_flat((ObsPart("state", (5,), torch.float64),))  # float64 state goes in a dict
    assert state_shape((IMAGE, STATE)) == (2,) and state_shape((IMAGE,)) == ()


def test_helpers_on_tensors_and_dicts():
    flat = torch.arange(12.0).view(4, 3)  # [N,O]
    d = _dict_obs(4)
    assert obs_batch_size(flat) == 4 and obs_batch_size(d) == 4
    assert torch.equal(obs_index(flat, torch.tensor([2, 0])), flat[[2, 0]])
    picked = obs_index(d, torch.tensor([True, False, False, True]))
    assert picked["state"][:, 0].tolist() == [0.0, 3.0] and picked["image/top"][:, 0, 0, 0].tolist() == [0, 3]
    assert picked["image/top"].dtype == torch.uint8
    doubled = obs_map(lambda x: x * 2, d)
    assert list(doubled) == ["image/top", "state"] and doubled["state"][3, 1].item() == -6.0
    cat = obs_cat([d, _dict_obs(2, start=10)])
    assert cat["state"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0] and cat["image/top"].shape == (6, 3, 4, 4)
    assert torch.equal(obs_cat([flat, flat]), torch.cat([flat, flat]))
    with pytest.raises(ValueError, match="same parts"):
        obs_cat([d, {"state": d["state"]}])
    with pytest.raises(ValueError, match="one form"):
        obs_cat([flat, d])
    moved = obs_to(d, "cpu")
    assert moved["image/top"].dtype == torch.uint8 and obs_equal(moved, d)


def test_clone_is_independent_and_equal_compares_form_parts_and_values():
    d = _dict_obs(3)
    c = obs_clone(d)
    assert obs_equal(c, d)
    d["image/top"][0] += 1
    assert not obs_equal(c, d)
    assert not obs_equal(d, {"state": d["state"]}) and not obs_equal(d["state"], d)
    assert obs_equal(torch.ones(2), torch.ones(2)) and not obs_equal(torch.ones(2), torch.zeros(2))


def test_obs_where_selects_whole_rows():
    mask = torch.tensor([True, False, True])
    a, b = _dict_obs(3), _dict_obs(3, start=100)
    out = obs_where(mask, a, b)
    assert out["state"][:, 0].tolist() == [0.0, 101.0, 2.0]
    assert out["image/top"][:, :, 2, 3].tolist() == [[0] * 3, [101] * 3, [2] * 3]  # every pixel of the row
    flat = obs_where(mask, torch.zeros(3, 2), torch.ones(3, 2))
    assert flat.tolist() == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]


def test_obs_isfinite_is_per_row_and_looks_at_float_parts_only():
    d = _dict_obs(3)
    d["state"][1, 0] = float("nan")
    assert obs_isfinite(d).tolist() == [True, False, True]
    assert obs_isfinite({"image/top": d["image/top"]}).tolist() == [True, True, True]
    flat = torch.zeros(2, 3)
    flat[0, 2] = float("inf")
    assert obs_isfinite(flat).tolist() == [False, True]


def test_env_spec_parts_flat_and_multipart():
    flat = EnvSpec("torch:X", (3,), False, 2, (-1.0, -1.0), (1.0, 1.0))  # positional fields as before
    assert flat.is_flat and flat.parts == parts_from_shape((3,)) and flat.obs_dim == 3
    pix = EnvSpec("torch:P", (2,), False, 2, obs_parts=(IMAGE, STATE))
    assert not pix.is_flat and pix.parts == (IMAGE, STATE) and pix.obs_dim == 2
    only_image = EnvSpec("torch:P", (), False, 2, obs_parts=[IMAGE])
    assert only_image.obs_parts == (IMAGE,) and only_image.obs_dim == 0 and hash(only_image)
    with pytest.raises(ValueError, match="'state' observation part"):
        EnvSpec("torch:P", (12,), False, 2, obs_parts=(IMAGE, STATE))
    with pytest.raises(ValueError, match="distinct names"):
        EnvSpec("torch:P", (2,), False, 2, obs_parts=(STATE, STATE))
