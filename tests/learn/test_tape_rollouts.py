"""The model-based loop's tapes collector (learn/model_based.py, ``TapeRollouts``) end to end on a small random
Hopper-v5 dataset in the D4RL layout: `ctrl-rl train neubay` with a fitted dynamics run, `ctrl-rl eval` of its
checkpoint, resume equals an uninterrupted run, bad flag values, and the collectors' capability checks."""

import json

import numpy as np
import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.cli import main
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import RunConfig, TapeRolloutsLoopConfig
from ctrl_rl.learn.model_based import train_model_based

AGENT = dict(d_model=16, lru_hidden=8, head_hidden=(16, 16), num_critics=3)
AGENT_FLAGS = ["--d-model", "16", "--lru-hidden", "8", "--head-hidden", "16", "16", "--num-critics", "3",
               "--batch-transitions", "64", "--parallel-rollouts", "4", "--horizon", "40", "--utd", "0.2",
               "--eval-episodes", "1", "--log-every", "2", "--threads", "1", "--no-progress"]


def test_neubay_trains_from_the_cli_and_its_checkpoint_evaluates(hopper_dataset, model_run, tmp_path, capsys):
    d = tmp_path / "neubay"
    code = main(["train", "neubay", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", str(model_run),
                 "--total-steps", "6", "--eval-every", "6", "--run-dir", str(d), *AGENT_FLAGS])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6] and np.isfinite(rows[-1]["episode_return"])
    first = rows[0]
    assert first["rollout/tapes"] == 4 and first["rollout/transitions"] > 0 and first["rollout/u_max"] > 0
    assert first["rollout/data_epistemic_max"] == first["rollout/u_max"]  # q = 1: the data's maximum
    assert all(np.isfinite(r["loss/critic"]) and np.isfinite(r["stats/q_mean"]) for r in rows)
    ends = first["rollout/terminated"] + first["rollout/truncated_uncertainty"] + first["rollout/truncated_horizon"]
    assert ends + first["rollout/whole_trajectories"] == 4  # every rollout ended, and for one reason
    ck = load_checkpoint(d / "checkpoints" / "latest.pt")
    assert ck["tape_buffer"]["size"] == [r for r in rows if "buffer/transitions" in r][-1]["buffer/transitions"] > 0
    assert main(["eval", str(d), "--episodes", "1"]) == 0
    assert '"return_mean"' in capsys.readouterr().out


def _lib_run(hopper_dataset, model_run, total):
    return RunConfig(env="Hopper-v5", dataset=hopper_dataset, total_steps=total, seed=1, progress=False, threads=1,
                     log_every=3, checkpoint_every=4, eval_every=0,
                     loop=TapeRolloutsLoopConfig(model=str(model_run), batch_transitions=48, parallel_rollouts=3,
                                                 utd=0.1, horizon=30))


def test_resume_equals_uninterrupted(hopper_dataset, model_run, tmp_path):
    cfg = registry.get("neubay").default_config(**AGENT)
    full = train_model_based(_lib_run(hopper_dataset, model_run, 10), "neubay", cfg, tmp_path / "full")
    part = train_model_based(_lib_run(hopper_dataset, model_run, 10), "neubay", cfg, tmp_path / "cut", max_iterations=7)
    assert part.step == 7
    res = train_model_based(_lib_run(hopper_dataset, model_run, 10), "neubay", cfg, tmp_path / "cut", resume=True)
    assert res.step == 10
    a, b = full.algo.state_dict(), res.algo.state_dict()
    for k in ("actor_encoder", "actor", "critic_encoder", "critic", "target_encoder", "target_critic"):
        assert all(torch.equal(x, y) for x, y in zip(a[k].values(), b[k].values())), k
    rows = [(tmp_path / n / "metrics.jsonl").read_text().splitlines() for n in ("full", "cut")]
    # losses and Q statistics of every logged step (collection figures pending at the cut are not re-logged)
    keep = lambda r: {k: v for k, v in json.loads(r).items() if k == "step" or k.startswith(("loss/", "stats/"))}  # noqa: E731
    assert [keep(r) for r in rows[0]] == [keep(r) for r in rows[1]] and len(rows[0]) == 4
    assert any("rollout/collections" in json.loads(r) for r in rows[0][1:])  # more than one collection happened


@pytest.mark.parametrize("flags,needle", [(["--real-weight", "2"], "--real-weight"), (["--utd", "0"], "--utd"),
                                          (["--uncertainty-quantile", "1.5"], "--uncertainty-quantile")])
def test_bad_flag_values_exit_2_with_one_sentence(hopper_dataset, model_run, tmp_path, capsys, flags, needle):
    d = tmp_path / "bad"
    code = main(["train", "neubay", "--env", "Hopper-v5", "--dataset", hopper_dataset, "--model", str(model_run),
                 "--total-steps", "2", "--run-dir", str(d), *AGENT_FLAGS, *flags])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not d.exists()


def test_one_model_based_regime_whose_entries_name_their_collector_and_keep_their_flags(tmp_path, capsys):
    from ctrl_rl.learn.config import FlatRolloutsLoopConfig, loop_config_class
    from ctrl_rl.learn.regimes import get_regime

    nb, mopo = registry.get("neubay"), registry.get("mopo")
    assert nb.regime == mopo.regime == "model-based" and nb.collector == "tapes" and mopo.collector is None
    assert loop_config_class(nb.regime, nb.collector) is TapeRolloutsLoopConfig
    assert loop_config_class(mopo.regime, mopo.collector) is FlatRolloutsLoopConfig
    with pytest.raises(UserInputError, match="collector 'tape' \\(did you mean 'tapes'\\?\\)"):
        get_regime("model-based").loop_config_for("tape")
    # a collector's flags are refused for an entry of the other collector, with the flag named
    assert main(["train", "mopo", "--utd", "0.1", "--run-dir", str(tmp_path / "m")]) == 2
    assert "--utd" in capsys.readouterr().err
    assert main(["train", "neubay", "--rollout-length", "3", "--run-dir", str(tmp_path / "n")]) == 2
    assert "--rollout-length" in capsys.readouterr().err


def test_each_collector_refuses_an_agent_without_its_capability(hopper_dataset, model_run):
    from ctrl_rl.algos.sac import SAC, SACConfig
    from ctrl_rl.envs.protocol import EnvSpec
    from ctrl_rl.learn.config import FlatRolloutsLoopConfig
    from ctrl_rl.learn.model_based import FlatRollouts, TapeRollouts

    spec = EnvSpec("Hopper-v5", (11,), False, 3, (-1.0,) * 3, (1.0,) * 3, max_episode_steps=1000)
    run = RunConfig(env="Hopper-v5", dataset=hopper_dataset, total_steps=10)
    tapes = TapeRollouts(run, TapeRolloutsLoopConfig(model=str(model_run), horizon=20), spec, model_run,
                         torch.device("cpu"))
    with pytest.raises(TypeError, match="cannot continue histories"):
        tapes.bind(SAC(SACConfig(actor_hidden=(8,), critic_hidden=(8,)), spec))
    flat = FlatRollouts(run, FlatRolloutsLoopConfig(model=str(model_run), rollout_starts=4), spec, model_run,
                        torch.device("cpu"))
    nb = registry.get("neubay")
    with pytest.raises(TypeError, match="acting state"):
        flat.bind(nb.make(nb.default_config(**AGENT), spec, "cpu", torch.Generator()))
    with pytest.raises(UserInputError, match="--model true"):
        TapeRollouts(run, TapeRolloutsLoopConfig(model="true"), spec, "true", torch.device("cpu"))
