"""MinAtar as a batched env family ``minatar:<Game>`` (envs/minatar.py): the contract, step-by-step equality with
the package's own single env, same-step auto-reset and truncation, exact resume from a state dict, the spec without
the package, and the one-sentence errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

minatar = pytest.importorskip("minatar")

from minatar.gym import BaseEnv  # noqa: E402  (the package's own single env, gymnasium API)

from ctrl_rl.envs.check import check_env  # noqa: E402
from ctrl_rl.envs.minatar import GAMES, IMAGE_PART, NUM_ACTIONS  # noqa: E402
from ctrl_rl.envs.registry import list_envs, make_env, spec_of  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402

NAMES = list(GAMES)


def _grid(state: np.ndarray) -> torch.Tensor:
    """The package's ``[10,10,C]`` bool state as this env's image row: uint8 ``[C,10,10]``, 255 where set."""
    return torch.from_numpy(state.transpose(2, 0, 1).astype(np.uint8) * 255)


def _rollout_against_package(game: str, n: int, steps: int, seed: int, **options) -> int:
    """Step ``minatar:<game>`` and n of the package's single envs (``MinAtar/<Game>-v1``'s class, copy i reset with
    seed + i, as this env seeds) with the same random actions; assert equal observations, rewards, terminations
    and final observations at every step, resetting a reference env where its episode ended (or hit the time
    limit given in ``options``). Returns the number of episodes that ended."""
    module = GAMES[game][0]
    minimal = options.get("minimal_action_set", True)
    limit = options.get("max_episode_steps")
    env = make_env(f"minatar:{game}", num_envs=n, seed=seed, **options)
    refs = [BaseEnv(module, use_minimal_action_set=minimal,
                    sticky_action_prob=options.get("sticky_action_prob", 0.1),
                    difficulty_ramping=options.get("difficulty_ramping", True)) for _ in range(n)]
    obs = env.reset()[IMAGE_PART]
    for i, ref in enumerate(refs):
        assert torch.equal(obs[i], _grid(ref.reset(seed=seed + i)[0]))
    rng = np.random.default_rng(seed)
    ep_len = np.zeros(n, dtype=np.int64)
    ended = 0
    for t in range(steps):
        action = rng.integers(env.spec.action_dim, size=n)
        out = env.step(torch.from_numpy(action))
        ep_len += 1
        for i, ref in enumerate(refs):
            state, reward, terminal, _, _ = ref.step(int(action[i]))
            truncated = limit is not None and ep_len[i] >= limit and not terminal
            where = f"{game} step {t} copy {i}"
            assert torch.equal(out.final_obs[IMAGE_PART][i], _grid(state)), where
            assert out.reward[i].item() == float(reward), where
            assert out.terminated[i].item() == bool(terminal), where
            assert out.truncated[i].item() == truncated, where
            assert out.info["elapsed_step"][i].item() == ep_len[i], where
            if terminal or truncated:
                state = ref.reset()[0]  # later resets continue the copy's generator, as the env's auto-reset does
                ep_len[i] = 0
                ended += 1
            assert torch.equal(out.obs[IMAGE_PART][i], _grid(state)), where
    env.close()
    return ended


@pytest.mark.parametrize("game", NAMES)
def test_check_env(game):
    env, twin = make_env(f"minatar:{game}", num_envs=3, seed=1), make_env(f"minatar:{game}", num_envs=3, seed=1)
    check_env(env, steps=300, twin=twin)
    env.close()
    twin.close()


@pytest.mark.parametrize("game", NAMES)
def test_steps_equal_the_packages_single_env(game):
    ended = _rollout_against_package(game, n=3, steps=400, seed=7)
    if game != "Freeway":  # Freeway ends only after 2500 frames (below)
        assert ended > 0  # random play loses within 400 steps: the same-step resets were compared too


def test_freeways_own_end_after_2500_frames_and_the_full_action_set():
    assert _rollout_against_package("Freeway", n=2, steps=2600, seed=3) == 2
    _rollout_against_package("SpaceInvaders", n=2, steps=300, seed=4, minimal_action_set=False)


def test_time_limit_truncates_and_options_reach_the_package():
    assert _rollout_against_package("Freeway", n=2, steps=100, seed=5, max_episode_steps=30) == 6
    _rollout_against_package("Asterix", n=2, steps=300, seed=6, sticky_action_prob=0.0, difficulty_ramping=False)


def test_auto_reset_gives_final_obs_and_the_next_episodes_first_obs():
    env = make_env("minatar:Breakout", num_envs=4, seed=0, sticky_action_prob=0.0)
    env.reset()
    seen = 0
    for _ in range(200):
        out = env.step(torch.zeros(4, dtype=torch.int64))  # no-op: the ball falls past the paddle
        done = out.done
        if done.any():
            seen += int(done.sum())
            # a new Breakout episode: paddle at column 4, ball (and its trail) in row 3 at a side, 3 full brick rows
            for f in out.obs[IMAGE_PART][done]:
                assert f[0].nonzero().tolist() == [[9, 4]] and f[3, 1:4].eq(255).all() and f[3].sum() == 30 * 255
                assert f[1].nonzero().tolist() in ([[3, 0]], [[3, 9]]) and torch.equal(f[1], f[2])
            assert (out.final_obs[IMAGE_PART][done] != out.obs[IMAGE_PART][done]).flatten(1).any(1).all()
            assert (out.info["elapsed_step"][done] > 1).all() and not out.truncated.any()
        keep = ~done
        assert torch.equal(out.obs[IMAGE_PART][keep], out.final_obs[IMAGE_PART][keep])
    assert seen > 0


@pytest.mark.parametrize("game", NAMES)
def test_state_dict_round_trip_equals_an_uninterrupted_rollout(game):
    gen = torch.Generator().manual_seed(0)
    env = make_env(f"minatar:{game}", num_envs=3, seed=11)
    env.reset()
    spec = env.spec
    for _ in range(150):
        env.step(torch.randint(spec.action_dim, (3,), generator=gen))
    buf = io.BytesIO()
    torch.save(env.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)  # the checkpoint format's loader
    resumed = make_env(f"minatar:{game}", num_envs=3, seed=99)
    resumed.load_state_dict(saved)
    for t in range(300):
        a = torch.randint(spec.action_dim, (3,), generator=gen)
        x, y = env.step(a), resumed.step(a)
        for k in ("reward", "terminated", "truncated"):
            assert torch.equal(getattr(x, k), getattr(y, k)), f"{game} step {t} {k}"
        assert torch.equal(x.obs[IMAGE_PART], y.obs[IMAGE_PART]), f"{game} step {t}"
        assert torch.equal(x.final_obs[IMAGE_PART], y.final_obs[IMAGE_PART]), f"{game} step {t}"
        assert torch.equal(x.info["elapsed_step"], y.info["elapsed_step"]), f"{game} step {t}"
    with pytest.raises(ValueError, match="copies"):
        make_env(f"minatar:{game}", num_envs=2).load_state_dict(saved)


@pytest.mark.parametrize("game", NAMES)
def test_the_static_table_is_the_packages(game):
    module, channels, minimal = GAMES[game]
    env = minatar.Environment(module)
    assert env.state_shape() == [10, 10, channels]
    assert tuple(env.minimal_action_set()) == minimal and env.num_actions() == NUM_ACTIONS


@pytest.mark.parametrize("game", NAMES)
def test_spec_of_equals_the_built_envs_spec(game):
    for options in ("", ",minimal_action_set=false,max_episode_steps=none",
                    ",sticky_action_prob=0,max_episode_steps=9"):
        env_id = f"minatar:{game}{options}"
        env = make_env(env_id, num_envs=2)
        assert spec_of(env_id) == env.spec
        part = env.spec.parts[0]
        assert part.name == IMAGE_PART and part.dtype == torch.uint8 and part.shape == (GAMES[game][1], 10, 10)
        assert env.spec.action_dim == (NUM_ACTIONS if "minimal" in options else len(GAMES[game][2]))
    assert spec_of(f"minatar:{game}").max_episode_steps == 27_000
    assert spec_of(f"minatar:{game},max_episode_steps=none").max_episode_steps is None


def test_the_family_is_listed():
    assert {f"minatar:{g}" for g in NAMES} <= set(list_envs("minatar"))


def test_wrong_names_and_options_are_one_sentence():
    with pytest.raises(UserInputError, match=r"unknown env id 'minatar:Breakot'.*did you mean 'minatar:Breakout'"):
        make_env("minatar:Breakot")
    with pytest.raises(UserInputError, match=r"unknown env id 'minatar:pong'"):
        spec_of("minatar:pong")
    with pytest.raises(UserInputError, match=r"sticky_action_prob=1.5 for minatar:Breakout: expected a probability"):
        make_env("minatar:Breakout,sticky_action_prob=1.5")
    with pytest.raises(UserInputError, match=r"max_episode_steps=0 for minatar:Asterix"):
        spec_of("minatar:Asterix,max_episode_steps=0")
    with pytest.raises(UserInputError, match=r"minatar:Breakout,frame_skip=4"):
        make_env("minatar:Breakout,frame_skip=4")
    env = make_env("minatar:Breakout", num_envs=2)
    with pytest.raises(ValueError, match=r"expects int64 action indices of shape \(2,\)"):
        env.step(torch.zeros(3, dtype=torch.int64))


def test_a_10x10_grid_gets_a_cnn_that_fits_and_a_sentence_when_it_does_not():
    from ctrl_rl.core.encoders import EncoderConfig, make_encoder

    part = spec_of("minatar:Seaquest").parts
    enc = make_encoder(part, EncoderConfig(cnn_layers=2))
    obs = make_env("minatar:Seaquest", num_envs=2).reset()
    feats = enc(obs)
    assert feats.shape == (2, enc.out_dim) and torch.isfinite(feats).all()
    with pytest.raises(UserInputError, match=r"10x10 is too small for 4 conv layers.*--cnn-layers 2 or fewer"):
        make_encoder(part, EncoderConfig(cnn_layers=4))


def test_impala_trains_and_evaluates_from_the_cli(tmp_path, capsys):
    import json

    from ctrl_rl.cli import main

    d = tmp_path / "impala"
    code = main(["train", "impala", "--env", "minatar:Breakout,max_episode_steps=200", "--actors", "2",
                 "--num-envs", "2", "--unroll", "10", "--segments-per-update", "2", "--cnn-layers", "2",
                 "--actor-hidden", "16", "--critic-hidden", "16", "--total-steps", "80", "--run-dir", str(d),
                 "--threads", "1", "--no-progress", "--log-every", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 80 and all(np.isfinite(r["loss/value"]) for r in rows)
    assert main(["eval", str(d), "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["episodes"] == 2
    assert main(["list", "envs"]) == 0
    assert "minatar:SpaceInvaders" in capsys.readouterr().out


def test_registry_import_listing_and_specs_leave_the_package_unimported():
    import subprocess
    import sys

    code = ("import sys, ctrl_rl.envs.registry as r; r.spec_of('minatar:Seaquest'); r.list_envs('minatar'); "
            "print('minatar' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_resumed_cli_run_equals_an_uninterrupted_one(tmp_path, capsys):
    import json

    from ctrl_rl.cli import main

    common = ["--env", "minatar:Seaquest", "--num-envs", "4", "--rollout-steps", "16", "--cnn-layers", "2",
              "--actor-hidden", "16", "--critic-hidden", "16", "--threads", "1", "--no-progress", "--seed", "3"]
    assert main(["train", "ppo", *common, "--total-steps", "256", "--run-dir", str(tmp_path / "a")]) == 0
    assert main(["train", "ppo", *common, "--total-steps", "128", "--checkpoint-every", "1",
                 "--run-dir", str(tmp_path / "b")]) == 0
    assert main(["train", "ppo", "--total-steps", "256", "--resume", str(tmp_path / "b"), "--threads", "1",
                 "--no-progress"]) == 0
    capsys.readouterr()
    rows = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()] for r in "ab"]
    keys = ("step", "loss/value", "loss/policy", "episode_return", "episode_length")
    assert [[r.get(k) for k in keys] for r in rows[0]] == [[r.get(k) for k in keys] for r in rows[1]]
