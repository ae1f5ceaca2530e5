"""The algorithm contract, checked once for every registered algorithm (d3rlpy's shared ``algo_tester`` is the model).

Each entry is built from its defaults (with a regime's size overrides, e.g. the VLAs' tiny chunk and LoRA) on a
tiny spec of its regime and given a synthetic batch of its regime's data flow; then: the object satisfies
``ctrl_rl.core.protocols.Algorithm`` (a dynamics model: ``DynamicsModel``), one update gives finite 0-d tensors and
moves parameters, ``state_dict`` round-trips bit-identically (a copy built with another seed, loaded, continues with
the same update), and the exported module (``deploy.export.ExportModule`` through ``torch.export``, fed as the
deployment runtime feeds it: an instruction as prompt token ids) gives the eager policy's deterministic action (a
chunk policy: the chunk's first action).

A new regime needs a ``Case`` below: ``test_every_registered_algorithm_has_a_case`` fails until it has one.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.core.obs import ObsPart
from ctrl_rl.core.protocols import Algorithm, ChunkPolicy, LanguagePolicy, Recurrent
from ctrl_rl.core.types import Rollout, Transition
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.storage.datasets.offline import OfflineDataset, to_replay
from ctrl_rl.storage.tapes import TapeBatch
from ctrl_rl.world_models.protocol import DynamicsModel
from tests.algos.test_neubay import A as NEUBAY_A
from tests.algos.test_neubay import O as NEUBAY_O
from tests.algos.test_neubay import tape_batch

NAMES = {"calql", "cql", "domo_ac", "dynamics", "impala", "iql", "mbpo", "mopo", "neubay", "ppo", "ravl", "rlpd", "sac",
         "sac_flow", "sac_flow_o2o", "vla_bc", "vla_habc", "vla_rl", "wsrl"}

O, A, B = 3, 2, 16
FLAT = EnvSpec("contract:Flat", (O,), False, A, (-1.0,) * A, (1.0,) * A, dt=0.05, max_episode_steps=50)
DISCRETE = EnvSpec("contract:Discrete", (O,), True, 3, dt=0.05, max_episode_steps=50)
L, HW = 24, (16, 16)  # instruction bytes, camera image size
VLA = EnvSpec("contract:VLA", (O,), False, A, (-1.0,) * A, (1.0,) * A, dt=0.05, max_episode_steps=50,
              obs_parts=(ObsPart("state", (O,), torch.float32), ObsPart("image/cam", (3, *HW), torch.uint8),
                         ObsPart("language", (L,), torch.int64)))
"""Images, an instruction and a state, as ``tests/vla/test_vla.py``'s manipulation env (a tiny one)."""
VLA_SIZE = {"chunk": 2, "max_text_len": 8, "lora_rank": 2, "flow_steps": 2, "proprio_columns": "0:3",
            "critic_hidden": (16,), "habc_warmup": 0, "ppo_epochs": 1, "value_epochs": 1, "sil_coef": 0.5,
            "sil_steps": 1}
"""The VLA entries' fields set for speed and coverage (a field an entry does not have is left out)."""
INSTRUCTION = "put the cube in the bowl"
VB = 4  # VLA batch rows


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def transitions(spec: EnvSpec, seed: int, n: int = B) -> Transition:
    g = _g(seed)
    return Transition(torch.randn(n, O, generator=g), torch.rand(n, A, generator=g) * 2 - 1,
                      torch.randn(n, generator=g), torch.randn(n, O, generator=g),
                      torch.rand(n, generator=g) < 0.1, torch.zeros(n, dtype=torch.bool))


class Sampler:
    """The replay interface an ``update_step`` draws from: fresh synthetic transitions per call, from the seed."""

    def __init__(self, spec: EnvSpec, seed: int):
        self.spec, self.seed = spec, seed

    def sample(self, n: int, generator: torch.Generator | None = None) -> Transition:
        self.seed += 1
        return transitions(self.spec, self.seed, n)


def rollout(spec: EnvSpec, seed: int, T: int = 4, N: int = 4) -> Rollout:
    g = _g(seed)
    action = (torch.randint(0, spec.action_dim, (T, N), generator=g) if spec.discrete
              else torch.randn(T, N, A, generator=g).clamp(-1, 1))
    done = torch.rand(T, N, generator=g) < 0.1
    return Rollout(torch.randn(T, N, O, generator=g), action, torch.randn(T, N, generator=g) - 1.0,
                   torch.randn(T, N, generator=g), done, torch.zeros(T, N, dtype=torch.bool),
                   torch.randn(T, N, O, generator=g))


def tapes(spec: EnvSpec, seed: int) -> TapeBatch:
    """NeuBay's synthetic tapes (tests/algos/test_neubay.py: four tapes, some rows real), observation and action
    sizes as here."""
    assert (spec.obs_dim, spec.action_dim) == (NEUBAY_O, NEUBAY_A)
    return tape_batch(seed=seed)


@dataclass
class Case:
    """How to test one regime: the spec, the config fields it sets, and one update from a seed."""

    spec: EnvSpec
    update: Callable[[registry.AlgoEntry, Any, Any, int], dict]
    """``update(entry, algo, config, seed) -> info``: one update on synthetic data made from ``seed``."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Config fields set on every entry of the regime that has them."""


def _entry_step(entry, algo, cfg, seed):
    return entry.update_step(algo, Sampler(FLAT, seed), B, cfg)


def _dataset(seed: int, n: int = 40) -> OfflineDataset:
    """Two episodes of ``n // 2`` synthetic steps, the first cut by a time limit, the second by termination."""
    t = transitions(FLAT, seed, n)
    terminated, truncated = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    truncated[n // 2 - 1], terminated[n - 1] = True, True
    return OfflineDataset(t.obs, t.action, t.reward, t.next_obs, terminated, truncated,
                          torch.tensor([0, n // 2, n]), torch.ones(n, dtype=torch.bool))


def _offline(entry, algo, cfg, seed):
    """The offline loop's data path: a dataset into the replay buffer, the entry's ``prepare_offline``, its step."""
    data = _dataset(seed)
    sampler: Any = to_replay(data, torch.device("cpu"))
    if entry.prepare_offline is not None:  # Cal-QL's Monte-Carlo returns, IQL's reward scale
        sampler, _ = entry.prepare_offline(data, sampler, cfg)
    return entry.update_step(algo, sampler, B, cfg)


def vla_obs(g: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    """Env-form observations of ``VLA``: the instruction as UTF-8 bytes + 1, 0-padded."""
    text = torch.zeros(L, dtype=torch.int64)
    raw = torch.tensor(list(INSTRUCTION.encode()), dtype=torch.int64) + 1
    text[: len(raw)] = raw
    return {"state": torch.randn(n, O, generator=g),
            "image/cam": torch.randint(0, 256, (n, 3, *HW), generator=g, dtype=torch.uint8),
            "language": text.expand(n, L).clone()}


def demonstrations(g: torch.Generator, n: int, H: int) -> dict:
    """A demonstration batch (``vla.data.Demos.batch``) of n frames with chunks of H actions."""
    obs = vla_obs(g, n)
    return {"images": {"image/cam": obs["image/cam"]}, "proprio": torch.randn(n, O, generator=g),
            "chunk": torch.rand(n, H, A, generator=g) * 2 - 1, "task_index": torch.zeros(n, dtype=torch.int64),
            "instructions": [INSTRUCTION], "critic_state": torch.randn(n, 5, generator=g),
            "next_critic_state": torch.randn(n, 5, generator=g), "last": torch.rand(n, generator=g) < 0.2,
            "steps_to_end": torch.randint(0, 10, (n,), generator=g), "intervention": torch.rand(n, generator=g) < 0.2,
            "success": torch.rand(n, generator=g) < 0.5}


def _demonstrations(entry, algo, cfg, seed):
    return algo.update(demonstrations(_g(seed), VB, cfg.chunk))


def _chunk_rollouts(entry, algo, cfg, seed, T=2, N=2):
    """A rollout of T chunks in N envs sampled by the algorithm itself (as ``vla.rollouts.ChunkCollector`` does),
    with synthetic rewards and ends, and the demonstration and own-success batches the algorithm reads."""
    g = _g(seed)
    obs = vla_obs(g, T * N)
    x, stored, logp, value = algo.sample_chunk(obs)  # [S,H,A], -, [S], [S]
    ro = {"obs": obs, "stored": stored, "log_prob": logp, "value": value.view(T, N),
          "reward": torch.randn(T, N, generator=g), "raw_reward": torch.randn(T, N, generator=g),
          "ended": torch.rand(T, N, generator=g) < 0.3, "actions": algo.to_actions(x),
          "last_value": algo.state_value(torch.randn(N, O, generator=g)),
          "succeeded": torch.rand(T * N, generator=g) < 0.5}
    count = algo.batches_per_update()
    own = None
    if count["own"]:
        own = {"obs": vla_obs(g, count["own"] * VB), "chunk": torch.rand(count["own"] * VB, cfg.chunk, A, generator=g)}
    return algo.update({"rollout": ro, "demos": demonstrations(g, count["demos"] * VB, cfg.chunk), "own": own})


CASES: dict[str, Case] = {
    "on-policy": Case(FLAT, lambda e, a, c, s: a.update(rollout(FLAT, s, T=c.rollout_steps, N=4))),
    "off-policy": Case(FLAT, _entry_step),
    "offline-to-online": Case(FLAT, _entry_step),
    "offline": Case(FLAT, _offline),
    # the model-based loop's collector: flat transitions (the default), or episode tapes (``collector="tapes"``)
    "model-based": Case(FLAT, lambda e, a, c, s: a.update(tapes(FLAT, s) if e.collector == "tapes"
                                                          else transitions(FLAT, s))),
    "actor-learner": Case(DISCRETE, lambda e, a, c, s: a.update(rollout(DISCRETE, s))),
    "demonstrations": Case(VLA, _demonstrations, overrides=VLA_SIZE),
    "chunk-rollouts": Case(VLA, _chunk_rollouts, overrides=VLA_SIZE),
}


def _entries(regime_filter=None) -> list[registry.AlgoEntry]:
    return [e for e in registry.entries() if regime_filter is None or regime_filter(e.regime)]


ALGOS = [e.name for e in _entries(lambda r: r in CASES)]


def test_the_registry_holds_exactly_the_known_algorithms():
    assert set(registry.names()) == NAMES


def test_every_registered_algorithm_has_a_case():
    """Every algorithm but the dynamics model (a ``DynamicsModel``, checked below) meets the contract."""
    uncovered = {e.name: e.regime for e in registry.entries() if e.regime not in CASES and e.regime != "world-model"}
    assert not uncovered, f"algorithms whose regime has no contract case: {uncovered}"


def build(name: str, seed: int = 0):
    entry = registry.get(name)
    case = CASES[entry.regime]
    fields = {f.name for f in dataclasses.fields(entry.config)}
    cfg = entry.default_config(**{k: v for k, v in case.overrides.items() if k in fields})
    torch.manual_seed(seed)
    algo = entry.make(cfg, case.spec, torch.device("cpu"), _g(seed))
    return entry, cfg, case, algo


def tensors(state: Any, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a (nested) state dict by its path."""
    if isinstance(state, torch.Tensor):
        return {path: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    return {p: t for k, v in items for p, t in tensors(v, f"{path}/{k}").items()}


def plain(state: Any) -> Any:
    """The non-tensor leaves of a state dict (counters, settings), for equality."""
    if isinstance(state, dict):
        return {k: plain(v) for k, v in state.items() if not isinstance(v, torch.Tensor)}
    if isinstance(state, (list, tuple)):
        return [plain(v) for v in state if not isinstance(v, torch.Tensor)]
    return state


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype
                                        and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ALGOS)
def test_one_update_gives_finite_tensors_and_moves_parameters(name):
    entry, cfg, case, algo = build(name)
    assert isinstance(algo, Algorithm), f"{name} does not satisfy the Algorithm protocol"
    before = {k: t.clone() for k, t in tensors(algo.state_dict()).items()}
    info = case.update(entry, algo, cfg, 1)
    assert info and all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in info.values()), \
        f"{name}.update must return 0-d tensors: {[(k, type(v).__name__) for k, v in info.items()]}"
    bad = [k for k, v in info.items() if not bool(torch.isfinite(v.float()))]
    assert not bad, f"{name}: non-finite {bad}"
    assert algo.parameters_finite()
    after = tensors(algo.state_dict())
    assert before.keys() <= after.keys(), (f"{name}: the update dropped state entries "
                                           f"{sorted(before.keys() - after.keys())}")
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved, f"{name}: one update changed no tensor of its state"


@pytest.mark.parametrize("name", ALGOS)
def test_state_dict_round_trips_bit_identically(name):
    entry, cfg, case, algo = build(name, seed=0)
    case.update(entry, algo, cfg, 1)  # optimizer moments and counters are not at their initial values
    state = algo.state_dict()
    _, _, _, other = build(name, seed=7)
    other.load_state_dict(copy.deepcopy(state))
    assert same(tensors(other.state_dict()), tensors(state)) and plain(other.state_dict()) == plain(state)
    other.gen.set_state(algo.gen.get_state())
    rng = torch.get_rng_state()
    info_a = case.update(entry, algo, cfg, 2)
    torch.set_rng_state(rng)
    info_b = case.update(entry, other, cfg, 2)
    assert same(info_a, info_b), f"{name}: the loaded copy's update differs"
    assert same(tensors(algo.state_dict()), tensors(other.state_dict())), f"{name}: the loaded copy diverged"


@pytest.mark.parametrize("name", ALGOS)
def test_the_exported_module_gives_the_eager_deterministic_action(name, tmp_path):
    from ctrl_rl.deploy.export import ExportModule, example_inputs
    from ctrl_rl.deploy.runtime import Prompter

    entry, cfg, case, algo = build(name)
    case.update(entry, algo, cfg, 1)
    spec = env_spec = case.spec
    policy = algo.exportable().eval()
    chunk = isinstance(policy, ChunkPolicy)  # emits [B,H,A] and keeps its own queue: no hidden-state inputs
    recurrent = isinstance(algo, Recurrent) and not chunk
    args = example_inputs(spec, 3, _g(5), policy.initial_hidden(1) if recurrent else None)
    obs: Any = args[0] if spec.is_flat else dict(zip([p.name for p in spec.parts], args))
    language = policy.language_input() if isinstance(policy, LanguagePolicy) else None
    if language is not None:  # the graph takes prompt token ids: the runtime's Prompter makes them from the bytes
        policy.save_tokenizer(tmp_path)
        obs = {**obs, "language": vla_obs(_g(6), 3)["language"]}
        prompter = Prompter(tmp_path, language)
        ids = torch.from_numpy(np.stack([prompter(row) for row in obs["language"].numpy()]))  # [3,Lt]
        parts = tuple(ObsPart("language", (language["max_length"],), torch.int64) if p.name == "language" else p
                      for p in spec.parts)
        spec = dataclasses.replace(spec, obs_parts=parts)
        args = tuple(ids if p.name == "language" else obs[p.name] for p in spec.parts)
    module = ExportModule(policy, spec, recurrent, env_spec).eval()
    with torch.no_grad():
        want = module(*args)
        got = torch.export.export(module, tuple(args), strict=False).module()(*args)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    if not recurrent:
        if isinstance(algo, Recurrent):  # a chunk queue: fresh episodes plan their first chunk
            algo.reset_state(3)
        with torch.no_grad():
            eager = algo.act(obs, deterministic=True)
        first = want[0][:, 0] if chunk else want[0]  # a chunk policy acts with its chunk's first action
        if spec.discrete:
            assert torch.equal(first, eager)
        else:  # the module maps [-1, 1] to the env's bounds, which are [-1, 1] here
            torch.testing.assert_close(first, eager.clamp(-1, 1), atol=1e-5, rtol=0)


def test_a_dynamics_model_meets_its_contract():
    entry = registry.get("dynamics")
    model = entry.make(entry.default_config(), FLAT, torch.device("cpu"), _g(0))
    assert isinstance(model, DynamicsModel) and not isinstance(model, Algorithm)
    step = model.predict(torch.randn(5, O), torch.rand(5, A) * 2 - 1, generator=_g(1))
    assert step.next_obs.shape == (5, O) and step.reward.shape == (5,)
    assert torch.isfinite(step.next_obs).all() and torch.isfinite(step.reward).all()
    other = entry.make(entry.default_config(), FLAT, torch.device("cpu"), _g(3))
    other.load_state_dict(model.state_dict())
    assert same(tensors(other.state_dict()), tensors(model.state_dict()))


def test_the_contract_test_catches_an_update_that_returns_floats():
    entry, cfg, case, algo = build("sac")
    real = algo.update
    algo.update = lambda batch: {k: float(v) for k, v in real(batch).items()}
    with pytest.raises(AssertionError, match="0-d tensors"):
        info = case.update(entry, algo, cfg, 1)
        assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in info.values()), "0-d tensors"
