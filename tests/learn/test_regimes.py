"""Regimes are registered objects: every algorithm names a registered regime, each regime's name is written once
(where its loop registers it), and ``train`` dispatches through the registry."""

import ast
from pathlib import Path

import pytest

from ctrl_rl.algos import registry
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.regimes import Regime, get_regime, regimes

ROOT = Path(__file__).resolve().parents[2] / "ctrl_rl"


def test_every_algorithm_names_a_registered_regime_and_every_regime_has_a_loop_config():
    names = {r.name for r in regimes()}
    assert {e.regime for e in registry.entries()} <= names
    for r in regimes():
        assert isinstance(r, Regime) and r.summary and callable(r.train)
        r.loop_config()  # every loop config builds from its defaults
        for cls in r.collectors.values():
            cls()
    for e in registry.entries():  # an entry's collector is one its regime offers (None: the default)
        assert get_regime(e.regime).loop_config_for(e.collector)


def test_each_regime_name_is_written_once_outside_the_algorithm_files():
    names = {r.name for r in regimes()}
    found: dict[str, list[str]] = {n: [] for n in names}
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent.name == "algos":  # an entry names its regime: that is the reference, not a table
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found[node.value].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    twice = {n: where for n, where in found.items() if len(where) != 1}
    assert not twice, f"regime names written in several places (or none): {twice}"


def test_an_unknown_regime_is_one_sentence():
    with pytest.raises(UserInputError, match=r"unknown regime 'of-policy' \(did you mean 'off-policy'\?\)"):
        get_regime("of-policy")
