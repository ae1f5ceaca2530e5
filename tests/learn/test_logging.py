"""metrics.jsonl on resume: cut to the checkpoint's byte offset (or, without one, before the first row past
the checkpoint's step) with os.truncate, never read and rewritten; a row cut by a kill is dropped.
Progress output: tqdm on a terminal, plain lines at a bounded rate (no carriage returns) in a log."""

import io
import json
import os
import time

import pytest

from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.logging import RunLogger, read_metrics
from ctrl_rl.learn.progress import PlainProgress, progress_bar


def log_steps(run_dir, steps, **kw):
    lg = RunLogger(run_dir, tensorboard=False, **kw)
    for s in steps:
        lg.log({"step": s, "wall_time": s / 10, "episode_return": -float(s)})
    return lg


def steps_in(run_dir):
    return [r["step"] for r in read_metrics(run_dir)]


def test_offset_counts_the_bytes_of_the_rows_written(tmp_path):
    lg = log_steps(tmp_path, [10, 20])
    assert lg.offset == (tmp_path / "metrics.jsonl").stat().st_size > 0
    lg.log({"step": 30, "loss": float("nan")})  # non-finite values are written as null
    assert lg.offset == (tmp_path / "metrics.jsonl").stat().st_size
    lg.sync()
    lg.close()
    assert read_metrics(tmp_path)[-1] == {"step": 30, "loss": None}


def test_resume_with_offset_truncates_in_place_and_appends(tmp_path):
    lg = log_steps(tmp_path, [10, 20])
    saved = lg.offset  # stored in the checkpoint at step 20
    for s in (30, 40):  # logged after the checkpoint, then the run was killed
        lg.log({"step": s})
    lg.close()
    path = tmp_path / "metrics.jsonl"
    inode = path.stat().st_ino
    lg = log_steps(tmp_path, [30], resume_offset=saved, resume_step=20)
    lg.close()
    assert steps_in(tmp_path) == [10, 20, 30]
    assert path.stat().st_ino == inode  # the same file, cut and appended: never rewritten
    assert lg.offset == path.stat().st_size


def test_resume_with_step_only_cuts_before_the_first_later_row(tmp_path):
    lg = log_steps(tmp_path, [10, 20, 30, 40])
    lg.close()
    path = tmp_path / "metrics.jsonl"
    inode = path.stat().st_ino
    lg = log_steps(tmp_path, [30, 40, 50], resume_step=20)
    lg.close()
    assert steps_in(tmp_path) == [10, 20, 30, 40, 50]
    assert path.stat().st_ino == inode


def test_row_cut_by_a_kill_is_dropped(tmp_path):
    lg = log_steps(tmp_path, [10, 20])
    saved = lg.offset
    lg.close()
    path = tmp_path / "metrics.jsonl"
    with open(path, "ab") as f:  # killed mid-write: half a row, no newline
        f.write(b'{"step": 30, "episode_ret')
    for kw in ({"resume_offset": saved}, {"resume_step": 20}, {"resume_step": 25}, {}):
        lg = log_steps(tmp_path, [30], **kw)
        lg.close()
        assert steps_in(tmp_path) == [10, 20, 30], kw
        lines = path.read_bytes().splitlines()
        assert all(json.loads(ln) for ln in lines)
        os.truncate(path, saved)
        with open(path, "ab") as f:
            f.write(b'{"step": 30, "episode_ret')


def test_offset_not_at_a_row_end_falls_back_to_the_step(tmp_path, capsys):
    lg = log_steps(tmp_path, [10, 20, 30])
    lg.close()
    size = (tmp_path / "metrics.jsonl").stat().st_size
    for bad in (size + 100, 7):  # the file lost rows (shorter than the checkpoint says), or a mid-row offset
        lg = log_steps(tmp_path, [], resume_offset=bad, resume_step=20)
        lg.close()
        assert steps_in(tmp_path) == [10, 20]
        assert "warning" in capsys.readouterr().err
        lg = log_steps(tmp_path, [30])
        lg.close()


def test_resume_in_a_directory_without_metrics(tmp_path):
    lg = log_steps(tmp_path, [5], resume_offset=0, resume_step=0)
    lg.close()
    assert steps_in(tmp_path) == [5]


def test_tensorboard_purge_step_on_resume(tmp_path):
    lg = RunLogger(tmp_path, tensorboard=True)
    lg.log({"step": 1, "x": 1.0})
    off = lg.offset
    lg.close()
    lg = RunLogger(tmp_path, resume_step=1, resume_offset=off, tensorboard=True)
    assert lg.tb is not None and lg.offset == off
    lg.close()


def test_read_metrics_skips_lines_that_are_not_objects(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n3\n\xff\xfe\n[1]\n{"step": 2}\n{"step"')
    assert steps_in(tmp_path) == [1, 2]


# -- progress output ----------------------------------------------------------------------------------------
class TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_disabled_is_none():
    assert progress_bar(False, 100, 0, "x") is None


def test_progress_in_a_log_file_is_plain_lines_at_an_interval():
    out = io.StringIO()
    bar = progress_bar(True, 10_000, 2_000, "sac Pendulum", stream=out, interval=3600)
    assert isinstance(bar, PlainProgress)
    for _ in range(800):
        bar.set_postfix_str("return -123.4", refresh=False)
        bar.update(10)
    bar.close()
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 1  # the interval never elapsed: only the line at close
    assert lines[0].startswith("sac Pendulum: 10.0k/10.0k step (100%)") and lines[0].endswith("| return -123.4")


def test_progress_interval_bounds_the_number_of_lines(monkeypatch):
    monkeypatch.setenv("CTRL_RL_PROGRESS_INTERVAL", "0.05")
    out = io.StringIO()
    bar = progress_bar(True, 1000, 0, "ppo", unit="upd", stream=out)
    t0 = time.monotonic()
    for _ in range(1000):
        bar.update(1)
        time.sleep(0.0005)
    bar.close()
    elapsed = time.monotonic() - t0
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 2 <= len(lines) <= elapsed / 0.05 + 2
    assert lines[-1].startswith("ppo: 1.00k/1.00k upd (100%)")


def test_progress_interval_env_must_be_a_number(monkeypatch):
    monkeypatch.setenv("CTRL_RL_PROGRESS_INTERVAL", "soon")
    with pytest.raises(UserInputError, match="CTRL_RL_PROGRESS_INTERVAL"):
        progress_bar(True, 10, 0, "x", stream=io.StringIO())


def test_progress_on_a_terminal_is_tqdm():
    from tqdm import tqdm

    out = TTY()
    bar = progress_bar(True, 100, 0, "x", stream=out)
    assert isinstance(bar, tqdm)
    bar.update(50)
    bar.set_postfix_str("r 1", refresh=False)
    bar.close()
    assert "\r" in out.getvalue()
