"""experiments/common.py: `runs_commit` (the commits result files name come from the runs themselves) and the rliable
aggregates (`iqm_ci` over seeds or seeds x tasks, `improvement_ci`, and their one-method forms `iqm_seeds`,
`improvement_seeds`)."""

import json

from tests.scripts import experiment_script


def _run(d, code=None):
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"algo": "ppo"} | ({"code": code} if code is not None else {})))
    return d


def test_runs_commit_names_the_commits_the_runs_recorded(tmp_path):
    with experiment_script("experiments/common.py", "bench_common") as common:
        now = common.git_commit()
        a = _run(tmp_path / "a", {"started": {"ctrl_rl": "0.1.0", "git": "aaaa"}})
        b = _run(tmp_path / "b", {"started": {"ctrl_rl": "0.1.0", "git": "aaaa"},
                                  "resumed": {"ctrl_rl": "0.1.0", "git": "bbbb"}})
        old = _run(tmp_path / "old")  # written before runs recorded their code
        assert common.runs_commit([a, b]) == "aaaa, bbbb"
        assert common.runs_commit([a, old]) == f"aaaa, {now} (now: some runs did not record theirs)"
        assert common.runs_commit([]) == f"{now} (now: no run recorded its code)"


def test_iqm_over_seeds_and_tasks_and_probability_of_improvement():
    import pytest

    pytest.importorskip("rliable")  # the bench extra's
    with experiment_script("experiments/common.py", "bench_common") as common:
        one_task = common.iqm_ci({"a": [1.0, 2.0, 3.0, 4.0]})["a"]
        assert one_task["iqm"] == pytest.approx(2.5) and one_task["seeds"] == 4
        x = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]  # [seeds][tasks]
        assert common.iqm_ci({"x": x})["x"]["iqm"] == pytest.approx((3 + 4 + 10 + 20) / 4)  # middle 4 of 8 cells
        y = [[0.0, 0.0], [0.5, 5.0], [1.0, 10.0], [1.5, 15.0]]
        poi = common.improvement_ci({"x > y": (x, y), "y > x": (y, x)})
        # per task, x beats y in 14 of 16 pairs, ties in 1 (1.0 against 1.0; 10.0 against 10.0) and loses 1
        assert poi["x > y"]["p"] == pytest.approx(14.5 / 16) and poi["y > x"]["p"] == pytest.approx(1.5 / 16)
        lo, hi = poi["x > y"]["ci95"]
        assert lo <= poi["x > y"]["p"] <= hi <= 1


def test_matmul_calls_and_their_flops_match_flop_counter_on_a_small_update():
    """The products torch.profiler records for a forward+backward (mm, addmm, bmm, baddbmm) sum to FlopCounterMode's
    total, and ``call_flops`` counts 2 m k n per product (times a bmm's batch)."""
    import torch

    with experiment_script("experiments/common.py", "bench_common") as common:
        assert common.call_flops([("aten::mm", [4, 3], [3, 5]), ("aten::bmm", [2, 4, 3], [2, 3, 5])]) == 120 + 240
        lin = torch.nn.Linear(3, 5)  # addmm forward; mm for the weight's gradient and the input's
        w = torch.randn(2, 5, 4, requires_grad=True)  # bmm forward and backward
        x = torch.randn(6, 3, requires_grad=True)

        def step():
            y = lin(x)  # [6,5]
            torch.bmm(y.expand(2, 6, 5), w).sum().backward()

        calls = common.matmul_calls(step)
        assert {c[0] for c in calls} >= {"aten::addmm", "aten::bmm"}
        assert common.call_flops(calls) == common.matmul_flops(step) > 0


def test_one_method_over_seeds_iqm_and_improvement_with_a_given_aggregator():
    with experiment_script("experiments/common.py", "bench_common") as common:
        assert common.iqm_seeds([7.0]) == {"iqm": 7.0, "ci95": [7.0, 7.0], "seeds": 1}  # one seed: no bootstrap
        assert common.improvement_seeds([2.0], [1.0]) == {"p": 1.0, "ci95": [1.0, 1.0]}
        assert common.improvement_seeds([1.0], [1.0])["p"] == 0.5
        seen = {}

        def mean_ci(values):
            seen.update(values)
            x = values["x"]
            return {"x": {"iqm": sum(x) / len(x), "ci95": [min(x), max(x)]}}

        def pairs_ci(pairs):
            (xs, ys), = pairs.values()
            wins = sum((a[0] > b[0]) + 0.5 * (a[0] == b[0]) for a in xs for b in ys)
            return {"x>y": {"p": wins / (len(xs) * len(ys)), "ci95": [0.0, 1.0]}}

        assert common.iqm_seeds([1.0, 3.0], mean_ci) == {"iqm": 2.0, "ci95": [1.0, 3.0]} and seen == {"x": [1.0, 3.0]}
        assert common.improvement_seeds([2.0, 4.0], [1.0, 3.0], pairs_ci)["p"] == 0.75


def test_a_study_record_keeps_what_earlier_invocations_covered(tmp_path):
    with experiment_script("experiments/common.py", "bench_common") as common:
        path = tmp_path / "study.json"
        first = common.merged_study_record(path, {"command": "a", "task": "hopper", "seeds": [0, 1, 2],
                                                  "variants": ["sac", "flow-g"], "commands": {"sac": "x"}},
                                           same=("task",), union=("seeds", "variants", "commands"))
        assert first["invocations"] == ["a"]
        path.write_text(json.dumps(first))
        second = common.merged_study_record(path, {"command": "b", "task": "hopper", "seeds": [2, 3],
                                                   "variants": ["flow-t"], "commands": {"flow-t": "y", "sac": "z"},
                                                   "steps": 10},
                                            same=("task",), union=("seeds", "variants", "commands"))
        assert second == {"command": "b", "task": "hopper", "seeds": [0, 1, 2, 3], "steps": 10,
                          "variants": ["sac", "flow-g", "flow-t"], "commands": {"sac": "z", "flow-t": "y"},
                          "invocations": ["a", "b"]}
        other = common.merged_study_record(path, {"command": "c", "task": "halfcheetah", "seeds": [5]},
                                           same=("task",), union=("seeds",))
        assert other == {"command": "c", "task": "halfcheetah", "seeds": [5], "invocations": ["c"]}  # not merged
        path.write_text("{not json")
        fresh = common.merged_study_record(path, {"command": "d", "seeds": [1]}, same=(), union=("seeds",))
        assert fresh["seeds"] == [1] and fresh["invocations"] == ["d"]
