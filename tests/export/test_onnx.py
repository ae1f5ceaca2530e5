"""`ctrl-rl export`: for every policy family, onnxruntime and the reloaded ``.pt2`` give the eager policy's action in
the env's units (atol 1e-5) at any batch size, and the sidecar / ONNX metadata say what a deployment needs."""

import json

import numpy as np
import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.deploy.export import ExportModule, example_inputs, input_name
from ctrl_rl.deploy.sidecar import onnx_session, read_export
from ctrl_rl.learn.evaluate import load_policy
from tests.learn.conftest import hopper_dataset, model_run  # noqa: F401  (session fixtures of the model-based runs)
from tests.learn.test_offline import write_pendulum_dataset

pytestmark = pytest.mark.filterwarnings("ignore")

SMALL = ["--threads", "1", "--no-progress"]
OFF = ["--num-envs", "2", "--total-steps", "64", "--learning-starts", "32", "--batch-size", "16",
       "--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--log-every", "32", *SMALL]
PPO = ["--num-envs", "4", "--total-steps", "64", "--rollout-steps", "8", "--minibatch-size", "16", "--epochs", "1",
       *SMALL]
PIX = "torch:PointMassPixels,image_size=16"
CNN = ["--cnn-layers", "1", "--cnn-channels", "4", "--image-features", "8"]
MB = ["--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--batch-size", "16", "--rollout-starts", "8",
      "--rollout-every", "2", "--rollout-length", "2", "--eval-episodes", "1", "--log-every", "2", *SMALL]

# family -> (train arguments after the algorithm name; the dataset and model are filled in by the fixture)
FAMILIES = {
    "ppo_gaussian": ["ppo", "--env", "torch:Pendulum", *PPO],
    "ppo_categorical": ["ppo", "--env", "torch:CartPole", *PPO],
    "ppo_image": ["ppo", "--env", PIX, *CNN, *PPO],
    "sac": ["sac", "--env", "Pendulum-v1", *OFF],  # bounds [-2, 2]: the rescaling is inside the graph
    "crossq": ["sac", "--env", "torch:Pendulum", "--crossq", "--actor-batch-renorm", "--renorm-warmup", "1", *OFF],
    "sac_image": ["sac", "--env", PIX, *CNN, *OFF],
    "sac_obs_norm": ["sac", "--env", "torch:Pendulum", "--obs-norm", "--n-step", "3", *OFF],  # normalizer in the graph
    "sac_flow": ["sac_flow", "--env", "torch:Pendulum", "--flow-hidden", "16", "--noise-hidden", "16", "--d-model", "8",
                 "--n-layers", "1", *OFF],
    "iql": ["iql", "--env", "torch:Pendulum", "--dataset", "{pendulum}", "--total-steps", "8", "--batch-size", "16",
            "--actor-hidden", "16", "--critic-hidden", "16", "--eval-episodes", "1", *SMALL],
    "cql": ["cql", "--env", "torch:Pendulum", "--dataset", "{pendulum}", "--total-steps", "8", "--batch-size", "16",
            "--actor-hidden", "16", "--critic-hidden", "16", "--eval-episodes", "1", *SMALL],
    "ravl": ["ravl", "--env", "Hopper-v5", "--dataset", "{hopper}", "--model", "{model}", "--total-steps", "4",
             "--num-critics", "3", "--target-subset", "3", *MB],
    "neubay": ["neubay", "--env", "Hopper-v5", "--dataset", "{hopper}", "--model", "{model}", "--total-steps", "2",
               "--d-model", "16", "--lru-hidden", "8", "--head-hidden", "16", "16", "--num-critics", "3",
               "--batch-transitions", "64", "--parallel-rollouts", "4", "--horizon", "40", "--utd", "0.2",
               "--eval-episodes", "1", "--log-every", "2", *SMALL],
}


def _fill(args: list[str], **values) -> list[str]:
    return [a.format(**values) if "{" in a else a for a in args]


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    return write_pendulum_dataset(tmp_path_factory.mktemp("data") / "pendulum-random.hdf5")


@pytest.fixture
def exported(request, tmp_path, capsys, pendulum):
    family = request.param
    args = FAMILIES[family]
    values = {"pendulum": pendulum}
    if "{hopper}" in args:
        values |= {"hopper": request.getfixturevalue("hopper_dataset"), "model": request.getfixturevalue("model_run")}
    d = tmp_path / family
    assert main(["train", *_fill(args, **values), "--run-dir", str(d)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["export", str(d)]) == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    assert printed["out"] == str(d / "export") and set(printed["files"]) == {"onnx", "pt2"}
    return family, d, printed


@pytest.mark.parametrize("exported", sorted(FAMILIES), indirect=True)
def test_exported_graphs_equal_the_eager_policy(exported):
    family, d, printed = exported
    meta = read_export(d / "export")
    assert all(v <= 1e-5 for v in meta["parity"].values())  # measured at export
    algo, run, ck_path, ck = load_policy(str(d))
    recurrent = hasattr(algo, "reset_state")
    policy = algo.exportable().eval()
    from ctrl_rl.learn.runtime import build_env

    probe = build_env(run, 1, 0)
    env_spec = probe.unwrapped().spec
    probe.close()
    module = ExportModule(policy, algo.spec, recurrent, env_spec).eval()
    sess = onnx_session(d / "export" / "policy.onnx")
    pt2 = torch.export.load(str(d / "export" / "policy.pt2")).module()
    names = [i.name for i in sess.get_inputs()]
    assert names[: len(algo.spec.parts)] == [input_name(p.name) for p in algo.spec.parts]
    for batch, seed in ((1, 11), (5, 12)):  # other batch sizes than the one traced
        args = example_inputs(env_spec if recurrent else algo.spec, batch, torch.Generator().manual_seed(seed),
                              policy.initial_hidden(1) if recurrent else None)
        with torch.no_grad():
            want = module(*args)
            got_pt2 = pt2(*args)
        want = want if isinstance(want, tuple) else (want,)
        got_pt2 = got_pt2 if isinstance(got_pt2, tuple) else (got_pt2,)
        got = sess.run(None, {n: a.numpy() for n, a in zip(names, args)})
        for g, p, w in zip(got, got_pt2, want):
            assert g.shape == tuple(w.shape) and w.shape[0] == batch
            np.testing.assert_allclose(g, w.numpy(), atol=1e-5, rtol=0)
            torch.testing.assert_close(p, w, atol=1e-5, rtol=0)
        # the graph is the agent's deterministic action, taken to the env's units
        if not recurrent:
            obs = args[0] if algo.spec.is_flat else dict(zip([p.name for p in algo.spec.parts], args))
            a = algo.act(obs, deterministic=True)
            if algo.spec.discrete:
                assert got[0].dtype == np.int64 and np.array_equal(got[0], a.numpy())
            else:
                low, high = np.array(env_spec.action_low), np.array(env_spec.action_high)
                np.testing.assert_allclose(got[0], low + (a.numpy().clip(-1, 1) + 1) / 2 * (high - low), atol=1e-5)
                assert (got[0] >= low - 1e-6).all() and (got[0] <= high + 1e-6).all()


def test_sidecar_and_onnx_metadata_describe_the_policy(tmp_path, capsys):
    d = tmp_path / "sac"
    assert main(["train", *FAMILIES["sac"], "--run-dir", str(d)]) == 0
    assert main(["export", str(d), "--format", "onnx", "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["policy.json", "policy.onnx"]
    meta = read_export(out)
    assert meta["algo"] == "sac" and meta["env"] == "Pendulum-v1"
    assert meta["inputs"] == [{"name": "state", "part": "state", "shape": ["batch", 3], "dtype": "float32"}]
    assert meta["action"]["low"] == [-2.0] and meta["action"]["high"] == [2.0]
    assert meta["action"]["kind"] == "continuous"
    assert meta["control_hz"] == pytest.approx(20.0)  # Pendulum-v1: dt 0.05 s
    ck = d / "checkpoints" / "latest.pt"
    import hashlib
    assert meta["checkpoint"]["sha256"] == hashlib.sha256(ck.read_bytes()).hexdigest()
    assert meta["checkpoint"]["step"] == 64
    assert meta["training_config"]["algo"] == "sac" and meta["training_config"]["config"]["actor_hidden"] == [16, 16]
    onnx_meta = onnx_session(out / "policy.onnx").get_modelmeta().custom_metadata_map
    assert json.loads(onnx_meta["ctrl_rl"])["checkpoint"]["sha256"] == meta["checkpoint"]["sha256"]
    assert onnx_meta["ctrl_rl.algo"] == "sac" and float(onnx_meta["ctrl_rl.control_hz"]) == pytest.approx(20.0)
    assert json.loads(onnx_meta["ctrl_rl"])["parity"]["onnx"] <= 1e-5


def test_export_bad_input_is_one_sentence_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, needle in [([str(empty)], "checkpoints/latest.pt"), ([str(tmp_path / "none")], "does not exist"),
                         ([str(empty), "--format", "tflite"], "tflite"), ([str(empty), "--formt", "onnx"], "--formt")]:
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and err.count("\n") == 0
    assert list(empty.iterdir()) == []
    # a dynamics run has no policy to export
    bad = tmp_path / "broken"
    (bad / "checkpoints").mkdir(parents=True)
    (bad / "checkpoints" / "latest.pt").write_bytes(b"not a checkpoint")
    assert main(["export", str(bad)]) == 2
    assert "latest.pt" in capsys.readouterr().err
    assert sorted(p.name for p in bad.iterdir()) == ["checkpoints"]


def test_read_export_refuses_what_is_not_an_export(tmp_path):
    from ctrl_rl.errors import UserInputError

    with pytest.raises(UserInputError, match="no policy.json"):
        read_export(tmp_path)
    (tmp_path / "policy.json").write_text('{"format": "other"}')
    with pytest.raises(UserInputError, match="not a ctrl_rl export"):
        read_export(tmp_path)
    (tmp_path / "policy.json").write_text("{")
    with pytest.raises(UserInputError, match="not valid JSON"):
        read_export(tmp_path)
