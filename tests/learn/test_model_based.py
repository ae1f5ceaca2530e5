"""World-model and model-based loops end to end on a small random Hopper-v5 dataset in the D4RL layout (with the
simulator state of every row): `train dynamics`, mbpo/mopo/ravl from the CLI with a fitted model, fitted first,
and with the true simulator; resume equals an uninterrupted run; one update per algorithm; bad inputs."""

import json

import numpy as np
import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.cli import main
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.learn.checkpoint import load_checkpoint, save_checkpoint
from ctrl_rl.learn.config import FlatRolloutsLoopConfig, RunConfig, list_presets, load_config, to_dict
from ctrl_rl.learn.model_based import MODEL_FILE, train_model_based

AGENT = dict(actor_hidden=(16, 16), critic_hidden=(16, 16))
AGENT_FLAGS = ["--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--rollout-starts", "32",
               "--rollout-every", "10", "--retain-rounds", "2", "--batch-size", "32", "--eval-episodes", "1",
               "--log-every", "5", "--threads", "1", "--no-progress"]


def test_train_dynamics_writes_a_model_run_with_holdout_metrics(model_run):
    assert (model_run / MODEL_FILE).is_file()
    rows = [json.loads(x) for x in (model_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and 1 <= len(rows) <= 3
    assert all(np.isfinite(r["holdout_mse"]) and 0 <= r["calibration"] <= 1 for r in rows)
    saved = load_checkpoint(model_run / MODEL_FILE)
    assert saved["task"] == "hopper" and len(saved["state"]["elite_ids"]) == 2
    assert 0 <= saved["summary"]["termination_recall"] <= 1  # the random data has terminal rows


def test_termination_recall_tells_a_model_that_falls_from_one_that_teleports(hopper_dataset):
    """1 for predictions equal to the real terminal states, 0 for the next episode's start (the qlearning rows)."""
    import h5py

    from ctrl_rl.learn.model_based import termination_recall
    from ctrl_rl.world_models.protocol import ModelStep

    with h5py.File(hopper_dataset) as f:
        raw = {k: torch.from_numpy(f[k][:]) for k in ("observations", "actions", "next_observations", "terminals")}
    n = raw["observations"].shape[0]
    data = {"obs": raw["observations"][:-1], "act": raw["actions"][:-1], "terminated": raw["terminals"][:-1].bool()}

    class Table:  # a "model" that predicts a fixed next state per row
        elite_ids = torch.tensor([0, 1])

        def __init__(self, table):
            self.table = table

        def predict(self, obs, act, members=None, sample=True):
            rows = [int(torch.nonzero((data["obs"] == o).all(1))[0]) for o in obs]
            return ModelStep(next_obs=self.table[rows], reward=torch.zeros(len(rows)), terminated=None,
                             uncertainty={})

    assert termination_recall(Table(raw["next_observations"][:-1]), data, "Hopper-v5") == 1.0
    assert termination_recall(Table(raw["observations"][1:n]), data, "Hopper-v5") == 0.0
    no_end = {**data, "terminated": torch.zeros_like(data["terminated"])}
    assert termination_recall(Table(raw["next_observations"][:-1]), no_end, "Hopper-v5") is None
    assert termination_recall(Table(raw["next_observations"][:-1]), data, "Pendulum-v1") is None


@pytest.mark.parametrize("algo", ["mbpo", "mopo", "ravl"])
def test_model_based_agents_train_from_the_cli(algo, model_run, hopper_dataset, tmp_path):
    d = tmp_path / algo
    extra = ["--num-critics", "3", "--target-subset", "3"] if algo == "ravl" else []
    code = main(["train", algo, "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", str(model_run),
                 "--total-steps", "20", "--eval-every", "20", "--run-dir", str(d), *AGENT_FLAGS, *extra])
    assert code == 0
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 20 and np.isfinite(rows[-1]["episode_return"])
    assert any(r.get("rollout/transitions", 0) > 0 for r in rows)
    assert all(np.isfinite(r["stats/q_max"]) for r in rows)
    if algo == "ravl":
        assert all("loss/edac_div" in r for r in rows)
    assert main(["eval", str(d), "--episodes", "1"]) == 0


def test_agent_without_model_fits_one_first_and_true_dynamics_runs(hopper_dataset, tmp_path, monkeypatch):
    monkeypatch.setitem(registry.get("dynamics").run_defaults, "total_steps", 2)
    d = tmp_path / "fit-first"
    code = main(["train", "mbpo", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--total-steps", "10",
                 "--eval-every", "0", "--run-dir", str(d), *AGENT_FLAGS])
    assert code == 0 and (d / "dynamics" / MODEL_FILE).is_file() and (d / "checkpoints" / "latest.pt").is_file()
    d = tmp_path / "true"
    code = main(["train", "mbpo", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", "true",
                 "--total-steps", "10", "--eval-every", "0", "--run-dir", str(d), *AGENT_FLAGS])
    assert code == 0
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("rollout/transitions", 0) > 0 for r in rows)


def _lib_run(hopper_dataset, model_run, total):
    return RunConfig(env="Hopper-v5", dataset=hopper_dataset, total_steps=total, seed=1, progress=False, threads=1,
                     log_every=5, checkpoint_every=10, eval_every=0,
                     loop=FlatRolloutsLoopConfig(batch_size=32, model=str(model_run), rollout_starts=32,
                                                 rollout_every=7, retain_rounds=2))


def test_resume_equals_uninterrupted(hopper_dataset, model_run, tmp_path):
    cfg = registry.get("ravl").default_config(**AGENT, num_critics=3, target_subset=3)
    full = train_model_based(_lib_run(hopper_dataset, model_run, 30), "ravl", cfg, tmp_path / "full")
    part = train_model_based(_lib_run(hopper_dataset, model_run, 30), "ravl", cfg, tmp_path / "cut", max_iterations=17)
    assert part.step == 17
    res = train_model_based(_lib_run(hopper_dataset, model_run, 30), "ravl", cfg, tmp_path / "cut", resume=True)
    assert res.step == 30
    a, b = full.algo.state_dict(), res.algo.state_dict()
    for k in ("actor", "critic", "critic_target"):
        assert all(torch.equal(x, y) for x, y in zip(a[k].values(), b[k].values())), k


def test_the_model_based_agents_are_sac_with_settings():
    from ctrl_rl.algos.sac import SAC, SACConfig

    for name in ("mbpo", "mopo", "ravl"):
        entry = registry.get(name)
        assert entry.config is SACConfig and entry.make is SAC and entry.regime == "model-based"
    assert registry.get("mopo").loop_defaults["penalty"] == 1.0 and not registry.get("mbpo").loop_defaults
    ravl = registry.get("ravl").default_config()
    assert (ravl.num_critics, ravl.critic_reduction, ravl.edac_eta, ravl.edac_init) == (10, "sum", 1.0, True)


@pytest.mark.parametrize("algo", ["mbpo", "mopo", "ravl"])
def test_one_update_on_a_synthetic_batch_moves_the_parameters(algo):
    spec = EnvSpec("Hopper-v5", (11,), False, 3, (-1.0,) * 3, (1.0,) * 3)
    entry = registry.get(algo)
    g = torch.Generator().manual_seed(0)
    agent = entry.make(entry.default_config(**AGENT), spec, "cpu", g)
    before = ([p.detach().clone() for p in agent.critic.parameters()]
              + [p.detach().clone() for p in agent.actor.parameters()])
    B = 64
    batch = Transition(torch.randn(B, 11, generator=g), torch.rand(B, 3, generator=g) * 2 - 1,
                       torch.randn(B, generator=g), torch.randn(B, 11, generator=g), torch.zeros(B, dtype=torch.bool),
                       torch.zeros(B, dtype=torch.bool))
    info = agent.update(batch)
    assert all(bool(torch.isfinite(v)) for v in info.values())
    after = [*agent.critic.parameters(), *agent.actor.parameters()]
    assert all(not torch.equal(x, y) for x, y in zip(before, after))


def test_bad_model_inputs_exit_2_with_one_sentence(hopper_dataset, model_run, tmp_path, capsys):
    def run(*flags, env="Hopper-v5"):
        code = main(["train", "mbpo", "--env", env, "--dataset", hopper_dataset, "--total-steps", "5",
                     "--run-dir", str(tmp_path / f"r{len(list(tmp_path.iterdir()))}"), *AGENT_FLAGS, *flags])
        return code, capsys.readouterr().err
    code, err = run("--model", str(tmp_path / "nowhere"))
    assert code == 2 and "no model.pt" in err
    other = tmp_path / "other"
    other.mkdir()
    data = load_checkpoint(model_run / MODEL_FILE)
    save_checkpoint(other / MODEL_FILE, {**data, "task": "walker2d", "env": "Walker2d-v5"})
    code, err = run("--model", str(other))
    assert code == 2 and "was fitted on 'Walker2d-v5'" in err
    save_checkpoint(other / MODEL_FILE, {**data, "meta": {**data["meta"], "obs_dim": 17}})
    code, err = run("--model", str(other))
    assert code == 2 and "17" in err
    code, err = run("--penalty", "-1", "--model", str(model_run))
    assert code == 2 and "--penalty" in err
    assert len(err.strip().splitlines()) == 1


def test_nan_model_stops_the_run_naming_the_step(hopper_dataset, model_run, tmp_path, capsys):
    bad = tmp_path / "nan-model"
    bad.mkdir()
    data = load_checkpoint(model_run / MODEL_FILE)
    state = dict(data["state"])
    state["target_mean"] = torch.full_like(state["target_mean"], float("nan"))
    save_checkpoint(bad / MODEL_FILE, {**data, "state": state})
    code = main(["train", "mbpo", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", str(bad),
                 "--total-steps", "5", "--run-dir", str(tmp_path / "r"), *AGENT_FLAGS])
    err = capsys.readouterr().err
    assert code == 1 and "before gradient step 1" in err and "NaN" in err


@pytest.mark.parametrize("algo", ["mopo", "ravl"])
def test_a_run_config_of_the_old_layout_loads_with_its_rollout_settings_in_the_loop(algo, tmp_path):
    """Runs saved before the rollout settings moved from the algorithm's config (MBPOConfig, RAVLConfig) to the loop
    config: the settings are mapped into the loop, and a field added since (critic_reduction) takes the entry's
    default, so the run resumes and evaluates as it was trained."""
    entry = registry.get(algo)
    cfg = entry.default_config(**AGENT)
    saved = {"algo": algo, "run": to_dict(RunConfig(env="Hopper-v5", dataset="d.hdf5", loop=FlatRolloutsLoopConfig(
        rollout_starts=32))), "config": to_dict(cfg)}
    old_loop = saved["run"]["loop"]
    for k, v in (("rollout_length", 3), ("real_ratio", 0.2), ("penalty", 0.5), ("penalty_kind", "epistemic"),
                 ("member_mode", "episode")):
        del old_loop[k]
        saved["config"][k] = v
    for k in ("critic_reduction", "edac_eta", "edac_init") if algo == "mopo" else ("critic_reduction",):
        del saved["config"][k]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    name, run, loaded = load_config(tmp_path / "config.json")
    assert name == algo and loaded == cfg
    assert (run.loop.rollout_length, run.loop.real_ratio, run.loop.penalty, run.loop.penalty_kind,
            run.loop.member_mode, run.loop.rollout_starts) == (3, 0.2, 0.5, "epistemic", "episode", 32)
    assert loaded.critic_reduction == ("sum" if algo == "ravl" else "mean")


def test_presets_give_mopo_its_rollout_length_and_penalty_as_loop_settings(tmp_path):
    from ctrl_rl.learn.config import build_run, load_preset

    preset = load_preset("mopo-hopper-medium")
    run = build_run(registry.get("mopo"), preset.run, {**registry.get("mopo").loop_defaults, **preset.loop})
    assert (run.loop.rollout_length, run.loop.penalty, run.loop.real_ratio) == (5, 5.0, 0.05)
    assert set(preset.config) == {"gamma", "tau", "target_entropy"}


NEUBAY_PRESETS = sorted(n for n in list_presets() if n.startswith("neubay-"))


@pytest.mark.parametrize("name", NEUBAY_PRESETS)
def test_neubay_presets_set_the_papers_per_dataset_settings(name):
    """The official code's per-dataset overrides (encoder lr, real-row weight, fixed temperature on hopper) as a
    valid NeuBay config; the rest stays the registry's. One for each of the 12 D4RL locomotion datasets."""
    from ctrl_rl.learn.config import load_preset

    assert len(NEUBAY_PRESETS) == 12
    preset = load_preset(name)
    cfg = registry.get("neubay").default_config(**preset.config)
    assert set(preset.config) == {"encoder_lr", "real_weight", "learn_alpha"}
    assert cfg.learn_alpha is (not name.startswith("neubay-hopper")) and cfg.init_alpha == 0.2
    assert preset.run["dataset"] == name.removeprefix("neubay-") + "-v5"


def test_dynamics_fit_resumed_after_an_interruption_equals_the_uninterrupted_fit(hopper_dataset, tmp_path):
    from ctrl_rl.learn.config import WorldModelLoopConfig
    from ctrl_rl.learn.model_based import train_dynamics

    entry = registry.get("dynamics")
    cfg = entry.default_config(members=3, elites=2, hidden=(16, 16), weight_decay=(0.0, 0.0, 0.0), min_epochs=5,
                               patience=20, batch_size=64)
    run = RunConfig(env="Hopper-v5", dataset=hopper_dataset, total_steps=5, seed=3, progress=False, threads=1,
                    log_every=1, checkpoint_every=1, eval_every=0, loop=WorldModelLoopConfig())
    full = train_dynamics(run, "dynamics", cfg, tmp_path / "full")
    part = train_dynamics(run, "dynamics", cfg, tmp_path / "cut", max_iterations=2)
    assert part.algo is None and not (tmp_path / "cut" / MODEL_FILE).exists()
    assert load_checkpoint(tmp_path / "cut" / "checkpoints" / "latest.pt")["fit_state"]["epoch"] == 2
    res = train_dynamics(run, "dynamics", cfg, tmp_path / "cut", resume=True)
    assert res.step == full.step == 5
    a, b = (load_checkpoint(d / MODEL_FILE)["state"] for d in (tmp_path / "full", tmp_path / "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def test_matmul_precision_holds_during_the_run_only_and_is_recorded(model_run, hopper_dataset, tmp_path, monkeypatch):
    from ctrl_rl.algos.sac import SAC

    seen = []
    real_update = SAC.update

    def spy(self, batch):
        seen.append(torch.get_float32_matmul_precision())
        return real_update(self, batch)

    monkeypatch.setattr(SAC, "update", spy)
    before = torch.get_float32_matmul_precision()
    d = tmp_path / "medium"
    code = main(["train", "mbpo", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", str(model_run),
                 "--total-steps", "3", "--eval-every", "0", "--run-dir", str(d), "--matmul-precision", "medium",
                 *AGENT_FLAGS])
    assert code == 0 and seen == ["medium"] * 3 and torch.get_float32_matmul_precision() == before
    assert json.loads((d / "config.json").read_text())["run"]["matmul_precision"] == "medium"
    code = main(["train", "mbpo", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", str(model_run),
                 "--run-dir", str(tmp_path / "bad"), "--matmul-precision", "bf16", *AGENT_FLAGS])
    assert code == 2 and not (tmp_path / "bad").exists()


def test_the_true_simulator_takes_the_agents_units_where_the_bounds_are_not_unit():
    import gymnasium as gym
    import numpy as np

    from ctrl_rl.learn.model_based import make_world

    raw = gym.make("InvertedPendulum-v5").unwrapped  # action bounds +-3
    raw.reset(seed=0)
    qpos, qvel = raw.data.qpos.copy()[None].repeat(4, 0), raw.data.qvel.copy()[None].repeat(4, 0)

    class Data:
        infos = {"qpos": qpos, "qvel": qvel}

    run = RunConfig(env="InvertedPendulum-v5", dataset="unused", seed=0)
    world = make_world(run, FlatRolloutsLoopConfig(), None, "true", 1, torch.device("cpu"), torch.zeros(4, 4), Data)
    assert world.spec.action_low == (-1.0,) and world.spec.action_high == (1.0,)
    world.reset()
    out = world.step(torch.tensor([[0.5]]))
    raw.set_state(qpos[0], qvel[0])
    want = raw.step(np.array([1.5], dtype=np.float32))[0]  # 0.5 of the agent's range is 1.5 in env units
    np.testing.assert_allclose(out.final_obs[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_the_dynamics_fit_sees_the_state_an_episode_ended_in_not_the_next_episodes_start(hopper_dataset, tmp_path):
    """A terminal row's next observation in the model's data is the stored ``next_observations`` (d4rl's qlearning
    rows would give the next episode's first observation: a teleport the model would learn); without stored next
    observations the episode ends are dropped."""
    import h5py

    from ctrl_rl.envs.registry import spec_of
    from ctrl_rl.learn.model_based import dataset_arrays

    with h5py.File(hopper_dataset) as f:
        raw = {k: f[k][:] for k in ("observations", "actions", "next_observations", "terminals", "timeouts")}
    spec = spec_of("Hopper-v5")
    got = dataset_arrays(RunConfig(env="Hopper-v5", dataset=hopper_dataset), spec, None, torch.device("cpu"))
    n = len(raw["observations"])
    assert got["obs"].shape[0] == n  # every row: terminals, the time-out and the file's last row included
    torch.testing.assert_close(got["next_obs"], torch.from_numpy(raw["next_observations"]), rtol=0, atol=0)
    ends = np.flatnonzero(raw["terminals"][:-1])
    assert ends.size >= 3 and torch.equal(got["terminated"], torch.from_numpy(raw["terminals"]).bool())
    assert not np.allclose(raw["next_observations"][ends], raw["observations"][ends + 1])  # the quirk would differ
    stripped = tmp_path / "hopper-random-v5.hdf5"  # the same rows without next_observations
    with h5py.File(stripped, "w") as f:
        for k in ("observations", "actions", "terminals", "timeouts"):
            f[k] = raw[k]
        with h5py.File(hopper_dataset) as src:
            for k in ("rewards", "infos/qpos", "infos/qvel"):
                f[k] = src[k][:]
    got = dataset_arrays(RunConfig(env="Hopper-v5", dataset=str(stripped)), spec, None, torch.device("cpu"))
    ended = (raw["terminals"] | raw["timeouts"]).astype(bool)
    ended[-1] = True
    keep = np.flatnonzero(~ended)
    assert got["obs"].shape[0] == keep.size and not bool(got["terminated"].any())
    torch.testing.assert_close(got["next_obs"], torch.from_numpy(raw["observations"][keep + 1]), rtol=0, atol=0)
