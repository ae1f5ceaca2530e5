"""``--seeds`` for online SAC (the off-policy loop): each seed's run directory equals, bit for bit at --threads 1, the
run of that seed alone (parameters, optimizer, temperature and generator states, env state, metrics); a cut seeds-run
resumes to the uninterrupted end; settings the batched update cannot reproduce are refused in one sentence."""

import dataclasses
import json

import pytest

from ctrl_rl.algos import registry
from ctrl_rl.cli import main
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OffPolicyLoopConfig, RunConfig, load_config
from ctrl_rl.learn.offpolicy import train_offpolicy
from ctrl_rl.learn.train import train_seeds
from tests.learn.test_seeds import _same_state

SEEDS = (0, 3, 7)
# SAC's defaults at width 32 (2 critics, every member in the target: no draw); REDQ-style with LayerNorm critics
# and actor, a random target subset (randperm from each seed's generator), a policy delay and a fixed temperature
CONFIGS = {"sac": registry.get("sac").default_config(actor_hidden=(32, 32), critic_hidden=(32, 32)),
           "redq": registry.get("sac").default_config(actor_hidden=(32, 32), critic_hidden=(32, 32), num_critics=5,
                                                      target_subset=2, layer_norm=True, actor_layer_norm=True,
                                                      policy_delay=2, learn_alpha=False),
           # WSRL's batch update: two critic minibatches of 32, then one actor step on their union
           "splits": registry.get("sac").default_config(actor_hidden=(32, 32), critic_hidden=(32, 32),
                                                        critic_splits=2),
           # the FastSAC recipe's inputs: running observation statistics (each seed's own), 3-step returns
           "fast": registry.get("sac").default_config(actor_hidden=(32, 32), critic_hidden=(32, 32), obs_norm=True)}
LOOP = {"fast": {"n_step": 3}}
# a batch of 32 rows (x 1 action): element-wise kernels with a vectorized body and a scalar tail (softplus) give a
# seed's slice its bits alone only if the slice is whole vector blocks (core.seeds), which 32 floats are
BATCH = {"sac": 32, "redq": 32, "splits": 64, "fast": 32}


def _metrics(run_dir) -> list[dict]:
    """The metrics rows without their timings."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("wall_time", "updates_per_s", "sps", "eval_s")} for r in rows]


def _run(seed=0, **loop):
    # 4 envs x 30 iterations; updates from the 8th iteration on, UTD 0.5 (2 updates per iteration); an evaluation
    # at step 0, 60 and at the end; checkpoints every 10 iterations
    return RunConfig(env="torch:Pendulum", num_envs=4, total_steps=4 * 30, seed=seed, progress=False, log_every=5,
                     checkpoint_every=10, eval_every=60, eval_episodes=1, threads=1,
                     loop=OffPolicyLoopConfig(**{"batch_size": 32, "learning_starts": 32, "buffer_size": 500,
                                                 "utd_ratio": 0.5, **loop}))


@pytest.mark.parametrize("name", ["sac", "redq", "splits", "fast"])
def test_each_seed_equals_its_run_alone(name, tmp_path):
    cfg, loop = CONFIGS[name], {"batch_size": BATCH[name], **LOOP.get(name, {})}
    dirs = [tmp_path / "seeds" / f"seed_{s}" for s in SEEDS]
    results = train_seeds([_run(s, **loop) for s in SEEDS], "sac", cfg, dirs)
    assert [r.step for r in results] == [120] * 3
    for seed, res, d in zip(SEEDS, results, dirs):
        alone = train_offpolicy(_run(seed, **loop), "sac", cfg, tmp_path / f"alone_{seed}")
        assert _same_state(res.algo.state_dict(), alone.algo.state_dict()) == []
        rows = _metrics(d)
        assert rows == _metrics(tmp_path / f"alone_{seed}")
        assert any("loss/critic" in r for r in rows) and any("eval_return" in r for r in rows)
        ck = load_checkpoint(d / "checkpoints" / "latest.pt", expect_algo="sac")
        ck_alone = load_checkpoint(tmp_path / f"alone_{seed}" / "checkpoints" / "latest.pt", expect_algo="sac")
        for part in ("rng", "env_state"):
            assert _same_state(ck[part], ck_alone[part]) == [], part
        assert ck["rng"]["python"] == ck_alone["rng"]["python"] and ck["config"] == ck_alone["config"]
        keys = ("iteration", "step", "updates", "credit", "next_eval")
        assert [ck["counters"][k] for k in keys] == [ck_alone["counters"][k] for k in keys]
    assert _same_state(results[0].algo.state_dict()["actor"], results[1].algo.state_dict()["actor"])


def test_a_cut_seeds_run_resumes_to_the_uninterrupted_end(tmp_path):
    cfg, seeds = CONFIGS["sac"], SEEDS[:2]
    runs = [_run(s, save_replay=True) for s in seeds]
    full = train_seeds(runs, "sac", cfg, [tmp_path / "full" / f"seed_{s}" for s in seeds])
    cut = [tmp_path / "cut" / f"seed_{s}" for s in seeds]
    train_seeds(runs, "sac", cfg, cut, max_iterations=13)  # killed after 13 iterations, mid-way between checkpoints
    assert [load_checkpoint(d / "checkpoints" / "latest.pt")["counters"]["iteration"] for d in cut] == [13, 13]
    resumed = train_seeds(runs, "sac", cfg, cut, resume=True)
    for a, b, d in zip(full, resumed, cut):
        assert b.step == 120 and _same_state(a.algo.state_dict(), b.algo.state_dict()) == []
        assert _metrics(d) == _metrics(tmp_path / "full" / d.name)


FLAGS = ["--env", "torch:Pendulum", "--num-envs", "2", "--total-steps", "40", "--learning-starts", "8",
         "--batch-size", "8", "--log-every", "5", "--checkpoint-every", "10", "--actor-hidden", "16", "16",
         "--critic-hidden", "16", "16", "--threads", "1", "--no-progress"]


def test_cli_sac_seeds_run_and_resume(tmp_path):
    parent = tmp_path / "sac2"
    assert main(["train", "sac", *FLAGS, "--seeds", "1", "2", "--run-dir", str(parent)]) == 0
    assert json.loads((parent / "seeds.json").read_text())["runs"] == ["seed_1", "seed_2"]
    assert [load_config(parent / f"seed_{s}" / "config.json")[1].seed for s in (1, 2)] == [1, 2]
    assert main(["train", "sac", "--resume", str(parent), "--total-steps", "60", "--no-progress"]) == 0
    assert [load_checkpoint(parent / f"seed_{s}" / "checkpoints" / "latest.pt")["counters"]["step"]
            for s in (1, 2)] == [60, 60]


@pytest.mark.parametrize("args, words", [
    (["--crossq"], "--crossq or --actor-batch-renorm"),
    (["--edac-eta", "1.0"], "--edac-eta above 0"),
    (["--compile"], "--compile"),
])
def test_settings_the_batched_update_cannot_do_are_refused(args, words, tmp_path, capsys):
    assert main(["train", "sac", *FLAGS, "--seeds", "0", "1", *args, "--run-dir", str(tmp_path / "new" / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--seeds cannot train 'sac' with" in err and words in err and err.count("\n") == 0
    assert not (tmp_path / "new").exists()


def test_image_observations_are_refused_before_anything_is_written(tmp_path):
    run = dataclasses.replace(_run(), env="torch:PointMassPixels")
    with pytest.raises(UserInputError, match="flat state observations"):
        train_seeds([run, dataclasses.replace(run, seed=1)], "sac", CONFIGS["sac"],
                    [tmp_path / "s0", tmp_path / "s1"])
    assert not (tmp_path / "s0" / "config.json").exists()
