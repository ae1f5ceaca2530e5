"""The off-policy loop with the FastSAC recipe's parts: n-step batches, running observation statistics fed every
step (and resumed), evaluation time logged; the fastsac presets parse and build."""

import json

import pytest
import torch

from ctrl_rl.algos.sac import SACConfig
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.config import OffPolicyLoopConfig, build_run, from_dict, load_preset
from ctrl_rl.learn.offpolicy import replay_sampler, train_offpolicy
from ctrl_rl.storage.replay import MixedSampler, NStepSampler, ReplayBuffer
from tests.learn.test_offpolicy import _run as offpolicy_run

CFG = SACConfig(actor_hidden=(32, 32), critic_hidden=(32, 32), obs_norm=True, layer_norm=True)
LOOP = dict(batch_size=32, learning_starts=64, buffer_size=1000, n_step=3, utd_ratio=0.25)


def _run(total=8 * 20, loop=None, **kw):
    return offpolicy_run(total, {**LOOP, **(loop or {})}, **kw)  # test_offpolicy's tiny run, this file's loop


def _params(res):
    a = res.algo
    return [t.detach().clone() for t in (*a.actor.state_dict().values(), *a.critic.state_dict().values(),
                                         *a.obs_norm.state_dict().values(), a.log_alpha)]


def test_nstep_obs_norm_run_feeds_statistics_and_logs_eval_time(tmp_path):
    res = train_offpolicy(_run(eval_every=80, eval_episodes=2), "sac", CFG, tmp_path / "r")
    norm = res.algo.obs_norm
    assert norm is not None and float(norm.count) == pytest.approx(8 * 20)  # every step's 8 observations
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_return" in r]
    assert [r["step"] for r in evals] == [0, 80, 160] and all(r["eval_s"] > 0 for r in evals)
    assert rows[-1]["updates"] == (20 - 7) * 2 and rows[-1]["loss/critic"] == rows[-1]["loss/critic"]


def test_resume_with_obs_norm_and_nstep_equals_uninterrupted(tmp_path):
    run = _run(loop={"save_replay": True})
    full = train_offpolicy(run, "sac", CFG, tmp_path / "full")
    d = tmp_path / "cut"
    train_offpolicy(run, "sac", CFG, d, max_iterations=11)
    resumed = train_offpolicy(run, "sac", CFG, d, resume=True)
    assert resumed.step == full.step
    assert all(torch.equal(x, y) for x, y in zip(_params(full), _params(resumed)))


def test_replay_sampler_picks_nstep_and_refuses_offline_mixing():
    buf = ReplayBuffer(64, (3,), 1)
    loop = OffPolicyLoopConfig(n_step=3, offline_ratio=0.5)
    with pytest.raises(UserInputError, match="--n-step 3"):
        replay_sampler(buf, ReplayBuffer(64, (3,), 1), loop, CFG, 4)
    s = replay_sampler(buf, None, OffPolicyLoopConfig(n_step=3), CFG, 4)
    assert isinstance(s, NStepSampler) and s.stride == 4 and s.gamma == CFG.gamma
    assert replay_sampler(buf, None, OffPolicyLoopConfig(), CFG, 4) is buf
    assert isinstance(replay_sampler(buf, buf, OffPolicyLoopConfig(offline_ratio=0.5), CFG, 4), MixedSampler)
    with pytest.raises(UserInputError, match="n-step"):
        OffPolicyLoopConfig(n_step=0)


@pytest.mark.parametrize("name", ["fastsac-halfcheetah", "fastsac-hopper", "fastsac-walker2d"])
def test_fastsac_presets_build(name):
    from ctrl_rl.algos import registry

    p = load_preset(name)
    entry = registry.get(p.algo)
    run = build_run(entry, p.run, p.loop, name)
    cfg = from_dict(entry.config, p.config, name)
    assert isinstance(run.loop, OffPolicyLoopConfig) and run.loop.n_step == 3 and run.num_envs >= 16
    assert run.loop.utd_ratio < 1 and run.env.endswith("-v5")
    assert cfg.obs_norm
    # HalfCheetah's critics dropped LayerNorm after experiments/fast_sac's screen; Hopper's and Walker2d's were not
    # screened and keep the recipe's LayerNorm critics
    assert cfg.layer_norm == (name != "fastsac-halfcheetah")


def test_cli_trains_a_fastsac_preset_without_naming_the_algorithm(tmp_path, capsys):
    from ctrl_rl.cli import main

    d = tmp_path / "r"
    args = ["train", "--preset", "fastsac-hopper", "--env", "torch:Pendulum", "--num-envs", "4", "--total-steps", "48",
            "--learning-starts", "16", "--batch-size", "16", "--buffer-size", "1000", "--actor-hidden", "16", "16",
            "--critic-hidden", "16", "16", "--threads", "1", "--no-progress", "--run-dir", str(d)]
    assert main(args) == 0, capsys.readouterr().err
    saved = json.loads((d / "config.json").read_text())
    assert saved["algo"] == "sac" and saved["config"]["obs_norm"] and saved["run"]["loop"]["n_step"] == 3
