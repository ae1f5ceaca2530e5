import copy
import math

import pytest
import torch

from ctrl_rl.algos.ppo import PPO, PPOConfig, ppo_losses, scale_envs
from ctrl_rl.core.types import Rollout
from ctrl_rl.envs.protocol import EnvSpec

CONT = EnvSpec("synthetic:cont", (3,), False, 2, (-1.0, -1.0), (1.0, 1.0))
DISC = EnvSpec("synthetic:disc", (4,), True, 3)


def _batch(spec, T=8, N=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, N, spec.obs_dim, generator=g)
    if spec.discrete:
        action = torch.randint(0, spec.action_dim, (T, N), generator=g)
    else:
        action = torch.randn(T, N, spec.action_dim, generator=g)
    term = torch.rand(T, N, generator=g) < 0.05
    trunc = (torch.rand(T, N, generator=g) < 0.05) & ~term
    return obs, action, torch.randn(T, N, generator=g), term, trunc, torch.randn(T, N, spec.obs_dim, generator=g)


@pytest.mark.parametrize("spec", [CONT, DISC], ids=["gaussian", "categorical"])
def test_update_on_synthetic_batch_moves_parameters_and_reports_finite_losses(spec):
    cfg = PPOConfig(rollout_steps=8, epochs=3, minibatch_size=32)
    algo = PPO(cfg, spec, "cpu", torch.Generator().manual_seed(0))
    obs, action, reward, term, trunc, final = _batch(spec)
    _, logp = algo.sample(obs.view(-1, spec.obs_dim))
    logp = algo.ac.log_prob_entropy(algo.ac.features(obs.view(-1, spec.obs_dim)),
                                    action.view(128, *action.shape[2:]))[0]
    before = [p.detach().clone() for p in algo.params]
    info = algo.update(Rollout(obs, action, logp.view(8, 16).detach(), reward, term, trunc, final))
    assert all(math.isfinite(v) for v in info.values())
    assert info["stats/grad_steps"] == 3 * math.ceil(128 / 32)
    moved = [not torch.equal(b, p) for b, p in zip(before, algo.params)]
    assert all(moved[:2]) and any(moved)
    # observation statistics were updated from the rollout after the gradient steps
    assert torch.allclose(algo.ac.norm.mean, obs.view(-1, spec.obs_dim).mean(0), atol=1e-3)


def test_first_minibatch_ratio_is_one_so_nothing_is_clipped():
    cfg = PPOConfig(rollout_steps=8, epochs=1, minibatch_size=10_000)
    algo = PPO(cfg, CONT, "cpu", torch.Generator().manual_seed(0))
    obs, action, reward, term, trunc, final = _batch(CONT)
    flat = obs.view(-1, 3)
    logp = algo.ac.log_prob_entropy(algo.ac.features(flat), action.view(-1, 2))[0].view(8, 16).detach()
    info = algo.update(Rollout(obs, action, logp, reward, term, trunc, final))
    assert info["stats/clip_frac"] == 0.0
    assert abs(info["stats/approx_kl"]) < 1e-7


@pytest.mark.parametrize("obs_norm", [True, False])
def test_sampled_log_prob_equals_recomputed_one_bit_for_bit_across_updates_and_loads(obs_norm):
    # the log-prob stored while collecting must equal the update's own computation bit for bit (so the
    # first-epoch ratio is exactly 1), also after the parameters and the normalizer change
    cfg = PPOConfig(rollout_steps=8, epochs=2, minibatch_size=32, init_log_std=-0.5, obs_norm=obs_norm)
    algo = PPO(cfg, CONT, "cpu", torch.Generator().manual_seed(0))
    obs = torch.randn(64, 3, generator=torch.Generator().manual_seed(1)) * 4

    def matches() -> bool:
        action, logp = algo.sample(obs)
        return torch.equal(logp, algo.ac.log_prob_entropy(algo.ac.features(obs), action)[0])

    assert matches()
    before = copy.deepcopy(algo.state_dict())  # state_dict holds references
    batch = _batch(CONT)
    flat = batch[0].view(-1, 3)
    logp = algo.ac.log_prob_entropy(algo.ac.features(flat), batch[1].view(-1, 2))[0].view(8, 16).detach()
    algo.update(Rollout(batch[0], batch[1], logp, *batch[2:]))
    assert not torch.equal(algo.ac.log_std, before["ac"]["log_std"])
    assert matches()
    algo.load_state_dict(before)
    assert matches()


def test_clipped_surrogate_by_hand():
    cfg = PPOConfig(norm_adv=False, clip_eps=0.2, clip_value_loss=False, vf_coef=0.0, ent_coef=0.0)
    logp_old = torch.zeros(2)
    logp = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5
    adv = torch.tensor([1.0, -1.0])
    z = torch.zeros(2)
    loss, parts = ppo_losses(cfg, logp, z, z, logp_old, z, adv, z)
    # min(1.5*1, 1.2*1) = 1.2 ; min(0.5*-1, 0.8*-1) = -0.8 -> -(1.2 - 0.8)/2
    assert torch.isclose(loss, torch.tensor(-0.2))
    assert parts["clip_frac"] == 1.0


def test_value_loss_clipping_by_hand():
    cfg = PPOConfig(norm_adv=False, clip_eps=0.2, clip_value_loss=True, vf_coef=1.0)
    z = torch.zeros(1)
    v, v_old, ret = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([2.0])
    _, parts = ppo_losses(cfg, z, z, v, z, v_old, z, ret)
    # unclipped (1-2)^2 = 1, clipped (0.2-2)^2 = 3.24 -> 0.5 * max = 1.62
    assert torch.isclose(parts["value"], torch.tensor(1.62))


def test_kl_adaptive_lr_shrinks_lr_when_kl_is_large():
    cfg = PPOConfig(rollout_steps=8, epochs=2, minibatch_size=16, lr=5e-2, kl_adaptive_lr=True, desired_kl=1e-6)
    algo = PPO(cfg, CONT, "cpu", torch.Generator().manual_seed(0))
    obs, action, reward, term, trunc, final = _batch(CONT)
    logp = algo.ac.log_prob_entropy(algo.ac.features(obs.view(-1, 3)), action.view(-1, 2))[0].view(8, 16).detach()
    info = algo.update(Rollout(obs, action, logp, reward, term, trunc, final))
    assert info["stats/lr"] < 5e-2


def test_scale_envs_keeps_inner_loop_and_multiplies_gradient_steps():
    cfg = PPOConfig(minibatch_size=1024, rollout_steps=16)
    n, scaled = scale_envs(512, cfg, 4)
    assert n == 2048 and scaled == cfg
    assert math.ceil(16 * n / scaled.minibatch_size) == 4 * math.ceil(16 * 512 / cfg.minibatch_size)


def test_invalid_config_values_are_rejected():
    with pytest.raises(ValueError, match="epochs"):
        PPOConfig(epochs=0)
