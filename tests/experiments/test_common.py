"""experiments/common.py's ``runs_commit``: the commits result files name come from the runs themselves."""

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
