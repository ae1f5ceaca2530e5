"""Run directories: every refusal is one sentence before anything is written; an unstarted run (killed
before its first checkpoint) restarts; the lock refuses a second live process and takes over a dead one's."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import save_checkpoint
from ctrl_rl.learn.rundir import RunDirLock, check_new_run_dir, check_resume_dir, clear_unstarted_run, lock_owner


def one_sentence(fn, *args, contains=()):
    with pytest.raises(UserInputError) as e:
        fn(*args)
    msg = str(e.value)
    assert "\n" not in msg and "expected" in msg, msg
    for c in contains:
        assert c in msg, msg
    return msg


def snapshot(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else None


def unstarted_run(d):
    """What a run killed before its first checkpoint leaves behind."""
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / ".latest.pt.tmp999999").write_bytes(b"half")
    (d / "config.json").write_text("{}")
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "events.out.tfevents.1700000000.host.123.0").write_bytes(b"tb")
    (d / ".config.json.tmp999998").write_text("{")
    return d


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_new_and_empty_directories_are_accepted(tmp_path):
    assert check_new_run_dir(tmp_path / "a" / "b" / "run") is False
    assert not (tmp_path / "a").exists()  # nothing written
    (tmp_path / "empty").mkdir()
    assert check_new_run_dir(tmp_path / "empty") is False


def test_existing_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    one_sentence(check_new_run_dir, tmp_path / "f", contains=["is an existing file"])
    one_sentence(check_new_run_dir, tmp_path / "f" / "run", contains=["is a file"])


def test_unwritable_directory_is_refused(tmp_path, monkeypatch):
    # root bypasses permission bits, so the permission check is simulated here
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).startswith(str(ro)) else real_access(p, mode))
    one_sentence(check_new_run_dir, ro, contains=["not writable"])
    one_sentence(check_new_run_dir, ro / "new" / "run", contains=["cannot be created", "not writable"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_directory_is_refused_for_real(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    one_sentence(check_new_run_dir, ro / "run", contains=["not writable"])


def test_unrelated_files_are_refused_and_kept(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    (d / "config.json").write_text("{}")
    msg = one_sentence(check_new_run_dir, d, contains=["'thesis.tex'", "not part of a ctrl_rl run"])
    assert "1 more" not in msg
    one_sentence(clear_unstarted_run, d)
    assert (d / "thesis.tex").read_text() == "precious" and (d / "config.json").exists()
    (d / "thesis.tex").unlink()
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "notes.txt").write_text("x")
    one_sentence(check_new_run_dir, d, contains=["checkpoints/notes.txt"])


def test_a_run_with_a_checkpoint_is_refused_with_the_resume_hint(tmp_path):
    d = unstarted_run(tmp_path / "run")
    save_checkpoint(d / "checkpoints" / "latest.pt", {"algo": "sac", "config": {}})
    one_sentence(check_new_run_dir, d, contains=["already holds a run with a checkpoint", f"--resume {d}"])
    one_sentence(clear_unstarted_run, d, contains=["--resume"])
    assert check_resume_dir(d) == d / "checkpoints" / "latest.pt"


def test_a_run_killed_before_its_first_checkpoint_restarts(tmp_path):
    d = unstarted_run(tmp_path / "run")
    assert check_new_run_dir(d) is True
    one_sentence(check_resume_dir, d, contains=["before its first checkpoint", "without --resume"])
    with RunDirLock(d):
        removed = clear_unstarted_run(d)
        assert snapshot(d) == [".lock"]
    assert "config.json" in removed and "checkpoints" in removed
    assert snapshot(d) == []
    assert check_new_run_dir(d) is False


def test_resume_refusals(tmp_path):
    one_sentence(check_resume_dir, tmp_path / "missing", contains=["does not exist"])
    (tmp_path / "f").write_text("x")
    one_sentence(check_resume_dir, tmp_path / "f", contains=["is a file"])
    one_sentence(check_resume_dir, tmp_path, contains=["no config.json"])


def test_lock_is_exclusive_and_released(tmp_path):
    d = tmp_path / "run"
    with RunDirLock(d):
        owner = json.loads((d / ".lock").read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        assert lock_owner(d)["alive"]
        one_sentence(RunDirLock(d).acquire, contains=[f"process {os.getpid()}"])
        one_sentence(check_new_run_dir, d, contains=["in use by process"])
    assert not (d / ".lock").exists() and lock_owner(d) is None


def test_lock_is_released_on_an_exception(tmp_path):
    d = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with RunDirLock(d):
            raise RuntimeError("boom")
    assert not (d / ".lock").exists()


def test_lock_of_a_live_foreign_process_is_refused(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (d / ".lock").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(), "token": "x"}))
        msg = one_sentence(RunDirLock(d).acquire, contains=[f"process {sleeper.pid}"])
        assert "in use" in msg
        assert json.loads((d / ".lock").read_text())["pid"] == sleeper.pid  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_lock_of_another_host_is_not_taken_over(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / ".lock").write_text(json.dumps({"pid": dead_pid(), "host": "some-other-host", "token": "x"}))
    one_sentence(RunDirLock(d).acquire, contains=["some-other-host", "delete"])


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir()
    pid = dead_pid()
    (d / ".lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "token": "x"}))
    assert lock_owner(d)["alive"] is False
    assert check_new_run_dir(d) is True  # only the stale lock: restartable
    with RunDirLock(d):
        assert json.loads((d / ".lock").read_text())["pid"] == os.getpid()
    assert f"process {pid}" in capsys.readouterr().err
    assert not (d / ".lock").exists()


def test_half_written_lock_is_refused_while_fresh(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / ".lock").write_bytes(b"")  # a process between O_EXCL create and write
    one_sentence(RunDirLock(d, wait=0.2).acquire, contains=["being locked"])
    old = os.stat(d / ".lock").st_mtime - 60
    os.utime(d / ".lock", (old, old))  # left half-written by a process killed at that moment
    with RunDirLock(d, wait=0.2):
        pass


def test_second_process_is_refused_while_the_first_holds_the_lock(tmp_path):
    d = tmp_path / "run"
    script = (f"from ctrl_rl.learn.rundir import RunDirLock\nfrom ctrl_rl.errors import UserInputError\n"
              f"try:\n    RunDirLock({str(d)!r}).acquire()\nexcept UserInputError as e:\n    print(e)\n")
    with RunDirLock(d):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert f"in use by process {os.getpid()}" in r.stdout, r.stdout + r.stderr


def test_processes_racing_for_a_stale_lock_get_it_once(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / ".lock").write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "token": "x"}))
    go = tmp_path / "go"
    script = (f"import sys, time\nfrom pathlib import Path\nfrom ctrl_rl.learn.rundir import RunDirLock\n"
              f"from ctrl_rl.errors import UserInputError\n"
              f"Path({str(tmp_path)!r}, 'ready' + sys.argv[1]).write_text('')\n"
              f"while not Path({str(go)!r}).exists(): time.sleep(0.005)\n"
              f"try:\n    with RunDirLock({str(d)!r}):\n        print('got', flush=True)\n        time.sleep(2)\n"
              f"except UserInputError as e:\n    print('refused', flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready*"))) < 4 and time.monotonic() < deadline:  # all imported, all waiting
        time.sleep(0.01)
    go.write_text("")
    outs = [p.communicate(timeout=120) for p in procs]
    results = sorted(o.strip() for o, _ in outs)
    assert results == ["got", "refused", "refused", "refused"], outs
    assert not (d / ".lock").exists() and not (d / ".lock.break").exists()


def test_pretrain_subrun_of_an_offline_to_online_run(tmp_path):
    d = unstarted_run(tmp_path / "run")
    unstarted_run(d / "pretrain")
    assert check_new_run_dir(d) is True  # the nested pre-training run is ctrl_rl's own
    (d / "pretrain" / "mine.txt").write_text("x")
    one_sentence(check_new_run_dir, d, contains=["'pretrain/mine.txt'"])
    (d / "pretrain" / "mine.txt").unlink()
    with RunDirLock(d):
        removed = clear_unstarted_run(d)
    assert "pretrain" in removed and "pretrain/config.json" in removed and snapshot(d) == []
    unstarted_run(d)
    unstarted_run(d / "pretrain")
    save_checkpoint(d / "pretrain" / "checkpoints" / "latest.pt", {"algo": "sac_flow_o2o", "config": {}})
    one_sentence(check_new_run_dir, d, contains=["--resume"])  # started: stopped inside the offline phase
    assert check_resume_dir(d) == d / "pretrain" / "checkpoints" / "latest.pt"
