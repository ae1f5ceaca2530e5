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


def test_device_data_keeps_whole_episodes_and_notes_the_cut(tmp_path):
    import h5py
    import numpy as np
    import pytest

    src = tmp_path / "src.hdf5"
    n = 10
    with h5py.File(src, "w") as f:  # episodes end at rows 2 (terminal), 6 (timeout) and 9
        f["observations"] = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
        f["next_observations"] = f["observations"][:] + 1
        f["actions"] = np.zeros((n, 1), np.float32)
        f["rewards"] = np.arange(n, dtype=np.float32)
        f["terminals"] = np.isin(np.arange(n), [2, 9])
        f["timeouts"] = np.arange(n) == 6
        f["infos/qpos"] = np.zeros((n, 3), np.float32)
        f.attrs["ctrl_rl"] = json.dumps({"env_id": "Hopper-v5", "extra": {"steps": n, "episodes": 3}})
    with experiment_script("experiments/seed_batching/device_data.py", "seed_batching_device_data") as dd:
        assert dd.cut(src, 8, tmp_path / "out.hdf5") == 7
        with pytest.raises(SystemExit, match="no episode ends"):
            dd.cut(src, 2, tmp_path / "none.hdf5")
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert f["rewards"][:].tolist() == list(range(7)) and "infos" not in f
        meta = json.loads(f.attrs["ctrl_rl"])
    assert meta["env_id"] == "Hopper-v5" and meta["extra"]["steps"] == 7 and meta["extra"]["episodes"] == 2
