"""MinAtar env-steps/s: the batched ``minatar:<Game>`` env (envs/minatar.py) against the package's own single env
stepped in a Python loop, and a torch-native port of Breakout as the probe that decided between the two designs
(issue: DoMo-AC where it differs from IMPALA, the MinAtar bullet: "numpy or torch-native batching, whichever is
faster").

For N = 1, 16, 128 copies and each game, the median over 3 repeats of env-steps/s (N x batched steps / seconds)
of:

- ``package``: N ``minatar.Environment`` objects, each ``act(a)`` then ``state()`` (``reset()`` where an episode
  ended), in a Python loop: the floor any wrapper of the package pays;
- ``batched``: ``make_env("minatar:<Game>", N).step(actions)``, the package loop plus the batched uint8 image, the
  tensors, the same-step reset bookkeeping;
- ``torch`` (Breakout only): ``TorchBreakout`` below, Breakout's rules written as [N] tensor operations with sticky
  actions, the observation image and same-step auto-reset. Before timing, its steps are checked against the
  package's: both are put in the same game state and stepped with the same action (sticky actions off, since the
  two cannot draw the same random numbers), for 3000 steps over many episodes.

Breakout is also measured at N = 1024 (``--large``), where the torch port's per-call cost is spread over more copies.
Uniform random actions, one torch thread, CPU. Writes minatar_speed.json and .md beside this script.

    python experiments/minatar_speed/minatar_speed.py [--steps 8000] [--repeats 3] [--large 1024]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py
from common import git_commit, write_result  # noqa: E402

from ctrl_rl.envs.minatar import GAMES  # noqa: E402
from ctrl_rl.envs.registry import make_env  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this benchmark's folder: its results live beside the script
SIZES = (1, 16, 128)


class TorchBreakout:
    """MinAtar Breakout for N copies as [N] tensors (a speed probe: sticky actions, the [N,4,10,10] uint8 image and
    same-step auto-reset included; MinAtar's actions n l u r d f; no seeding API or checkpoints)."""

    DX = torch.tensor([-1, 1, 1, -1])  # ball direction 0..3 -> column step
    DY = torch.tensor([-1, -1, 1, 1])  # -> row step
    FLIP_X = torch.tensor([1, 0, 3, 2])  # off a side wall
    FLIP_Y = torch.tensor([3, 2, 1, 0])  # off the top, a brick, or the paddle under the ball
    FLIP_XY = torch.tensor([2, 3, 0, 1])  # off the paddle's corner

    def __init__(self, n: int, sticky: float = 0.1, seed: int = 0):
        self.n, self.sticky = n, sticky
        self.gen = torch.Generator().manual_seed(seed)
        self.rows = torch.arange(n)  # [N]
        self.last_action = torch.zeros(n, dtype=torch.int64)  # [N]
        self.reset_where(torch.ones(n, dtype=torch.bool))

    def reset_where(self, mask: torch.Tensor) -> None:
        right = torch.randint(2, (self.n,), generator=self.gen).bool()  # [N] the ball starts on the right
        fresh = {"ball_y": torch.full((self.n,), 3), "ball_x": right * 9, "dir": 2 + right.long(),
                 "pos": torch.full((self.n,), 4), "strike": torch.zeros(self.n, dtype=torch.bool)}
        fresh["last_x"], fresh["last_y"] = fresh["ball_x"], fresh["ball_y"]
        for k, v in fresh.items():
            setattr(self, k, torch.where(mask, v, getattr(self, k)) if hasattr(self, k) else v)
        bricks = torch.zeros(self.n, 10, 10, dtype=torch.bool)  # [N,10,10]
        bricks[:, 1:4] = True
        self.brick = torch.where(mask[:, None, None], bricks, self.brick) if hasattr(self, "brick") else bricks

    def observe(self) -> torch.Tensor:
        img = torch.zeros(self.n, 4, 10, 10, dtype=torch.uint8)  # [N,C,10,10]
        img[self.rows, 0, 9, self.pos] = 255
        img[self.rows, 1, self.ball_y, self.ball_x] = 255
        img[self.rows, 2, self.last_y, self.last_x] = 255
        img[:, 3] = self.brick * 255
        return img

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``action`` [N] MinAtar actions -> (obs, reward, terminated, final_obs)."""
        if self.sticky > 0:
            repeat = torch.rand(self.n, generator=self.gen) < self.sticky  # [N]
            action = torch.where(repeat, self.last_action, action)
        self.last_action = action
        self.pos = torch.where(action == 1, (self.pos - 1).clamp(min=0),
                               torch.where(action == 3, (self.pos + 1).clamp(max=9), self.pos))
        self.last_x, self.last_y = self.ball_x, self.ball_y
        d = self.dir
        x, y = self.ball_x + self.DX[d], self.ball_y + self.DY[d]  # [N]
        wall = (x < 0) | (x > 9)
        x, d = x.clamp(0, 9), torch.where(wall, self.FLIP_X[d], d)
        top = y < 0
        y, d = torch.where(top, 0, y), torch.where(top, self.FLIP_Y[d], d)
        in_brick = ~top & self.brick[self.rows, y.clamp(0, 9), x]  # [N]
        hit = in_brick & ~self.strike  # a brick breaks (a ball still inside the last one passes through)
        self.brick[self.rows[hit], y[hit], x[hit]] = False
        reward = hit.float()  # [N]
        y, d = torch.where(hit, self.last_y, y), torch.where(hit, self.FLIP_Y[d], d)
        self.strike = in_brick
        bottom = ~top & ~in_brick & (y == 9)
        refill = bottom & ~self.brick.flatten(1).any(1)  # [N] the last brick was gone: three new rows
        self.brick[:, 1:4] |= refill[:, None, None]
        under = bottom & (self.ball_x == self.pos)
        corner = bottom & ~under & (x == self.pos)
        d = torch.where(under, self.FLIP_Y[d], torch.where(corner, self.FLIP_XY[d], d))
        y = torch.where(under | corner, self.last_y, y)
        terminated = bottom & ~under & ~corner
        self.ball_x, self.ball_y, self.dir = x, y, d
        final = self.observe()
        self.reset_where(terminated)
        return self.observe(), reward, terminated, final

    # ---- for the equality check: the package's game state in and out ----------------------------------------------

    def set_from(self, games: list) -> None:
        """Copy the state of package Breakout games (``Environment.env``), one per copy."""
        for k in ("ball_x", "ball_y", "last_x", "last_y", "pos"):
            setattr(self, k, torch.tensor([int(getattr(g, k)) for g in games]))
        self.dir = torch.tensor([int(g.ball_dir) for g in games])
        self.strike = torch.tensor([bool(g.strike) for g in games])
        self.brick = torch.from_numpy(np.stack([g.brick_map for g in games]) == 1)


def check_torch_breakout(steps: int = 3000, n: int = 8) -> int:
    """Step TorchBreakout and n package games from the same states with the same actions (no sticky actions);
    assert equal images, rewards and terminations; after a termination both restart from the package's reset.
    Returns the number of episodes compared."""
    from minatar import Environment

    rng = np.random.default_rng(0)
    envs = [Environment("breakout", sticky_action_prob=0.0) for _ in range(n)]
    for i, e in enumerate(envs):
        e.seed(i)
        e.reset()
    probe = TorchBreakout(n, sticky=0.0)
    episodes = 0
    for t in range(steps):
        probe.set_from([e.env for e in envs])  # the same state for both, every step
        a = rng.integers(6, size=n)
        _, reward, terminated, final = probe.step(torch.from_numpy(a))
        for i, e in enumerate(envs):
            r, term = e.act(int(a[i]))
            want = torch.from_numpy(e.state().transpose(2, 0, 1).astype(np.uint8) * 255)
            assert torch.equal(final[i], want), f"step {t} copy {i}: image"
            assert reward[i].item() == r and terminated[i].item() == term, f"step {t} copy {i}"
            if term:
                e.reset()
                episodes += 1
    return episodes


def rate(step, n: int, steps: int, actions: list) -> float:
    """env-steps/s of ``steps`` calls of ``step`` on n copies."""
    t0 = time.perf_counter()
    for k in range(steps):
        step(actions[k % len(actions)])
    return n * steps / (time.perf_counter() - t0)


def measure(game: str, n: int, env_steps: int, rng: np.random.Generator) -> dict[str, float]:
    from minatar import Environment

    module, _, minimal = GAMES[game]
    steps = max(20, env_steps // n)
    idx = [rng.integers(len(minimal), size=n) for _ in range(64)]  # agent actions [N], cycled

    envs = [Environment(module) for _ in range(n)]
    for i, e in enumerate(envs):
        e.seed(i)
        e.reset()
    full = [[minimal[k] for k in a] for a in idx]  # the package's action numbers

    def package_step(a: list) -> None:
        for e, ai in zip(envs, a):
            _, term = e.act(ai)
            e.state()
            if term:
                e.reset()

    out = {"package": rate(package_step, n, steps, full)}
    env = make_env(f"minatar:{game}", num_envs=n, seed=0)
    env.reset()
    out["batched"] = rate(env.step, n, steps, [torch.from_numpy(a) for a in idx])
    if game == "Breakout":
        probe = TorchBreakout(n)
        out["torch"] = rate(probe.step, n, steps, [torch.tensor(a) for a in full])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8000, help="env-steps per measurement (N x batched steps)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--large", type=int, default=1024, help="one more N, for Breakout only (0: none)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    episodes = check_torch_breakout()
    print(f"TorchBreakout equals the package's Breakout step by step ({episodes} episodes)")
    rng = np.random.default_rng(0)
    runs: dict[str, dict[str, list[float]]] = {}
    for rep in range(a.repeats):
        for game in GAMES:
            for n in SIZES + ((a.large,) if a.large and game == "Breakout" else ()):
                for kind, v in measure(game, n, a.steps, rng).items():
                    runs.setdefault(f"{game}/{n}", {}).setdefault(kind, []).append(v)
        print(f"repeat {rep + 1}/{a.repeats} done")
    table = {key: {kind: statistics.median(v) for kind, v in kinds.items()} for key, kinds in runs.items()}
    payload = {"commit": git_commit(), "machine": platform.processor() or platform.machine(),
               "torch_threads": 1, "env_steps_per_measurement": a.steps, "repeats": a.repeats, "sizes": SIZES,
               "large": a.large,
               "torch_breakout_episodes_checked": episodes, "median_env_steps_per_s": table, "runs": runs}
    lines = [f"# MinAtar env-steps/s (medians of {a.repeats}; CPU, 1 torch thread; commit {payload['commit']})", "",
             "| game | N | package loop | batched minatar: | ratio | torch-native probe |", "|---|---|---|---|---|---|"]
    for key, v in table.items():
        game, n = key.split("/")
        torch_rate = f"{v['torch']:,.0f}" if "torch" in v else ""
        lines.append(f"| {game} | {n} | {v['package']:,.0f} | {v['batched']:,.0f} | "
                     f"{v['batched'] / v['package']:.2f} | {torch_rate} |")
    write_result("minatar_speed", payload, "\n".join(lines) + "\n", folder=RESULTS)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
