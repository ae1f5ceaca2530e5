"""experiments/peers/sac_flow_official: run.py's flags and its reading of the official run's logs into results.json
(on fabricated logs), and the shim's Gymnasium 0.29 vector-step API and run monitor (in ctrl_rl's venv, whose
gymnasium is the peer venv's 1.4.0); nothing here needs the peer venv, JAX or the official checkout."""

import json
import sys

import gymnasium as gym
import numpy as np
import pytest

from tests.scripts import ROOT, experiment_script

PEER = ROOT / "experiments/peers/sac_flow_official"


@pytest.fixture(scope="module")
def run():
    with experiment_script("experiments/peers/sac_flow_official/run.py", "sac_flow_peer_run") as mod:
        yield mod


@pytest.fixture
def shim(monkeypatch, tmp_path):
    """The shim package ``sac_flow_shim`` imported from the peer folder, writing its JSON lines into ``tmp_path``."""
    monkeypatch.syspath_prepend(str(PEER / "shim"))
    monkeypatch.setenv("SAC_FLOW_SHIM_DIR", str(tmp_path))
    import sac_flow_shim.vector as vector

    yield vector
    for name in [m for m in sys.modules if m.startswith("sac_flow_shim")]:
        del sys.modules[name]


def flag(flags: list[str], name: str):
    i = len(flags) - 1 - flags[::-1].index(name)
    return flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else True


def test_study_settings_in_official_flags(run):
    args, extra = run.parse(["--algo", "flow-t", "--seed", "2", "--out", "x", "--", "--policy-delay", "3"])
    flags = run.official_flags(args)
    assert extra == ["--policy-delay", "3"]
    assert [flag(flags, f) for f in ("--env-id", "--seed", "--total-timesteps", "--learning-starts", "--batch-size")] \
        == ["Hopper-v5", "2", "100000", "5000", "256"]
    assert [flag(flags, f) for f in ("--tau", "--q-lr", "--alpha", "--policy-delay", "--d-model", "--n-layers")] \
        == ["0.005", "0.0003", "0.2", "1", "96", "2"]
    assert flag(flags, "--no-crossq-style") is True
    assert run.passed_learning_starts(flags + extra) == 5000
    sac = run.official_flags(run.parse(["--algo", "sac", "--out", "x", "--learning-starts", "700"])[0])
    assert flag(sac, "--alpha") == "1.0" and "--no-crossq-style" not in sac and "--d-model" not in sac
    assert sac.count("--learning-starts") == 1 and run.passed_learning_starts(sac) == 700
    official = run.official_flags(run.parse(["--algo", "flow-g", "--settings", "official", "--out", "x"])[0])
    assert official == ["--env-id", "Hopper-v5", "--seed", "0", "--total-timesteps", "100000"]
    assert run.passed_learning_starts(official) == 50_000  # the scripts' default


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_collect_reads_the_official_logs(run, tmp_path):
    write_jsonl(tmp_path / "tensorboard.jsonl", [
        {"_event": "init", "log_dir": "runs/x", "_t": 0.1},
        {"tag": "hyperparameters", "text": "|param|value|", "step": None, "_t": 0.1},
        {"tag": "charts/episodic_return", "value": 12.5, "step": 24, "_t": 1.0},
        {"tag": "charts/episodic_length", "value": 25, "step": 24, "_t": 1.0},
        {"tag": "charts/episodic_return", "value": 40.0, "step": 99, "_t": 2.0},
        {"tag": "charts/episodic_length", "value": 75, "step": 99, "_t": 2.0},
        {"tag": "losses/qf_loss", "value": 3.0, "step": 20, "_t": 2.5},
        {"tag": "charts/SPS", "value": 7, "step": 20, "_t": 2.5},
    ])
    write_jsonl(tmp_path / "wandb.jsonl", [
        {"_event": "init", "config": {"learning_starts": 10, "batch_size": 256}, "_t": 0.0},
        {"losses/qf_loss": 3.0, "step": 20, "_t": 2.5},
        {"final_stats/mean_return": 26.25, "final_stats/total_episodes": 2, "step": 30, "_t": 9.0},
        {"_event": "finish", "_t": 9.1},
    ])
    clock = [(0, 1.0, 0.5, 0.0), (10, 2.0, 1.4, 0.5), (11, 2.1, 1.5, 0.5), (12, 5.1, 4.0, 0.5), (20, 8.0, 6.0, 0.5),
             (30, 12.0, 9.0, 1.5)]  # env_steps, _t, cpu_s, eval_s (eval_cpu_s = eval_s / 2)
    write_jsonl(tmp_path / "shim.jsonl", [
        {"_event": "start", "jax": "0.7.2", "gymnasium": "1.4.0", "cpus": [1], "xla_flags": "f", "eval_every": 10,
         "eval_episodes": 2, "_t": 0.0},
        *({"_event": "clock", "env_steps": n, "_t": t, "cpu_s": c, "eval_s": e, "eval_cpu_s": e / 2} for n, t, c, e in
          clock),
        {"_event": "eval", "env_steps": 10, "return_mean": 5.0, "return_std": 1.0, "returns": [4.0, 6.0],
         "lengths": [9, 11], "eval_s": 0.4, "_t": 2.6},
    ])
    r = run.collect(tmp_path, learning_starts=99)  # the wandb config's learning_starts (10) wins
    assert r["official_args"] == {"learning_starts": 10, "batch_size": 256}
    assert r["train_episodes"] == [{"env_steps": 25, "return": 12.5, "length": 25},
                                   {"env_steps": 100, "return": 40.0, "length": 75}]
    assert r["evals"] == [{"env_steps": 10, "return_mean": 5.0, "return_std": 1.0, "returns": [4.0, 6.0],
                           "lengths": [9, 11], "eval_s": 0.4}]
    assert r["tensorboard_scalars"] == {"losses/qf_loss": [[20, 3.0]], "charts/SPS": [[20, 7]]}
    assert r["official_sps_prints"] == [{"step": 20, "sps": 7}]
    assert r["final_stats"] == {"final_stats/mean_return": 26.25, "final_stats/total_episodes": 2}
    assert r["wandb_rows"][0] == {"losses/qf_loss": 3.0, "step": 20, "_t": 2.5}
    s = r["speed"]
    # from step 10 to 30: 20 steps in (12 - 2) - (1.5 - 0.5) = 9 s wall, (9 - 1.4) - (0.75 - 0.25) = 7.1 s CPU
    assert s["after_warmup"]["seconds"] == 9.0 and s["after_warmup"]["env_steps_per_s"] == pytest.approx(20 / 9, 1e-3)
    assert s["after_warmup"]["env_steps_per_cpu_s"] == pytest.approx(20 / 7.1, 1e-3)
    # steady: from the first row past learning_starts + 3 (20): 10 steps in (12 - 8) - 1 = 3 s
    assert s["steady"]["from_env_steps"] == 20 and s["steady"]["env_steps_per_s"] == pytest.approx(10 / 3, 1e-3)
    assert s["first_update_s"] == 3.0  # t(12) - t(11)
    assert s["warmup_env_steps_per_s"] == pytest.approx(10 / (1.0 - 0.5), 0.01)
    assert r["shim"]["eval_every"] == 10 and r["shim"]["cpus"] == [1]


def test_collect_without_wandb_uses_the_passed_warmup(run, tmp_path):
    write_jsonl(tmp_path / "shim.jsonl", [
        {"_event": "clock", "env_steps": n, "_t": n / 2, "cpu_s": n / 4, "eval_s": 0.0, "eval_cpu_s": 0.0}
        for n in (0, 4, 5, 6, 8, 10)])
    r = run.collect(tmp_path, learning_starts=4)  # --no-track: no wandb config
    assert r["official_args"] is None and r["train_episodes"] == [] and r["final_stats"] is None
    assert r["speed"]["after_warmup"]["from_env_steps"] == 4 and r["speed"]["steady"]["from_env_steps"] == 8
    assert r["speed"]["steady"]["env_steps_per_s"] == 2.0 and r["speed"]["steady"]["env_steps_per_cpu_s"] == 4.0
    assert run.collect(tmp_path, learning_starts=10)["speed"]["after_warmup"] is None  # nothing after the warm-up


class Counter(gym.Env):
    """obs = steps since reset; reward 1 per step; terminates when the action is > 0.5; ``limit`` steps at most."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return np.array([0.0]), {}

    def step(self, action):
        self.n += 1
        return np.array([float(self.n)]), 1.0, bool(action[0] > 0.5), False, {}


def make(limit=3):
    return lambda: gym.wrappers.RecordEpisodeStatistics(gym.wrappers.TimeLimit(Counter(), limit))


def test_old_api_vector_env(shim):
    calls = []

    class Monitor:
        def __call__(self, steps, final=False):
            calls.append((steps, final))

    envs = shim.OldApiSyncVectorEnv([make()])
    envs.monitor = Monitor()
    obs, _ = envs.reset(seed=0)
    assert envs.single_action_space is envs.envs[0].action_space  # the script seeds it through make_env
    out = [envs.step(np.zeros((1, 1), np.float32)) for _ in range(3)]
    for _, _, term, trunc, infos in out[:2]:
        assert "final_info" not in infos and "final_observation" not in infos and not term[0] and not trunc[0]
    obs, _, term, trunc, infos = out[2]  # truncated at 3 steps, reset within the step (Gymnasium 0.29)
    assert trunc[0] and not term[0] and obs[0, 0] == 0.0
    assert infos["final_observation"][0][0] == 3.0 and infos["_final_observation"].tolist() == [True]
    assert infos["final_info"][0]["episode"]["r"] == 3.0 and infos["final_info"][0]["episode"]["l"] == 3
    assert "final_obs" not in infos  # Gymnasium 1.x's names are not passed on
    obs, _, term, trunc, infos = envs.step(np.ones((1, 1), np.float32))  # terminates after 1 step
    assert term[0] and not trunc[0] and obs[0, 0] == 0.0 and infos["final_info"][0]["episode"]["r"] == 1.0
    envs.close()
    envs.close()
    assert calls == [(0, False), (1, False), (2, False), (3, False), (4, True)]


def test_run_monitor_schedule(shim, tmp_path):
    evaluated = []
    monitor = shim.RunMonitor(eval_every=4, evaluate=evaluated.append, learning_starts=lambda: 5, clock_every=10)
    for n in range(13):
        monitor(n)
    monitor(12, final=True)  # close() at a step already evaluated: no second evaluation
    assert evaluated == [0, 4, 8, 12]
    rows = [json.loads(line) for line in (tmp_path / "shim.jsonl").read_text().splitlines()]
    assert [(r["env_steps"], r["final"]) for r in rows] == [(0, False), (5, False), (6, False), (7, False),
                                                            (10, False), (12, True)]
    assert all(r["_event"] == "clock" and r["eval_s"] >= 0 and r["cpu_s"] > 0 for r in rows)
