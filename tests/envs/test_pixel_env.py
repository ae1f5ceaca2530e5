"""Observations with several parts: the PointMass pixel env, check_env on dict observations, wrappers."""

from __future__ import annotations

import pytest
import torch

from ctrl_rl.core.obs import ObsPart, obs_clone, obs_equal
from ctrl_rl.envs.check import check_env
from ctrl_rl.envs.protocol import EnvSpec, StepOut
from ctrl_rl.envs.registry import list_envs, make_env
from ctrl_rl.envs.torch_envs import PointMass, PointMassPixels
from ctrl_rl.envs.wrappers import ActionRescale, EpisodeStats, ObsNormalize


def _actions(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, 2, generator=gen) * 2.4 - 1.2  # [N,2]; beyond [-1, 1] exercises the clip


def _centroid(mask: torch.Tensor) -> torch.Tensor:
    """Mean (x, y) arena coordinates of the True pixels of ``mask [N,S,S]`` (row 0 at y = +1)."""
    s = mask.shape[-1]
    c = (torch.arange(s) + 0.5) * (2.0 / s) - 1.0  # [S]
    w = mask.float()
    count = w.sum((1, 2)).clamp(min=1)  # [N]
    return torch.stack([(w.sum(1) * c).sum(1) / count, (w.sum(2) * c.flip(0)).sum(1) / count], 1)  # [N,2]


@pytest.mark.parametrize("kwargs", [{}, {"proprio": False, "image_size": 16}], ids=["proprio", "image-only"])
def test_pixel_env_passes_check_env(kwargs):
    env = make_env("torch:PointMassPixels", num_envs=3, seed=3, max_episode_steps=30, **kwargs)
    twin = make_env("torch:PointMassPixels", num_envs=3, seed=3, max_episode_steps=30, **kwargs)
    check_env(env, steps=90, twin=twin)


def test_spec_describes_the_parts():
    env = PointMassPixels(2)
    spec = env.spec
    assert spec.env_id == "torch:PointMassPixels" and not spec.is_flat and spec.max_episode_steps == 50
    assert spec.parts == (ObsPart("image/top", (3, 64, 64), torch.uint8), ObsPart("state", (2,), torch.float32))
    assert spec.obs_shape == (2,) and spec.obs_dim == 2
    small = PointMassPixels(2, image_size=32, proprio=False).spec
    assert small.parts == (ObsPart("image/top", (3, 32, 32), torch.uint8),)
    assert small.obs_shape == () and small.obs_dim == 0
    flat = PointMass(2).spec
    assert flat.is_flat and flat.obs_shape == (4,)
    assert {"torch:PointMass", "torch:PointMassPixels"} <= set(list_envs("torch"))
    with pytest.raises(ValueError, match="image_size"):
        PointMassPixels(2, image_size=4)


def test_image_draws_goal_red_and_agent_green_where_the_state_says():
    env = PointMassPixels(2, image_size=64)
    env.reset()
    env.state = torch.tensor([[0.5, -0.9], [0.5, 0.0], [-0.5, -0.9], [-0.5, 0.0]])  # [4,N]: (x, y, gx, gy)
    img = env.step(torch.zeros(2, 2)).obs["image/top"]  # [N,3,S,S]
    red, green, blue = img[:, 0], img[:, 1], img[:, 2]
    assert set(red.unique().tolist()) == {0, 255} and set(green.unique().tolist()) == {0, 255}
    assert (blue == 64).all()
    # env 0: agent at (0.5, 0.5) -> column 47.5, row 15.5; goal at (-0.5, -0.5) -> column 15.5, row 47.5
    assert green[0, 15:17, 47:49].eq(255).all() and red[0, 15:17, 47:49].eq(0).all()
    assert red[0, 47:49, 15:17].eq(255).all() and green[0, 47:49, 15:17].eq(0).all()
    torch.testing.assert_close(_centroid(green == 255)[0], torch.tensor([0.5, 0.5]), atol=0.02, rtol=0)
    torch.testing.assert_close(_centroid(red == 255)[0], torch.tensor([-0.5, -0.5]), atol=0.02, rtol=0)
    # disc areas: pi r^2 over a pixel area (2/64)^2 -> ~32 (agent, r 0.1) and ~72 (goal, r 0.15) pixels
    assert 24 <= int((green[0] == 255).sum()) <= 40 and 60 <= int((red[0] == 255).sum()) <= 84
    # env 1: agent and goal overlap on (-0.9, 0.0): both stay visible (yellow where they overlap)
    assert ((red[1] == 255) & (green[1] == 255)).sum() == (green[1] == 255).sum()


def test_pixel_and_state_variants_share_the_dynamics():
    n, gen = 64, torch.Generator().manual_seed(0)
    pix, flat = PointMassPixels(n, seed=7, max_episode_steps=9), PointMass(n, seed=7, max_episode_steps=9)
    obs_p, obs_f = pix.reset(), flat.reset()
    assert torch.equal(obs_p["state"], obs_f[:, :2])
    for _ in range(20):  # crosses two time limits, so the auto-reset draws are compared too
        a = _actions(n, gen)
        out_p, out_f = pix.step(a), flat.step(a)
        assert torch.equal(out_p.reward, out_f.reward) and torch.equal(out_p.truncated, out_f.truncated)
        assert torch.equal(out_p.obs["state"], out_f.obs[:, :2])
        assert torch.equal(out_p.final_obs["state"], out_f.final_obs[:, :2])
        # the image shows the flat observation's positions (to within a pixel)
        img, want = out_p.final_obs["image/top"], out_f.final_obs
        # where the discs neither overlap nor touch the border, their centroids are their centres
        whole = ((want[:, :2] - want[:, 2:]).norm(dim=1) > 0.3) & (want[:, :2].abs() < 0.9).all(1)
        torch.testing.assert_close(_centroid(img[:, 1] == 255)[whole], want[whole, :2], atol=0.03, rtol=0)
        torch.testing.assert_close(_centroid(img[:, 0] == 255)[whole], want[whole, 2:], atol=0.03, rtol=0)


def test_reward_is_negative_distance_after_a_clipped_move():
    env = PointMass(3)
    env.reset()
    env.state = torch.tensor([[0.0, 0.95, 0.0], [0.0, 0.0, 0.0], [0.3, 0.0, 0.0], [0.4, 0.0, 0.0]])  # [4,N]
    out = env.step(torch.tensor([[1.0, 1.0], [1.0, 0.0], [-5.0, 0.0]]))
    want_pos = torch.tensor([[0.1, 0.1], [1.0, 0.0], [-0.1, 0.0]])  # action clipped to 1, position to the arena
    torch.testing.assert_close(out.obs[:, :2], want_pos)
    torch.testing.assert_close(out.reward, -torch.tensor([(0.2**2 + 0.3**2) ** 0.5, 1.0, 0.1]))


def test_truncation_final_obs_is_the_pre_reset_image():
    n, limit = 16, 5
    env = PointMassPixels(n, seed=4, max_episode_steps=limit, image_size=16)
    twin = PointMassPixels(n, image_size=16, max_episode_steps=100)
    env.reset()
    gen = torch.Generator().manual_seed(1)
    for t in range(1, 2 * limit + 1):
        twin.load_state_dict({**env.state_dict(), "elapsed_steps": torch.zeros(n, dtype=torch.int64)})
        a = _actions(n, gen)
        out, ref = env.step(a), twin.step(a)
        assert obs_equal(out.final_obs, ref.obs)
        assert bool(out.truncated.all()) == (t % limit == 0)
        if t % limit == 0:
            assert not torch.equal(out.obs["image/top"], out.final_obs["image/top"])


def test_seeding_and_state_dict_resume_are_bit_exact():
    def rollout(env, steps, seed):
        gen, outs = torch.Generator().manual_seed(seed), []
        for _ in range(steps):
            out = env.step(_actions(env.num_envs, gen))
            outs.append((obs_clone(out.obs), obs_clone(out.final_obs), out.reward.clone()))
        return outs

    def same(a, b):
        return all(obs_equal(x[0], y[0]) and obs_equal(x[1], y[1]) and torch.equal(x[2], y[2]) for x, y in zip(a, b))

    a = PointMassPixels(8, seed=5, max_episode_steps=7, image_size=16)
    b = PointMassPixels(8, seed=5, max_episode_steps=7, image_size=16)
    assert obs_equal(a.reset(), b.reset())
    assert same(rollout(a, 12, 0), rollout(b, 12, 0))
    snapshot = a.state_dict()
    expected = rollout(a, 15, 1)
    other = PointMassPixels(8, seed=99, max_episode_steps=7, image_size=16)
    other.load_state_dict(snapshot)
    assert same(rollout(other, 15, 1), expected)
    with pytest.raises(ValueError, match="state_dict is for env"):
        PointMass(8).load_state_dict(snapshot)


def test_many_envs_render_at_once():
    env = PointMassPixels(2048, image_size=32)
    obs = env.reset()
    assert obs["image/top"].shape == (2048, 3, 32, 32) and obs["image/top"].dtype == torch.uint8
    assert ((obs["image/top"][:, 1] == 255).sum((1, 2)) > 0).all()  # every env's agent is drawn


def test_the_image_holds_what_the_task_needs():
    # Heading for the goal as located in the image alone (red and green centroids) scores close to
    # heading for it from the true state, and far above random actions: the task is solvable from pixels.
    def run(policy, steps=50, n=128):
        env = PointMassPixels(n, seed=2, proprio=False, image_size=32)
        obs, ret = env.reset(), torch.zeros(n)
        for _ in range(steps):
            out = env.step(policy(env, obs))
            obs, ret = out.obs, ret + out.reward
        return ret.mean().item()

    def from_pixels(env, obs):
        img = obs["image/top"]
        return ((_centroid(img[:, 0] == 255) - _centroid(img[:, 1] == 255)) / 0.1).clamp(-1, 1)

    def from_state(env, obs):
        return ((env.state[2:4] - env.state[0:2]).T / 0.1).clamp(-1, 1)

    gen = torch.Generator().manual_seed(0)
    pixels, state, random = run(from_pixels), run(from_state), run(lambda env, obs: _actions(env.num_envs, gen))
    assert state > -4.5 and pixels > state - 1.5 and random < -35, (pixels, state, random)


# ---- check_env on broken multi-part envs ------------------------------------------------------------


class _Parts:
    """A 2-env multi-part env (image + state) that can break one rule of the contract."""

    def __init__(self, broken: str | None = None):
        self.num_envs, self.device, self.broken = 2, torch.device("cpu"), broken
        parts = (ObsPart("image/top", (3, 4, 4), torch.uint8), ObsPart("state", (1,), torch.float32))
        self.spec = EnvSpec("torch:Parts", (1,), False, 1, (-1.0,), (1.0,), 0.1, 4, "torch", obs_parts=parts)
        self.t = 0

    def _obs(self, t: int) -> dict[str, torch.Tensor]:
        obs = {"image/top": torch.full((2, 3, 4, 4), t % 256, dtype=torch.uint8), "state": torch.full((2, 1), float(t))}
        if self.broken == "float image":
            obs["image/top"] = obs["image/top"].float()
        if self.broken == "missing part":
            del obs["state"]
        return obs

    def reset(self, seed=None):
        self.t = 0
        return self._obs(0)

    def step(self, action):
        self.t += 1
        done = self.t % 4 == 0
        final = self._obs(self.t)
        obs = self._obs(100 + self.t) if done else self._obs(self.t)
        if self.broken == "final differs" and not done:
            final["image/top"] = final["image/top"] + 1
        if done:
            self.t = 0
        flag = torch.full((2,), done)
        return StepOut(obs, torch.zeros(2), torch.zeros(2, dtype=torch.bool), flag, final)

    def close(self):
        pass


@pytest.mark.parametrize(
    ("broken", "match"),
    [("float image", "part 'image/top' has dtype torch.float32, expected torch.uint8"),
     ("missing part", r"has parts \['image/top'\], expected \['image/top', 'state'\]"),
     ("final differs", "final_obs differs from obs")],
)
def test_check_env_catches_broken_multipart_envs(broken, match):
    check_env(_Parts(), steps=10)  # the unbroken env passes
    with pytest.raises(AssertionError, match=match):
        check_env(_Parts(broken), steps=10)


def test_check_env_refuses_a_float_image_part_in_the_spec():
    env = _Parts()
    env.spec = EnvSpec("torch:Parts", (1,), False, 1, (-1.0,), (1.0,), 0.1, 4, "torch",
                       obs_parts=(ObsPart("image/top", (3, 4, 4), torch.float32),
                                  ObsPart("state", (1,), torch.float32)))
    with pytest.raises(AssertionError, match="image part 'image/top' is torch.float32"):
        check_env(env, steps=2)


# ---- wrappers --------------------------------------------------------------------------------------


def test_episode_stats_and_action_rescale_pass_dict_observations_through():
    env = ActionRescale(EpisodeStats(PointMassPixels(4, seed=1, image_size=16, max_episode_steps=3)))
    ref = PointMassPixels(4, seed=1, image_size=16, max_episode_steps=3)
    assert obs_equal(env.reset(), ref.reset())
    for t in range(1, 5):
        a = torch.full((4, 2), 0.5)
        out, want = env.step(a), ref.step(a * 1.0)
        assert obs_equal(out.obs, want.obs) and obs_equal(out.final_obs, want.final_obs)
        assert bool(out.info["episode_done"].all()) == (t == 3)
    assert out.info["episode_length"].tolist() == [0] * 4


def test_obs_normalize_touches_the_state_part_only():
    env = ObsNormalize(PointMassPixels(64, seed=1, image_size=16))
    ref = PointMassPixels(64, seed=1, image_size=16)
    obs, raw = env.reset(), ref.reset()
    assert torch.equal(obs["image/top"], raw["image/top"])
    torch.testing.assert_close(obs["state"], env.norm(raw["state"]))
    assert obs["state"].std(0).sub(1).abs().max() < 0.05  # normalized with the batch's own statistics
    out, raw_out = env.step(torch.ones(64, 2)), ref.step(torch.ones(64, 2))
    assert torch.equal(out.final_obs["image/top"], raw_out.final_obs["image/top"])
    torch.testing.assert_close(out.final_obs["state"], env.norm(raw_out.final_obs["state"]))
    with pytest.raises(ValueError, match="'state' observation part.*image/top"):
        ObsNormalize(PointMassPixels(2, proprio=False, image_size=16))
