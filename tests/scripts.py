"""The experiments/ scripts imported as modules in tests (they are scripts, not a package)."""

import importlib.util
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def experiment_script(relpath: str, name: str):
    """Import ``ROOT/relpath`` as module ``name``, registered in ``sys.modules`` while in use (dataclasses look their
    module up by name) and removed afterwards."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(name, None)


def plain_iqm(values: dict[str, list[float]]) -> dict[str, dict]:
    """Stands in for experiments/common.py's ``iqm_ci`` where rliable (the bench extra's) is not installed: the plain
    mean, the range as the interval, the same keys."""
    return {k: {"iqm": sum(v) / len(v), "ci95": [min(v), max(v)], "seeds": len(v)} for k, v in values.items() if v}


def cli(*args, cwd=ROOT, timeout=300) -> subprocess.CompletedProcess:
    """``python -m ctrl_rl ARGS`` in a subprocess (matplotlib headless), its output captured."""
    return subprocess.run([sys.executable, "-m", "ctrl_rl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "MPLBACKEND": "Agg"})


def local_references(monkeypatch, path: Path, scores: dict[str, tuple[float, float]]) -> Path:
    """Local reference scores (task -> (random, expert)) written to ``path`` and made the ones ``"local"`` reads for
    this test (tests/conftest.py points the default elsewhere, so no test depends on what another one generated)."""
    from ctrl_rl.storage.datasets.scores import LOCAL_REFS_ENV, ReferenceScores, save_local_references

    monkeypatch.setenv(LOCAL_REFS_ENV, str(path))
    return save_local_references({k: ReferenceScores(r, e) for k, (r, e) in scores.items()}, path, source="test")
