"""Which code a run ran: the package version and, in a git checkout, the commit (``+dirty`` when tracked code files
differ from it). ``config.json`` records it, so a result can be traced to the code that produced it; and
``file_sha256``, the digest by which a run, an export or a dataset names the files it came from."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

from ctrl_rl import __version__

RESULT_SUFFIXES = (".json", ".md", ".png", ".csv", ".txt", ".gz")  # .gz: the kept records of runs


def is_result_file(path: str) -> bool:
    """A study's or benchmark's result file (``experiments/<study>/`` JSON, Markdown, PNG, CSV, text, or the kept
    records of a run, ``kept/<run>/*.gz``; presets and scripts are code): a benchmark that continues from its own
    results file rewrites it while it runs, which does not change the code a run ran."""
    return (path.startswith("experiments/") and not path.startswith("experiments/presets/")
            and path.endswith(RESULT_SUFFIXES))


def git_commit(root: str | Path, digits: int = 12) -> str | None:
    """The short commit of the git checkout at ``root``, ``+dirty`` when tracked files other than result files
    (``is_result_file``) differ from it; None when ``root`` is not a git checkout or git is missing."""
    if not (Path(root) / ".git").exists():
        return None
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # `git status` must not take the index lock of a busy checkout
    try:
        sha = subprocess.run(["git", "rev-parse", f"--short={digits}", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, env=env)
        if sha.returncode != 0 or not sha.stdout.strip():
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    changed = [line[3:].split(" -> ")[-1].strip('"') for line in dirty.stdout.splitlines() if line.strip()]
    return sha.stdout.strip() + ("+dirty" if any(not is_result_file(f) for f in changed) else "")


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str | None]:
    """``{"ctrl_rl": version, "git": "abc123def456[+dirty]" or None}`` (None: an installed wheel, or no git)."""
    return {"ctrl_rl": __version__, "git": git_commit(Path(__file__).resolve().parents[2])}


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex), read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere), for results whose float rounding
    depends on the machine."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
