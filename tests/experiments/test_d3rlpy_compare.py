"""experiments/d3rlpy_compare/d3rlpy_compare.py without training: its t-test and the summary of fabricated runs."""

import json

import pytest

from tests.scripts import experiment_script


@pytest.fixture(scope="module")
def compare():
    with experiment_script("experiments/d3rlpy_compare/d3rlpy_compare.py", "d3rlpy_compare") as mod:
        yield mod


@pytest.mark.parametrize("t,df,p", [(0.0, 5, 1.0), (2.0, 10, 0.07339), (-2.0, 10, 0.07339), (2.228, 10, 0.05),
                                    (1.96, 1e6, 0.05), (5.0, 3, 0.01539), (0.5, 10, 0.62789), (0.1, 4, 0.92516)])
def test_two_sided_p_matches_student_t_tables(compare, t, df, p):
    assert compare.t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4)


def test_welch_needs_two_of_each(compare):
    assert compare.welch([1.0], [1.0, 2.0]) is None
    t, df = compare.welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert t == pytest.approx(-3.0 / (2 / 3) ** 0.5) and df == pytest.approx(4.0)


def test_summary_of_fabricated_runs(compare, tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "RESULTS", tmp_path / "out")
    (tmp_path / "out").mkdir()
    runs = tmp_path / "runs"
    for lib, finals in (("ctrl_rl", (40.0, 50.0, 60.0)), ("d3rlpy", (30.0, 35.0, 40.0))):
        for seed, final in enumerate(finals):
            d = runs / f"{lib}-iql-s{seed}"
            d.mkdir(parents=True)
            curve = [{"step": 100, "episode_return": 1.0, "normalized_score": final / 2, "wall_time": 2.0},
                     {"step": 200, "episode_return": 2.0, "normalized_score": final, "wall_time": 4.0}]
            for c in curve:
                c.update({"updates_per_s": 100.0} if lib == "ctrl_rl" else {"eval_time": 2.0})
            (d / "result.json").write_text(json.dumps({"library": lib, "algo": "iql", "seed": seed, "steps": 200,
                                                       "process_seconds": 9.0, "curve": curve}))
    a = compare.parse_args(["--summarize", "--runs-dir", str(runs)])
    compare.summarize(a)
    md = (tmp_path / "out" / "d3rlpy_compare.md").read_text()
    assert "| iql | ctrl_rl | 200 | 0, 1, 2 | 50.0 ± 10.0 | 40.0, 50.0, 60.0 | 50.0 | 50.0 ± 10.0 | 100.0 | 9 |" in md
    assert "| iql | d3rlpy | 200 | 0, 1, 2 | 35.0 ± 5.0 | 30.0, 35.0, 40.0 | 35.0 | 35.0 ± 5.0 | 100.0 | 9 |" in md
    assert "IQL: ctrl_rl − d3rlpy = +15.0 points" in md and "n = 3 vs 3" in md
    assert (tmp_path / "out" / "d3rlpy_compare.png").stat().st_size > 0
