"""MinAtar (Young & Tian 2019, the ``minatar`` package) as a BatchedEnv: ``minatar:<Game>``.

MinAtar's five games (Asterix, Breakout, Freeway, Seaquest, SpaceInvaders) are small Atari analogues on a 10x10 grid,
the standard small-compute stand-in for Atari. ``MinAtarEnv`` runs N copies of the package's own
``minatar.Environment`` in a Python loop and batches what they return; the game rules are the package's code, so
nothing here re-implements them. A torch-native port was measured against this loop
(experiments/minatar_speed/README.md) before the choice was made.

Conventions of minatar 1.0.15 that this adapter relies on (checked in tests/envs/test_minatar.py):

- ``Environment(game, sticky_action_prob, difficulty_ramping)`` holds one ``numpy.random.RandomState`` that the
  sticky-action draw and, after ``seed(s)``, the game's own randomness (spawns, ball start, car speeds) share.
  Sticky actions (package default ``sticky_action_prob=0.1``): with that probability a step repeats the previous
  action instead of the chosen one. The previous action survives ``reset()`` in the package; here it does too,
  except on a seeded reset, which puts it back to 0 (its value in a new ``Environment``), so that ``reset(seed)``
  starts the same way every time. Difficulty ramping (package default on: Asterix, Seaquest and SpaceInvaders get
  faster as an episode goes on) is the package's; ``difficulty_ramping=false`` turns it off.
- Actions: every game takes MinAtar's six actions ``n l u r d f`` (no-op, left, up, right, down, fire). The agent's
  actions are the game's ``minimal_action_set()`` by default, as the package's ``MinAtar/<Game>-v1`` gymnasium ids
  (and this project's Atari tasks) do: Asterix 5, Breakout 3, Freeway 3, Seaquest 6, SpaceInvaders 4 actions;
  agent action k is MinAtar action ``minimal_action_set()[k]``. ``minimal_action_set=false`` gives all six
  (``Environment.num_actions()``, the ``-v0`` ids and the paper's agents).
- Observations: the game's ``state()`` is a ``[10,10,C]`` bool array (rows, columns, one channel per kind of
  object). Here it is the image part ``image/grid``, uint8 ``[C,10,10]`` (channels first, like every image part
  and the CNN of ``core/encoders.py``), 255 where a cell of that channel is set and 0 elsewhere: the encoder's
  ``x / 255`` then gives the package's 0/1 state exactly, at a quarter of float32's storage. C per game: Asterix 4,
  Breakout 4, Freeway 7, Seaquest 10, SpaceInvaders 6.
- Reward: ``act`` returns the game's score change (an int; Seaquest's surfacing bonus can exceed 1), as float32.
- Termination: ``act``'s terminal flag (Freeway ends itself after 2500 frames). MinAtar has no time limit; this
  adapter truncates at ``max_episode_steps`` (default 27000 steps, the cap the project's Atari tasks use), so that a
  policy that never loses cannot stall an evaluation; ``max_episode_steps=none`` removes it. A terminal state on
  the last allowed step counts as terminated.
- Same-step auto-reset: a copy whose episode ended is reset (``Environment.reset()``) inside the step;
  ``final_obs`` holds its last state and ``obs`` the new episode's first. ``info["elapsed_step"]`` counts the steps
  of the episode each step belongs to.
- Seeding: copy i is seeded with ``seed + i`` (``Environment.seed``) on the first ``reset()`` and on every seeded
  ``reset(seed)``; later resets continue the copies' generators. One MinAtar step is one frame (no frame skip),
  and ``spec.dt`` is 0.0 (the games have no physical time).

Checkpointing is exact: ``state_dict()`` holds every copy's game variables (numbers, lists, arrays as tensors), its
previous action and its generator's state, in a form ``torch.load(weights_only=True)`` reads; a run resumed from it
continues exactly as an uninterrupted one (tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ctrl_rl.core.obs import ObsPart
from ctrl_rl.envs.protocol import EnvSpec, StepOut, action_to_numpy
from ctrl_rl.errors import UserInputError

# The observation part: the game grid, channels first.
IMAGE_PART = "image/grid"

GRID = 10  # MinAtar's grid is 10 x 10 cells


# Per game: the package's module name, its channels (``state_shape()[2]``) and the MinAtar actions of its
# ``minimal_action_set()`` (indices into ``n l u r d f``); static, so ``spec_of`` needs no package, and checked
# against the package in tests/envs/test_minatar.py.
GAMES: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "Asterix": ("asterix", 4, (0, 1, 2, 3, 4)),
    "Breakout": ("breakout", 4, (0, 1, 3)),
    "Freeway": ("freeway", 7, (0, 2, 4)),
    "Seaquest": ("seaquest", 10, (0, 1, 2, 3, 4, 5)),
    "SpaceInvaders": ("space_invaders", 6, (0, 1, 3, 5)),
}

NUM_ACTIONS = 6  # every MinAtar game takes n l u r d f
DEFAULT_MAX_EPISODE_STEPS = 27_000


def minatar_spec(game: str, sticky_action_prob: float = 0.1, difficulty_ramping: bool = True,
                 minimal_action_set: bool = True, max_episode_steps: int | None = DEFAULT_MAX_EPISODE_STEPS
                 ) -> EnvSpec:
    """The spec of ``minatar:<game>`` with these options (module docstring), from the static table: what
    ``MinAtarEnv(game, ...).spec`` is. Options that leave the spec as it is are still checked."""
    _, channels, minimal = _game(game)
    _check_options(game, sticky_action_prob, max_episode_steps)
    return EnvSpec(
        env_id=f"minatar:{game}",
        obs_shape=(),  # no 'state' part: the grid is an image part
        discrete=True,
        action_dim=len(minimal) if minimal_action_set else NUM_ACTIONS,
        dt=0.0,
        max_episode_steps=None if max_episode_steps is None else int(max_episode_steps),
        backend="minatar",
        obs_parts=(ObsPart(IMAGE_PART, (channels, GRID, GRID), torch.uint8),),
    )


class MinAtarEnv:
    """N copies of one MinAtar game stepped as a batch; see the module docstring.

    Args:
        game: ``Asterix``, ``Breakout``, ``Freeway``, ``Seaquest`` or ``SpaceInvaders``.
        num_envs: N.
        device: where returned tensors live (the games run in NumPy on the CPU).
        seed: copy i is seeded with ``seed + i`` on the first ``reset()``.
        sticky_action_prob: probability that a step repeats the previous action (MinAtar's default 0.1).
        difficulty_ramping: the package's difficulty ramp (default on).
        minimal_action_set: the game's minimal action set (default) or all six MinAtar actions.
        max_episode_steps: truncation after this many steps (None: no time limit, as the package).
    """

    def __init__(self, game: str, num_envs: int = 1, device: str | torch.device = "cpu", seed: int = 0,
                 sticky_action_prob: float = 0.1, difficulty_ramping: bool = True, minimal_action_set: bool = True,
                 max_episode_steps: int | None = DEFAULT_MAX_EPISODE_STEPS) -> None:
        self.spec = minatar_spec(game, sticky_action_prob, difficulty_ramping, minimal_action_set, max_episode_steps)
        from minatar import Environment  # after the spec: an unknown game is refused without the package

        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        module, channels, _ = _game(game)
        self._envs = [Environment(module, sticky_action_prob=float(sticky_action_prob),
                                  difficulty_ramping=bool(difficulty_ramping)) for _ in range(self.num_envs)]
        # agent action k -> MinAtar action; the package's own minimal set (the static table is checked against it)
        actions = self._envs[0].minimal_action_set() if minimal_action_set else list(range(NUM_ACTIONS))
        self._actions = np.asarray(actions, dtype=np.int64)  # [A]
        self._limit = max_episode_steps
        self._seed = int(seed)
        self._seed_copies(self._seed)  # one generator per copy from the start (the package's is unseeded)
        self._pending_seed: int | None = self._seed  # the first reset seeds copy i with seed + i
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)  # [N] steps of each copy's episode
        self._grid = np.zeros((self.num_envs, GRID, GRID, channels), dtype=bool)  # [N,10,10,C] scratch

    # ---- the BatchedEnv protocol ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        """Start a new episode in every copy; with a ``seed`` (or on the first reset), copy i is seeded
        with ``seed + i`` and its previous action set back to 0."""
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        if seed is not None:
            self._seed = int(seed)
            self._seed_copies(self._seed)
        for i, env in enumerate(self._envs):
            env.reset()
            self._grid[i] = env.state()
        self._elapsed[:] = 0
        return self._obs(self._grid)

    def step(self, action: torch.Tensor) -> StepOut:
        """One step of every copy, then a same-step reset of the copies whose episode ended."""
        act = self._actions[action_to_numpy(action, self.spec, (self.num_envs,), np.int64)].tolist()  # N MinAtar
        results = [env.act(a) for env, a in zip(self._envs, act)]  # (reward, terminal) of each copy
        np.stack([env.state() for env in self._envs], out=self._grid)  # [N,10,10,C]
        reward = np.array([r for r, _ in results], dtype=np.float32)  # [N]
        terminated = np.array([t for _, t in results], dtype=bool)  # [N]
        self._elapsed += 1
        elapsed = self._elapsed.copy()  # [N]
        truncated = ((elapsed >= self._limit) if self._limit is not None
                     else np.zeros(self.num_envs, dtype=bool)) & ~terminated  # [N]; terminated wins
        final_obs = self._obs(self._grid)
        done = np.flatnonzero(terminated | truncated)
        for i in done:
            env = self._envs[i]
            env.reset()
            self._grid[i] = env.state()
        self._elapsed[done] = 0
        return StepOut(
            obs=self._obs(self._grid) if done.size else {k: v.clone() for k, v in final_obs.items()},
            reward=self._tensor(reward),
            terminated=self._tensor(terminated),
            truncated=self._tensor(truncated),
            final_obs=final_obs,
            info={"elapsed_step": self._tensor(elapsed)},  # steps of the episode this step belongs to
        )

    def close(self) -> None:
        """Nothing to release (the copies are plain Python objects)."""

    # ---- checkpointing (exact) -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every copy's game variables, previous action and generator state, plus the step counters (exact)."""
        return {
            "env_id": self.spec.env_id,
            "backend": "minatar",
            "exact": True,
            "seed": self._seed,
            "pending_seed": self._pending_seed,
            "elapsed_steps": torch.from_numpy(self._elapsed.copy()),
            "copies": [_copy_state(env) for env in self._envs],
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if d.get("env_id") != self.spec.env_id or d.get("backend") != "minatar":
            raise ValueError(f"state_dict is for env {d.get('env_id')!r}, not {self.spec.env_id!r}.")
        copies = d["copies"]
        if len(copies) != self.num_envs:
            raise ValueError(f"state_dict holds {len(copies)} copies of {self.spec.env_id}, expected num_envs="
                             f"{self.num_envs}.")
        for env, s in zip(self._envs, copies):
            _load_copy(env, s)
        self._seed, self._pending_seed = int(d["seed"]), d["pending_seed"]
        self._elapsed = d["elapsed_steps"].numpy().astype(np.int64, copy=True)  # [N]

    # ---- helpers -------------------------------------------------------------------------------

    def _seed_copies(self, seed: int) -> None:
        for i, env in enumerate(self._envs):
            env.seed(seed + i)  # one RandomState for the sticky draw and the game
            env.last_action = 0

    def _obs(self, grid: np.ndarray) -> dict[str, torch.Tensor]:
        """``{"image/grid": uint8 [N,C,10,10]}`` (0 or 255) from the ``[N,10,10,C]`` bool grids, an owned copy."""
        image = np.multiply(grid.transpose(0, 3, 1, 2), np.uint8(255), dtype=np.uint8)  # [N,C,10,10]
        return {IMAGE_PART: self._tensor(image)}

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device)

    def __repr__(self) -> str:
        return f"MinAtarEnv({self.spec.env_id!r}, num_envs={self.num_envs}, device={str(self.device)!r})"


def _game(game: str) -> tuple[str, int, tuple[int, ...]]:
    if game not in GAMES:
        from ctrl_rl.envs.backends import unknown_env

        raise unknown_env(f"minatar:{game}", [f"minatar:{g}" for g in GAMES],
                          expected=f"one of {', '.join('minatar:' + g for g in GAMES)}")
    return GAMES[game]


def _check_options(game: str, sticky_action_prob: float, max_episode_steps: int | None) -> None:
    if not 0.0 <= float(sticky_action_prob) <= 1.0:
        raise UserInputError(f"sticky_action_prob={sticky_action_prob!r} for minatar:{game}: expected a probability "
                             "in [0, 1].")
    if max_episode_steps is not None and (isinstance(max_episode_steps, bool) or int(max_episode_steps) < 1):
        raise UserInputError(f"max_episode_steps={max_episode_steps!r} for minatar:{game}: expected a positive "
                             "integer or none.")


# ---- a copy's state as weights_only-loadable values -------------------------------------------------------------


def _plain(x: Any) -> Any:
    """A game variable as values ``torch.load(weights_only=True)`` reads: arrays become tensors (dtype kept),
    NumPy scalars Python numbers, lists and dicts recursively; anything else as it is."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _unplain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.numpy().copy()
    if isinstance(x, list):
        return [_unplain(v) for v in x]
    if isinstance(x, dict):
        return {k: _unplain(v) for k, v in x.items()}
    return x


def _copy_state(env: Any) -> dict[str, Any]:
    """One ``minatar.Environment``: its game's variables (without the generator), its previous action and the
    state of the one generator it shares with its game (``_seed_copies`` made it shared)."""
    kind, keys, pos, has_gauss, cached = env.random.get_state()
    return {
        "game": {k: _plain(v) for k, v in vars(env.env).items() if k != "random"},
        "last_action": int(env.last_action),
        "rng": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }


def _load_copy(env: Any, s: dict[str, Any]) -> None:
    rng = np.random.RandomState()
    r = s["rng"]
    rng.set_state((r["kind"], r["keys"].numpy().astype(np.uint32), r["pos"], r["has_gauss"], r["cached_gaussian"]))
    env.random = env.env.random = rng
    for k, v in s["game"].items():
        setattr(env.env, k, _unplain(v))
    env.last_action = int(s["last_action"])
