"""d4rl stand-in for the official NeuBay code: ``import d4rl`` registers the ``<task>-<level>-v5`` ids in gym 0.23's
registry, each a Gymnasium v5 task whose ``get_dataset()`` reads ctrl_rl's D4RL-layout file (neubay_shim)."""

from neubay_shim import register

register()
