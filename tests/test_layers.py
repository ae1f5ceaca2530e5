"""Packages point one way: ground (core, errors, robots) < envs < storage < models (world_models, vla) < algos <
learn < applications (datagen, deploy, plot) < cli.

Every import of the package is parsed, function-local ones included, and an import of a higher layer fails
the test. ``docs/architecture.md`` describes the layers; this test is what holds them.
"""

import ast
from pathlib import Path

import pytest

from ctrl_rl.algos import registry

ROOT = Path(__file__).resolve().parents[1] / "ctrl_rl"

# top-level package or module -> floor. A package lives on one floor; the longest matching prefix wins.
LAYERS = {
    "ctrl_rl": 0, "ctrl_rl.errors": 0, "ctrl_rl.core": 0, "ctrl_rl.robots": 0,
    "ctrl_rl.envs": 1,
    "ctrl_rl.storage": 2,
    "ctrl_rl.world_models": 3, "ctrl_rl.vla": 3,
    "ctrl_rl.algos": 4,
    "ctrl_rl.learn": 5,
    "ctrl_rl.datagen": 6, "ctrl_rl.deploy": 6, "ctrl_rl.plot": 6,
    "ctrl_rl.cli": 7, "ctrl_rl.__main__": 7,
}
NAMES = {0: "ground", 1: "envs", 2: "storage", 3: "models", 4: "algos", 5: "learn", 6: "applications", 7: "cli"}


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ctrl_rl import in the file, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("ctrl_rl")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if mod.startswith("ctrl_rl"):
                # `from ctrl_rl import cli` imports the submodule: judge each imported name
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}".replace(".", "/") and
                        (ROOT.parent / f"{mod}.{a.name}".replace(".", "/")).with_suffix(".py").exists()]
                out += [(node.lineno, s) for s in subs] or [(node.lineno, mod)]
    return out


FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_import_points_up_a_layer(path):
    me = module_name(path)
    mine = layer(me)
    bad = [f"line {ln}: {mod} ({NAMES[layer(mod)]})" for ln, mod in imports(path) if layer(mod) > mine]
    assert not bad, f"{me} ({NAMES[mine]}) imports a higher layer: " + "; ".join(bad)


def package(module: str) -> str:
    """The top-level package (or top-level module) ``module`` belongs to: ``ctrl_rl.learn.offline`` -> ``learn``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ctrl_rl"


def package_graph() -> dict[str, set[str]]:
    """package -> the other packages it imports, counting function-local imports."""
    graph: dict[str, set[str]] = {}
    for path in FILES:
        me = package(module_name(path))
        graph.setdefault(me, set()).update(package(m) for _, m in imports(path) if package(m) not in (me, "ctrl_rl"))
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_cycle_between_top_level_packages():
    graph = package_graph()
    assert {"core", "robots", "envs", "storage", "algos", "learn", "deploy", "cli"} <= set(graph)
    found = cycle(graph)
    assert found is None, "top-level packages import each other in a cycle: " + " -> ".join(found or [])


def test_every_package_lives_on_one_floor():
    """A top-level package is listed whole (a sub-module on another floor would mix two floors in one package)."""
    mixed = sorted(p for p in LAYERS if p.count(".") > 1)
    assert not mixed, f"sub-modules given their own floor: {mixed}"
    unlisted = sorted({f"ctrl_rl.{package(module_name(p))}" for p in FILES} - set(LAYERS) - {"ctrl_rl.ctrl_rl"})
    assert not unlisted, f"top-level packages without a floor: {unlisted}"


def test_the_cycle_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_layer_check_catches_an_upward_import(tmp_path):
    fake = ROOT / "storage" / "_layer_probe_tmp.py"
    fake.write_text("def f():\n    from ctrl_rl.learn.offpolicy import train_offpolicy\n")
    try:
        assert [m for _, m in imports(fake)] == ["ctrl_rl.learn.offpolicy"]
        assert layer("ctrl_rl.learn.offpolicy") > layer(module_name(fake))
    finally:
        fake.unlink()


def test_no_table_of_algorithm_names_outside_the_algorithm_files():
    """learn/ and the CLI read the registry: no string constant equal to an algorithm name appears there."""
    names = set(registry.names())
    files = sorted((ROOT / "learn").rglob("*.py")) + [ROOT / "cli.py"]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found, "algorithm names outside algos/: " + ", ".join(found)
