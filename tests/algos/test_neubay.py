"""NeuBay (algos/neubay.py), its collector (world_models/history.py) and tape buffer (storage/tapes.py): one update
on a synthetic tape batch, the real/imagined weighting, the LRU's parallel scan against its step recurrence, the
encoder sequence of a batch, acting and export, one ensemble member per imagined episode, uncertainty and time
truncation, u_max, and the tape buffer's FIFO, sampling and state."""

import copy
import math

import numpy as np
import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.algos.neubay import NeuBay, NeuBayConfig
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.offline import OfflineDataset
from ctrl_rl.storage.tapes import TapeBatch, TapeBuffer
from ctrl_rl.world_models.history import (
    HistoryCollector,
    prefix_inputs,
    trajectories_from_dataset,
    uncertainty_threshold,
)
from ctrl_rl.world_models.protocol import ModelStep

O, A = 3, 2
SPEC = EnvSpec("synthetic:cont", (O,), False, A, (-1.0,) * A, (1.0,) * A)
TINY = dict(d_model=16, lru_hidden=8, head_hidden=(16, 16), num_critics=4)


def agent(**kw) -> NeuBay:
    torch.manual_seed(0)
    return NeuBay(NeuBayConfig(**{**TINY, **kw}), SPEC, "cpu", torch.Generator().manual_seed(0))


def tape_batch(lengths=(7, 5, 9, 3), real=(3, 0, 4, 3), seed=0) -> TapeBatch:
    """Tapes of the given lengths, the first ``real[i]`` rows of tape i real; rows consecutive inside a tape."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    obs, nxt = torch.zeros(T, O), torch.zeros(T, O)
    first, is_real = torch.zeros(T, dtype=torch.bool), torch.zeros(T, dtype=torch.bool)
    row = 0
    for n, r in zip(lengths, real):
        states = torch.randn(n + 1, O, generator=g)
        obs[row:row + n], nxt[row:row + n] = states[:-1], states[1:]
        first[row], is_real[row:row + r] = True, True
        row += n
    term = torch.zeros(T, dtype=torch.bool)
    term[lengths[0] - 1] = True
    return TapeBatch(obs, torch.rand(T, A, generator=g) * 2 - 1, torch.randn(T, generator=g), nxt, term,
                     torch.zeros(T, dtype=torch.bool), is_real, first)


def test_one_update_gives_finite_losses_moves_every_network_and_the_target_by_tau():
    algo = agent()
    nets = {k: [p.detach().clone() for p in getattr(algo, k).parameters()]
            for k in ("actor_encoder", "actor", "critic_encoder", "critic")}
    target = [p.detach().clone() for p in algo._tgt]
    info = algo.update(tape_batch())
    assert all(np.isfinite(v) for v in info.values()) and {"loss/critic", "loss/actor", "loss/alpha"} <= set(info)
    for k, before in nets.items():
        after = list(getattr(algo, k).parameters())
        assert all(not torch.equal(x, y) for x, y in zip(before, after) if x.numel() > 1), k
    tau = algo.config.tau
    for t0, t1, s in zip(target, algo._tgt, algo._src):
        assert torch.allclose(t1, (1 - tau) * t0 + tau * s.detach(), atol=1e-6)
    assert algo.parameters_finite() and algo.updates == 1


def test_update_is_bit_identical_for_the_same_seed_and_state_round_trip():
    a, b = agent(), agent()
    for k in range(2):
        ia, ib = a.update(tape_batch(seed=k)), b.update(tape_batch(seed=k))
        assert ia == ib
    d = agent()
    d.load_state_dict(a.state_dict())
    assert a.update(tape_batch(seed=5)) == d.update(tape_batch(seed=5))


def _critic_grads(algo: NeuBay, batch: TapeBatch) -> list[torch.Tensor]:
    algo.gen.manual_seed(3)  # the same a' and target subset for both batches
    algo.critic_opt.zero_grad(set_to_none=True)
    loss, _ = algo.critic_loss(batch)
    loss.backward()
    return [p.grad.clone() for g in algo.critic_groups for p in g]


@pytest.mark.parametrize("weight,same", [(1.0, True), (0.5, False)])
def test_real_weight_one_ignores_the_imagined_rows(weight, same):
    algo = agent(real_weight=weight)
    b1 = tape_batch()
    b2 = copy.deepcopy(b1)
    b2.reward[~b2.real] += 10.0  # only the imagined rows' rewards change
    g1, g2 = _critic_grads(algo, b1), _critic_grads(algo, b2)
    assert all(torch.equal(x, y) for x, y in zip(g1, g2)) == same


def test_mixed_loss_weights_the_real_and_imagined_means():
    algo = agent(real_weight=0.3)
    _, info = algo.critic_loss(tape_batch())
    assert math.isclose(float(info["loss/critic"]), 0.3 * float(info["loss/critic_real"])
                        + 0.7 * float(info["loss/critic_imag"]), rel_tol=1e-5)


def test_sequence_puts_each_history_and_the_next_input_after_every_tape():
    b = tape_batch(lengths=(2, 1), real=(1, 0))
    seq, start, pos = NeuBay.sequence(b)
    assert (pos.tolist() == [0, 1, 3] and seq.shape == (5, O + A + 1)
            and start.tolist() == [True, False, False, True, False])
    x = prefix_inputs(b.obs, b.action, b.reward, b.first)
    assert torch.equal(seq[[0, 1, 3]], x)
    assert torch.equal(seq[1, O:O + A], b.action[0]) and seq[1, -1] == b.reward[0] and torch.all(seq[3, O:] == 0)
    for row, src in ((2, 1), (4, 2)):  # after the last row of each tape: its next_obs, action, reward
        assert torch.equal(seq[row], torch.cat([b.next_obs[src], b.action[src], b.reward[src:src + 1]]))


def test_acting_follows_the_history_and_observe_restarts_ended_episodes():
    algo = agent()
    N, steps = 2, 6
    obs = torch.randn(steps, N, O)
    rewards = torch.randn(steps, N)
    done = torch.zeros(steps, N, dtype=torch.bool)
    done[2, 1] = True  # env 1 restarts at step 3
    algo.reset_state(N)
    acts = []
    for t in range(steps):
        acts.append(algo.act(obs[t], deterministic=True))
        algo.observe(rewards[t], done[t])
    # the same histories through the encoder as sequences (what training sees)
    for n in range(N):
        first = torch.zeros(steps, dtype=torch.bool)
        first[0] = True
        if n == 1:
            first[3] = True
        x = prefix_inputs(obs[:, n], torch.stack(acts)[:, n], rewards[:, n], first)
        z, _ = algo.actor_encoder(x.unsqueeze(1), first.unsqueeze(1))
        expect = torch.tanh(algo.actor(z.squeeze(1))[0])
        assert torch.allclose(expect, torch.stack(acts)[:, n], atol=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_traced_export_matches_the_agents_deterministic_actions():
    algo = agent()
    algo.update(tape_batch())
    pol = algo.exportable()
    N = 3
    obs, pa, pr, h = torch.randn(N, O), torch.zeros(N, A), torch.zeros(N), pol.initial_hidden(N)
    with torch.no_grad():
        traced = torch.jit.trace(pol, (obs, pa, pr, h))
    algo.reset_state(N)
    for _t in range(4):
        o, r = torch.randn(N, O), torch.randn(N)
        with torch.no_grad():
            a_eager, h_eager = pol(o, pa, pr, h)
            a_tr, h = traced(o, pa, pr, h)
        assert torch.allclose(a_tr, a_eager, atol=1e-5) and torch.allclose(h, h_eager, atol=1e-5)
        a_ag = algo.act(o, deterministic=True)
        algo.observe(r, torch.zeros(N, dtype=torch.bool))
        assert torch.allclose(a_tr, a_ag, atol=1e-5) and a_tr.abs().max() <= 1
        pa, pr = a_tr, r


# ---- the collector -------------------------------------------------------------------------------------

class FakeModel:
    """A DynamicsModel whose reward is the member id (so a tape shows which members stepped it), whose next state
    moves obs[0] by +0.1, and whose epistemic figure is |obs[0]| of the step's input state."""

    obs_dim, act_dim = O, A

    def __init__(self):
        self._elites = torch.tensor([4, 0, 2, 5])

    @property
    def elites(self):
        return self._elites

    @property
    def num_members(self):
        return 6

    def predict(self, obs, act, members=None, sample=True, generator=None):
        if members is None:
            members = self._elites[torch.randint(4, (obs.shape[0],), generator=generator)]
        nxt = obs + torch.tensor([0.1, 0.0, 0.0])
        if sample:
            nxt = nxt + 0.0 * torch.randn(nxt.shape, generator=generator)
        u = obs[:, 0].abs()
        return ModelStep(nxt, members.float(), None, {"aleatoric": u, "epistemic": u, "total_var": u})


def offline_data(lengths=(3, 8, 5, 2, 6, 4), seed=0) -> OfflineDataset:
    g = torch.Generator().manual_seed(seed)
    S = sum(lengths)
    states = [torch.rand(n + 1, O, generator=g) * 2 - 1 for n in lengths]  # next_obs[i] = obs[i + 1] inside episodes
    obs, nxt = torch.cat([x[:-1] for x in states]), torch.cat([x[1:] for x in states])
    ends = torch.tensor(lengths).cumsum(0) - 1
    term = torch.zeros(S, dtype=torch.bool)
    term[ends[0]] = True
    trunc = torch.zeros(S, dtype=torch.bool)
    trunc[ends[1:]] = True
    return OfflineDataset(obs, torch.rand(S, A, generator=g) * 2 - 1, torch.randn(S, generator=g),
                          nxt, term, trunc, torch.cat([torch.zeros(1, dtype=torch.int64), ends + 1]),
                          torch.ones(S, dtype=torch.bool))


def test_u_max_is_the_datasets_maximum_for_q_one_and_its_quantile_otherwise():
    data = trajectories_from_dataset(offline_data(), 1000, "cpu")
    u = data.obs[:, 0].abs()
    assert uncertainty_threshold(FakeModel(), data.obs, data.action, 1.0, chunk=7)[0] == float(u.max())
    q, _ = uncertainty_threshold(FakeModel(), data.obs, data.action, 0.3, chunk=5)
    assert math.isclose(q, float(torch.quantile(u, 0.3)), rel_tol=1e-6)
    with pytest.raises(UserInputError, match="quantile"):
        uncertainty_threshold(FakeModel(), data.obs, data.action, 1.5)


def test_collector_keeps_one_member_per_imagined_episode_and_truncates_by_uncertainty_and_time():
    H = 6
    data = trajectories_from_dataset(offline_data(), H, "cpu")
    assert data.lengths.tolist() == [3, 6, 5, 2, 6, 4]  # the 8-step trajectory cut at the horizon
    u_max = float(data.obs[:, 0].abs().max())
    col = HistoryCollector(FakeModel(), data, None, H, u_max, 40, "synthetic:cont", seed=0)
    tapes, stats = col.collect(agent())
    starts = tapes.first.nonzero().squeeze(1).tolist() + [len(tapes)]
    assert len(starts) - 1 == 40 and tapes.num_tapes == 40
    members = set()
    n_unc = n_time = 0
    for s, e in zip(starts[:-1], starts[1:]):
        real, img = tapes.real[s:e], ~tapes.real[s:e]
        r = int(real.sum())
        assert real[:r].all() and not real[r:].any()  # the real history comes first
        assert e - s <= H and (tapes.terminated[e - 1] or tapes.truncated[e - 1])  # ends, within the horizon
        assert not (tapes.terminated[s:e - 1] | tapes.truncated[s:e - 1]).any()
        if img.any():
            ids = tapes.reward[s:e][img].unique()
            assert ids.numel() == 1 and int(ids) in (4, 0, 2, 5)  # ONE member for the whole imagined episode
            members.add(int(ids))
            if r > 0:
                assert torch.equal(tapes.obs[s + r], tapes.next_obs[s + r - 1])  # continues the real history
            o0 = tapes.obs[s + r:e, 0]
            assert torch.allclose(tapes.next_obs[s + r:e, 0], o0 + 0.1)
            if o0[-1].abs() > u_max:  # the only step above u_max is the last one: truncated for uncertainty
                assert (o0[:-1].abs() <= u_max).all() and tapes.truncated[e - 1]
                n_unc += 1
            else:
                assert e - s == H and tapes.truncated[e - 1]  # reached the horizon from the trajectory's start
                n_time += 1
    assert len(members) > 1 and n_unc > 0 and n_time > 0
    assert stats["rollout/truncated_uncertainty"] == n_unc and stats["rollout/truncated_horizon"] == n_time
    assert stats["rollout/transitions"] == len(tapes) and stats["rollout/u_max"] == u_max


def test_collector_is_reproducible_from_its_state():
    data = trajectories_from_dataset(offline_data(), 6, "cpu")
    a = HistoryCollector(FakeModel(), data, None, 6, 0.5, 8, "synthetic:cont", seed=3)
    b = HistoryCollector(FakeModel(), data, None, 6, 0.5, 8, "synthetic:cont", seed=99)
    a.collect(agent())
    b.load_state_dict(a.state_dict())
    ta, _ = a.collect(agent())
    tb, _ = b.collect(agent())
    assert all(torch.equal(getattr(ta, f), getattr(tb, f)) for f in ("obs", "action", "reward", "real", "first"))


# ---- the tape buffer -----------------------------------------------------------------------------------

def test_tape_buffer_is_fifo_by_whole_tapes_and_samples_exactly_a_batch_of_whole_tapes():
    buf = TapeBuffer(20, O, A)
    b = tape_batch(lengths=(7, 5, 9), real=(2, 0, 3))  # 21 rows: the first tape does not fit with the others
    assert buf.add(b) == 14 and buf.num_tapes == 2 and len(buf) == 14
    b2 = tape_batch(lengths=(4, 3), real=(1, 1), seed=1)
    buf.add(b2)  # 21 rows > 20: the oldest tape (5 rows) goes
    assert buf.lengths.tolist() == [9, 4, 3] and len(buf) == 16 and buf.dropped == 1
    g = torch.Generator().manual_seed(0)
    s = buf.sample(11, g)
    assert len(s) == 11 and s.first[0]
    bounds = s.first.nonzero().squeeze(1).tolist() + [11]
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # each tape is a stored tape's prefix, in order
        matches = [k for k in range(buf.num_tapes) if torch.equal(
            s.obs[lo:hi], buf.obs[(buf.starts[k] + torch.arange(hi - lo)) % 20])]
        assert matches and (hi == 11 or hi - lo == int(buf.lengths[matches[0]]))
    fresh = TapeBuffer(20, O, A)
    fresh.load_state_dict(buf.state_dict())
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x, y = buf.sample(13, g1), fresh.sample(13, g2)
    assert all(torch.equal(getattr(x, f), getattr(y, f)) for f in ("obs", "reward", "real", "first", "next_obs"))
    with pytest.raises(UserInputError, match="does not fit"):
        buf.add(tape_batch(lengths=(21,), real=(0,)))


def test_neubay_is_registered_in_its_regime_and_refuses_bad_settings():
    e = registry.get("neubay")
    assert e.regime == "model-based" and e.collector == "tapes" and e.requires_dataset and e.continuous_only
    for bad in (dict(real_weight=1.5), dict(target_subset=11), dict(encoder_lr=0.0), dict(r_max=1.0)):
        with pytest.raises(UserInputError):
            NeuBayConfig(**bad)


def test_critic_heads_of_a_subset_equal_those_heads_of_the_full_call():
    algo = agent()
    z, a = torch.randn(6, algo.config.d_model), torch.rand(6, A) * 2 - 1
    heads = torch.tensor([3, 0]) if algo.config.num_critics > 3 else torch.tensor([1, 0])
    with torch.no_grad():
        full, part = algo.critic(z, a), algo.critic(z, a, heads)
    assert part.shape == (2, 6) and torch.allclose(part, full[heads], atol=1e-6)


def test_bf16_update_computes_the_float32_losses_to_bfloat16_rounding_with_float32_outputs():
    batches = [tape_batch(seed=s) for s in range(3)]
    full, mixed = agent(), agent(bf16=True)
    for b in batches:
        ref, got = full.update(b), mixed.update(b)
        for k in ("loss/critic", "loss/actor", "stats/q_mean"):
            assert torch.isfinite(got[k]) and abs(float(got[k]) - float(ref[k])) <= 0.05 * abs(float(ref[k])) + 1e-3, k
    assert all(p.dtype == torch.float32 for p in mixed.critic.parameters())
    z, a = torch.randn(4, mixed.config.d_model), torch.rand(4, A) * 2 - 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mixed.critic(z, a).dtype == torch.float32 and mixed.actor(z)[0].dtype == torch.float32
