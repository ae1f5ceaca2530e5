"""Which code a run ran: the package version and, in a git checkout, the commit (``+dirty`` when tracked files
differ from it). ``config.json`` records it, so a result can be traced to the code that produced it."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from ctrl_rl import __version__


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """``{"ctrl_rl": version, "git": "abc123def456[+dirty]" or None}`` (None: not a git checkout, or no git)."""
    root = Path(__file__).resolve().parents[2]
    out: dict = {"ctrl_rl": __version__, "git": None}
    if not (root / ".git").exists():  # an installed wheel: the version is all there is
        return out
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # `git status` must not take the index lock of a busy checkout
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10, env=env)
        if sha.returncode == 0 and sha.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                   capture_output=True, text=True, timeout=30, env=env)
            out["git"] = sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out
