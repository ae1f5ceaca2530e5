"""MuJoCo Playground tasks through envpool (``envpool:<Task>``): every task the installed envpool ships.

The spec without a simulator (parts, privileged parts, bounds, control period) for all of them at once; then per
task check_env on one copy and 300 random steps of two copies with the parts and the same-step reset checked.
Building an envpool pool dominates (check_env's seeded resets rebuild it three times). Measured with the two
background jobs of this 2-core machine running (wall time of both tests of a task): most tasks 3-8 s, the file
~4 min in all; the seven tasks above 9 s are marked ``slow`` (Op3Joystick 23 s, ApolloJoystickFlatTerrain 19 s,
BerkeleyHumanoidJoystick Flat/Rough 15-16 s, PandaRobotiqPushCube 13 s, G1Joystick Flat/Rough 10-11 s: larger
models to compile per copy), and run with ``-m slow``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctrl_rl.envs.check import check_env, random_actions
from ctrl_rl.envs.registry import list_envs, make_env, spec_of

envpool = pytest.importorskip("envpool")

from ctrl_rl.envs.envpool import playground_tasks  # noqa: E402  (after the skip: envpool is installed)

TASKS = playground_tasks()
SLOW = {"Op3Joystick-v1", "ApolloJoystickFlatTerrain-v1", "BerkeleyHumanoidJoystickFlatTerrain-v1",
        "BerkeleyHumanoidJoystickRoughTerrain-v1", "PandaRobotiqPushCube-v1", "G1JoystickFlatTerrain-v1",
        "G1JoystickRoughTerrain-v1"}  # slow to build (module docstring)
# tasks whose observation is the dict {state, privileged_state} (the others give one vector)
DICT_TASKS = {t for t in TASKS if hasattr(envpool.make_spec(t).gymnasium_observation_space, "spaces")}


def _param(task: str):
    return pytest.param(task, marks=pytest.mark.slow) if task in SLOW else task


def test_every_playground_task_is_listed_with_a_label():
    from ctrl_rl.envs.registry import describe_env

    assert len(TASKS) >= 25 and "Go1JoystickFlatTerrain-v1" in TASKS and "PandaPickCube-v1" in TASKS
    listed = set(list_envs("envpool"))
    for task in TASKS:
        assert f"envpool:{task}" in listed
        assert describe_env(f"envpool:{task}").startswith("MuJoCo Playground, ")
    assert describe_env("envpool:Go1JoystickFlatTerrain-v1").startswith(
        "MuJoCo Playground, quadruped Unitree Go1; state[48], privileged_state[123] (privileged); 12 actions at 50 Hz")
    assert describe_env("envpool:HalfCheetah-v5") == ""


def test_specs_come_without_a_simulator(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("spec_of built an envpool simulator")

    monkeypatch.setattr(envpool, "make", refuse)
    for task in TASKS:
        raw = envpool.make_spec(task)
        config = raw.config._asdict()
        spec = spec_of(f"envpool:{task}")
        space = raw.gymnasium_observation_space
        if task in DICT_TASKS:  # kept as parts, the robot's first, each float32
            assert [p.name for p in spec.parts] == ["state", "privileged_state"]
            assert [p.shape for p in spec.parts] == [space["state"].shape, space["privileged_state"].shape]
            assert spec.privileged_parts == ("privileged_state",) and spec.robot_parts == ("state",)
            assert not spec.is_flat and spec.obs_shape == space["state"].shape
        else:
            assert spec.is_flat and spec.obs_shape == space.shape and spec.privileged_parts == ()
        assert all(p.dtype == torch.float32 for p in spec.parts)
        act = raw.gymnasium_action_space
        assert spec.action_dim == act.shape[0] and not spec.discrete
        assert np.allclose(spec.action_low, act.low) and np.allclose(spec.action_high, act.high)
        assert spec.dt == pytest.approx(config["ctrl_dt"] * config.get("action_repeat", 1)) and spec.dt > 0
        assert spec.max_episode_steps == config["max_episode_steps"] and spec.backend == "envpool"
    assert spec_of("envpool:Go1JoystickFlatTerrain-v1").dt == pytest.approx(0.02)
    assert spec_of("envpool:AlohaSinglePegInsertion-v1").dt == pytest.approx(0.005)  # 0.0025 s x action_repeat 2


@pytest.mark.parametrize("task", [_param(t) for t in TASKS])
def test_check_env(task):
    """The contract on one copy (check_env's seeded resets rebuild envpool's pool three times: one copy keeps that
    cheap), and the built spec is ``spec_of``'s."""
    env = make_env(f"envpool:{task}", num_envs=1, seed=3)
    try:
        check_env(env, steps=60)
        assert env.spec == spec_of(f"envpool:{task}")
    finally:
        env.close()


@pytest.mark.parametrize("task", [_param(t) for t in TASKS])
def test_steps_keep_parts_and_same_step_reset(task):
    """300 random steps of 2 copies: every part in the spec's order, shape and dtype, finite; final_obs equals obs
    where no episode ended; a task with a time limit within the 300 steps ends an episode in every copy."""
    env = make_env(f"envpool:{task}", num_envs=2, seed=3)
    try:
        _random_steps(env)
    finally:
        env.close()


def _random_steps(env) -> None:
    spec, n = env.spec, env.num_envs
    gen = torch.Generator().manual_seed(0)
    obs = env.reset(seed=11)
    names = [p.name for p in spec.parts]
    ended = 0
    for _ in range(300):
        out = env.step(random_actions(spec, n, env.device, gen))
        parts = out.obs if isinstance(out.obs, dict) else {"state": out.obs}
        final = out.final_obs if isinstance(out.final_obs, dict) else {"state": out.final_obs}
        assert list(parts) == names
        for p in spec.parts:
            assert parts[p.name].shape == (n, *p.shape) and parts[p.name].dtype == torch.float32
            assert torch.isfinite(parts[p.name]).all() and torch.isfinite(final[p.name]).all()
        assert torch.isfinite(out.reward).all()
        done = out.terminated | out.truncated
        for p in spec.parts:  # envs that go on: final_obs is obs
            assert torch.equal(final[p.name][~done], parts[p.name][~done])
        ended += int(done.sum())
        obs = out.obs
    assert obs is not None
    if spec.max_episode_steps is not None and spec.max_episode_steps <= 300:
        assert ended >= n  # every env reached the time limit at least once


def test_state_is_envpool_state_not_privileged():
    """The ``state`` part is envpool's ``state`` array (the one a robot measures), not a slice of a concatenation
    that starts with the privileged part: same seed, same first observation."""
    raw = envpool.make("Go1JoystickFlatTerrain-v1", env_type="gymnasium", num_envs=2, seed=5)
    want, _ = raw.reset()
    raw.close()
    env = make_env("envpool:Go1JoystickFlatTerrain-v1", num_envs=2, seed=5)
    got = env.reset()
    env.close()
    assert isinstance(got, dict)
    assert torch.equal(got["state"], torch.as_tensor(want["state"], dtype=torch.float32))
    assert torch.equal(got["privileged_state"], torch.as_tensor(want["privileged_state"], dtype=torch.float32))
