"""experiments/edge_of_reach/q_truth.py: the Monte Carlo value it measures in the true simulator, checked against
gymnasium's Hopper stepped by hand from the same dataset states and actions."""


import gymnasium as gym
import numpy as np
import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.learn.evaluate import load_policy
from ctrl_rl.storage.datasets import load_dataset
from ctrl_rl.world_models.true_dynamics import TrueDynamicsEnv
from tests.scripts import experiment_script

FLAGS = ["--batch-size", "32", "--rollout-starts", "16", "--rollout-every", "5", "--retain-rounds", "2",
         "--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def q_truth():
    with experiment_script("experiments/edge_of_reach/q_truth.py", "q_truth") as mod:
        yield mod


def test_monte_carlo_value_equals_hand_stepped_hopper(q_truth, hopper_dataset, tmp_path):
    horizon = 3
    d = tmp_path / "mbpo"
    assert main(["train", "mbpo", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", "true", "--total-steps",
                 "10", "--eval-every", "0", "--run-dir", str(d), *FLAGS]) == 0
    ds = load_dataset(hopper_dataset)
    n, seed = 6, 3
    out = q_truth.measure(d, ds, n, horizon, seed)

    # the same draws by hand: start rows from the env's generator, actions from a generator seeded alike
    algo, run, _, _ = load_policy(str(d), "cpu", seed=seed)
    probe = TrueDynamicsEnv("Hopper-v5", ds.infos["qpos"], ds.infos["qvel"], n, horizon=horizon, seed=seed)
    obs = probe.reset(seed=seed)
    rows = probe.start_rows.numpy()
    probe.close()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        a, _ = algo.actor.sample(algo.encode(obs), gen)
        q = algo.q(algo.critic, algo.encode(obs), a)  # [E,N]
    gamma = algo.config.gamma
    # step every env in lockstep like the measurement, with the actions it samples in the same order
    envs = []
    for row in rows:
        e = gym.make("Hopper-v5").unwrapped
        e.reset(seed=0)
        e.set_state(np.asarray(ds.infos["qpos"][row], np.float64), np.asarray(ds.infos["qvel"][row], np.float64))
        envs.append(e)
    alive = np.ones(n, bool)
    ret = np.zeros(n)
    act = a
    for t in range(horizon):
        nxt = np.zeros((n, obs.shape[1]), np.float32)
        for i, e in enumerate(envs):
            ob, r, term, _, _ = e.step(act[i].numpy())
            nxt[i] = ob
            ret[i] += alive[i] * gamma ** t * r
            alive[i] = alive[i] and not term
        if t + 1 < horizon:
            with torch.no_grad():
                act, _ = algo.actor.sample(algo.encode(torch.as_tensor(nxt)), gen)
    assert out["mc_return"] == pytest.approx(float(ret.mean()), rel=1e-5)
    assert out["q_mean"] == pytest.approx(float(q.mean()), rel=1e-5)
    assert out["q_min"] == pytest.approx(float(q.min(0).values.mean()), rel=1e-5)
    assert out["step"] == 10 and out["states"] == n
