import copy
import math

import pytest
import torch

from ctrl_rl.algos.iql import IQL, IQLConfig, awr_weights, cosine_factor, expectile_loss, locomotion_reward_scale
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec

SPEC = EnvSpec("synthetic:cont", (5,), False, 2, (-1.0, -1.0), (1.0, 1.0))
TINY = dict(actor_hidden=(16, 16), critic_hidden=(16, 16), value_hidden=(16, 16))


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks: one intra-op thread (on a loaded 2-core machine, 2 threads made the loops 10-50x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _batch(B=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transition(torch.randn(B, 5, generator=g), torch.rand(B, 2, generator=g) * 2 - 1,
                      torch.randn(B, generator=g), torch.randn(B, 5, generator=g), torch.rand(B, generator=g) < 0.2,
                      torch.zeros(B, dtype=torch.bool))


def test_expectile_loss_and_awr_weights_hand_numbers():
    torch.testing.assert_close(expectile_loss(torch.tensor([2.0, -2.0, 0.0, 0.5]), 0.7),
                               torch.tensor([0.7 * 4, 0.3 * 4, 0.0, 0.7 * 0.25]))
    torch.testing.assert_close(awr_weights(torch.tensor([0.0, 1.0, -1.0, 10.0]), 3.0, 100.0),
                               torch.tensor([1.0, math.exp(3.0), math.exp(-3.0), 100.0]))


def test_cosine_schedule_and_reward_scale_hand_numbers():
    assert cosine_factor(0, 10) == 1.0 and abs(cosine_factor(5, 10) - 0.5) < 1e-12
    assert abs(cosine_factor(10, 10)) < 1e-12 and abs(cosine_factor(20, 10)) < 1e-12 and cosine_factor(7, None) == 1.0
    assert locomotion_reward_scale(torch.tensor([10.0, 60.0, 30.0])) == 20.0


def test_official_mujoco_defaults():
    c = IQLConfig()
    assert (c.expectile, c.beta, c.weight_clip, c.num_critics, c.tau, c.gamma) == (0.7, 3.0, 100.0, 2, 0.005, 0.99)
    assert (c.actor_lr, c.critic_lr, c.value_lr, c.cosine_steps, c.dropout) == (3e-4, 3e-4, 3e-4, 1_000_000, 0.0)
    from ctrl_rl.algos import registry

    assert registry.get("iql").loop_defaults["batch_size"] == 256  # the offline loop's batch (code: 256)
    assert c.actor_hidden == c.critic_hidden == c.value_hidden == (256, 256)


def test_actor_is_an_unsquashed_gaussian_with_tanh_mean_and_state_independent_std():
    iql = IQL(IQLConfig(**TINY), SPEC, "cpu")
    with torch.no_grad():
        iql.actor.log_std.copy_(torch.tensor([-7.0, 0.3]))  # -7 is clipped to -5
    obs, a = torch.randn(4, 5), torch.rand(4, 2) * 2 - 1
    mean = torch.tanh(iql.actor.net(obs))
    ref = torch.distributions.Normal(mean, torch.tensor([-5.0, 0.3]).exp()).log_prob(a).sum(-1)
    torch.testing.assert_close(iql.actor.log_prob(obs, a, None), ref)
    torch.testing.assert_close(iql.act(obs, deterministic=True), mean)
    assert iql.act(torch.randn(500, 5)).abs().max() <= 1  # samples are clipped to the action box


def test_update_losses_match_reference_and_targets_move_by_tau():
    cfg = IQLConfig(**TINY, tau=0.1)
    iql = IQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(0))
    b = _batch()
    before = copy.deepcopy([iql.actor, iql.value, iql.critic, iql.critic_target])
    with torch.no_grad():  # the value loss is computed before any step, from the target critics
        q_t = before[3](torch.cat([b.obs, b.action], -1)).squeeze(-1).min(0).values
        v_loss = expectile_loss(q_t - before[1](b.obs).squeeze(-1), 0.7).mean()
    info = iql.update(b)
    assert all(math.isfinite(v) for v in info.values()) and iql.parameters_finite()
    assert abs(info["loss/value"] - float(v_loss)) < 1e-5
    for old, new in zip(before[:3], [iql.actor, iql.value, iql.critic]):
        assert any(not torch.equal(p0, p1) for p0, p1 in zip(old.parameters(), new.parameters()))
    for t0, t1, src in zip(before[3].parameters(), iql.critic_target.parameters(), iql.critic.parameters()):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * src.detach(), atol=1e-6, rtol=0)
    # the critic regresses onto r + gamma (1 - terminated) V(s') with the value after its step: check the loss
    # of the next update against that target computed independently
    b2 = _batch(seed=1)
    with torch.no_grad():
        nets = copy.deepcopy([iql.value, iql.critic, iql.critic_target])
    v_opt = torch.optim.Adam(nets[0].parameters(), lr=3e-4)
    v_opt.load_state_dict(copy.deepcopy(iql.value_opt.state_dict()))
    with torch.no_grad():
        q_t2 = nets[2](torch.cat([b2.obs, b2.action], -1)).squeeze(-1).min(0).values
    loss = expectile_loss(q_t2 - nets[0](b2.obs).squeeze(-1), 0.7).mean()
    v_opt.zero_grad()
    loss.backward()
    v_opt.step()
    with torch.no_grad():
        y = b2.reward + 0.99 * (~b2.terminated).float() * nets[0](b2.next_obs).squeeze(-1)
        c_loss = (nets[1](torch.cat([b2.obs, b2.action], -1)).squeeze(-1) - y).square().mean(1).sum()
    info2 = iql.update(b2)
    assert abs(info2["loss/critic"] - float(c_loss)) < 1e-4


def test_actor_learning_rate_follows_the_cosine_schedule():
    iql = IQL(IQLConfig(**TINY, cosine_steps=4), SPEC, "cpu")
    lrs = [iql.update(_batch(seed=k))["stats/actor_lr"] for k in range(5)]
    assert lrs[0] == pytest.approx(3e-4) and lrs[2] == pytest.approx(1.5e-4) and lrs[4] == pytest.approx(0.0, abs=1e-12)
    assert iql.critic_opt.param_groups[0]["lr"] == 3e-4


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_seeded_updates_are_bit_identical_and_state_round_trips(dropout):
    cfg = IQLConfig(**TINY, dropout=dropout, cosine_steps=10)

    def make(seed_global):
        torch.manual_seed(seed_global)
        return IQL(cfg, SPEC, "cpu", torch.Generator().manual_seed(1))

    a, b = make(0), make(0)
    for k in range(3):
        a.update(_batch(seed=k))
        b.update(_batch(seed=k))
    assert all(torch.equal(x, y) for x, y in zip(a.actor.parameters(), b.actor.parameters()))
    c = make(5)
    c.load_state_dict(a.state_dict())
    assert a.update(_batch(seed=9)) == c.update(_batch(seed=9))
    assert all(torch.equal(x, y) for x, y in zip(a.critic.parameters(), c.critic.parameters()))
    assert torch.equal(a.act(torch.ones(2, 5)), c.act(torch.ones(2, 5)))


def test_awr_prefers_the_rewarded_action_on_a_bandit():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    B = 128
    obs = torch.randn(B, 5, generator=g)
    good = torch.rand(B, generator=g) < 0.5
    act = torch.where(good[:, None], 0.6, -0.6).expand(B, 2).clone()
    data = Transition(obs, act, good.float(), obs, torch.ones(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool))
    iql = IQL(IQLConfig(**TINY, critic_lr=3e-3, value_lr=3e-3, actor_lr=3e-3, tau=0.05), SPEC, "cpu",
              torch.Generator().manual_seed(0))
    for _ in range(200):
        iql.update(data)
    assert iql.act(obs, deterministic=True).mean() > 0.2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_exportable_traces_to_torchscript_with_equal_outputs():
    iql = IQL(IQLConfig(**TINY, dropout=0.1), SPEC, "cpu")
    pol = iql.exportable()
    x = torch.randn(7, 5)
    traced = torch.jit.trace(pol, x)
    torch.testing.assert_close(traced(x), pol(x), atol=1e-5, rtol=0)
    torch.testing.assert_close(pol(x), iql.act(x, deterministic=True))
    assert pol(x).abs().max() <= 1


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="expectile"):
        IQLConfig(expectile=1.0)
