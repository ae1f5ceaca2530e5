"""Checkpoint files: a self-checking header (sha256 + length) refuses damaged and truncated copies in one
sentence; foreign files (text, random bytes, empty, torch.save of a non-dict) are refused in one sentence;
a write killed with SIGKILL leaves only a temporary file, which the next save removes."""

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import (
    FORMAT,
    VERSION,
    global_rng_state,
    load_checkpoint,
    remove_stale_tmp,
    save_checkpoint,
)


def payload(seed: int = 0) -> dict:
    """A checkpoint shaped like the loops' ones: network weights, optimizer state, RNG, counters."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"algo": "sac", "config": {"run": {"env": "torch:Pendulum", "seed": seed}, "algo": {"gamma": 0.99}},
            "algo_state": {"actor": net.state_dict(), "opt": opt.state_dict()}, "obs": torch.randn(2, 3),
            "rng": global_rng_state(), "counters": {"step": 128, "wall_time": 1.5, "metrics_offset": 1234}}


@pytest.fixture
def real(tmp_path):
    path = tmp_path / "checkpoints" / "latest.pt"
    save_checkpoint(path, payload())
    return path


def refused(path, *fragments):
    with pytest.raises(UserInputError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_roundtrip_keeps_every_value_and_writes_a_header(real):
    ck = load_checkpoint(real, expect_algo="sac")
    ref = payload()
    assert ck["format"] == FORMAT and ck["version"] == VERSION == 2
    assert ck["counters"] == ref["counters"] and ck["config"] == ref["config"]
    for k, v in ref["algo_state"]["actor"].items():
        assert torch.equal(ck["algo_state"]["actor"][k], v)
    head = real.read_bytes()[:80]
    assert head.startswith(b"ctrl_rl.checkpoint 2 sha256:")
    assert not [p for p in real.parent.iterdir() if p.name != "latest.pt"]  # no temporary file left


def test_resaving_a_loaded_checkpoint_works(real):
    ck = load_checkpoint(real)
    save_checkpoint(real, {**ck, "replay": None})
    again = load_checkpoint(real)
    assert again["replay"] is None and again["version"] == VERSION


def test_wrong_algorithm_is_one_sentence(real):
    refused_msg = pytest.raises(UserInputError, load_checkpoint, real, expect_algo="ppo")
    assert "'sac'" in str(refused_msg.value) and "'ppo'" in str(refused_msg.value)


def test_plain_text_is_refused(tmp_path):
    p = tmp_path / "notes.pt"
    p.write_text("these are my notes, not a checkpoint\n" * 5)
    refused(p, "not a ctrl_rl checkpoint")


def test_random_bytes_are_refused(tmp_path):
    p = tmp_path / "noise.pt"
    p.write_bytes(random.Random(0).randbytes(5000))
    refused(p, "not a ctrl_rl checkpoint")


def test_empty_file_is_refused(tmp_path):
    p = tmp_path / "empty.pt"
    p.write_bytes(b"")
    refused(p, "is empty")


@pytest.mark.parametrize("keep", [0.5, 0.99, "header", "header-3", "one-byte-less"])
def test_truncated_checkpoint_is_refused(real, keep):
    data = real.read_bytes()
    h = data.index(b"\n") + 1  # the header line
    assert h == 120
    n = {"header": h, "header-3": h - 3, "one-byte-less": len(data) - 1}.get(keep) or int(len(data) * keep)
    real.write_bytes(data[:n])
    refused(real, "truncated")


def test_torch_save_of_a_non_dict_is_refused(tmp_path):
    p = tmp_path / "tensor.pt"
    torch.save(torch.arange(10), p)
    refused(p, "not a ctrl_rl checkpoint")
    torch.save({"weights": torch.ones(3)}, p)  # a dict, but not ours
    refused(p, "not a ctrl_rl checkpoint")


def test_pickled_object_outside_weights_only_is_refused(tmp_path):
    p = tmp_path / "obj.pt"
    torch.save({"format": FORMAT, "version": 1, "algo": "sac", "config": {}, "fn": Exception("x")}, p)
    refused(p, "not a ctrl_rl checkpoint")


def test_version_1_checkpoints_without_checksum_still_load(tmp_path):
    p = tmp_path / "old.pt"
    torch.save({"format": FORMAT, "version": 1, **payload()}, p)
    ck = load_checkpoint(p, expect_algo="sac")
    assert ck["version"] == 1 and ck["counters"]["step"] == 128


def test_every_single_flipped_byte_is_refused(real):
    """Before the checksum, 29 of 40 such copies loaded silently."""
    data = real.read_bytes()
    rng = random.Random(11)
    positions = sorted(rng.sample(range(len(data)), 40))
    positions[:3] = [0, 40, 100]  # the magic, the digest and the length in the header too
    damaged = real.with_name("damaged.pt")
    for pos in positions:
        b = bytearray(data)
        b[pos] ^= 1 << rng.randrange(8)
        damaged.write_bytes(bytes(b))
        with pytest.raises(UserInputError) as e:
            load_checkpoint(damaged)
        assert str(damaged) in str(e.value), (pos, str(e.value))


def test_remove_stale_tmp_removes_only_files_of_dead_writers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen(["sleep", "30"])
    try:
        names = {f".latest.pt.tmp{dead.pid}": False, f".config.json.tmp{dead.pid}": False,
                 f".latest.pt.tmp{live.pid}": True, f".latest.pt.tmp{os.getpid()}": True,
                 "latest.pt": True, "notes.tmp123": True, ".hidden": True}
        for n in names:
            (tmp_path / n).write_bytes(b"x")
        removed = remove_stale_tmp(tmp_path)
        assert {p.name for p in removed} == {n for n, keep in names.items() if not keep}
        assert {p.name for p in tmp_path.iterdir()} == {n for n, keep in names.items() if keep}
        remove_stale_tmp(tmp_path, all_pids=True)  # at the start of a run, holding the run directory's lock
        assert {p.name for p in tmp_path.iterdir()} == {"latest.pt", "notes.tmp123", ".hidden"}
    finally:
        live.kill()
        live.wait()
    assert remove_stale_tmp(tmp_path / "missing") == []


def test_kill_9_mid_write_leaves_a_tmp_file_that_the_next_save_removes(tmp_path):
    path = tmp_path / "checkpoints" / "latest.pt"
    script = textwrap.dedent(f"""
        import os, sys, time
        import torch
        from ctrl_rl.learn import checkpoint as C
        def stuck(src, dst):  # the data are written and fsynced: hang just before the rename
            print("written", flush=True)
            time.sleep(60)
        os.replace = stuck
        C.save_checkpoint({str(path)!r}, {{"algo": "sac", "config": {{}}, "w": torch.ones(1000)}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    left = [p.name for p in path.parent.iterdir()]
    assert left == [f".latest.pt.tmp{proc.pid}"] and not path.exists()
    save_checkpoint(path, payload())
    assert [p.name for p in path.parent.iterdir()] == ["latest.pt"]
    assert load_checkpoint(path)["counters"]["step"] == 128
