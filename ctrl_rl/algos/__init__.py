"""Algorithms, one file each; importing this package registers every built-in algorithm
(``ctrl_rl.algos.registry``). Adding one: a file here that calls ``register(AlgoEntry(...))``, listed below."""

from ctrl_rl.algos import cql, domo_ac, dynamics, impala, iql, mbpo, mopo, neubay, ppo, ravl, sac, sac_flow, vla, wsrl  # noqa: F401,E501  (each registers itself)
