"""Algorithms, one file each; importing this package registers every built-in algorithm
(``ctrl_rl.algos.registry``). Adding one: a file here that calls ``register(AlgoEntry(...))``, listed below."""

from ctrl_rl.algos import (  # noqa: F401  (each registers itself)
    cql,
    domo_ac,
    dynamics,
    impala,
    iql,
    mbpo,
    mopo,
    neubay,
    ppo,
    ravl,
    sac,
    sac_flow,
    vla_bc,
    vla_habc,
    vla_rl,
    wsrl,
)
