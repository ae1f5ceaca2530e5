"""The batched dynamics ensemble: batched == per-member math, fitting a known linear system, elites, the protocol's
prediction and uncertainty figures, errors that speak to the user, saving, and the termination head."""

import io
import json

import pytest
import torch

import ctrl_rl.world_models.ensemble as ensemble_mod
from ctrl_rl.errors import UserInputError
from ctrl_rl.world_models.ensemble import DynamicsConfig, EnsembleDynamics, evaluate, fit, member_forward, soft_clamp
from ctrl_rl.world_models.protocol import UNCERTAINTIES, DynamicsModel

O, A = 3, 2
TINY = dict(members=4, elites=2, hidden=(16, 16), weight_decay=(2.5e-5, 5e-5, 1e-4))
FAST = dict(min_epochs=0, batch_size=64)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks: one intra-op thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model(seed=0, **kw) -> EnsembleDynamics:
    """A model with random parameters everywhere (LayerNorm affines and logvar bounds too) and non-trivial
    statistics."""
    torch.manual_seed(seed)
    m = EnsembleDynamics(O, A, DynamicsConfig(**{**TINY, **kw}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
        for name, n in (("obs", O), ("act", A), ("target", O + 1)):
            getattr(m, f"{name}_mean").copy_(torch.randn(n, generator=g))
            getattr(m, f"{name}_std").copy_(torch.rand(n, generator=g) + 0.5)
    return m


def _linear_data(S=2000, seed=0, noise=0.02):
    """s' = M s + N a + noise, r = c . s + d . a + noise, terminated = s[0] > 0.5."""
    g = torch.Generator().manual_seed(seed)
    M = torch.eye(O) * 0.9 + 0.1 * torch.randn(O, O, generator=torch.Generator().manual_seed(100))
    N = 0.5 * torch.randn(A, O, generator=torch.Generator().manual_seed(101))
    c, d = torch.tensor([1.0, -0.5, 0.2]), torch.tensor([0.3, 0.1])
    obs, act = torch.randn(S, O, generator=g), torch.rand(S, A, generator=g) * 2 - 1
    next_obs = obs @ M + act @ N + noise * torch.randn(S, O, generator=g)
    reward = obs @ c + act @ d + noise * torch.randn(S, generator=g)
    mean = (obs @ M + act @ N, obs @ c + act @ d)
    return {"obs": obs, "act": act, "next_obs": next_obs, "reward": reward, "terminated": obs[:, 0] > 0.5}, mean


@pytest.mark.parametrize("kw", [dict(), dict(layer_norm=True, activation="leaky_relu", logvar_bounds="fixed"),
                                dict(layer_norm=True, residual=True, learn_termination=True)])
def test_batched_forward_equals_member_forward(kw):
    m = _model(**kw)
    obs, act = torch.randn(5, O) * 3, torch.randn(5, A)
    obs_e, act_e = torch.randn(4, 5, O), torch.randn(4, 5, A)  # one batch per member
    with torch.no_grad():
        shared, per = m(obs, act), m(obs_e, act_e)
        for i in range(4):
            for out, (o, a) in ((shared, (obs, act)), (per, (obs_e[i], act_e[i]))):
                ref = member_forward(m, i, o, a)
                torch.testing.assert_close(out[0][i], ref[0], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out[1][i], ref[1], atol=1e-5, rtol=1e-5)
                if kw.get("learn_termination"):
                    torch.testing.assert_close(out[2][i], ref[2], atol=1e-5, rtol=1e-5)
                else:
                    assert out[2] is None and ref[2] is None
    assert shared[0].shape == shared[1].shape == (4, 5, O + 1)


def test_soft_clamp_hand_numbers():
    x = torch.tensor([-100.0, 0.0, 100.0])
    y = soft_clamp(x, -5.0, 0.25)
    sp = torch.nn.functional.softplus
    # the lower bound is met last, so at x -> +inf the result is -5 + softplus(5.25) = 0.2552, just above 0.25
    assert abs(y[0] + 5) < 1e-4 and torch.isclose(y[2], -5 + sp(torch.tensor(5.25))) and 0.25 < y[2] < 0.256
    assert torch.isclose(y[1], -5 + sp(0.25 - sp(torch.tensor(0.25)) + 5))


def test_fit_learns_a_linear_system_and_keeps_the_best_members_as_elites():
    data, (true_next, true_r) = _linear_data()
    m = EnsembleDynamics(O, A, DynamicsConfig(**TINY, **FAST, max_epochs=25))
    seen = []
    hist = fit(m, data, torch.Generator().manual_seed(0), progress=lambda e, x: seen.append(e))
    assert seen == [h["epoch"] for h in hist] and len(hist) >= 5
    assert hist[-1]["holdout_mse"] < 0.1 * hist[0]["holdout_mse"]
    assert set(hist[0]) >= {"epoch", "train_loss", "holdout_mse", "holdout_nll", "calibration", "calibration_dims",
                            "lr"}
    assert len(hist[0]["calibration_dims"]) == O + 1
    step = m.predict(data["obs"][:500], data["act"][:500], sample=False)
    delta_sd = (true_next[:500] - data["obs"][:500]).std()
    assert (step.next_obs - true_next[:500]).abs().mean() < 0.1 * delta_sd  # one-step error small against the change
    assert (step.reward - true_r[:500]).abs().mean() < 0.1 * true_r.std()
    # elites = lowest holdout MSE of the restored weights; fit's first random draw is the holdout permutation
    hold = torch.randperm(2000, generator=torch.Generator().manual_seed(0))[:400]
    x, y = m.inputs(data["obs"][hold], data["act"][hold]), m.targets(data["obs"][hold], data["next_obs"][hold],
                                                                     data["reward"][hold])
    mse = evaluate(m, x, y)["mse"]
    torch.testing.assert_close(mse, m.holdout_mse)
    assert sorted(m.elites.tolist()) == sorted(mse.argsort()[:2].tolist())


def test_fit_is_bit_identical_for_a_seed():
    data, _ = _linear_data(S=400)
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        m = EnsembleDynamics(O, A, DynamicsConfig(**TINY, **FAST, max_epochs=3))
        fit(m, data, torch.Generator().manual_seed(5))
        runs.append(m.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


@pytest.mark.parametrize("bootstrap", [True, False])
def test_fit_resumed_from_an_epoch_checkpoint_equals_the_uninterrupted_fit(bootstrap):
    import copy

    data, _ = _linear_data(S=400)
    cfg = DynamicsConfig(**TINY, **FAST, max_epochs=5, bootstrap=bootstrap)
    states = {}
    torch.manual_seed(1)
    whole = EnsembleDynamics(O, A, cfg)
    hist = fit(whole, data, torch.Generator().manual_seed(5),
               checkpoint=lambda st: states.__setitem__(st["epoch"], copy.deepcopy(st)))
    assert sorted(states) == [1, 2, 3, 4, 5]
    torch.manual_seed(2)  # another init: the checkpoint's weights replace it
    resumed = EnsembleDynamics(O, A, cfg)
    seen = []
    hist2 = fit(resumed, data, torch.Generator().manual_seed(99), progress=lambda e, m: seen.append(e),
                resume=states[2])
    assert seen == [3, 4, 5] and hist2 == hist
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fit_resumed_after_its_early_stop_trains_no_further():
    data, _ = _linear_data(S=300)
    cfg = DynamicsConfig(**{**TINY, **FAST}, improvement=0.999, patience=2, max_epochs=20)
    last = {}
    m = EnsembleDynamics(O, A, cfg)
    hist = fit(m, data, torch.Generator().manual_seed(0), checkpoint=lambda st: last.update(st))
    assert last["stopped"] and last["epoch"] == hist[-1]["epoch"] < 20
    seen = []
    fit(EnsembleDynamics(O, A, cfg), data, torch.Generator().manual_seed(0), progress=lambda e, x: seen.append(e),
        resume=last)
    assert seen == []


def test_lr_decays_once_on_a_stall_before_min_epochs_then_stops():
    data, _ = _linear_data(S=300)
    m = EnsembleDynamics(O, A, DynamicsConfig(**{**TINY, **FAST, "min_epochs": 6}, improvement=0.999, patience=2,
                                              max_epochs=20, lr=1e-3))
    hist = fit(m, data, torch.Generator().manual_seed(0))
    # epoch 1 improves (from inf); stalls at 2, 3 -> decay; 4, 5 stall (decayed already, < min_epochs); 6 stops
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4, 5, 6]
    assert [h["lr"] for h in hist] == pytest.approx([1e-3] * 3 + [3e-4] * 3)


def test_predict_uses_the_given_members_and_computes_the_protocol_uncertainties():
    m = _model(learn_termination=True)
    m.elite_ids.copy_(torch.tensor([3, 1]))
    assert isinstance(m, DynamicsModel) and m.num_members == 4 and m.elites.tolist() == [3, 1]
    obs, act = torch.randn(6, O), torch.randn(6, A)
    refs = [member_forward(m, i, obs, act) for i in range(4)]
    with torch.no_grad():
        for members in (torch.tensor([0, 1, 2, 3, 0, 2]), torch.tensor([3, 1, 1, 3, 3, 1])):  # non-elites; elites only
            step = m.predict(obs, act, members=members, sample=False)
            mean = torch.stack([refs[int(k)][0][b] for b, k in enumerate(members)])  # [B,D]
            raw = mean * m.target_std + m.target_mean
            torch.testing.assert_close(step.next_obs, obs + raw[:, :O], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step.reward, raw[:, O], atol=1e-5, rtol=1e-5)
            logit = torch.stack([refs[int(k)][2][b] for b, k in enumerate(members)])
            assert torch.equal(step.terminated, logit > 0)
            mu = torch.stack([refs[3][0], refs[1][0]])  # [K,B,D] the elites
            var = torch.stack([refs[3][1], refs[1][1]]).exp()
            assert set(step.uncertainty) == set(UNCERTAINTIES)
            assert all(v.shape == (6,) for v in step.uncertainty.values())
            ale = (var * m.target_std ** 2).sum(-1).sqrt().amax(0)
            epi = mu.var(0, unbiased=False)
            torch.testing.assert_close(step.uncertainty["aleatoric"], ale, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step.uncertainty["epistemic"], epi.mean(-1).sqrt(), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step.uncertainty["total_var"], (epi + var.mean(0)).mean(-1), atol=1e-5,
                                       rtol=1e-5)
    # None: a random elite per row, drawn from the generator; rows in chunks give the same figures
    m2 = _model(learn_termination=True, predict_chunk=4)
    m2.elite_ids.copy_(torch.tensor([3, 1]))
    s1 = m.predict(obs, act, generator=torch.Generator().manual_seed(7))
    s2 = m2.predict(obs, act, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(s1.uncertainty["epistemic"], s2.uncertainty["epistemic"])
    assert s1.next_obs.shape == (6, O) and s1.reward.shape == (6,)


def test_epistemic_is_zero_when_all_elites_are_equal():
    m = _model()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p[:1].clone().expand_as(p))
    step = m.predict(torch.randn(8, O), torch.randn(8, A), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(step.uncertainty["epistemic"], torch.zeros(8), atol=1e-6)
    assert (step.uncertainty["total_var"] > 0).all() and (step.uncertainty["aleatoric"] > 0).all()


def test_state_dict_and_meta_round_trip_give_identical_predictions():
    m = _model(layer_norm=True, learn_termination=True)
    m.elite_ids.copy_(torch.tensor([2, 0]))
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    m2 = EnsembleDynamics.from_meta(json.loads(json.dumps(m.meta())))
    m2.load_state_dict(torch.load(buf))
    assert m2.cfg == m.cfg
    obs, act = torch.randn(10, O), torch.randn(10, A)
    s1, s2 = (x.predict(obs, act, generator=torch.Generator().manual_seed(3)) for x in (m, m2))
    assert torch.equal(s1.next_obs, s2.next_obs) and torch.equal(s1.reward, s2.reward)
    assert torch.equal(s1.terminated, s2.terminated)
    assert all(torch.equal(s1.uncertainty[k], s2.uncertainty[k]) for k in UNCERTAINTIES)


def test_learned_termination_head_learns_a_threshold_rule():
    data, _ = _linear_data(S=2000)
    m = EnsembleDynamics(O, A, DynamicsConfig(**TINY, **FAST, max_epochs=20, lr=1e-2, learn_termination=True))
    hist = fit(m, data, torch.Generator().manual_seed(0))
    assert hist[-1]["holdout_term_acc"] > 0.95
    test, _ = _linear_data(S=1000, seed=1)
    step = m.predict(test["obs"], test["act"], generator=torch.Generator().manual_seed(0))
    assert (step.terminated == test["terminated"]).float().mean() > 0.95


def test_bad_data_is_a_user_error():
    data, _ = _linear_data(S=100)
    m = EnsembleDynamics(O, A, DynamicsConfig(**TINY, **FAST, max_epochs=2))
    bad = {**data, "reward": data["reward"].clone()}
    bad["reward"][7] = float("nan")
    with pytest.raises(UserInputError, match="'reward' holds NaN"):
        fit(m, bad)
    with pytest.raises(UserInputError, match=r"'act' has shape \(100, 3\)"):
        fit(m, {**data, "act": torch.zeros(100, 3)})
    with pytest.raises(UserInputError, match="no 'next_obs'"):
        fit(m, {k: v for k, v in data.items() if k != "next_obs"})
    with torch.no_grad():
        m.layers[0].weight[0, 0, 0] = float("nan")
    with pytest.raises(UserInputError, match="at epoch 1"):
        fit(m, data)


@pytest.mark.parametrize("kw, field", [
    (dict(members=0), "members"), (dict(elites=8), "elites"), (dict(members=2.5), "members"),
    (dict(hidden=(16, 0)), "hidden"), (dict(weight_decay=(1e-4,) * 4), "weight_decay"),
    (dict(weight_decay=(1e-4, -1.0, 0.0)), "weight_decay"), (dict(lr=-1.0), "lr"), (dict(lr=float("nan")), "lr"),
    (dict(holdout_ratio=1.0), "holdout_ratio"), (dict(activation="gelu"), "activation"),
    (dict(logvar_bounds="free"), "logvar_bounds"), (dict(batch_size=0), "batch_size"),
    (dict(min_epochs=10, max_epochs=5), "max_epochs"), (dict(lr_decay=0.0), "lr_decay"),
    (dict(max_holdout=0), "max_holdout"), (dict(layer_norm="yes"), "layer_norm")])
def test_bad_config_values_are_user_errors(kw, field):
    with pytest.raises(UserInputError, match=f"DynamicsConfig.{field}"):
        DynamicsConfig(**{**TINY, **kw})


def test_defaults_are_ravls():
    c = DynamicsConfig()
    assert (c.members, c.elites, c.hidden, c.activation, c.layer_norm) == (7, 5, (200,) * 4, "silu", False)
    assert c.weight_decay == (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
    assert (c.lr, c.batch_size, c.holdout_ratio, c.patience, c.improvement) == (1e-3, 256, 0.2, 5, 0.01)
    assert (c.min_epochs, c.max_epochs, c.lr_decay, c.bootstrap, c.logvar_bounds) == (350, 2000, 0.3, True, "learned")
    m = EnsembleDynamics(17, 6)
    assert m.max_logvar.shape == (7, 1, 18) and bool((m.max_logvar == 0.5).all()) and bool((m.min_logvar == -10).all())


def test_index_tables_drawn_in_chunks_equal_one_draw(monkeypatch):
    """fit's [E,N] bootstrap and order tables are drawn a few members at a time (NeuBay's 128 members x 1M rows
    would otherwise need GBs of temporaries); the tables equal one [E,N] draw from the same generator."""
    E, N = 7, 50
    ref_gen = torch.Generator().manual_seed(3)
    boot_ref = torch.randint(N, (E, N), generator=ref_gen)
    order_ref = boot_ref.gather(1, torch.rand(E, N, generator=ref_gen).argsort(1))
    monkeypatch.setattr(ensemble_mod, "_CHUNK", 2 * N)  # two members per chunk: chunks of 2, 2, 2, 1
    gen = torch.Generator().manual_seed(3)
    boot = ensemble_mod._chunked_rows(E, N, lambda e0, e1: torch.randint(N, (e1 - e0, N), generator=gen), torch.int32,
                                      torch.device("cpu"))
    order = ensemble_mod._member_orders(boot, E, N, gen, torch.device("cpu"), torch.int32)
    assert boot.dtype == torch.int32 and torch.equal(boot.long(), boot_ref)
    assert torch.equal(order.long(), order_ref)
