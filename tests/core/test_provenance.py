"""``core.provenance.git_commit``: a checkout is dirty when code differs from its commit, not when a benchmark has
rewritten its own results file."""

import os
import shutil
import subprocess

import pytest

from ctrl_rl.core.provenance import git_commit, is_result_file

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env=env)


def test_result_files_are_told_from_code():
    assert is_result_file("experiments/fast_sac/fast_sac.json") and is_result_file("experiments/x/y.png")
    assert is_result_file("experiments/sac_flow/kept/hopper-sac-s0/metrics.jsonl.gz")
    assert not is_result_file("experiments/fast_sac/fast_sac.py")
    assert not is_result_file("experiments/presets/fastsac-halfcheetah.json")  # a preset is code
    assert not is_result_file("ctrl_rl/data/behaviour/manifest.json") and not is_result_file("README.md")


def test_dirty_only_when_code_changed(tmp_path):
    files = {"ctrl_rl/a.py": "x = 1\n", "experiments/b/b.json": "{}\n", "experiments/presets/p.json": "{}\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "c")
    clean = git_commit(tmp_path, 7)
    assert clean is not None and len(clean) == 7
    (tmp_path / "experiments/b/b.json").write_text('{"runs": 1}\n')  # a benchmark continuing its results file
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert git_commit(tmp_path, 7) == clean
    (tmp_path / "experiments/presets/p.json").write_text('{"lr": 1}\n')
    assert git_commit(tmp_path, 7) == clean + "+dirty"
    git(tmp_path, "checkout", "-q", "--", "experiments/presets/p.json")
    (tmp_path / "ctrl_rl/a.py").write_text("x = 2\n")
    assert git_commit(tmp_path, 7) == clean + "+dirty"
