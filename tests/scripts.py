"""The experiments/ scripts imported as modules in tests (they are scripts, not a package)."""

import importlib.util
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
