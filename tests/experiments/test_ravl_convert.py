"""experiments/peers/ravl_official/convert.py's mapping of a ctrl_rl ensemble to the official layout: the official
member's forward (dynamics_training/net.py: standardised clipped inputs, 4 SiLU layers, a mean and a log-variance
head, PETS' soft clamp with the ensemble's bounds, the state added to the predicted delta) evaluated here on the
converted tensors gives ctrl_rl's predictions in raw units; with bounds that differ between members, only the
log-variance moves."""

import pytest
import torch
import torch.nn.functional as F

from ctrl_rl.world_models.ensemble import DynamicsConfig, EnsembleDynamics
from tests.scripts import experiment_script

O, A = 3, 2


@pytest.fixture(scope="module")
def conv():
    with experiment_script("experiments/peers/ravl_official/convert.py", "ravl_convert") as mod:
        yield mod


def model(same_bounds: bool) -> EnsembleDynamics:
    torch.manual_seed(0)
    m = EnsembleDynamics(O, A, DynamicsConfig(members=3, elites=2, hidden=(8, 8, 8, 8)))
    with torch.no_grad():
        for name in ("obs", "act", "target"):
            n = getattr(m, f"{name}_mean").numel()
            getattr(m, f"{name}_mean").copy_(torch.randn(n))
            getattr(m, f"{name}_std").copy_(torch.rand(n) * 3 + 0.1)
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
        hi, lo = torch.full((1, 1, O + 1), -0.5), torch.full((1, 1, O + 1), -3.0)
        m.max_logvar.copy_(hi if same_bounds else hi + torch.randn(3, 1, O + 1))
        m.min_logvar.copy_(lo if same_bounds else lo + torch.randn(3, 1, O + 1))
    return m


def official_forward(t: dict, i: int, obs, act):
    """The official Net.get_mean_logvar on the converted tensors (written from dynamics_training/net.py)."""
    sd = t["members"][i]
    x = torch.cat([((obs - t["state_mean"].float()) / t["state_std"].float()).clamp(-10, 10),
                   ((act - t["action_mean"].float()) / t["action_std"].float()).clamp(-10, 10)], 1)
    for name in ("fc1", "fc2", "fc3", "fc4"):
        x = F.silu(F.linear(x, sd[f"net.{name}.weight"], sd[f"net.{name}.bias"]))
    mean = F.linear(x, sd["net.delta.weight"], sd["net.delta.bias"])
    lv = F.linear(x, sd["net.logvar.weight"], sd["net.logvar.bias"])
    hi, lo = t["logvar_max"], t["logvar_min"]
    lv = hi - F.softplus(hi - lv)
    lv = lo + F.softplus(lv - lo)
    mean[:, :O] += obs
    return mean, lv


@pytest.mark.parametrize("same_bounds", [True, False])
def test_converted_members_predict_what_ctrl_rl_predicts(conv, same_bounds):
    m = model(same_bounds)
    t = {**conv.official_tensors(m), **conv.reference(m, n=256)}
    assert set(t["members"][0]) == {f"net.{n}.{p}" for n in ("fc1", "fc2", "fc3", "fc4", "delta", "logvar")
                                    for p in ("weight", "bias")}
    for i in range(3):
        mean, lv = official_forward(t, i, t["probe_obs"], t["probe_act"])
        torch.testing.assert_close(mean, t["expect_mean"][i], rtol=1e-4, atol=1e-4)
        if same_bounds:
            torch.testing.assert_close(lv, t["expect_logvar"][i], rtol=1e-4, atol=1e-4)
    if not same_bounds:  # the median bounds move some log-variances
        lvs = torch.stack([official_forward(t, i, t["probe_obs"], t["probe_act"])[1] for i in range(3)])
        assert (lvs - t["expect_logvar"]).abs().max() > 1e-2


def test_other_architectures_are_refused(conv):
    m = EnsembleDynamics(O, A, DynamicsConfig(members=3, elites=2, hidden=(8, 8, 8, 8), layer_norm=True))
    with pytest.raises(SystemExit, match="expected the official architecture"):
        conv.official_tensors(m)
