"""Dataset actions are stored in the env's units and trained on in the agent's [-1, 1] (issue 28): the map with the
env's bounds, refusal of data outside them (or clipping with --clip-dataset-actions), the action units a dynamics
model records, and an agent trained on env-unit data whose export acts in env units again."""

import numpy as np
import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.deploy.sidecar import onnx_session
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.envs.registry import spec_of
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint, save_checkpoint
from ctrl_rl.learn.config import RunConfig
from ctrl_rl.learn.model_based import MODEL_FILE, load_model, model_entry, save_model
from ctrl_rl.learn.runtime import training_spec
from ctrl_rl.storage.datasets import DatasetMeta, open_dataset, to_agent_units, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore")

PENDULUM = "Pendulum-v1"  # Gymnasium's: torque bounds [-2, 2]
FAST = ["--threads", "1", "--no-progress", "--eval-episodes", "1", "--eval-every", "0"]
TINY = dict(members=2, elites=1, hidden=(8,), weight_decay=(0.0, 0.0))  # a dynamics model, never fitted
IQL = ["--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--value-hidden", "16", "16", "--batch-size", "32"]


def write_pendulum(path, actions: torch.Tensor) -> str:
    """A Pendulum-v1 dataset of ``len(actions)`` rows with these actions (env units), written by ctrl_rl's writer:
    random observations and rewards, an episode ending in a time-out every 16 rows."""
    g = torch.Generator().manual_seed(0)
    n = actions.shape[0]
    arrays = {"observations": torch.randn(n, 3, generator=g), "next_observations": torch.randn(n, 3, generator=g),
              "actions": actions.reshape(n, 1), "rewards": -torch.rand(n, generator=g),
              "terminals": torch.zeros(n, dtype=torch.bool), "timeouts": torch.arange(n) % 16 == 15}
    return str(write_dataset(path, arrays, DatasetMeta(env_id=PENDULUM, level="constant")))


def out_of_bounds(n=64) -> torch.Tensor:
    a = torch.full((n,), 1.5)
    a[[3, 20, 41]] = torch.tensor([2.5, -2.2, 2.1])  # 3 rows past [-2, 2], the largest by 0.5
    return a


# ----- the map -----

def test_pendulum_actions_are_mapped_to_the_agents_units(tmp_path):
    a = torch.tensor([1.5, -2.0, 2.0, 0.0, -0.5])
    ds = open_dataset(write_pendulum(tmp_path / "p.hdf5", a), PENDULUM, None)
    assert torch.equal(ds.action, torch.tensor([[0.75], [-1.0], [1.0], [0.0], [-0.25]])[: len(ds)])
    assert ds.metadata["action_units"] == "agent" and ds.metadata["actions_clipped"] == 0
    # the loop's --clip-actions applies after the map, in agent units
    ds = open_dataset(write_pendulum(tmp_path / "q.hdf5", a), PENDULUM, 0.9)
    assert float(ds.action.max()) == pytest.approx(0.9) and float(ds.action.min()) == pytest.approx(-0.9)


def test_the_map_per_dimension_and_where_it_is_the_identity():
    spec = EnvSpec("x", (2,), False, 3, action_low=(0.0, -3.0, -float("inf")), action_high=(1.0, 1.0, float("inf")))
    a = torch.tensor([[0.25, -1.0, 7.0], [1.0, -3.0, -9.0]])  # [S,A]
    got, clipped = to_agent_units(a, spec, "d", clip=False)
    assert clipped == 0 and torch.equal(got, torch.tensor([[-0.5, 0.0, 7.0], [1.0, -1.0, -9.0]]))
    unit = EnvSpec("y", (2,), False, 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    a = torch.rand(5, 2) * 2 - 1
    assert to_agent_units(a, unit, "d", clip=False)[0] is a  # bounds of +-1: the same tensor, bit for bit
    idx = torch.tensor([0, 1, 1])
    assert to_agent_units(idx, EnvSpec("z", (2,), True, 2), "d", clip=False)[0] is idx  # discrete: untouched


# ----- out of bounds -----

def test_out_of_bounds_data_is_refused_in_one_sentence_and_writes_nothing(tmp_path, capsys):
    data = write_pendulum(tmp_path / "wild.hdf5", out_of_bounds())
    d = tmp_path / "run"
    assert main(["train", "iql", "--env", PENDULUM, "--dataset", data, "--total-steps", "2", "--run-dir", str(d),
                 *IQL, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("ctrl-rl: error: dataset ")
    # the qlearning view keeps 60 of the 64 rows (the last row of every episode has no next row there)
    assert "wild.hdf5" in err and "3 of 60 actions" in err and "by up to 0.5 in env units" in err
    assert "--clip-dataset-actions" in err
    assert not d.exists()
    with pytest.raises(UserInputError, match="3 of 64 actions"):  # NeuBay's tapes: the trajectory view
        open_dataset(data, PENDULUM, None, view="trajectory")


def test_clip_dataset_actions_clips_to_the_bounds_and_says_how_many(tmp_path, capsys):
    data = write_pendulum(tmp_path / "wild.hdf5", out_of_bounds())
    ds = open_dataset(data, PENDULUM, None, clip_to_bounds=True, view="trajectory")
    assert ds.metadata["actions_clipped"] == 3 and float(ds.action.abs().max()) == 1.0
    assert float(ds.action[3]) == 1.0 and float(ds.action[20]) == -1.0 and float(ds.action[0]) == 0.75
    capsys.readouterr()
    d = tmp_path / "run"
    assert main(["train", "iql", "--env", PENDULUM, "--dataset", data, "--total-steps", "2", "--run-dir", str(d),
                 "--clip-dataset-actions", *IQL, *FAST]) == 0
    out = capsys.readouterr().out
    assert out.count("clipped 3 of 60 dataset actions to the env's bounds") == 1, out


# ----- dynamics models -----

@pytest.fixture
def pendulum_model(tmp_path):
    spec = training_spec(RunConfig(env=PENDULUM))
    entry = model_entry()
    model = entry.make(entry.default_config(**TINY), spec, torch.device("cpu"),
                       torch.Generator().manual_seed(0))
    return save_model(tmp_path / "dyn", model, PENDULUM, {}), spec


def test_a_dynamics_model_records_its_action_units(pendulum_model, tmp_path, capsys):
    path, spec = pendulum_model
    data = load_checkpoint(path)
    assert data["action_units"] == "agent"
    assert load_model(path.parent, spec, PENDULUM, torch.device("cpu")).act_dim == 1
    other = tmp_path / "other"
    save_checkpoint(other / MODEL_FILE, {**data, "action_units": "env"})
    with pytest.raises(UserInputError, match="fitted on actions in 'env' units.*refit"):
        load_model(other, spec, PENDULUM, torch.device("cpu"))
    # from the command line: exit code 2, one sentence, no run directory
    dataset = write_pendulum(tmp_path / "p.hdf5", torch.full((32,), 1.5))
    d = tmp_path / "run"
    assert main(["train", "mopo", "--env", PENDULUM, "--dataset", dataset, "--model", str(other), "--run-dir", str(d),
                 "--total-steps", "2", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'env' units" in err and not d.exists()


def test_a_model_saved_before_action_units_is_accepted_only_where_bounds_are_unit(pendulum_model, tmp_path):
    path, spec = pendulum_model
    legacy = {k: v for k, v in load_checkpoint(path).items() if k != "action_units"}
    save_checkpoint(tmp_path / "old" / MODEL_FILE, legacy)
    with pytest.raises(UserInputError, match="raw dataset actions.*not \\+-1.*refit"):
        load_model(tmp_path / "old", spec, PENDULUM, torch.device("cpu"))
    # torch:PointMass acts in [-1, 1]: its raw actions are the agent's, so an old model of it still loads
    pm = "torch:PointMass"
    assert spec_of(pm).action_low == (-1.0, -1.0) and spec_of(pm).action_high == (1.0, 1.0)
    pm_spec = training_spec(RunConfig(env=pm))
    entry = model_entry()
    model = entry.make(entry.default_config(**TINY), pm_spec, torch.device("cpu"),
                       torch.Generator().manual_seed(0))
    p = save_model(tmp_path / "pm", model, pm, {})
    save_checkpoint(p, {k: v for k, v in load_checkpoint(p).items() if k != "action_units"})
    assert load_model(p.parent, pm_spec, pm, torch.device("cpu")).act_dim == 2


# ----- end to end -----

def test_an_agent_trained_on_env_unit_data_exports_env_units(tmp_path, capsys):
    """IQL on a Pendulum-v1 dataset whose every action is the torque 1.5: the agent learns 0.75 in its own units,
    and the exported policy gives 1.5 again (without the map it would learn the clipped 1, exported as 2)."""
    data = write_pendulum(tmp_path / "const.hdf5", torch.full((64,), 1.5))
    d = tmp_path / "iql"
    assert main(["train", "iql", "--env", PENDULUM, "--dataset", data, "--total-steps", "150", "--actor-lr", "1e-2",
                 "--run-dir", str(d), *IQL, *FAST]) == 0, capsys.readouterr().err
    assert main(["export", str(d), "--format", "onnx"]) == 0, capsys.readouterr().err
    sess = onnx_session(d / "export" / "policy.onnx")
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    action = sess.run(None, {sess.get_inputs()[0].name: obs})[0]
    assert action.shape == (5, 1) and np.abs(action - 1.5).max() < 0.1, action
