"""``--seeds``: several seeds of one run trained in one process, one run directory each (``core.seeds`` batches
their networks; the loop of the run's regime drives them).

A seeds-run ``DIR`` holds ``seeds.json`` (the algorithm, the seeds and their directories) and one directory per seed,
``DIR/seed_<K>``, each a complete run of its own (config.json with ``seed`` K, metrics, checkpoints) that
summaries, ``ctrl-rl export``, ``ctrl-rl eval`` and ``--resume`` read like any run; at a fixed ``--threads`` its
parameters and metrics are bit for bit those of the run ``--seed K`` alone. ``ctrl-rl train ALGO --resume DIR``
continues every seed.

Shape letters: S seeds, B batch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.obs import obs_cat, obs_map
from ctrl_rl.core.seeds import SeedGenerators, unstack
from ctrl_rl.core.types import Transition
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import global_rng_state, set_global_rng_state
from ctrl_rl.storage.replay import ReplayBuffer

RECORD = "seeds.json"


def check_seeds(seeds: Sequence[int], entry: Any, cfg: Any) -> None:
    """``--seeds`` names two or more distinct seeds of an algorithm whose entry has a seed layout and whose config
    the layout can batch; else one sentence naming what was expected."""
    if entry.seed_layout is None:
        able = [e.name for e in registry.entries() if e.seed_layout is not None]
        raise UserInputError(f"--seeds is not available for {entry.name!r}: expected one of {able}, or one "
                             "process per seed with --seed K")
    if len(seeds) < 2:
        raise UserInputError(f"--seeds got {list(seeds)}: expected two or more seeds (one seed is --seed K)")
    if len(set(seeds)) != len(seeds):
        dup = sorted({s for s in seeds if list(seeds).count(s) > 1})
        raise UserInputError(f"--seeds names seed {dup[0]} more than once: expected distinct seeds")
    why = entry.seed_layout.refuse(cfg) if entry.seed_layout.refuse is not None else None
    if why is not None:
        raise UserInputError(f"--seeds cannot train {entry.name!r} with {why}: expected one process per seed "
                             "with --seed K for that setting")


def seed_dir(parent: Path, seed: int) -> Path:
    return Path(parent) / f"seed_{seed}"


def seed_runs(run: Any, parent: Path, seeds: Sequence[int]) -> list[Any]:
    """The run of each seed: ``run`` with its ``seed`` and its own directory."""
    return [dataclasses.replace(run, seed=s, run_dir=str(seed_dir(parent, s))) for s in seeds]


def write_record(parent: Path, algo: str, seeds: Sequence[int]) -> None:
    """``seeds.json``: what ties the seed directories of one seeds-run together."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    record = {"algo": algo, "seeds": list(seeds), "runs": [seed_dir(Path("."), s).name for s in seeds]}
    (Path(parent) / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def read_record(parent: Path) -> dict | None:
    """The seeds-run record of ``parent``, or None where ``parent`` is not a seeds-run."""
    path = Path(parent) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        seeds = [int(s) for s in record["seeds"]]
        return {"algo": str(record["algo"]), "seeds": seeds}
    except (ValueError, KeyError, TypeError):
        raise UserInputError(f"{str(path)!r} is not a seeds-run record: expected the seeds.json `ctrl-rl train "
                             "--seeds` writes") from None


def sample_seeds(sampler: Any, batch_size: int, gens: Sequence[torch.Generator]) -> Transition:
    """One batch per seed, each drawn with its seed's generator exactly as ``sampler.sample(batch_size, gen)`` draws
    it alone, stacked to ``[S,B,...]`` (a replay buffer: the seeds' indices gathered in one indexed copy per field;
    another sampler's batches field by field, of their own Transition class, e.g. Cal-QL's with ``mc_return``)."""
    if isinstance(sampler, ReplayBuffer):
        idx = torch.stack([sampler.sample_indices(batch_size, g) for g in gens])  # [S,B]
        return sampler.gather(idx)
    return stack_batches([sampler.sample(batch_size, g) for g in gens])


def stack_batches(parts: Sequence[Any]) -> Any:
    """The seeds' batches (one Transition class, ``[B,...]`` each) stacked field by field to ``[S,B,...]``."""
    def stack(name: str) -> Any:
        values = [getattr(p, name) for p in parts]
        if values[0] is None:  # an optional field left unset (Transition.discount of one-step batches)
            return None
        if name in ("obs", "next_obs"):  # a tensor or a dict of parts
            return obs_cat([obs_map(lambda t: t.unsqueeze(0), o) for o in values])  # [S,B,...]
        return torch.stack(values)  # [S,B,...]

    return type(parts[0])(**{f.name: stack(f.name) for f in dataclasses.fields(parts[0])})


class SeedSamplers:
    """Each seed's own sampler (an online run's replay buffer, or its mix with offline data) as one sampler of a
    seeds-run: ``sample(B, gens)`` with the seed-batched algorithm's ``gen`` (``core.seeds.SeedGenerators``) draws
    seed k's batch from seed k's sampler with seed k's generator, exactly as its run alone draws it, and stacks
    them ``[S,B,...]``; so an entry's ``update_step`` runs unchanged on the batched algorithm."""

    def __init__(self, samplers: Sequence[Any]):
        self.samplers = list(samplers)

    def sample(self, batch_size: int, generator: SeedGenerators) -> Any:
        assert len(generator) == len(self.samplers), "one generator per seed's sampler"
        return stack_batches([s.sample(batch_size, g) for s, g in zip(self.samplers, generator.gens)])


def split_info(info: dict[str, torch.Tensor], seeds: int) -> list[dict[str, torch.Tensor]]:
    """A seed-batched update's info (``[S]`` values, or one value for all) as one info dict per seed."""
    columns = {k: list(unstack(v, seeds)) for k, v in info.items()}
    return [{k: col[i] for k, col in columns.items()} for i in range(seeds)]


class OwnRNG:
    """A seed's global RNG state (Python, NumPy, torch), swapped in around what may draw from it (evaluation,
    checkpoints, which record it), so each seed's checkpoint holds the state its run alone would have."""

    def __init__(self) -> None:
        self.state = global_rng_state()

    def __enter__(self) -> OwnRNG:
        self.outer = global_rng_state()
        set_global_rng_state(self.state)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.state = global_rng_state()
        set_global_rng_state(self.outer)
