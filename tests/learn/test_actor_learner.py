"""The actor-learner loop: IMPALA and DoMo-AC from the CLI, policy-lag accounting, in-process resume equal to an
uninterrupted run, worker-process and Ray backends, actor crashes survived, all actors lost."""

import json
import sys

import pytest
import torch

from ctrl_rl.cli import main
from ctrl_rl.learn.checkpoint import load_checkpoint

FLAGS = ["--env", "torch:CartPole", "--actors", "2", "--num-envs", "4", "--unroll", "8", "--segments-per-update", "2",
         "--actor-hidden", "16", "--critic-hidden", "16", "--threads", "1", "--no-progress", "--log-every", "1"]
PER_UPDATE = 2 * 8 * 4


def _rows(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def _train(capsys, *args, err=None):
    code = main(["train", *map(str, args)])
    out = capsys.readouterr()
    assert code == 0, out.err
    if err is not None:
        assert err in out.err
    return json.loads(out.out.splitlines()[0])


@pytest.mark.parametrize("algo", ["impala", "domo_ac"])
def test_trains_from_the_cli_and_evaluates_and_exports(algo, tmp_path, capsys):
    d = tmp_path / algo
    res = _train(capsys, algo, *FLAGS, "--total-steps", 4 * PER_UPDATE, "--run-dir", d, "--lambda", "0.9")
    assert res["step"] == 4 * PER_UPDATE
    rows = _rows(d)
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    assert all(r["actors/alive"] == 2 and r["actors/lag_max"] == 0 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["loss/value"])) for r in rows)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["config"]["trace_lambda"] == 0.9 and cfg["config"]["kappa"] == (0.5 if algo == "domo_ac" else 0.0)
    assert main(["eval", str(d), "--episodes", "2"]) == 0
    assert main(["export", str(d), "--format", "onnx"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["parity"]["onnx"] <= 1e-5


def test_policy_lag_is_counted_per_segment(tmp_path, capsys):
    # in-process with a broadcast every 3 updates: segments of update u were collected with weights of
    # 3 * floor(u / 3), so the lags run 0, 1, 2, 0, 1, 2 (two segments per update)
    d = tmp_path / "lag"
    _train(capsys, "impala", *FLAGS, "--broadcast-every", "3", "--max-policy-lag", "1", "--total-steps", 6 * PER_UPDATE,
           "--run-dir", d, err="policy lag 2 updates exceeds --max-policy-lag 1 at update 2")
    rows = _rows(d)
    assert [r["actors/lag_max"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert [r["actors/lag_mean"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert rows[-1]["actors/lag_over"] == 4  # the two segments of each lag-2 update


def test_inprocess_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    whole, part = tmp_path / "whole", tmp_path / "part"
    _train(capsys, "domo_ac", *FLAGS, "--total-steps", 6 * PER_UPDATE, "--run-dir", whole, "--checkpoint-every", "3")
    _train(capsys, "domo_ac", *FLAGS, "--total-steps", 3 * PER_UPDATE, "--run-dir", part, "--checkpoint-every", "3")
    _train(capsys, "domo_ac", "--resume", part, "--total-steps", 6 * PER_UPDATE, "--no-progress")
    a = load_checkpoint(whole / "checkpoints" / "latest.pt")["algo_state"]["ac"]
    b = load_checkpoint(part / "checkpoints" / "latest.pt")["algo_state"]["ac"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["episode_return"] for r in _rows(whole)] == [r["episode_return"] for r in _rows(part)]


def test_worker_processes_train_and_a_crashed_actor_is_survived(tmp_path, capsys, monkeypatch):
    # actor 1 exits abruptly once started, before its first segment; on a loaded machine actor 0 and the learner
    # can finish before it has even started, and then the loss is reported when the run ends
    monkeypatch.setenv("CTRL_RL_ACTOR_FAULT", "1:0")
    d = tmp_path / "proc"
    code = main(["train", "impala", *FLAGS, "--backend", "process", "--total-steps", str(40 * PER_UPDATE),
                 "--run-dir", str(d)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out.splitlines()[0])["step"] == 40 * PER_UPDATE
    rows = _rows(d)
    if rows[-1]["actors/alive"] == 1:  # lost during the run, trained on with the other
        assert "actor 1 exited with code 3; going on with 1 actor(s)" in out.err
    else:
        assert "actor 1 exited with code 3 before the run ended" in out.err
    assert all(r["actors/lag_max"] >= 0 for r in rows) and max(r["actors/lag_max"] for r in rows) >= 1


def test_all_actors_lost_stops_with_a_sentence_and_keeps_the_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CTRL_RL_ACTOR_FAULT", "*:2")
    d = tmp_path / "lost"
    code = main(["train", "impala", *FLAGS, "--backend", "process", "--total-steps", str(50 * PER_UPDATE),
                 "--checkpoint-every", "1", "--run-dir", str(d)])
    err = capsys.readouterr().err
    assert code == 1 and "all 2 actors are gone" in err and "last checkpoint is kept" in err
    assert (d / "checkpoints" / "latest.pt").is_file()


@pytest.mark.slow  # ray.init and two Ray workers: ~10 s idle, over a minute on a loaded 2-core machine
def test_ray_backend_with_two_local_actors(tmp_path, capsys):
    d = tmp_path / "ray"
    res = _train(capsys, "impala", *FLAGS, "--backend", "ray", "--total-steps", 3 * PER_UPDATE, "--run-dir", d)
    assert res["step"] == 3 * PER_UPDATE and _rows(d)[-1]["actors/alive"] == 2


def test_ray_backend_without_ray_is_one_sentence(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code = main(["train", "impala", *FLAGS, "--backend", "ray", "--total-steps", "64",
                 "--run-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "pip install 'ctrl-rl[ray]'" in err and "\n" not in err
    assert not (tmp_path / "x").exists()
