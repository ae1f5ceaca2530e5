"""The ``storage/datasets/lerobot`` sub-package points one way: layout, robot < video < reader, writer.

Every ctrl_rl import of each module is parsed, function-local ones included (``tests/test_layers.py``'s parser walks
the whole syntax tree), and an import of a sibling that is not below it fails: the reader and the writer may use the
layout and the video codec, never each other; no module imports the package itself (whose ``__init__`` imports
them all). The flat ``lerobot*.py`` modules it replaced do not come back beside it.
"""

from pathlib import Path

import pytest

from tests.test_layers import ROOT, imports

PACKAGE = "ctrl_rl.storage.datasets.lerobot"
DIR = ROOT / "storage" / "datasets" / "lerobot"
MAY_IMPORT = {
    "layout": set(),
    "robot": set(),
    "video": {"layout"},
    "reader": {"layout", "video", "robot"},
    "writer": {"layout", "video"},
}
"""Each module -> the siblings it may import (the order the package docstring draws)."""


def siblings(path: Path) -> list[tuple[int, str]]:
    """(line, sibling) of every import of the package or one of its modules in ``path``; the package itself is
    named ``__init__``."""
    out = []
    for line, mod in imports(path):
        if mod == PACKAGE:
            out.append((line, "__init__"))
        elif mod.startswith(PACKAGE + "."):
            out.append((line, mod[len(PACKAGE) + 1:].split(".")[0]))
    return out


def test_every_module_has_a_place_in_the_order():
    assert {p.stem for p in DIR.glob("*.py")} - {"__init__"} == set(MAY_IMPORT)
    assert not sorted(p.name for p in DIR.parent.glob("lerobot*.py"))  # no flat module or shim beside the package


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_no_module_imports_a_sibling_above_or_beside_it(name):
    bad = [f"line {line}: {sib}" for line, sib in siblings(DIR / f"{name}.py") if sib not in MAY_IMPORT[name]]
    assert not bad, f"{PACKAGE}.{name} may import only {sorted(MAY_IMPORT[name]) or 'no sibling'}: " + "; ".join(bad)


def test_the_check_sees_the_imports_that_are_there():
    """Not vacuous: the reader's and the writer's imports of the layout and the codec are found."""
    assert {sib for _, sib in siblings(DIR / "reader.py")} == {"layout", "video", "robot"}
    assert {sib for _, sib in siblings(DIR / "writer.py")} == {"layout", "video"}
    assert {sib for _, sib in siblings(DIR / "__init__.py")} == {"reader", "video", "writer"}
