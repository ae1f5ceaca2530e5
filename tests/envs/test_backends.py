"""Simulator backends (envpool, gymnasium, dm_control, torch) against the BatchedEnv contract.

check_env on every backend; envpool's next-step auto-reset converted to same-step; make_env routing
and its errors; check_env itself failing on broken envs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctrl_rl.envs.check import check_env, random_actions
from ctrl_rl.envs.protocol import EnvSpec, StepOut, action_to_numpy
from ctrl_rl.envs.registry import list_envs, make_env
from ctrl_rl.errors import UserInputError

N = 3
SHORT = 30  # time limit used to see several auto-resets within a short check

# (id, make_env kwargs); the time limit is shortened where the task's own is long.
CASES = [
    ("envpool:HalfCheetah-v5", {"max_episode_steps": SHORT}),
    ("envpool:Pendulum-v1", {}),
    ("envpool:CartPole-v1", {}),
    ("envpool:CheetahRun-v1", {"max_episode_steps": SHORT}),
    ("gym:Pendulum-v1", {}),
    ("gym:CartPole-v1", {}),
    ("gym:HalfCheetah-v5", {"max_episode_steps": SHORT}),
    ("gym:Pendulum-v1", {"vector_mode": "async", "max_episode_steps": SHORT}),
    ("dmc:cheetah-run", {"max_episode_steps": SHORT}),
]
TORCH_CASES = ["torch:Pendulum", "torch:CartPole", "torch:MountainCarContinuous", "torch:Reacher"]


@pytest.mark.parametrize(("env_id", "kwargs"), CASES,
                         ids=[f"{i}{'-' + k['vector_mode'] if 'vector_mode' in k else ''}" for i, k in CASES])
def test_check_env_backends(env_id, kwargs):
    env = make_env(env_id, num_envs=N, seed=3, **kwargs)
    twin = make_env(env_id, num_envs=N, seed=3, **kwargs)
    try:
        assert env.spec.env_id == env_id
        check_env(env, steps=230, twin=twin)
    finally:
        env.close()
        twin.close()


@pytest.mark.parametrize("env_id", TORCH_CASES)
def test_check_env_torch(env_id):
    torch_envs = pytest.importorskip("ctrl_rl.envs.torch_envs")
    name = env_id.split(":", 1)[1]
    if name not in torch_envs.TORCH_ENVS:
        pytest.skip(f"{env_id} not in TORCH_ENVS yet")
    env = make_env(env_id, num_envs=N, seed=3, max_episode_steps=SHORT)
    twin = make_env(env_id, num_envs=N, seed=3, max_episode_steps=SHORT)
    assert env.spec.backend == "torch"
    check_env(env, steps=3 * SHORT, twin=twin)


# ---- auto-reset: envpool's next-step convention becomes same-step ---------------------------------


def _envpool_pendulum_step(obs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """envpool Pendulum-v1 dynamics and reward from an observation (cos, sin, thdot) and torque u [N].

    envpool keeps old gym's order: theta integrates the *unclipped* velocity, then the velocity is
    clipped to [-8, 8]. gymnasium's Pendulum-v1 clips first, so the two differ once |thdot| saturates.
    """
    th = torch.atan2(obs[:, 1], obs[:, 0]).double()
    thdot, u = obs[:, 2].double(), u.double().clamp(-2.0, 2.0)
    cost = th**2 + 0.1 * thdot**2 + 0.001 * u**2  # atan2 already wraps th to [-pi, pi]
    new_thdot = thdot + (3 * 10.0 / 2 * torch.sin(th) + 3.0 * u) * 0.05
    new_th = th + new_thdot * 0.05
    new_thdot = new_thdot.clamp(-8.0, 8.0)
    return torch.stack([torch.cos(new_th), torch.sin(new_th), new_thdot], 1).float(), (-cost).float()


def test_envpool_same_step_autoreset_pendulum():
    """At the truncation step: final_obs is the episode's last obs, obs a fresh reset obs, and the next
    step is an ordinary step from that reset obs (dynamics and reward of Pendulum checked by hand)."""
    env = make_env("envpool:Pendulum-v1", num_envs=4, seed=0)
    assert env.spec.max_episode_steps == 200 and env.spec.dt == 0.05
    gen = torch.Generator().manual_seed(0)
    obs = env.reset()
    for t in range(200):
        u = random_actions(env.spec, 4, env.device, gen)  # [N,1]
        expected_next, expected_reward = _envpool_pendulum_step(obs, u[:, 0])
        out = env.step(u)
        # Every step, including the last of the episode, follows the dynamics from the previous obs.
        torch.testing.assert_close(out.final_obs, expected_next, atol=2e-4, rtol=0)
        torch.testing.assert_close(out.reward, expected_reward, atol=2e-3, rtol=1e-4)
        assert out.info["elapsed_step"].tolist() == [t + 1] * 4
        if t < 199:
            assert not out.done.any()
            assert torch.equal(out.obs, out.final_obs)
        obs = out.obs
    assert out.truncated.all() and not out.terminated.any()
    # obs is the new episode's first obs: a reset state (|thdot| <= 1), not the episode's last one.
    assert not torch.allclose(out.obs, out.final_obs)
    assert (out.obs[:, 2].abs() <= 1.0).all()
    # The next step is a real step from the reset obs: dynamics hold, reward is not envpool's dummy 0.
    u = random_actions(env.spec, 4, env.device, gen)
    expected_next, expected_reward = _envpool_pendulum_step(out.obs, u[:, 0])
    nxt = env.step(u)
    assert nxt.info["elapsed_step"].tolist() == [1] * 4
    assert not nxt.done.any()
    torch.testing.assert_close(nxt.obs, expected_next, atol=2e-4, rtol=0)
    torch.testing.assert_close(nxt.reward, expected_reward, atol=2e-3, rtol=1e-4)
    assert (nxt.reward != 0).all()
    env.close()


def test_envpool_native_convention_is_next_step():
    """Canary: raw envpool still resets on the step after an episode ends (reward 0, elapsed_step 0),
    which is what EnvpoolEnv converts; if this changes, EnvpoolEnv's subset reset must be revisited."""
    import envpool

    raw = envpool.make("Pendulum-v1", env_type="gymnasium", num_envs=2, seed=0, max_episode_steps=3)
    raw.reset()
    act = np.zeros((2, 1), dtype=np.float32)
    for _ in range(3):
        _, _, _, trunc, _ = raw.step(act)
    assert trunc.all()
    _, reward, _, _, info = raw.step(act)
    assert (reward == 0).all() and (info["elapsed_step"] == 0).all()
    # The subset reset that EnvpoolEnv uses instead: the next step of a reset env is a normal one.
    for _ in range(3):
        raw.step(act)
    raw.reset(np.array([1], dtype=np.int32))
    _, reward, _, _, info = raw.step(act)
    assert info["elapsed_step"].tolist() == [0, 1]
    assert reward[0] == 0 and reward[1] != 0
    raw.close()


@pytest.mark.parametrize("env_id", ["envpool:Pendulum-v1", "gym:Pendulum-v1"])
def test_pendulum_episode_invariants(env_id):
    """Same invariants on both backends: every episode is exactly 200 steps, rewards after a reset are real."""
    env = make_env(env_id, num_envs=N, seed=1)
    gen = torch.Generator().manual_seed(1)
    env.reset()
    ends = []
    after_reset_rewards = []
    just_reset = False
    for t in range(401):
        out = env.step(random_actions(env.spec, N, env.device, gen))
        if just_reset:
            after_reset_rewards.append(out.reward)
        just_reset = bool(out.done.any())
        if just_reset:
            assert out.done.all() and out.truncated.all() and not out.terminated.any()
            ends.append(t + 1)
    env.close()
    assert ends == [200, 400]
    assert len(after_reset_rewards) == 2
    assert all((r != 0).all() for r in after_reset_rewards)


def test_terminations_are_terminated_not_truncated():
    """CartPole falls over under random actions: terminated, never truncated, on both backends."""
    for env_id in ("envpool:CartPole-v1", "gym:CartPole-v1"):
        env = make_env(env_id, num_envs=4, seed=0)
        env.reset()
        gen = torch.Generator().manual_seed(0)
        seen = torch.zeros(4, dtype=torch.bool)
        for _ in range(100):
            out = env.step(random_actions(env.spec, 4, env.device, gen))
            assert not out.truncated.any()
            seen |= out.terminated
        env.close()
        assert seen.all(), env_id


# ---- dm_control: direct and through envpool ---------------------------------------------------------


@pytest.mark.parametrize(
    ("dmc_id", "envpool_id", "obs_dim"),
    [
        ("dmc:cheetah-run", "envpool:CheetahRun-v1", 17),
        ("dmc:walker-walk", "envpool:WalkerWalk-v1", 24),
        ("dmc:humanoid-run", "envpool:HumanoidRun-v1", 67),  # envpool pads with 28 zeros of `position`
        ("dmc:quadruped-run", "envpool:QuadrupedRun-v1", 78),  # and with 35 entries of other tasks here
    ],
)
def test_dmc_direct_and_envpool_agree_on_layout(dmc_id, envpool_id, obs_dim):
    direct = make_env(dmc_id, num_envs=1)
    pooled = make_env(envpool_id, num_envs=1)
    for field in ("obs_shape", "action_dim", "action_low", "action_high", "dt", "max_episode_steps"):
        assert getattr(direct.spec, field) == pytest.approx(getattr(pooled.spec, field)), field
    assert direct.spec.obs_shape == (obs_dim,)
    direct.close()
    pooled.close()


def test_dmc_time_limit_is_truncation():
    """The suite's own time limit (discount 1 at LAST) is a truncation; default limit is 1000 steps."""
    env = make_env("dmc:pendulum-swingup", num_envs=1)
    assert env.spec.max_episode_steps == 1000 and env.spec.dt == pytest.approx(0.02)
    env.reset()
    a = torch.zeros(1, 1)
    for t in range(1000):
        out = env.step(a)
        if t < 999:
            assert not out.done.any()
    assert out.truncated.all() and not out.terminated.any()
    assert out.info["elapsed_step"].tolist() == [1000]
    env.close()


# ---- seeding and metadata state_dict ------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["envpool:Pendulum-v1", "gym:Pendulum-v1", "dmc:cheetah-run"])
def test_seeding_and_resume_metadata(env_id):
    a, b, c = (make_env(env_id, num_envs=2, seed=s) for s in (5, 5, 6))
    first_a, first_b, first_c = a.reset(), b.reset(), c.reset()
    assert torch.equal(first_a, first_b)
    assert not torch.equal(first_a, first_c)
    a.step(torch.zeros(2, a.spec.action_dim))
    sd = a.state_dict()
    assert sd["seed"] == 5 and sd["resets"] == 1 and sd["exact"] is False
    # Resume re-seeds deterministically from the metadata, with episodes different from the start.
    r1, r2 = make_env(env_id, num_envs=2, seed=5), make_env(env_id, num_envs=2, seed=5)
    r1.load_state_dict(sd)
    r2.load_state_dict(sd)
    o1, o2 = r1.reset(), r2.reset()
    assert torch.equal(o1, o2)
    assert not torch.equal(o1, first_a)
    for env in (a, b, c, r1, r2):
        env.close()


# ---- adapters reject malformed actions ------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["envpool:CartPole-v1", "gym:CartPole-v1"])
def test_discrete_actions_must_be_integer_indices(env_id):
    env = make_env(env_id, num_envs=2)
    env.reset()
    with pytest.raises(ValueError, match="integer"):
        env.step(torch.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(3, dtype=torch.int64))
    out = env.step(torch.tensor([0, 1]))
    assert out.obs.shape == (2, 4)
    env.close()


@pytest.mark.parametrize("env_id", ["envpool:HalfCheetah-v5", "gym:HalfCheetah-v5", "dmc:cheetah-run"])
def test_continuous_action_shape_is_checked(env_id):
    env = make_env(env_id, num_envs=2)
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(2, 5))
    env.close()


# ---- make_env routing and errors ----------------------------------------------------------------------


def test_make_env_routing():
    cases = {
        "HalfCheetah-v5": ("envpool", "envpool:HalfCheetah-v5"),
        "CartPole-v1": ("envpool", "envpool:CartPole-v1"),
        "envpool:CheetahRun-v1": ("envpool", "envpool:CheetahRun-v1"),
        "gym:Pendulum-v1": ("gymnasium", "gym:Pendulum-v1"),
        "gymnasium:Pendulum-v1": ("gymnasium", "gym:Pendulum-v1"),
        "dmc:cheetah-run": ("dmc", "dmc:cheetah-run"),
    }
    for env_id, (backend, spec_id) in cases.items():
        env = make_env(env_id, num_envs=2)
        assert (env.spec.backend, env.spec.env_id, env.num_envs) == (backend, spec_id, 2), env_id
        env.close()
    env = make_env("Pendulum-v1", backend="gymnasium")
    assert env.spec.backend == "gymnasium"
    env.close()


def test_bare_id_falls_back_to_gymnasium():
    import gymnasium

    env_id = "CtrlRlTestPendulum-v0"  # registered with gymnasium only, so envpool cannot have it
    if env_id not in gymnasium.registry:
        gymnasium.register(env_id, entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                           max_episode_steps=7)
    env = make_env(env_id, num_envs=2)
    assert env.spec.backend == "gymnasium" and env.spec.max_episode_steps == 7
    check_env(env, steps=20)
    env.close()


def test_make_env_torch_prefix():
    torch_envs = pytest.importorskip("ctrl_rl.envs.torch_envs")
    if "Pendulum" not in torch_envs.TORCH_ENVS:
        pytest.skip("torch:Pendulum not registered yet")
    env = make_env("torch:Pendulum", num_envs=5, seed=1)
    assert env.spec.backend == "torch" and env.num_envs == 5


@pytest.mark.parametrize(
    ("env_id", "kwargs", "match"),
    [
        ("Foo-v0", {}, "unknown env id 'Foo-v0'"),
        ("HalfCheeta-v5", {}, "did you mean 'HalfCheetah-v5'"),
        ("foo:Pendulum-v1", {}, "unknown backend prefix 'foo'"),
        ("gmy:Pendulum-v1", {}, "did you mean 'gym:'"),
        ("envpool:HalfCheetah-v9", {}, "'envpool:HalfCheetah-v9'.*did you mean 'envpool:HalfCheetah-v5'"),
        ("gym:Pendulumm-v1", {}, "'gym:Pendulumm-v1'.*did you mean 'gym:Pendulum-v1'"),
        ("dmc:cheetah-runn", {}, "'dmc:cheetah-runn'.*did you mean 'dmc:cheetah-run'"),
        ("dmc:cheetah", {}, "'dmc:cheetah'.*dmc:<domain>-<task>"),
        ("torch:NoSuchEnv", {}, "unknown env id 'torch:NoSuchEnv'"),
        ("Pendulum-v1", {"num_envs": 0}, "num_envs=0 for env 'Pendulum-v1'"),
        ("torch:Pendulum", {"num_envs": -2}, "num_envs=-2 for env 'torch:Pendulum'"),
        ("gym:Pendulum-v1", {"backend": "envpool"}, "'gym:Pendulum-v1'"),
        ("Pendulum-v1", {"backend": "mujoco"}, "backend='mujoco' for env 'Pendulum-v1'"),
    ],
)
def test_make_env_errors(env_id, kwargs, match):
    if env_id.startswith("torch:"):
        pytest.importorskip("ctrl_rl.envs.torch_envs")
    with pytest.raises(UserInputError, match=match) as info:
        make_env(env_id, **kwargs)
    assert isinstance(info.value, ValueError)
    assert str(info.value).count(". ") == 0, "the message is one sentence"


def test_list_envs():
    ids = list_envs()
    assert len(ids) == len(set(ids))
    for prefix in ("envpool:", "gym:", "dmc:"):
        assert any(i.startswith(prefix) for i in ids)
    assert "envpool:HalfCheetah-v5" in ids and "gym:Pendulum-v1" in ids and "dmc:cheetah-run" in ids
    assert set(list_envs("dmc")) == {i for i in ids if i.startswith("dmc:")}
    with pytest.raises(UserInputError):
        list_envs("mujoco")


def test_registry_import_is_lazy():
    """Importing the registry must not import the simulators (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, ctrl_rl.envs.registry, ctrl_rl.envs.check; "
        "print(sorted(m for m in ('envpool', 'gymnasium', 'dm_control', 'mujoco') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- check_env itself fails on broken envs -------------------------------------------------------------


class _CountingEnv:
    """A tiny correct env (obs = [steps, noise], time limit 5) with switchable contract violations."""

    def __init__(self, num_envs: int = 3, bug: str | None = None) -> None:
        self.num_envs = num_envs
        self.device = torch.device("cpu")
        self.spec = EnvSpec("torch:Counting", (2,), False, 1, (-1.0,), (1.0,), 0.1, 5, "torch")
        self.bug = bug
        self.gen = torch.Generator().manual_seed(0)
        self.t = torch.zeros(num_envs)
        self.buf = torch.zeros(num_envs, 2)

    def _obs(self) -> torch.Tensor:
        return torch.stack([self.t, torch.rand(self.num_envs, generator=self.gen)], 1)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.gen.manual_seed(seed)
        self.t = torch.zeros(self.num_envs)
        return self._obs()

    def step(self, action: torch.Tensor) -> StepOut:
        self.t = self.t + 1
        final = self._obs()
        limit = 6 if self.bug == "limit" else 5
        truncated = self.t >= limit
        terminated = truncated.clone() if self.bug == "both" else torch.zeros_like(truncated)
        self.t = torch.where(truncated, torch.zeros_like(self.t), self.t)
        obs = torch.where(truncated.unsqueeze(1), self._obs(), final)
        if self.bug == "next_step":  # envpool's native convention passed through
            obs = final
        if self.bug == "final_obs":
            final = final + 1.0
        if self.bug == "dtype":
            obs = obs.double()
        if self.bug == "overwrite":
            self.buf.copy_(obs)
            obs = self.buf
        return StepOut(obs, action[:, 0].float(), terminated, truncated, final.clone())

    def close(self) -> None:
        pass


def test_check_env_passes_a_correct_env():
    check_env(_CountingEnv(), steps=20)


@pytest.mark.parametrize(
    ("bug", "match"),
    [
        ("both", "terminated and truncated both set"),
        ("final_obs", "final_obs differs from obs"),
        ("next_step", "obs equals final_obs"),
        ("dtype", "dtype torch.float64"),
        ("overwrite", "overwritten"),
        ("limit", "max_episode_steps"),
    ],
)
def test_check_env_catches(bug, match):
    with pytest.raises(AssertionError, match=match):
        check_env(_CountingEnv(bug=bug), steps=20)


def test_check_env_catches_envpool_next_step_passthrough():
    """An adapter that forgot the same-step conversion fails check_env."""
    from ctrl_rl.envs.envpool import EnvpoolEnv

    class NextStep(EnvpoolEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = self._env.step(
                action_to_numpy(action, self.spec, self._action_shape, self._action_dtype))
            obs = self._flat(obs)
            return StepOut(
                obs=self._tensor(obs),
                reward=self._tensor(np.asarray(reward, np.float32)),
                terminated=self._tensor(np.asarray(terminated)),
                truncated=self._tensor(np.asarray(truncated)),
                final_obs=self._tensor(obs.copy()),
                info={"elapsed_step": self._tensor(np.asarray(info["elapsed_step"], np.int64))},
            )

    env = NextStep("Pendulum-v1", num_envs=2, max_episode_steps=5)
    with pytest.raises(AssertionError, match="auto-reset"):
        check_env(env, steps=20)
    env.close()


def test_random_actions_within_bounds():
    spec = EnvSpec("torch:X", (3,), False, 2, (-2.0, 0.0), (2.0, 0.5))
    a = random_actions(spec, 1000, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert a.shape == (1000, 2) and a.dtype == torch.float32
    assert (a[:, 0] >= -2).all() and (a[:, 0] <= 2).all() and (a[:, 1] >= 0).all() and (a[:, 1] <= 0.5).all()
    assert a[:, 0].min() < -1.9 and a[:, 0].max() > 1.9  # uniform over the whole range
    d = random_actions(EnvSpec("torch:Y", (3,), True, 4), 1000, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert d.dtype == torch.int64 and d.shape == (1000,) and set(d.tolist()) == {0, 1, 2, 3}
    assert math.isclose(float((d == 0).float().mean()), 0.25, abs_tol=0.05)


def test_mujoco_settotalmass_deprecation_is_dropped_and_other_warnings_kept(capfd, monkeypatch):
    mujoco = pytest.importorskip("mujoco")
    import ctrl_rl.envs.gymnasium as gym_backend

    previous = mujoco.get_mju_user_warning()  # dm_control installs its own handler when imported
    monkeypatch.setattr(gym_backend, "_warning_filter_installed", False)
    mujoco.set_mju_user_warning(None)
    try:
        capfd.readouterr()
        env = gym_backend.make("HalfCheetah-v5")  # its XML uses settotalmass: MuJoCo >= 3.3 warns on compiling it
        env.close()
        handler = mujoco.get_mju_user_warning()
        assert handler is not None
        handler("Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.")
        err = capfd.readouterr().err
    finally:
        mujoco.set_mju_user_warning(previous)
    assert "settotalmass" not in err
    assert err.count("WARNING:") == 1 and "QACC" in err
