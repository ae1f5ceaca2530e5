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


def test_spearman_is_a_rank_correlation(diag):
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert diag.spearman(x, x ** 3) == pytest.approx(1.0)
    assert diag.spearman(x, -x) == pytest.approx(-1.0)
