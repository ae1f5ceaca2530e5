"""experiments/model_based_learning/summarize.py without training: per-seed curves and provenance read from
fabricated run directories, scores at a step, the fit summary, and the report (rliable is the bench extra's:
the aggregate is given here)."""

import json
from pathlib import Path

import pytest

from tests.scripts import experiment_script, local_references


@pytest.fixture(scope="module")
def summ():
    with experiment_script("experiments/model_based_learning/summarize.py", "mb_learning_summarize") as mod:
        yield mod


def fake_run(d: Path, curve: dict[int, float], commit: str = "abc1234", resumed: str | None = None) -> None:
    d.mkdir(parents=True)
    code = {"started": {"git": commit}, **({"resumed": {"git": resumed}} if resumed else {})}
    (d / "config.json").write_text(json.dumps({"code": code}))
    rows = []
    for step in range(1000, max(curve) + 1, 1000):
        row = {"step": step, "wall_time": step / 100}
        if step in curve:
            row["episode_return"] = curve[step]
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_run_reads_as_its_evaluations_with_local_scores_and_commits(summ, tmp_path, monkeypatch):
    from ctrl_rl.storage.datasets.scores import normalized_score

    local_references(monkeypatch, tmp_path / "refs.json", {"halfcheetah": (-300.0, 10000.0)})

    fake_run(tmp_path / "mopo-s0", {2000: 100.0, 4000: 2500.0}, resumed="def5678")
    run = summ.read_run(tmp_path / "mopo-s0", "HalfCheetah-v5")
    assert run["steps"] == [2000, 4000] and run["returns"] == [100.0, 2500.0] and run["last_step"] == 4000
    assert run["scores"][1] == pytest.approx(float(normalized_score("HalfCheetah-v5", 2500.0, "local")[0]))
    assert run["scores"][1] == pytest.approx(100 * 2800 / 10300)  # the local references, not D4RL's
    assert (run["commit"], run["resumed_commit"]) == ("abc1234", "def5678")
    assert summ.score_at(run, 3999) == run["scores"][0] and summ.score_at(run, 1999) is None
    (tmp_path / "empty").mkdir()
    assert summ.read_run(tmp_path / "empty", "HalfCheetah-v5") is None


def test_the_report_names_each_method_its_share_of_the_papers_steps_and_the_gap_to_the_data(summ):
    run = {"steps": [5000, 10000], "scores": [20.0, 35.0], "last_step": 10000, "commit": "abc1234"}
    agg = {"iqm": 35.0, "ci95": [33.0, 37.0], "seeds": 1}
    payload = {"date": "2026-11-25", "command": "python summarize.py", "datasets": {"halfcheetah-medium-v5": {
        "runs": {"ravl": {"0": run}}, "common_step": 10000, "dataset_score": 30.7, "dataset_return": 2167.7,
        "dynamics": {"epochs": 30, "holdout_mse_best_elites": 0.0034, "calibration": 0.75, "finished": True,
                     "wall_time_s": 1200, "per_member": {"holdout_mse": [0.0031, 0.0035], "elites": [0]}},
        "aggregate": {"final": {"ravl": agg}, "common": {"ravl": agg}}}}}
    md = summ.markdown(payload)
    row = next(line for line in md.splitlines() if line.startswith("| ravl |"))
    assert "0.3%" in row and "35.0 [33.0, 37.0]" in row and "+4.3" in row and "abc1234" in row
    assert "holdout MSE per member [0.0031, 0.0035], elites [0]" in md
