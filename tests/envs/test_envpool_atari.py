"""envpool Atari as an image env: one uint8 part ``image/frames`` [4,84,84] (envs/envpool.py), the contract's
dict observations and ``final_obs``, the CNN built for it, and IMPALA trained and evaluated on it from the CLI."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("envpool")

from ctrl_rl.cli import main  # noqa: E402
from ctrl_rl.core.encoders import ImageEncoder, make_encoder  # noqa: E402
from ctrl_rl.core.obs import ObsPart  # noqa: E402
from ctrl_rl.envs.check import check_env  # noqa: E402
from ctrl_rl.envs.registry import make_env  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402

ENV = "envpool:Breakout-v5"
FRAMES = "image/frames"


def _random(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 4, (n,), generator=gen)  # [N] int64; Breakout's minimal action set has 4 actions


def test_spec_is_one_uint8_image_part_with_envpool_defaults():
    env = make_env(ENV, num_envs=2, seed=0)
    spec = env.spec
    assert spec.parts == (ObsPart(FRAMES, (4, 84, 84), torch.uint8),)
    assert not spec.is_flat and spec.obs_shape == () and spec.obs_dim == 0
    assert spec.discrete and spec.action_dim == 4 and spec.backend == "envpool"
    assert spec.max_episode_steps == 27000  # envpool's default: 108k frames
    assert spec.dt == pytest.approx(4 / 60)  # frame_skip 4 at 60 Hz
    assert make_env(f"{ENV},stack_num=2", num_envs=1).spec.parts == (ObsPart(FRAMES, (2, 84, 84), torch.uint8),)
    env.close()


def test_reset_and_step_give_dict_observations_of_stacked_frames():
    env = make_env(ENV, num_envs=3, seed=1)
    gen = torch.Generator().manual_seed(0)
    obs = env.reset()
    assert list(obs) == [FRAMES] and obs[FRAMES].dtype == torch.uint8 and obs[FRAMES].shape == (3, 4, 84, 84)
    assert all(torch.equal(obs[FRAMES][:, 0], obs[FRAMES][:, k]) for k in range(4))  # a fresh stack: one frame x4
    assert obs[FRAMES].float().std() > 0  # a real screen, not zeros
    for _ in range(5):
        out = env.step(_random(3, gen))
        assert list(out.obs) == [FRAMES] and list(out.final_obs) == [FRAMES]
        assert out.obs[FRAMES].shape == (3, 4, 84, 84) and out.obs[FRAMES].dtype == torch.uint8
        assert out.reward.shape == (3,) and out.reward.dtype == torch.float32
        assert out.terminated.dtype == torch.bool and out.truncated.dtype == torch.bool
        assert not out.done.any()
        # the stack slides by one frame (oldest first), and final_obs is obs where nothing ended
        assert torch.equal(out.obs[FRAMES][:, :3], obs[FRAMES][:, 1:])
        assert torch.equal(out.final_obs[FRAMES], out.obs[FRAMES])
        obs = out.obs
    env.close()


def test_truncation_keeps_the_last_frames_in_final_obs_and_starts_a_new_game():
    env = make_env(ENV, num_envs=2, seed=2, max_episode_steps=4)
    gen = torch.Generator().manual_seed(1)
    obs = env.reset()
    for t in range(1, 5):
        out = env.step(_random(2, gen))
        ended = t == 4
        assert out.truncated.tolist() == [ended] * 2 and not out.terminated.any()
        assert torch.equal(out.final_obs[FRAMES][:, :3], obs[FRAMES][:, 1:])  # the episode's own next stack
        if ended:
            new = out.obs[FRAMES]
            assert all(torch.equal(new[:, 0], new[:, k]) for k in range(4))  # the new game's first stack
            assert not torch.equal(out.final_obs[FRAMES], new)
            assert (out.info["elapsed_step"] == 4).all()
        obs = out.obs
    nxt = env.step(_random(2, gen))  # an ordinary step of the new game, not envpool's dummy reset step
    assert (nxt.info["elapsed_step"] == 1).all() and torch.equal(nxt.obs[FRAMES][:, :3], obs[FRAMES][:, 1:])
    env.close()


def test_a_lost_game_terminates_with_its_final_frames():
    # random play loses Breakout's 5 lives within a few hundred steps; the reward is the unclipped score change
    env = make_env(ENV, num_envs=2, seed=3)
    gen = torch.Generator().manual_seed(2)
    obs, rewards = env.reset(), []
    for _ in range(3000):
        out = env.step(_random(2, gen))
        rewards.append(out.reward)
        if out.terminated.any():
            break
        obs = out.obs
    else:
        pytest.fail("no Breakout game ended in 3000 random steps")
    i = int(out.terminated.nonzero()[0])
    assert not out.truncated[i]
    assert torch.equal(out.final_obs[FRAMES][i, :3], obs[FRAMES][i, 1:])
    assert not torch.equal(out.final_obs[FRAMES][i], out.obs[FRAMES][i])
    assert all(torch.equal(out.obs[FRAMES][i, 0], out.obs[FRAMES][i, k]) for k in range(4))
    seen = torch.cat(rewards).unique().tolist()
    assert set(seen) <= {0.0, 1.0, 4.0, 7.0}  # Breakout's brick values: no clipping, no life-loss penalty
    env.close()


def test_passes_check_env():
    check_env(make_env(ENV, num_envs=2, seed=4, max_episode_steps=20), steps=45,
              twin=make_env(ENV, num_envs=2, seed=4, max_episode_steps=20))


def test_episodic_life_is_refused():
    with pytest.raises(UserInputError, match="episodic_life=True"):
        make_env(f"{ENV},episodic_life=true", num_envs=1)


def test_make_encoder_builds_a_cnn_over_the_four_frames():
    spec = make_env(ENV, num_envs=1).spec
    enc = make_encoder(spec.parts)
    cnn = enc.encoders[FRAMES]
    assert isinstance(cnn, ImageEncoder) and cnn.convs[0].in_channels == 4
    x = {FRAMES: torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)}
    feats = enc(x)
    assert feats.shape == (2, enc.out_dim) and torch.isfinite(feats).all()
    # each frame of the stack reaches the features
    for k in range(4):
        y = {FRAMES: x[FRAMES].clone()}
        y[FRAMES][:, k] = 255 - y[FRAMES][:, k]
        assert not torch.allclose(enc(y), feats)


def test_impala_trains_and_evaluates_from_the_cli(tmp_path, capsys):
    d = tmp_path / "impala"
    env = f"{ENV},max_episode_steps=15"  # short games, so that episodes end in training and in eval
    code = main(["train", "impala", "--env", env, "--actors", "2", "--num-envs", "2", "--unroll", "10",
                 "--segments-per-update", "2", "--cnn-layers", "2", "--actor-hidden", "16", "--critic-hidden", "16",
                 "--total-steps", "80", "--run-dir", str(d), "--threads", "1", "--no-progress", "--log-every", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out.splitlines()[0])["step"] == 80
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor([r["loss/value"], r["loss/policy"]])).all() for r in rows)
    assert rows[-1]["episode_return"] is not None  # 15-step games ended (each env ran 20 steps)
    assert main(["eval", str(d), "--episodes", "2"]) == 0
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert res["episodes"] == 2 and res["length_mean"] == 15


def test_ppo_pipelines_its_two_env_groups_on_image_observations(tmp_path, capsys):
    d = tmp_path / "ppo"
    code = main(["train", "ppo", "--env", ENV, "--pipeline", "--num-envs", "4", "--rollout-steps", "8",
                 "--total-steps", "64", "--cnn-layers", "2", "--actor-hidden", "16", "--critic-hidden", "16",
                 "--run-dir", str(d), "--threads", "1", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 64
