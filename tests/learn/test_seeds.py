"""Several seeds in one process (``--seeds``): each seed's run directory equals, bit for bit at --threads 1, the run
of that seed alone (parameters, optimizer and generator states, metrics); a cut seeds-run resumes to the same end;
bad input is one sentence with exit code 2 and leaves nothing behind."""

import dataclasses
import json

import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.cli import main
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import load_config
from ctrl_rl.learn.offline import train_offline
from ctrl_rl.learn.train import train_seeds
from tests.learn.test_offline import _run, write_pendulum_dataset

SEEDS = (0, 3, 7)
# 64-wide nets with batch 64: widths other than 1 take the batched matmul, the width-1 heads (value, actor on
# Pendulum's one action) the per-seed path; dims to the end of the update (S, E, B) all exercised
IQL = registry.get("iql").default_config(actor_hidden=(64, 64), critic_hidden=(64, 64), value_hidden=(64, 64),
                                         cosine_steps=60)
# CQL with WSRL's defaults (10 LayerNorm critics, subsets of 2, LayerNorm actor, 10 samples of each kind) at width 64:
# random draws inside the update (subsets, policy samples, uniform actions) from each seed's generator
CONFIGS = {a: registry.get(a).default_config(actor_hidden=(64, 64), critic_hidden=(64, 64)) for a in ("cql", "calql")}
CONFIGS["iql"] = IQL


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_pendulum_dataset(tmp_path_factory.mktemp("data") / "pendulum-random.hdf5")


def _cfg(dataset, **kw):
    run = _run(dataset, total_steps=60, log_every=10, checkpoint_every=30, eval_every=30, **kw)
    assert run.loop is not None
    return dataclasses.replace(run, loop=dataclasses.replace(run.loop, batch_size=64))


def _flat(state: dict, prefix: str = ""):
    for k, v in state.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif isinstance(v, torch.Tensor):
            yield f"{prefix}{k}", v


def _same_state(a: dict, b: dict) -> list[str]:
    fa, fb = dict(_flat(a)), dict(_flat(b))
    assert fa.keys() == fb.keys()
    return [k for k in fa if not torch.equal(fa[k], fb[k])]


def _metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("wall_time", "updates_per_s")} for r in rows]


def _alone(dataset, tmp_path, seed, algo="iql"):
    run = dataclasses.replace(_cfg(dataset), seed=seed)
    return train_offline(run, algo, CONFIGS[algo], tmp_path / f"alone_{seed}")


@pytest.mark.parametrize("algo", ["iql", "cql", "calql"])
def test_each_seed_equals_its_run_alone(algo, dataset, tmp_path):
    runs = [dataclasses.replace(_cfg(dataset), seed=s) for s in SEEDS]
    dirs = [tmp_path / "seeds" / f"seed_{s}" for s in SEEDS]
    results = train_seeds(runs, algo, CONFIGS[algo], dirs)
    assert [r.step for r in results] == [60] * 3
    for seed, res, d in zip(SEEDS, results, dirs):
        alone = _alone(dataset, tmp_path, seed, algo)
        assert _same_state(res.algo.state_dict(), alone.algo.state_dict()) == []
        assert _metrics(d) == _metrics(tmp_path / f"alone_{seed}")
        ck = load_checkpoint(d / "checkpoints" / "latest.pt", expect_algo=algo)
        ck_alone = load_checkpoint(tmp_path / f"alone_{seed}" / "checkpoints" / "latest.pt", expect_algo=algo)
        assert _same_state(ck["rng"], ck_alone["rng"]) == [] and ck["rng"]["python"] == ck_alone["rng"]["python"]
        assert ck["config"] == {**ck_alone["config"]}
        assert load_config(d / "config.json")[1] == load_config(tmp_path / f"alone_{seed}" / "config.json")[1]
    # the seeds differ from each other (each drew its own init and batches)
    assert _same_state(results[0].algo.state_dict()["actor"], results[1].algo.state_dict()["actor"])


@pytest.mark.parametrize("algo", ["iql", "cql"])
def test_a_cut_seeds_run_resumes_to_the_uninterrupted_end(algo, dataset, tmp_path):
    runs = [dataclasses.replace(_cfg(dataset), seed=s) for s in SEEDS[:2]]
    full = train_seeds(runs, algo, CONFIGS[algo], [tmp_path / "full" / f"seed_{s}" for s in SEEDS[:2]])
    cut_dirs = [tmp_path / "cut" / f"seed_{s}" for s in SEEDS[:2]]
    train_seeds(runs, algo, CONFIGS[algo], cut_dirs, max_iterations=25)
    assert [load_checkpoint(d / "checkpoints" / "latest.pt")["counters"]["step"] for d in cut_dirs] == [25, 25]
    resumed = train_seeds(runs, algo, CONFIGS[algo], cut_dirs, resume=True)
    for a, b, d in zip(full, resumed, cut_dirs):
        assert b.step == 60 and _same_state(a.algo.state_dict(), b.algo.state_dict()) == []
        assert _metrics(d) == _metrics(tmp_path / "full" / d.name)


FLAGS = ["--env", "torch:Pendulum", "--total-steps", "20", "--eval-every", "0", "--eval-episodes", "1",
         "--log-every", "10", "--checkpoint-every", "10", "--batch-size", "32", "--actor-hidden", "16", "16",
         "--critic-hidden", "16", "16", "--value-hidden", "16", "16", "--threads", "1", "--no-progress"]


def _without(flags: list[str], name: str, values: int) -> list[str]:
    i = flags.index(name)
    return flags[:i] + flags[i + 1 + values:]


def test_cli_seeds_run_layout_and_resume(dataset, tmp_path, capsys):
    parent = tmp_path / "runs" / "iql3"
    assert main(["train", "iql", "--dataset", dataset, *FLAGS, "--seeds", "0", "1", "--run-dir", str(parent)]) == 0
    assert json.loads((parent / "seeds.json").read_text()) == {"algo": "iql", "seeds": [0, 1],
                                                              "runs": ["seed_0", "seed_1"]}
    for s in (0, 1):  # each seed directory is a run of its own: its config names its seed, a single run resumes it
        assert load_config(parent / f"seed_{s}" / "config.json")[1].seed == s
    assert main(["train", "iql", "--resume", str(parent), "--total-steps", "30", "--no-progress"]) == 0
    steps = [load_checkpoint(parent / f"seed_{s}" / "checkpoints" / "latest.pt")["counters"]["step"] for s in (0, 1)]
    assert steps == [30, 30]
    assert main(["train", "iql", "--resume", str(parent / "seed_1"), "--total-steps", "40", "--no-progress"]) == 0
    assert load_checkpoint(parent / "seed_1" / "checkpoints" / "latest.pt")["counters"]["step"] == 40


@pytest.mark.parametrize("args, words", [
    (["ppo", "--seeds", "0", "1"], "--seeds is not available for 'ppo'"),
    (["cql", "--seeds", "0", "1", "--compile"], "--compile"),
    (["iql", "--seeds", "0", "1", "0"], "seed 0 more than once"),
    (["iql", "--seeds", "0", "1", "--seed", "3"], "--seeds and --seed were both given"),
    (["iql", "--seed", "3", "--seeds", "0", "1"], "--seeds and --seed were both given"),
    (["iql", "--seeds", "2"], "expected two or more seeds"),
    (["iql", "--seeds", "one", "two"], "expected whole numbers"),
    (["iql", "--seeds", "0", "1", "--dropout", "0.1"], "--dropout above 0"),
])
def test_bad_seeds_input_is_one_sentence_and_writes_nothing(args, words, dataset, tmp_path, capsys):
    run_dir = tmp_path / "new" / "r"
    flags = FLAGS if args[0] == "iql" else _without(FLAGS, "--value-hidden", 2)
    assert main(["train", args[0], "--dataset", dataset, *flags, *args[1:], "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and err.count("\n") == 0
    assert not (tmp_path / "new").exists()


def test_seeds_with_resume_and_a_wrong_dataset_are_refused(dataset, tmp_path, capsys):
    parent = tmp_path / "s"
    assert main(["train", "iql", "--dataset", dataset, *FLAGS, "--seeds", "0", "1", "--run-dir", str(parent)]) == 0
    assert main(["train", "iql", "--resume", str(parent), "--seeds", "0", "1"]) == 2
    assert "--seeds cannot be given with --resume" in capsys.readouterr().err
    assert main(["train", "cql", "--resume", str(parent)]) == 2
    assert "holds a seeds-run of 'iql'" in capsys.readouterr().err
    # refused once training starts (the dataset does not fit the env): nothing of the seeds-run is left behind
    bad = tmp_path / "bad" / "r"
    assert main(["train", "iql", "--dataset", dataset, *[f if f != "torch:Pendulum" else "Hopper-v5" for f in FLAGS],
                 "--seeds", "0", "1", "--run-dir", str(bad)]) == 2
    assert not (tmp_path / "bad").exists()


def test_every_seed_layout_names_what_its_algorithm_has():
    """A registered seed layout names modules, optimizers/schedulers, tensor lists, tensors, counters and parts an
    instance really holds (a part by its own layout, recursively)."""
    from ctrl_rl.envs.registry import spec_of
    from ctrl_rl.envs.wrappers import rescaled_spec

    spec = rescaled_spec(spec_of("torch:Pendulum"))
    entries = [e for e in registry.entries() if e.seed_layout is not None]
    assert {"iql", "cql", "calql", "sac"} <= {e.name for e in entries}

    def check(obj, layout, name):
        assert all(isinstance(getattr(obj, n), torch.nn.Module) for n in layout.modules), name
        assert all(callable(getattr(getattr(obj, n), "step", None)) for n in layout.each
                   if getattr(obj, n) is not None), name
        assert all(isinstance(getattr(obj, n), list) for n in layout.lists), name
        assert all(isinstance(getattr(obj, n), (torch.Tensor, type(None))) for n in layout.tensors), name
        assert all(isinstance(getattr(obj, n), int) for n in layout.counters), name
        assert all(isinstance(getattr(obj, n), (torch.nn.Module, type(None))) for n in layout.calls), name
        for part, sub in layout.parts:
            check(getattr(obj, part), sub, f"{name}.{part}")

    for e in entries:
        assert e.seed_layout is not None
        lagrange = "lagrange" in {f.name for f in dataclasses.fields(e.config)}
        for cfg in (e.default_config(), e.default_config(lagrange=True)) if lagrange else (e.default_config(),):
            check(e.make(cfg, spec, "cpu", torch.Generator()), e.seed_layout, e.name)


def test_a_seeds_run_stopped_before_its_first_checkpoint_restarts(dataset, tmp_path, capsys):
    parent = tmp_path / "s"
    args = ["train", "iql", "--dataset", dataset, *FLAGS, "--seeds", "0", "1", "--run-dir", str(parent)]
    assert main(args) == 0
    for s in (0, 1):  # as if killed before the first checkpoint
        (parent / f"seed_{s}" / "checkpoints" / "latest.pt").unlink()
    assert main(args) == 0
    assert "restarting it" in capsys.readouterr().err
    assert main(args) == 2  # now it has checkpoints: resume it instead
    assert f"--resume {parent}" in capsys.readouterr().err
    (parent / "notes.txt").write_text("mine")
    for s in (0, 1):
        (parent / f"seed_{s}" / "checkpoints" / "latest.pt").unlink()
    assert main(args) == 2 and "exists and is not empty" in capsys.readouterr().err
    assert (parent / "notes.txt").read_text() == "mine"
