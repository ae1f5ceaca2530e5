"""experiments/d4rl/run_table.py without training: the summarizer on fabricated run directories (tables,
missing and incomplete runs, local references, the WSRL checks) and the commands --dry-run prints."""

import csv
import json
from pathlib import Path

import pytest

from ctrl_rl.learn.checkpoint import save_checkpoint
from ctrl_rl.storage.datasets.cache import DATA_DIR_ENV
from ctrl_rl.storage.datasets.scores import D4RL_REFERENCES
from tests.scripts import experiment_script

ROOT = Path(__file__).resolve().parents[2]
H = D4RL_REFERENCES["hopper"]


@pytest.fixture(scope="module")
def table():
    with experiment_script("experiments/d4rl/run_table.py", "d4rl_run_table") as mod:
        yield mod


def ret(score: float) -> float:
    """The Hopper return whose D4RL-normalized score is ``score``."""
    return H.random + score / 100 * (H.expert - H.random)


def fake_run(d: Path, algo: str, seed: int, budget: int, curve: dict[int, float], online: bool, warmup: int = 0,
             with_score: bool = True) -> None:
    """A run directory as ctrl-rl writes it: config.json and metrics.jsonl with evaluation rows."""
    d.mkdir(parents=True)
    cfg = {"algo": algo, "run": {"env": "Hopper-v5", "total_steps": budget, "seed": seed},
           "config": {"learning_starts": warmup}}
    (d / "config.json").write_text(json.dumps(cfg))
    key = "eval_return" if online else "episode_return"
    rows = []
    for step, score in curve.items():
        row = {"step": step, "wall_time": step / 10, key: ret(score)}
        if with_score:
            row.update(normalized_score=score, score_reference="D4RL")
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


GRID = ["--tasks", "hopper", "--offline-levels", "medium", "--o2o-datasets", "hopper-medium-replay",
        "--seeds", "0", "1",
        "--offline-steps", "100", "--eval-every", "50", "--online-steps", "200", "--online-eval-every", "100",
        "--eval-episodes", "2"]


def offline_rows(md: str, ds: str) -> dict[str, list[str]]:
    """Table 1's rows of dataset ``ds``: method -> the cells after it."""
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in md.split("## 2.")[0].splitlines()
            if x.startswith(f"| {ds} |")]
    return {r[1]: r[2:] for r in rows}


@pytest.fixture(autouse=True)
def no_datasets(tmp_path, monkeypatch):
    """No dataset resolves: the tables do not depend on what this machine's dataset cache holds."""
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "no-datasets"))


def test_summary_tables(table, tmp_path, monkeypatch):
    refs = tmp_path / "refs.json"  # local references: random 0, expert 1000
    refs.write_text(json.dumps({"source": "test refs", "scores": {"hopper": {"random": 0.0, "expert": 1000.0}}}))
    monkeypatch.setenv("CTRL_RL_REFERENCE_SCORES", str(refs))
    runs, out = tmp_path / "runs", tmp_path / "out"
    med, rep = runs / "hopper-medium-v5", runs / "hopper-medium-replay-v5"
    fake_run(med / "iql-s0", "iql", 0, 100, {50: 20.0, 100: 40.0}, online=False)
    fake_run(med / "iql-s1", "iql", 1, 100, {50: 30.0, 100: 60.0}, online=False, with_score=False)  # score recomputed
    fake_run(med / "cql-s0", "cql", 0, 100, {50: 10.0, 100: 55.0}, online=False)
    fake_run(med / "cql-s1", "cql", 1, 100, {50: 12.0}, online=False)  # interrupted half-way
    for s, final in ((0, 30.0), (1, 50.0)):
        fake_run(rep / f"cql-s{s}", "cql", s, 100, {50: 5.0, 100: final}, online=False)
        # WSRL: starts at CQL's score, dips after the 100-step warm-up, ends higher
        fake_run(rep / f"wsrl-s{s}", "wsrl", s, 200, {0: final, 100: final, 150: final - 10, 200: final + 20},
                 online=True, warmup=100)
    fake_run(rep / "rlpd-s0", "rlpd", 0, 200, {0: 1.0, 100: 1.0, 200: 41.0}, online=True, warmup=100)  # rlpd-s1 missing
    fake_run(med / "mopo-s0", "mopo", 0, 100, {50: 35.0, 100: 70.0}, online=False)  # mopo-s1 missing
    fit = med / "dynamics"
    fit.mkdir()
    (fit / "model.pt").write_bytes(b"")
    (fit / "metrics.jsonl").write_text("".join(json.dumps({"step": e, "holdout_mse": 1 / e - 1 / 12,
                                                           "calibration": 0.2 * e})
                                               + "\n" for e in (1, 2, 3)))
    args = table.parse_args(GRID + ["--runs-dir", str(runs)])
    table.summarize(table.grid_spec(args), runs, out, "GRID-COMMAND", "SUMMARY-COMMAND")

    md = (out / "d4rl.md").read_text()
    assert "REGENERATED D4RL-protocol datasets on Gymnasium MuJoCo v5" in md and "`GRID-COMMAND`" in md
    assert "| dataset | method | score (D4RL ref) | score (local ref) | published v2 (different data) |" in md
    # IQL: scores 40 and 60 -> 50 ± 14.1; local: returns / 10; CQL: one complete seed, one at 50 of 100 steps
    iql_local = [r / 10 for r in (ret(40), ret(60))]
    med_rows = offline_rows(md, "hopper-medium-v5")
    assert med_rows["dataset itself (return —)"] == ["—", "—", "—"]  # no data file here
    assert med_rows["iql"][0] == "50.0 ± 14.1 (n=2)"
    assert med_rows["iql"][1].startswith(f"{sum(iql_local) / 2:.1f} ± ") and med_rows["iql"][2] == "65.7"
    assert med_rows["cql"][0] == "55.0 (n=1) [1 incomplete, at 50/100]" and med_rows["cql"][2] == "59.1"
    # model-based rows: mopo with its preset and OfflineRL-Kit's reproduction; ravl and neubay unpublished
    assert med_rows["mopo (preset)"][0] == "70.0 (n=1) [1 missing]" and med_rows["mopo (preset)"][2] == "62.8"
    assert med_rows["ravl"][0] == "— [2 missing]" and med_rows["ravl"][2].startswith("— (paper table not read")
    rep_rows = offline_rows(md, "hopper-medium-replay-v5")
    assert rep_rows["iql"][0] == "not in grid" and rep_rows["iql"][2] == "94.8"
    assert rep_rows["cql"][0] == "40.0 ± 14.1 (n=2)" and rep_rows["cql"][2] == "98.6"
    # the dynamics fits the model-based rows load: their last epoch's holdout figures
    assert "| hopper-medium-v5 | dynamics | 3 | 0.25 | 0.6 | yes |" in md
    assert "| hopper-medium-v5 | dynamics-neubay | — | — | — | no |" in md
    o2o = {x.split("|")[2].strip(): [c.strip() for c in x.strip("|").split("|")[2:]]
           for x in md.splitlines() if x.startswith("| hopper-medium-replay-v5 | ")}
    # step 0, final, min after warm-up, mean over the run (trapezoids / budget)
    assert o2o["wsrl"] == ["40.0 ± 14.1 (n=2)", "60.0 ± 14.1 (n=2)", "30.0 ± 14.1 (n=2)", "40.0 ± 14.1 (n=2)"]
    assert o2o["rlpd"] == ["1.0 (n=1) [1 missing]", "41.0 (n=1) [1 missing]", "41.0 (n=1) [1 missing]",
                           "11.0 (n=1) [1 missing]"]
    assert o2o["retained"] == ["— [2 missing]"] * 4
    assert "largest per-seed difference 0.00 -> holds" in md
    assert ("dip 10.0 points); collapse (minimum below 50% of the run's step-0 score) in 0 of 2 seed(s) "
            "-> no collapse") in md
    assert "40.0 (WSRL) vs 11.0 (RLPD) -> WSRL above" in md

    rows = list(csv.DictReader((out / "d4rl.csv").open()))
    assert len(rows) == 10  # every run that exists, incomplete ones included
    cql1 = next(r for r in rows if r["dataset"] == "hopper-medium-v5" and r["method"] == "cql" and r["seed"] == "1")
    assert cql1["complete"] == "False" and cql1["steps_done"] == "50"
    iql1 = next(r for r in rows if r["method"] == "iql" and r["seed"] == "1")
    assert (float(iql1["final_score_d4rl"]) == pytest.approx(60.0)
            and float(iql1["final_score_local"]) == pytest.approx(ret(60) / 10))
    assert (out / "d4rl_offline.png").stat().st_size > 0 and (out / "d4rl_o2o.png").stat().st_size > 0


def test_summary_without_local_references(table, tmp_path, monkeypatch):
    monkeypatch.setenv("CTRL_RL_REFERENCE_SCORES", str(tmp_path / "absent.json"))
    runs = tmp_path / "runs"
    fake_run(runs / "hopper-medium-v5" / "iql-s0", "iql", 0, 100, {100: 40.0}, online=False)
    args = table.parse_args(GRID + ["--runs-dir", str(runs), "--o2o-datasets"])
    table.summarize(table.grid_spec(args), runs, tmp_path / "out", "G", "S")
    md = (tmp_path / "out" / "d4rl.md").read_text()
    assert "(local ref)" not in md and "local references: not available" in md
    assert "Offline-to-online" not in md  # no o2o datasets, no table 2
    rows = offline_rows(md, "hopper-medium-v5")
    assert rows["iql"] == ["40.0 (n=1) [1 missing]", "65.7"] and rows["cql"] == ["— [2 missing]", "59.1"]


def test_dry_run_prints_the_commands(table, tmp_path, capsys):
    runs = tmp_path / "runs"
    rep = runs / "hopper-medium-replay-v5"
    for name, step in (("cql-s0", 100), ("rlpd-s0", 120)):  # one complete run, one interrupted at 120 of 200
        (rep / name / "checkpoints").mkdir(parents=True)
        save_checkpoint(rep / name / "checkpoints" / "latest.pt", {"algo": name[:-3], "config": {},
                                                                        "counters": {"step": step}})
    table.main(GRID + ["--seeds", "0", "--runs-dir", str(runs), "--o2o-args", "--num-critics 2", "--dry-run"])
    lines = [x.split("ctrl_rl ", 1)[-1] for x in capsys.readouterr().out.splitlines()]
    assert "data generate --env Hopper-v5 --level medium-replay --no-progress" in lines
    assert "data generate --env Hopper-v5 --level medium --no-progress" in lines
    assert "# complete: hopper-medium-replay-v5/cql-s0" in lines
    assert (f"train iql --dataset hopper-medium-v5 --env Hopper-v5 --total-steps 100 --eval-every 50 --eval-episodes 2 "
            f"--seed 0 --run-dir {runs}/hopper-medium-v5/iql-s0 --checkpoint-every 50 --no-progress "
            f"--cosine-steps 100") in lines
    assert f"train rlpd --resume {rep}/rlpd-s0 --total-steps 200 --no-progress" in lines
    o2o = "--env Hopper-v5 --total-steps 200 --eval-every 100 --eval-episodes 2 --seed 0"
    assert (f"train wsrl --init {rep}/cql-s0 {o2o} --run-dir {rep}/wsrl-s0 --checkpoint-every 100 --no-progress "
            f"--save-replay --num-critics 2") in lines
    assert (f"train wsrl --init {rep}/cql-s0 --dataset hopper-medium-replay-v5 --offline-ratio 0.5 {o2o} --run-dir "
            f"{rep}/retained-s0 --checkpoint-every 100 --no-progress --save-replay --num-critics 2") in lines
    # the model-based rows: one dynamics fit per dataset and kind, the agents load it with --model
    fit = runs / "hopper-medium-v5" / "dynamics"
    assert (f"train dynamics --env Hopper-v5 --dataset hopper-medium-v5 --seed 0 --run-dir {fit} "
            f"--no-progress") in lines
    neubay_fit = next(x for x in lines if x.startswith("train dynamics") and "dynamics-neubay" in x)
    assert "--members 128" in neubay_fit and "--elites 100" in neubay_fit
    mopo = next(x for x in lines if x.startswith("train mopo"))
    assert mopo.startswith(f"train mopo --preset {ROOT}/experiments/presets/mopo-hopper-medium.json --dataset "
                           f"hopper-medium-v5 --model {fit} --env Hopper-v5 --total-steps 100")
    assert next(x for x in lines if x.startswith("train ravl")).count(f"--model {fit} ") == 1
    neubay = next(x for x in lines if x.startswith("train neubay"))  # its per-dataset preset, as MOPO's
    assert neubay.startswith(f"train neubay --preset {ROOT}/experiments/presets/neubay-hopper-medium.json ")
    assert f"--model {fit}-neubay " in neubay and "--preset" not in next(x for x in lines if x.startswith("train ravl"))
    # iql, cql on medium; rlpd, wsrl, retained; two fits; mopo, ravl, neubay
    assert len([x for x in lines if x.startswith("train ")]) == 10
    assert sorted(p.name for p in runs.iterdir()) == ["hopper-medium-replay-v5"]  # nothing written


def test_dry_run_shared_model_and_capped_fit(table, tmp_path, capsys):
    """--neubay-model shared: one fit per dataset, loaded by every model-based agent; --dynamics-epochs caps it;
    --mb-algos alone, without model-free rows (--offline-algos with no names)."""
    runs = tmp_path / "runs"
    table.main(GRID + ["--seeds", "0", "1", "--o2o-datasets", "--offline-algos", "--mb-algos", "mopo", "neubay",
                       "--neubay-model", "shared", "--dynamics-epochs", "3", "--mb-steps", "40",
                       "--runs-dir", str(runs), "--dry-run"])
    lines = [x.split("ctrl_rl ", 1)[-1] for x in capsys.readouterr().out.splitlines()]
    train = [x for x in lines if x.startswith("train ")]
    fit = runs / "hopper-medium-v5" / "dynamics"
    assert [x.split()[1] for x in train] == ["dynamics", "mopo", "neubay", "mopo", "neubay"]
    assert train[0].endswith(f"--run-dir {fit} --no-progress --total-steps 3")
    assert all(f"--model {fit} " in x and "--total-steps 40 " in x for x in train[1:])


def _checkpoint(d: Path, algo: str, step: int) -> None:
    (d / "checkpoints").mkdir(parents=True)
    save_checkpoint(d / "checkpoints" / "latest.pt", {"algo": algo, "config": {}, "counters": {"step": step}})


def test_batch_seeds_one_process_per_dataset_and_algorithm(table, tmp_path, capsys, monkeypatch):
    """--batch-seeds: iql and cql train every seed of a dataset in one `--seeds` process whose seed_<K> directories
    are the runs the table reads and the o2o runs start from; started seeds-runs resume whole, finished ones are
    skipped; the other rows keep one process per seed."""
    runs = tmp_path / "runs"
    med, rep = runs / "hopper-medium-v5", runs / "hopper-medium-replay-v5"
    _checkpoint(med / "cql-seeds0_1" / "seed_0", "cql", 100)  # the medium cql seeds-run: complete
    _checkpoint(med / "cql-seeds0_1" / "seed_1", "cql", 100)
    _checkpoint(rep / "cql-seeds0_1" / "seed_0", "cql", 50)  # the medium-replay one: stopped at 50 of 100
    _checkpoint(rep / "cql-seeds0_1" / "seed_1", "cql", 50)
    table.main(GRID + ["--batch-seeds", "--mb-algos", "--runs-dir", str(runs), "--dry-run"])
    lines = [x.split("ctrl_rl ", 1)[-1] for x in capsys.readouterr().out.splitlines()]
    train = [x for x in lines if x.startswith("train ")]
    assert f"train cql --resume {rep}/cql-seeds0_1 --total-steps 100 --no-progress" in train
    assert "# complete: hopper-medium-v5/cql-seeds0_1" in lines
    assert (f"train iql --dataset hopper-medium-v5 --env Hopper-v5 --total-steps 100 --eval-every 50 --eval-episodes 2 "
            f"--seeds 0 1 --run-dir {med}/iql-seeds0_1 --checkpoint-every 50 --no-progress --cosine-steps 100") in train
    for s in (0, 1):  # wsrl and retained start from their seed's directory of the cql seeds-run
        assert sum(f"train wsrl --init {rep}/cql-seeds0_1/seed_{s} " in x for x in train) == 2
    # one cql resume and one iql process for 2 seeds; rlpd, wsrl, retained per seed
    assert [x.split()[1] for x in train].count("iql") == 1 and len(train) == 2 + 3 * 2
    # the table reads the seeds' directories as the runs of the grid
    monkeypatch.setenv("CTRL_RL_REFERENCE_SCORES", str(tmp_path / "absent.json"))
    for s, score in ((0, 40.0), (1, 60.0)):
        fake_run(med / "iql-seeds0_1" / f"seed_{s}", "iql", s, 100, {50: 10.0, 100: score}, online=False)
    args = table.parse_args(GRID + ["--batch-seeds", "--mb-algos", "--o2o-datasets", "--runs-dir", str(runs)])
    table.summarize(table.grid_spec(args), runs, tmp_path / "out", "G", "S")
    rows = offline_rows((tmp_path / "out" / "d4rl.md").read_text(), "hopper-medium-v5")
    assert rows["iql"][0] == "50.0 ± 14.1 (n=2)"


def test_batch_seeds_refuses_compile_before_launching(table, tmp_path):
    """--batch-seeds with --compile in --cql-args stops with one sentence before any run starts (`--seeds` refuses
    --compile); without --batch-seeds the same flags are accepted."""
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match=r"--batch-seeds trains cql with --seeds, which does not take --compile"):
        table.main(GRID + ["--batch-seeds", "--mb-algos", "--runs-dir", str(runs), "--cql-args=--compile", "--dry-run"])
    assert not runs.exists()
    table.main(GRID + ["--mb-algos", "--runs-dir", str(runs), "--cql-args=--compile", "--dry-run"])
