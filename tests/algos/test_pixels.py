"""PPO and SAC on observations with several parts (a uint8 camera image and a proprio state).

Synthetic dict batches: finite losses, the CNN moves, the actor's loss leaves SAC's encoder alone, DrQ's
shift is applied, flat envs keep no encoder, dict-input policies trace. End to end through the CLI on
torch:PointMassPixels (16 px, a tiny CNN): train, resume == uninterrupted, eval, uint8 replay.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from ctrl_rl.algos.ppo import PPO, PPOConfig
from ctrl_rl.algos.sac import SAC, SACConfig
from ctrl_rl.cli import main
from ctrl_rl.core.types import Rollout, Transition
from ctrl_rl.envs.registry import make_env, split_env_options
from ctrl_rl.envs.torch_envs import PointMassPixels
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint

SPEC = PointMassPixels(1, image_size=16).spec  # image/top uint8 [3,16,16] + state float32 [2]
ENC = dict(cnn_layers=2, cnn_channels=8, image_features=16)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _obs(*lead: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"image/top": torch.randint(0, 256, (*lead, 3, 16, 16), dtype=torch.uint8, generator=g),
            "state": torch.rand(*lead, 2, generator=g) * 2 - 1}


def _cnn(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for n, p in module.named_parameters() if "convs" in n]


def test_ppo_update_on_a_dict_rollout_trains_the_cnn_and_normalizes_the_state_only():
    T, N = 4, 8
    g = torch.Generator().manual_seed(0)
    algo = PPO(PPOConfig(rollout_steps=T, epochs=2, minibatch_size=16, value_chunk=5, **ENC), SPEC, "cpu",
               torch.Generator().manual_seed(0))
    obs, final = _obs(T, N, g=g), _obs(T, N, g=g)
    flat = {k: v.flatten(0, 1) for k, v in obs.items()}  # parts [T*N,...]
    action, logp = algo.sample(flat)  # [T*N,2], [T*N]
    assert torch.equal(logp, algo.ac.log_prob_entropy(algo.ac.features(flat), action)[0])  # first ratio exactly 1
    cnn0, mlp0 = _cnn(algo.ac), [p.detach().clone() for p in algo.ac.actor.parameters()]
    info = algo.update(Rollout(obs, action.view(T, N, 2), logp.view(T, N), torch.randn(T, N, generator=g),
                               torch.zeros(T, N, dtype=torch.bool), torch.zeros(T, N, dtype=torch.bool), final))
    assert all(math.isfinite(v) for v in info.values()) and info["stats/grad_steps"] == 2 * 2
    assert all(not torch.equal(a, b) for a, b in zip(cnn0, _cnn(algo.ac)))  # gradients reached every conv
    assert any(not torch.equal(a, b) for a, b in zip(mlp0, algo.ac.actor.parameters()))
    assert algo.ac.norm.mean.shape == (2,)  # the normalizer sees the state part, not the image
    assert torch.allclose(algo.ac.norm.mean, obs["state"].reshape(-1, 2).mean(0), atol=1e-3)


def test_ppo_values_in_chunks_equal_one_pass():
    g = torch.Generator().manual_seed(1)
    algo = PPO(PPOConfig(value_chunk=7, minibatch_size=64, **ENC), SPEC, "cpu", torch.Generator().manual_seed(0))
    obs = _obs(5, 6, g=g)
    whole = algo.ac.value({k: v.flatten(0, 1) for k, v in obs.items()}).view(5, 6)
    assert torch.allclose(algo._values(obs, 5, 6), whole, atol=1e-6)


def test_sac_update_on_a_dict_batch_drq_scheme():
    g = torch.Generator().manual_seed(0)
    B = 32
    batch = Transition(_obs(B, g=g), torch.rand(B, 2, generator=g) * 2 - 1, torch.randn(B, generator=g), _obs(B, g=g),
                       torch.zeros(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool))
    sac = SAC(SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), tau=0.1, drq_pad=2, **ENC), SPEC, "cpu",
              torch.Generator().manual_seed(0))
    # the actor's step alone never changes the encoder (it reads detached features)
    cnn0 = _cnn(sac.encoder)
    sac.update_actor(batch)
    assert all(torch.equal(a, b) for a, b in zip(cnn0, _cnn(sac.encoder)))
    # DrQ's shift: two draws of the same batch's features differ; the target's features carry no gradient
    f1, n1 = sac.features(batch)
    f2, _ = sac.features(batch)
    assert not torch.equal(f1, f2) and f1.requires_grad and not n1.requires_grad
    actor0 = [p.detach().clone() for p in sac.actor.parameters()]
    tgt0 = [p.detach().clone() for p in sac.critic_target.parameters()]
    info = sac.update(batch)
    assert all(math.isfinite(v) for v in info.values())
    assert all(not torch.equal(a, b) for a, b in zip(cnn0, _cnn(sac.encoder)))  # the critic loss trains the CNN
    assert any(not torch.equal(a, p) for a, p in zip(actor0, sac.actor.parameters()))
    for t0, t1, src in zip(tgt0, sac.critic_target.parameters(), sac.critic.parameters()):
        assert torch.allclose(t1, 0.9 * t0 + 0.1 * src.detach(), atol=1e-6)
    # the state round-trips with the encoder
    other = SAC(SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), drq_pad=2, **ENC), SPEC)
    other.load_state_dict(sac.state_dict())
    x = _obs(5, g=g)
    assert torch.equal(other.act(x, deterministic=True), sac.act(x, deterministic=True))


def test_image_only_observations_train_without_a_normalizer():
    spec = PointMassPixels(1, image_size=16, proprio=False).spec
    g = torch.Generator().manual_seed(3)
    img = lambda *lead: {"image/top": _obs(*lead, g=g)["image/top"]}  # noqa: E731
    ppo = PPO(PPOConfig(rollout_steps=2, epochs=1, minibatch_size=8, **ENC), spec)
    assert isinstance(ppo.ac.norm, torch.nn.Identity)
    obs = img(2, 4)
    action, logp = ppo.sample({"image/top": obs["image/top"].flatten(0, 1)})
    info = ppo.update(Rollout(obs, action.view(2, 4, 2), logp.view(2, 4), torch.randn(2, 4, generator=g),
                              torch.zeros(2, 4, dtype=torch.bool), torch.ones(2, 4, dtype=torch.bool), img(2, 4)))
    sac = SAC(SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), drq_pad=1, **ENC), spec)
    batch = Transition(img(8), torch.rand(8, 2, generator=g) * 2 - 1, torch.randn(8, generator=g), img(8),
                       torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.bool))
    info.update(sac.update(batch))
    assert all(math.isfinite(v) for v in info.values())


def test_flat_envs_have_no_encoder_and_configs_check_the_encoder_fields():
    flat = make_env("torch:PointMass").spec
    assert PPO(PPOConfig(), flat).ac.encoder is None
    sac = SAC(SACConfig(drq_pad=4), flat)
    assert sac.encoder is None and "encoder" not in sac.state_dict()
    with pytest.raises(ValueError, match="drq_pad"):
        SACConfig(drq_pad=-1)
    with pytest.raises(ValueError, match="cnn_layers"):
        PPOConfig(cnn_layers=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_exported_policy_takes_the_dict_and_traces(algo):
    g = torch.Generator().manual_seed(2)
    agent = (PPO(PPOConfig(**ENC), SPEC) if algo == "ppo"
             else SAC(SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), **ENC), SPEC))
    pol = agent.exportable()
    x, x2 = _obs(7, g=g), _obs(3, g=g)
    with torch.no_grad():
        eager = pol(x)
        traced = torch.jit.trace(pol, (x,), strict=False)
        assert eager.shape == (7, 2) and torch.allclose(traced(x), eager, atol=1e-5)
        assert torch.allclose(traced(x2), pol(x2), atol=1e-5)
        assert torch.allclose(agent.act(x, deterministic=True), eager, atol=1e-6)


def test_env_id_options():
    assert split_env_options("torch:PointMassPixels,image_size=16,proprio=false") == (
        "torch:PointMassPixels", {"image_size": 16, "proprio": False})
    env = make_env("torch:PointMassPixels,image_size=16,proprio=false", 2)
    assert [(p.name, p.shape) for p in env.spec.parts] == [("image/top", (3, 16, 16))]
    for bad in ("torch:PointMassPixels,size=16", "torch:PointMassPixels,image_size",
                "torch:PointMassPixels,image_size=4"):
        with pytest.raises(UserInputError):
            make_env(bad)
    with pytest.raises(UserInputError, match="one place"):
        make_env("torch:PointMassPixels,image_size=16", image_size=16)


# ---- end to end through the CLI --------------------------------------------------------------------

ENV = "torch:PointMassPixels,image_size=16"
FLAGS = ["--env", ENV, "--cnn-layers", "2", "--cnn-channels", "8", "--image-features", "16", "--threads", "1",
         "--no-progress", "--actor-hidden", "16", "16", "--critic-hidden", "16", "16"]
PPO_FLAGS = ["--num-envs", "8", "--rollout-steps", "8", "--minibatch-size", "32", "--epochs", "2",
             "--checkpoint-every", "1"]
SAC_FLAGS = ["--num-envs", "4", "--learning-starts", "48", "--batch-size", "16", "--buffer-size", "256",
             "--drq-pad", "2", "--save-replay"]


def _train(capsys, *args) -> dict:
    assert main(["train", *map(str, args)]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.splitlines()[0])


def _algo_state(run_dir) -> dict:
    return load_checkpoint(run_dir / "checkpoints" / "latest.pt")["algo_state"]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize("algo,flags,first,total", [("ppo", PPO_FLAGS, 128, 256), ("sac", SAC_FLAGS, 96, 160)])
def test_cli_trains_resumes_and_evaluates_from_pixels(capsys, tmp_path, algo, flags, first, total):
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert _train(capsys, algo, *FLAGS, *flags, "--total-steps", total, "--run-dir", whole)["step"] == total
    _train(capsys, algo, *FLAGS, *flags, "--total-steps", first, "--run-dir", part)
    assert _train(capsys, algo, "--resume", part, "--total-steps", total, "--no-progress")["step"] == total
    state = _algo_state(whole)
    enc = state["ac"] if algo == "ppo" else state["encoder"]
    assert any("convs" in k for k in enc)  # the CNN is part of the saved networks
    assert _same(state, _algo_state(part))  # resume == uninterrupted, encoder included
    ck = load_checkpoint(whole / "checkpoints" / "latest.pt")
    assert ck["obs"]["image/top"].dtype == torch.uint8 and ck["obs"]["state"].dtype == torch.float32
    if algo == "sac":  # the replay keeps images as uint8
        replay = ck["replay"]
        assert replay["obs"]["image/top"].dtype == torch.uint8 and replay["next_obs"]["image/top"].dtype == torch.uint8
        assert replay["obs"]["image/top"].shape == (total, 3, 16, 16) and replay["obs"]["state"].dtype == torch.float32
    assert main(["eval", str(whole), "--episodes", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 2 and out["env"] == ENV and -100 < out["return_mean"] <= 0
