"""Bad input at the command line, with stdout and stderr piped (as in a job script or CI): the error is one
whole sentence on one line of stderr (never cut at the terminal width), exit code 2, nothing written."""

import json
import os
import subprocess
import sys

import pytest

TAIL = "see `ctrl-rl train sac --help` for the expected flags and types"


def cli(*args, cwd=None, columns=None):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "ctrl_rl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env=env)


def one_sentence(r):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctrl-rl: error: "), r.stderr
    assert r.stdout == ""
    return lines[0]


@pytest.mark.parametrize("columns", [None, 40])
def test_invalid_int_is_one_whole_line(tmp_path, columns):
    line = one_sentence(cli("train", "sac", "--num-envs", "abc", cwd=tmp_path, columns=columns))
    assert "--num-envs" in line and "'abc'" in line and line.endswith(TAIL)
    assert not list(tmp_path.iterdir())


def test_long_invalid_value_is_not_cut(tmp_path):
    value = "0.5" + "x" * 150  # longer than any terminal line
    line = one_sentence(cli("train", "sac", "--gamma", value, cwd=tmp_path, columns=80))
    assert repr(value) in line and line.endswith(TAIL), line
    assert not list(tmp_path.iterdir())


def test_missing_flag_value_is_one_whole_line(tmp_path):
    line = one_sentence(cli("train", "sac", "--num-envs", cwd=tmp_path))
    assert "--num-envs" in line and line.endswith(TAIL)


def test_help_is_still_printed_at_the_terminal_width(tmp_path):
    r = cli("train", "sac", "--help", cwd=tmp_path, columns=80)
    assert r.returncode == 0 and "--num-envs" in r.stdout
    lines = r.stdout.splitlines()
    # tyro's option table is wrapped at 80 columns (the one unwrapped line is the config's docstring)
    assert len(lines) > 20 and sum(len(ln) > 80 for ln in lines) <= 1


def write_run(d, rows):
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_plot_refusals_exit_2_and_write_nothing(tmp_path):
    good = write_run(tmp_path / "good", [{"step": 10, "wall_time": 1.0, "episode_return": -5.0}])
    bad = write_run(tmp_path / "bad", [{"wall_time": 1.0, "episode_return": -5.0}])
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert "'step'" in one_sentence(cli("plot", bad))
    assert ".pdf" in one_sentence(cli("plot", good, "--out", tmp_path / "curve.txt"))
    assert "does not exist" in one_sentence(cli("plot", good, "--out", tmp_path / "missing" / "c.png"))
    assert "needs a value" in one_sentence(cli("plot", good, "--out"))
    assert "unexpected argument" in one_sentence(cli("plot", good, "extra"))
    assert "run directory first" in one_sentence(cli("plot", "--out", tmp_path / "c.png"))
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    r = cli("plot", good, "--out", tmp_path / "curve.svg")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "curve.svg"), r.stderr


@pytest.mark.parametrize("content", [b"not a checkpoint\n", bytes(range(256)) * 8, b""])
def test_eval_of_a_file_that_is_not_a_checkpoint_is_one_sentence(tmp_path, content):
    p = tmp_path / "model.pt"
    p.write_bytes(content)
    line = one_sentence(cli("eval", p))
    assert str(p) in line


def test_unknown_names_get_one_did_you_mean_hint(tmp_path):
    """Flags, env ids and algorithm names share one hint (``ctrl_rl.errors.did_you_mean``) inside one sentence."""
    line = one_sentence(cli("train", "sac", "--totl-steps", "5", cwd=tmp_path))
    assert "unknown flag '--totl-steps'" in line and "(did you mean '--total-steps'?)" in line
    line = one_sentence(cli("train", "sac", "--env", "torch:Pendulm", "--total-steps", "5", cwd=tmp_path))
    assert "unknown env id 'torch:Pendulm'" in line and "(did you mean 'torch:Pendulum'?)" in line
    line = one_sentence(cli("train", "sacc", cwd=tmp_path))
    assert "unknown algorithm 'sacc'" in line and "(did you mean 'sac'?)" in line
    assert not list(tmp_path.iterdir())


def test_run_summary_is_strict_json_before_any_episode_ends(tmp_path, capsys):
    """A run that ends before any episode finished prints ``"episode_return": null`` (NaN is not JSON: jq and other
    strict parsers refuse it)."""
    from types import SimpleNamespace

    from ctrl_rl.cli import _report_run

    _report_run(tmp_path, SimpleNamespace(step=600, last_return=float("nan"), wall_time=4.04))
    line = capsys.readouterr().out.strip()

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    assert json.loads(line, parse_constant=refuse) == {"run_dir": str(tmp_path), "step": 600, "episode_return": None,
                                                       "wall_time_s": 4.0}
