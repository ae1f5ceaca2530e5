"""The backend registry: ``spec_of(id)`` is the built env's spec for every backend, torch-native and manipulation
specs come without a simulator, the manipulation spec carries the robot metadata, and the one did-you-mean helper."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

import pytest

from ctrl_rl.envs import spec_of as public_spec_of
from ctrl_rl.envs.backends import BACKENDS, Backend, register
from ctrl_rl.envs.protocol import RobotStateLayout
from ctrl_rl.envs.registry import has_simulator, list_envs, make_env, resolve_backend, spec_of
from ctrl_rl.errors import UserInputError, did_you_mean

# One id per backend (options included), the make_env keyword arguments, and the module each needs.
CASES = [
    ("torch:Pendulum", {}, None),
    ("torch:PointMassPixels,image_size=16,proprio=false", {}, None),
    ("torch:CartPole", {"max_episode_steps": 30}, None),
    ("envpool:HalfCheetah-v5", {"max_episode_steps": 30}, "envpool"),
    ("envpool:CheetahRun-v1", {}, "envpool"),
    ("envpool:Breakout-v5,frame_skip=2", {}, "envpool"),
    ("HalfCheetah-v5", {}, "envpool"),
    ("gym:Pendulum-v1", {}, "gymnasium"),
    ("gymnasium:CartPole-v1", {"max_episode_steps": 30}, "gymnasium"),
    ("gym:HalfCheetah-v5,max_episode_steps=40", {"vector_mode": "async"}, "mujoco"),
    ("dmc:cheetah-run", {}, "dm_control"),
    ("dmc:walker-walk,max_episode_steps=30", {}, "dm_control"),
    ("warp:HalfCheetah-v5,max_episode_steps=30", {}, "mujoco_warp"),
    ("minatar:Breakout,sticky_action_prob=0", {"max_episode_steps": 30}, "minatar"),
    ("manip:Lift", {}, "envpool_assets"),
    ("manip:Reach,action=joint_velocity,cameras=all,image_size=32x48,language=true", {}, "envpool_assets"),
    ("robot:franka_droid,state=8,cameras=wrist_left,image_size=24x32,language=true", {}, None),
]


def _needs(module: str | None) -> None:
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


@pytest.mark.parametrize(("env_id", "kwargs", "module"), CASES, ids=[c[0] + (",kw" if c[1] else "") for c in CASES])
def test_spec_of_is_the_built_envs_spec(env_id, kwargs, module):
    _needs(module)
    if not has_simulator(env_id):  # a spec-only backend (robot:): nothing to build, and make says so
        with pytest.raises(UserInputError, match="without a simulator"):
            make_env(env_id, num_envs=2, **kwargs)
        assert spec_of(env_id, **kwargs).env_id == env_id
        return
    env = make_env(env_id, num_envs=2, **kwargs)
    try:
        assert spec_of(env_id, **kwargs) == env.spec
        assert hash(spec_of(env_id, **kwargs)) == hash(env.spec)
    finally:
        env.close()


def test_every_registered_backend_has_a_case():
    assert {resolve_backend(env_id.split(",")[0]) for env_id, _, _ in CASES} == set(BACKENDS)


def test_specs_are_cached_per_id_and_the_public_function_is_the_registrys():
    a = public_spec_of("torch:PointMassPixels,image_size=16")
    assert a is spec_of("torch:PointMassPixels,image_size=16")
    assert a.parts[0].shape == (3, 16, 16)
    assert spec_of("torch:Pendulum", max_episode_steps=7).max_episode_steps == 7  # with kwargs: not the cached one
    assert spec_of("torch:Pendulum").max_episode_steps == 200


def _failing(backend: str, monkeypatch) -> None:
    def make(*args, **kwargs):
        raise AssertionError(f"spec_of built a {backend} env")

    monkeypatch.setitem(BACKENDS, backend, dataclasses.replace(BACKENDS[backend], make=make))


def test_spec_of_builds_no_torch_env(monkeypatch):
    from ctrl_rl.envs.torch_envs.base import TorchEnv

    _failing("torch", monkeypatch)
    monkeypatch.setattr(TorchEnv, "__init__", lambda self, *a, **k: pytest.fail("a TorchEnv was constructed"))
    spec = spec_of("torch:PointMassPixels,image_size=24,proprio=true", max_episode_steps=9)
    assert [p.name for p in spec.parts] == ["image/top", "state"] and spec.max_episode_steps == 9
    with pytest.raises(UserInputError, match="image_size"):
        spec_of("torch:PointMassPixels,image_size=4")  # the constructor's checks run without it
    with pytest.raises(UserInputError, match="no option 'imagesize'.*did you mean 'image_size'"):
        spec_of("torch:PointMassPixels,imagesize=24")


def test_spec_of_builds_no_manipulation_env_and_imports_no_mujoco(monkeypatch):
    from ctrl_rl.envs.manipulation.env import ManipEnv

    _failing("manip", monkeypatch)
    monkeypatch.setattr(ManipEnv, "__init__", lambda self, *a, **k: pytest.fail("a ManipEnv was constructed"))
    assert spec_of("manip:Push,cameras=wrist").parts[1].name == "image/wrist_image_left"
    with pytest.raises(UserInputError, match="unknown manipulation task 'Lfit'.*did you mean 'manip:Lift'"):
        spec_of("manip:Lfit")
    code = ("import sys; from ctrl_rl.envs import spec_of; s = spec_of('manip:Lift,cameras=all,language=true'); "
            "print(s.robot.name, 'mujoco' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "False", out.stdout


def test_envpool_spec_comes_from_its_metadata(monkeypatch):
    envpool = pytest.importorskip("envpool")
    monkeypatch.setattr(envpool, "make", lambda *a, **k: pytest.fail("envpool.make was called"))
    spec = spec_of("envpool:Hopper-v5", max_episode_steps=50)
    assert (spec.obs_shape, spec.action_dim, spec.max_episode_steps, spec.dt) == ((11,), 3, 50, pytest.approx(0.008))
    with pytest.raises(UserInputError, match="episodic_life=True"):
        spec_of("envpool:Breakout-v5,episodic_life=true")


def test_the_manipulation_spec_carries_the_robot_units_and_action_space():
    pytest.importorskip("envpool_assets")
    from ctrl_rl.robots.spec import franka_droid

    spec = spec_of("manip:Lift")
    assert spec.robot == franka_droid()
    assert spec.action_units == ("m", "m", "m", "rad", "rad", "rad", "1")
    assert spec.action_space_name == "cartesian_velocity"
    assert spec.robot_state_layout == RobotStateLayout(joint_position=(0, 7), ee_position=(7, 10))
    assert spec.dt == pytest.approx(1 / 15)
    joint = spec_of("manip:Lift,action=joint_velocity")
    assert joint.action_units == ("rad",) * 7 + ("1",) and joint.action_space_name == "joint_velocity"
    assert joint.robot.action_space("joint_velocity").dim == 7  # plus the gripper of the cartesian space


def test_other_envs_carry_no_robot():
    spec = spec_of("torch:Pendulum")
    assert spec.robot is None and spec.action_units == () and spec.action_space_name is None
    assert spec.robot_state_layout is None


def test_action_units_must_match_the_action_dim():
    spec = spec_of("torch:Pendulum")
    with pytest.raises(ValueError, match="one unit per action dimension"):
        dataclasses.replace(spec, action_units=["m", "m"])
    assert dataclasses.replace(spec, action_units=["m"]).action_units == ("m",)  # a list becomes a tuple


@pytest.mark.parametrize(
    ("env_id", "match"),
    [
        ("Foo-v0", "unknown env id 'Foo-v0'"),
        ("gmy:Pendulum-v1", "did you mean 'gym:'"),
        ("torch:Pendulm", "unknown env id 'torch:Pendulm'.*did you mean 'torch:Pendulum'"),
        ("dmc:cheetah", "'dmc:cheetah'.*dmc:<domain>-<task>"),
        ("", "non-empty string"),
    ],
)
def test_spec_of_refuses_what_make_env_refuses(env_id, match):
    for fn in (spec_of, make_env):
        with pytest.raises(UserInputError, match=match) as info:
            fn(env_id)
        assert str(info.value).count(". ") == 0, "the message is one sentence"


def test_spec_of_refuses_an_option_given_twice():
    with pytest.raises(UserInputError, match="one place"):
        spec_of("torch:Pendulum,max_episode_steps=5", max_episode_steps=6)


def test_a_missing_package_is_named_for_a_simulator_backend_but_not_for_a_static_spec(monkeypatch):
    monkeypatch.setitem(BACKENDS, "dmc", dataclasses.replace(BACKENDS["dmc"], requires="no_such_module_xyz"))
    monkeypatch.setitem(BACKENDS, "torch", dataclasses.replace(BACKENDS["torch"], requires="no_such_module_xyz"))
    with pytest.raises(UserInputError, match="needs the no_such_module_xyz package"):
        spec_of("dmc:cheetah-run,max_episode_steps=3")
    with pytest.raises(UserInputError, match="needs the no_such_module_xyz package"):
        make_env("torch:Pendulum")
    assert spec_of("torch:Pendulum", max_episode_steps=3).max_episode_steps == 3  # static: no package needed


def test_listed_ids_resolve_to_their_backend():
    for name, backend in BACKENDS.items():
        ids = list_envs(name)
        assert ids and all(i.startswith(backend.prefix + ":") for i in ids)
        assert {resolve_backend(i) for i in ids} == {name}


def test_register_refuses_a_taken_name_or_prefix():
    torch_backend = BACKENDS["torch"]
    with pytest.raises(ValueError, match="clashes"):
        register(dataclasses.replace(torch_backend, name="torch2"))
    with pytest.raises(ValueError, match="clashes"):
        register(Backend("torch", ("tch",), torch_backend.make, torch_backend.spec_of, tuple, tuple))
    assert BACKENDS["torch"] is torch_backend and "torch2" not in BACKENDS


def test_did_you_mean():
    assert did_you_mean("HalfCheeta-v5", ["HalfCheetah-v5", "Hopper-v5"]) == " (did you mean 'HalfCheetah-v5'?)"
    assert did_you_mean("xyz", ["HalfCheetah-v5"]) == ""
    assert did_you_mean("sac", []) == ""
    two = did_you_mean("walker-run", ["walker-runn", "walker-rum", "cheetah-run"], n=2)
    assert two.startswith(" (did you mean 'walker-") and " or " in two and two.endswith("?)")


@pytest.mark.parametrize("env_id", ["torch:Pendulum", "torch:CartPole", "manip:Lift"])
def test_rescaled_spec_is_the_training_wrappers_spec(env_id):
    from ctrl_rl.envs.wrappers import ActionRescale, rescaled_spec

    if env_id.startswith("manip:"):
        _needs("envpool_assets")
    env = make_env(env_id)
    try:
        wrapped = env if env.spec.discrete else ActionRescale(env)
        assert rescaled_spec(spec_of(env_id)) == wrapped.spec
    finally:
        env.close()
