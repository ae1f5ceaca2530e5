"""experiments/model_based_learning/diagnose.py's rollout comparison on stand-ins: a model whose prediction drifts
from the simulator by a known amount per step, a simulator that terminates some rollouts, and the rank correlation."""

import pytest
import torch

from ctrl_rl.envs.protocol import StepOut
from ctrl_rl.world_models.protocol import ModelStep
from tests.scripts import experiment_script


@pytest.fixture(scope="module")
def diag():
    with experiment_script("experiments/model_based_learning/diagnose.py", "mb_diagnose") as mod:
        yield mod


class Policy:
    def act(self, obs, deterministic=False):
        return torch.zeros(obs.shape[0], 1)


class Model:
    """Next state obs + 1 + 0.1 (the simulator's is obs + 1); reward 1.5 (the simulator's 1); uncertainty = index."""

    elites = torch.tensor([0, 1])

    def predict(self, obs, act, members, sample=True, generator=None):
        n = obs.shape[0]
        return ModelStep(next_obs=obs + 1.1, reward=torch.full((n,), 1.5), terminated=None,
                         uncertainty={"aleatoric": torch.arange(n, dtype=torch.float32),
                                      "epistemic": torch.zeros(n)})


class Sim:
    """Four rollouts from state 0; rollout 3 terminates at its second step."""

    def __init__(self):
        self.obs = torch.zeros(4, 2)
        self.t = 0

    def reset(self, seed=None):
        self.obs, self.t = torch.zeros(4, 2), 0
        return self.obs

    def step(self, act):
        self.t += 1
        nxt = self.obs + 1
        term = torch.tensor([False, False, False, self.t == 2])
        self.obs = nxt
        return StepOut(obs=nxt, reward=torch.ones(4), terminated=term, truncated=torch.zeros(4, dtype=torch.bool),
                       final_obs=nxt)


def test_error_compounds_along_the_rollout_and_ended_rollouts_stop_counting(diag):
    rows = diag.rollout_error(Policy(), Model(), Sim(), None, torch.tensor([1.0, 0.5]), 3, 0.5, "aleatoric",
                              torch.Generator().manual_seed(0))
    # the model's state is 0.1 t ahead of the simulator's after t steps: MSE in std units mean(0.01 t^2 / std^2)
    for r, t in zip(rows, (1, 2, 3)):
        assert r["t"] == t
        assert r["state_mse_std"] == pytest.approx(0.01 * t * t * (1 + 4) / 2, rel=1e-4)
        assert r["reward_abs_error"] == pytest.approx(0.5)
    assert [r["alive"] for r in rows] == [4, 4, 3]  # rollout 3 ended at step 2
    assert rows[0]["uncertainty"] == pytest.approx(1.5) and rows[2]["uncertainty"] == pytest.approx(1.0)
    assert rows[0]["penalty"] == pytest.approx(0.75)
    assert rows[1]["terminated_true"] == pytest.approx(0.25)


class Critics(Policy):
    """Three critics at (s, a): Q_i = s[0] + i (i = 0, 1, 2), so their mean is s[0] + 1, their minimum s[0]."""

    critic = None

    def encode(self, obs):
        return obs

    def q(self, net, f, a):
        return torch.stack([f[:, 0] + i for i in range(3)])  # [E,N]


def test_the_critics_spread_is_measured_at_each_steps_start_state(diag):
    rows = diag.rollout_error(Critics(), Model(), Sim(), None, torch.tensor([1.0, 0.5]), 3, 0.0, "aleatoric",
                              torch.Generator().manual_seed(0))
    # the model's state at step t's start is 1.1 (t - 1) in every dimension
    for r, t in zip(rows, (1, 2, 3)):
        assert r["q_mean"] == pytest.approx(1.1 * (t - 1) + 1)
        assert r["q_mean_minus_min"] == pytest.approx(1.0) and r["q_member_std"] == pytest.approx(1.0)
    assert "q_mean" not in diag.rollout_error(Policy(), Model(), Sim(), None, torch.tensor([1.0, 0.5]), 1, 0.0,
                                              "aleatoric", torch.Generator().manual_seed(0))[0]


def test_spearman_is_a_rank_correlation(diag):
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert diag.spearman(x, x ** 3) == pytest.approx(1.0)
    assert diag.spearman(x, -x) == pytest.approx(-1.0)


def test_markdown_and_plot_name_each_run_and_show_q_against_the_truth(diag, tmp_path):
    steps = [{"t": t, "alive": 4, "state_mse_std": 0.01 * t, "state_mse_std_median": 0.01 * t,
              "reward_abs_error": 0.1, "reward_model": 1.0, "reward_true": 0.9, "uncertainty": 0.2, "penalty": 0.2,
              "rank_corr_unc_reward_error": 0.5, "rank_corr_unc_state_error": 0.5, "terminated_true": 0.0}
             for t in (1, 2, 3)]
    q = {"q_mean": 120.0, "mc_target": 80.0, "ratio_mean": 1.5, "corr_q_mc": 0.6, "states": 4, "horizon": 10,
         "mean_length": 9.0, "terminated_within": 1.0}
    runs = [{"run": f"/runs/mopo-s{s}", "algo": "mopo", "step": 1000, "model": "/runs/dynamics", "rollout_length": 2,
             "penalty": 1.0, "penalty_kind": "aleatoric", "steps": steps, "q_truth": q, "commit": "abc"}
            for s in (0, 1)]
    payload = {"command": "diagnose.py", "date": "2026-11-27", "dataset": "d", "states": 4, "horizon": 3,
               "runs": runs}
    md = diag.markdown(payload)
    assert "/runs/mopo-s0" in md and "/runs/mopo-s1" in md and "Q / G = 1.50" in md
    dest = tmp_path / "d.png"
    diag.plot(payload, dest)
    assert dest.stat().st_size > 10_000
