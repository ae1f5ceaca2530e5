"""ModelEnv (a dynamics model as a BatchedEnv) and imagine() (a rollout round into a ReplayBuffer).

The model is a fake written here, so these tests do not depend on world_models/ensemble.py: linear dynamics
with a known offset per member, ``next = 0.5 obs + 0.1 sum(act) + member (+ std noise)``; with ``std = 0``
the member a row used can be read back from its next observation.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from ctrl_rl.envs.check import check_env
from ctrl_rl.envs.protocol import BatchedEnv
from ctrl_rl.envs.torch_envs import Pendulum
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.replay import ReplayBuffer
from ctrl_rl.world_models.model_env import ModelDiverged, ModelEnv, imagine
from ctrl_rl.world_models.protocol import UNCERTAINTIES, DynamicsModel, ModelStep

O, A, E = 3, 2, 5
ELITES = (0, 2, 4)


class FakeModel:
    """``next = 0.5 obs + 0.1 sum(act) + member + std * noise``, reward = next[:, 0] without the noise.

    Uncertainties are made-up known figures: aleatoric ``std * sqrt(O + 1)``, epistemic ``mean |obs|`` (varies
    per row, so truncation can be checked row by row), total_var ``aleatoric^2 + epistemic^2``. With
    ``termination_head`` the model terminates where ``next[:, 1] > 2``; with ``nan_at`` its ``nan_at``-th
    predict call returns a NaN.
    """

    def __init__(self, std: float = 0.0, termination_head: bool = False, nan_at: int | None = None):
        self.obs_dim, self.act_dim = O, A
        self.std, self.termination_head, self.nan_at = std, termination_head, nan_at
        self._elites = torch.tensor(ELITES)
        self.calls = 0

    @property
    def elites(self) -> torch.Tensor:
        return self._elites

    @property
    def num_members(self) -> int:
        return E

    def mean(self, obs, act, members):
        return 0.5 * obs + 0.1 * act.sum(1, keepdim=True) + members.float().unsqueeze(1)  # [B,O]

    def predict(self, obs, act, members=None, sample=True, generator=None) -> ModelStep:
        self.calls += 1
        if members is None:
            members = self._elites[torch.randint(len(ELITES), (obs.shape[0],), generator=generator)]
        mu = self.mean(obs, act, members)  # [B,O]
        nxt = mu + self.std * torch.randn(mu.shape, generator=generator) if sample else mu.clone()
        if self.nan_at is not None and self.calls >= self.nan_at:
            nxt[0, 0] = math.nan
        alea = torch.full((obs.shape[0],), self.std * math.sqrt(O + 1))  # [B]
        epi = obs.abs().mean(1)  # [B]
        term = nxt[:, 1] > 2.0 if self.termination_head else None
        return ModelStep(nxt, mu[:, 0].clone(), term,
                         {"aleatoric": alea, "epistemic": epi, "total_var": alea**2 + epi**2})


def make_env(model=None, n=16, seed=0, **kw) -> ModelEnv:
    start = torch.randn(100, O, generator=torch.Generator().manual_seed(7))  # [M,O]
    return ModelEnv(model if model is not None else FakeModel(), kw.pop("start_obs", start), n, [-1.0] * A, [1.0] * A,
                    "fake", seed=seed, **kw)


def actions(env, gen) -> torch.Tensor:
    return torch.rand(env.num_envs, A, generator=gen) * 2 - 1  # [N,A]


def used_members(env_model: FakeModel, obs, act, final_obs) -> torch.Tensor:
    """The member a (noise-free) transition used: its next obs minus the member-free part of the mean."""
    off = final_obs - env_model.mean(obs, act, torch.zeros(obs.shape[0], dtype=torch.int64))  # [N,O]
    return off[:, 0].round().long()  # [N]


def in_rows(rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """[N] bool: each row of ``rows`` equals some row of ``table``."""
    return (rows.unsqueeze(1) == table.unsqueeze(0)).all(-1).any(-1)


# ---- the BatchedEnv contract -------------------------------------------------------------------


def test_fake_model_keeps_the_protocol():
    assert isinstance(FakeModel(), DynamicsModel)


@pytest.mark.parametrize("mode", ["step", "episode"])
def test_check_env(mode):
    kw = dict(member_mode=mode, horizon=7, termination_fn=lambda o, a, nx: nx[:, 0] > 3.0, penalty=0.5)
    env = make_env(FakeModel(std=0.1), n=32, seed=3, **kw)
    twin = make_env(FakeModel(std=0.1), n=32, seed=3, **kw)
    assert isinstance(env, BatchedEnv)
    check_env(env, steps=40, twin=twin)


def test_spec():
    env = make_env(horizon=12)
    s = env.spec
    assert (s.env_id, s.obs_shape, s.discrete, s.action_dim, s.backend) == ("model:fake", (O,), False, A, "model")
    assert s.action_low == (-1.0,) * A and s.action_high == (1.0,) * A and s.max_episode_steps == 12
    assert make_env().spec.max_episode_steps is None


# ---- members -------------------------------------------------------------------------------------


def test_step_mode_draws_a_random_elite_per_transition():
    model = FakeModel()
    env = make_env(model, n=200, member_mode="step")
    gen, obs, changed, seen = torch.Generator().manual_seed(0), env.reset(seed=1), [], []
    prev = None
    for _ in range(6):
        a = actions(env, gen)
        out = env.step(a)
        m = out.info["member"]
        assert torch.equal(m, used_members(model, obs, a, out.final_obs))  # the reported member is the one used
        if prev is not None:
            changed.append((m != prev).float().mean())
        seen.append(m)
        prev, obs = m, out.obs
    assert set(torch.cat(seen).tolist()) == set(ELITES)  # only elites, all of them
    assert float(torch.stack(changed).mean()) > 0.5  # ~2/3 of rows change member between steps (K = 3)


def test_episode_mode_keeps_one_member_until_reset():
    model = FakeModel()
    env = make_env(model, n=200, member_mode="episode", horizon=4)
    gen, obs = torch.Generator().manual_seed(0), env.reset(seed=1)
    prev, prev_done, redrawn = None, None, []
    for _ in range(13):
        a = actions(env, gen)
        out = env.step(a)
        m = out.info["member"]
        assert torch.equal(m, used_members(model, obs, a, out.final_obs))
        if prev is not None:
            assert torch.equal(m[~prev_done], prev[~prev_done])  # same member throughout an episode
            redrawn.append(m[prev_done] != prev[prev_done])
        prev, prev_done, obs = m, out.done, out.obs
    redrawn = torch.cat(redrawn)
    assert redrawn.numel() >= 400 and 0.5 < float(redrawn.float().mean()) < 0.8  # new draw at every reset (2/3 differ)


# ---- reward penalty, termination, truncation, auto-reset ------------------------------------------


@pytest.mark.parametrize("kind", UNCERTAINTIES)
def test_penalty_subtracts_lambda_times_uncertainty(kind):
    plain = make_env(FakeModel(std=0.3), seed=5)
    pen = make_env(FakeModel(std=0.3), seed=5, penalty=0.7, penalty_kind=kind)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        a = actions(plain, gen)
        p, q = plain.step(a), pen.step(a)
        assert torch.equal(q.info["raw_reward"], p.reward)  # raw reward = the unpenalised reward
        assert torch.equal(q.reward, p.reward - 0.7 * q.info[kind])
        assert (q.reward < q.info["raw_reward"]).all()


def test_horizon_truncates_and_elapsed_counts():
    env = make_env(n=8, horizon=3)
    gen, elapsed = torch.Generator().manual_seed(0), []
    env.reset(seed=0)
    for t in range(7):
        out = env.step(actions(env, gen))
        assert not out.terminated.any()
        assert bool(out.truncated.all()) == (t % 3 == 2) and bool(out.truncated.any()) == (t % 3 == 2)
        elapsed.append(out.info["elapsed_step"][0].item())
    assert elapsed == [1, 2, 3, 1, 2, 3, 1]


def test_truncate_above_truncates_where_epistemic_exceeds():
    env = make_env(n=64, truncate_above=0.7)
    gen = torch.Generator().manual_seed(0)
    obs = env.reset(seed=0)
    out = env.step(actions(env, gen))
    epi = obs.abs().mean(1)  # the fake model's epistemic figure of this step
    assert torch.equal(out.info["epistemic"], epi)
    assert torch.equal(out.truncated, epi > 0.7) and 0 < int(out.truncated.sum()) < 64
    assert not out.terminated.any()


def test_termination_fn_terminates_and_wins_over_truncation():
    fn = lambda o, a, nx: nx[:, 0] > 2.5  # noqa: E731
    env = make_env(n=64, termination_fn=fn, horizon=1)
    gen = torch.Generator().manual_seed(0)
    obs = env.reset(seed=0)
    a = actions(env, gen)
    out = env.step(a)
    want = fn(obs, a, out.final_obs)
    assert 0 < int(want.sum()) < 64
    assert torch.equal(out.terminated, want)
    assert torch.equal(out.truncated, ~want)  # horizon 1 cuts every other env; a terminal state counts as terminated


def test_model_termination_head_is_used_without_termination_fn():
    model = FakeModel(termination_head=True)
    env = make_env(model, n=64)
    gen = torch.Generator().manual_seed(0)
    env.reset(seed=0)
    out = env.step(actions(env, gen))
    assert torch.equal(out.terminated, out.final_obs[:, 1] > 2.0) and out.terminated.any()
    never = make_env(n=64)  # no head, no function: never terminates
    never.reset(seed=0)
    assert not any(never.step(actions(never, gen)).terminated.any() for _ in range(5))


def test_auto_reset_final_obs_and_new_start_states():
    model = FakeModel()
    env = make_env(model, n=64, termination_fn=lambda o, a, nx: nx[:, 0] > 2.5, horizon=3)
    gen, obs = torch.Generator().manual_seed(0), env.reset(seed=0)
    ended = 0
    for _ in range(6):
        a = actions(env, gen)
        out = env.step(a)
        done = out.done
        assert torch.equal(out.final_obs, model.mean(obs, a, out.info["member"]))  # the step's prediction
        assert torch.equal(out.obs[~done], out.final_obs[~done])
        assert in_rows(out.obs[done], env.start_obs).all()  # ended envs start again from a start state
        assert not in_rows(out.final_obs[done], env.start_obs).any()
        ended += int(done.sum())
        obs = out.obs
    assert ended > 64


def test_start_sampler_replaces_start_obs():
    sampler = lambda n, g: torch.full((n, O), 0.25)  # noqa: E731
    env = ModelEnv(FakeModel(), None, 4, [-1.0] * A, [1.0] * A, "fake", start_sampler=sampler, horizon=1)
    assert torch.equal(env.reset(), torch.full((4, O), 0.25))
    assert torch.equal(env.step(torch.zeros(4, A)).obs, torch.full((4, O), 0.25))


# ---- resume, divergence ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["step", "episode"])
def test_state_dict_resume_is_identical(mode):
    kw = dict(member_mode=mode, horizon=3, termination_fn=lambda o, a, nx: nx[:, 0] > 3.0)
    env = make_env(FakeModel(std=0.2), n=32, seed=1, **kw)
    gen = torch.Generator().manual_seed(0)
    env.reset(seed=4)
    for _ in range(4):
        env.step(actions(env, gen))
    state = copy.deepcopy(env.state_dict())
    acts = [actions(env, gen) for _ in range(6)]
    first = [env.step(a) for a in acts]
    other = make_env(FakeModel(std=0.2), n=32, seed=99, **kw)
    other.load_state_dict(state)
    for a, x in zip(acts, first):
        y = other.step(a)
        for f in ("obs", "reward", "terminated", "truncated", "final_obs"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f
        assert all(torch.equal(x.info[k], y.info[k]) for k in x.info)


def test_nan_prediction_raises_naming_the_step():
    env = make_env(FakeModel(nan_at=3))
    gen = torch.Generator().manual_seed(0)
    env.step(actions(env, gen))
    env.reset()
    env.step(actions(env, gen))
    with pytest.raises(ModelDiverged, match=r"at step 2 after the last reset \(in 1 of 16 imagined rollouts\)") as e:
        env.step(actions(env, gen))
    assert isinstance(e.value, UserInputError)


# ---- imagine ----------------------------------------------------------------------------------------


def policy(obs: torch.Tensor) -> torch.Tensor:
    return torch.tanh(obs[:, :A])  # [N,A], deterministic, so two runs act alike


def test_imagine_stops_extending_rollouts_at_the_horizon():
    env = make_env(n=16, horizon=2)
    buf = ReplayBuffer(1000, (O,), A)
    stats = imagine(env, policy, 5, buf)
    assert len(buf) == 32 and stats["rollout/transitions"] == 32 and stats["rollout/steps"] == 2
    assert stats["rollout/truncated"] == 16 and stats["rollout/terminated"] == 0 and stats["rollout/alive"] == 0
    assert buf.truncated[:16].sum() == 0 and buf.truncated[16:32].all()
    assert torch.equal(buf.obs[16:32], buf.next_obs[:16])  # step 1 continues from step 0's next obs


def test_imagine_adds_only_alive_transitions():
    fn = lambda o, a, nx: nx[:, 0] > 2.5  # noqa: E731
    env, ref = make_env(FakeModel(std=0.3), n=64, seed=2, termination_fn=fn), make_env(FakeModel(std=0.3), n=64, seed=2,
                                                                                   termination_fn=fn)
    buf = ReplayBuffer(10_000, (O,), A)
    stats = imagine(env, policy, 5, buf)
    # the same round by hand
    obs, alive, rows = ref.reset(), torch.ones(64, dtype=torch.bool), []
    for _ in range(5):
        a = policy(obs)
        out = ref.step(a)
        rows.append((obs[alive], a[alive], out.reward[alive], out.final_obs[alive], out.terminated[alive],
                     out.truncated[alive], out.info["aleatoric"][alive]))
        alive &= ~out.done
        obs = out.obs
    want = [torch.cat(c) for c in zip(*rows)]
    n = want[0].shape[0]
    assert 64 < n < 5 * 64 and stats["rollout/transitions"] == n == len(buf)
    for got, w in zip((buf.obs, buf.action, buf.reward, buf.next_obs, buf.terminated, buf.truncated), want):
        assert torch.equal(got[:n], w)
    assert stats["rollout/terminated"] == int(want[4].sum()) and stats["rollout/alive"] == int(alive.sum())
    assert stats["rollout/reward_mean"] == pytest.approx(float(want[2].mean()), rel=1e-5)
    assert stats["rollout/aleatoric_mean"] == pytest.approx(float(want[6].mean()), rel=1e-5)


def test_imagine_with_a_round_bigger_than_the_buffer():
    env = make_env(n=32)
    buf = ReplayBuffer(10, (O,), A)
    imagine(env, policy, 2, buf)
    ref = make_env(n=32)
    obs = ref.reset()
    last = ref.step(policy(ref.step(policy(obs)).obs))
    assert buf.added == 64 and len(buf) == 10
    order = (torch.arange(10) + buf.ptr) % 10  # oldest row first
    assert torch.equal(buf.next_obs[order], last.final_obs[22:])  # the last 10 transitions, as FIFO adds leave them


def test_imagine_on_a_true_dynamics_env():
    env = Pendulum(num_envs=8, max_episode_steps=3)
    buf = ReplayBuffer(100, env.spec.obs_shape, env.spec.action_dim)
    stats = imagine(env, lambda o: torch.zeros(8, 1), 5, buf)
    assert len(buf) == 24 and stats["rollout/truncated"] == 8 and "rollout/epistemic_mean" not in stats


def test_imagine_continues_without_reset():
    env = make_env(n=8, horizon=10)
    obs = env.reset(seed=0)
    with pytest.raises(UserInputError, match="needs obs"):
        imagine(env, policy, 2, reset=False)
    stats = imagine(env, policy, 3, reset=False, obs=obs)
    assert stats["rollout/transitions"] == 24 and env.elapsed.tolist() == [3] * 8


# ---- bad inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "match"), [
    (dict(start_obs=torch.zeros(10, O + 1)), r"start_obs has shape \(10, 4\), expected \[M,3\]"),
    (dict(start_obs=torch.zeros(0, O)), "start_obs is empty"),
    (dict(start_obs=torch.full((2, O), math.nan)), "NaN or inf"),
    (dict(n=0), "num_envs is 0"),
    (dict(member_mode="trajectory"), "member_mode"),
    (dict(penalty_kind="max"), "penalty_kind"),
    (dict(penalty=-1.0), "penalty is -1.0"),
    (dict(horizon=0), "horizon is 0"),
    (dict(start_sampler=lambda n, g: torch.zeros(n, O)), "exactly one of start_obs"),
])
def test_bad_inputs_raise_user_input_error(kw, match):
    with pytest.raises(UserInputError, match=match):
        make_env(**kw)


def test_bad_bounds_actions_and_model():
    with pytest.raises(UserInputError, match="action_low has 1 entries"):
        ModelEnv(FakeModel(), torch.zeros(3, O), 4, [-1.0], [1.0] * A, "fake")
    with pytest.raises(UserInputError, match="expected a DynamicsModel"):
        ModelEnv(object(), torch.zeros(3, O), 4, [-1.0] * A, [1.0] * A, "fake")
    env = make_env(n=4)
    with pytest.raises(UserInputError, match=r"expects float actions of shape \(4, 2\)"):
        env.step(torch.zeros(4, A + 1))
    with pytest.raises(UserInputError, match="imagine steps is 0"):
        imagine(env, policy, 0)
