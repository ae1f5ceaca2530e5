"""experiments/seed_batching/op_count.py: the operations a seeds-batched update dispatches, counted against one
seed's update (the bound of a host-bound update on a GPU), written as JSON and markdown."""

import json

from tests.scripts import experiment_script


def test_counts_one_seed_and_the_batched_update(tmp_path, monkeypatch):
    with experiment_script("experiments/seed_batching/op_count.py", "seed_batching_op_count") as oc:
        monkeypatch.setattr("sys.argv", ["op_count.py", "--algos", "iql", "--seeds", "2", "--batch-size", "16",
                                         "--out", str(tmp_path)])
        oc.main()
    rec = json.loads((tmp_path / "op_count.json").read_text())
    iql = rec["algos"]["iql"]
    assert rec["seeds"] == 2 and rec["batch_size"] == 16
    # the batched update is one update of stacked networks: more than one seed's operations, fewer than two seeds'
    assert iql["alone"]["ops"] < iql["batched"]["ops"] < 2 * iql["alone"]["ops"]
    assert 0 < iql["alone"]["kernels"] <= iql["alone"]["ops"] and iql["ops_ratio"] > 1
    assert "| iql |" in (tmp_path / "op_count.md").read_text()
