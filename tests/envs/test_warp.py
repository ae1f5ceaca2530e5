"""The MuJoCo Warp backend (``warp:``): the BatchedEnv contract on every task, agreement with gymnasium's MuJoCo v5
tasks from the same state and actions, same-step auto-reset, bit-exact resume, graph replay = eager launches, the
user-facing errors, and PPO from the CLI. Everything runs on Warp's CPU device with a few worlds; the CUDA path is
``gpu``-marked.

Kernels: Warp caches compiled kernels in ``WARP_CACHE_PATH`` (default ``~/.cache/warp/<version>``); with the cache
warm this module takes ~25 s on 2 loaded cores (half of it the PPO run), cold ~70 s (MuJoCo Warp's kernels compile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco_warp")
gymnasium = pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from ctrl_rl.envs import warp as warp_module  # noqa: E402
from ctrl_rl.envs.check import check_env  # noqa: E402
from ctrl_rl.envs.gymnasium import filter_mujoco_warnings  # noqa: E402
from ctrl_rl.envs.registry import list_envs, make_env, spec_of  # noqa: E402
from ctrl_rl.envs.warp import WarpEnv  # noqa: E402
from ctrl_rl.envs.warp_tasks import TASKS  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.learn.checkpoint import load_checkpoint  # noqa: E402


@pytest.mark.parametrize("task", list(TASKS))
def test_check_env(task):
    """The contract on each task, with a short time limit so that truncations and auto-resets are seen (and, on the
    hoppers and walkers, terminations under random actions)."""
    env = make_env(f"warp:{task},max_episode_steps=8", num_envs=3, seed=1)
    twin = make_env(f"warp:{task},max_episode_steps=8", num_envs=3, seed=1)
    check_env(env, steps=30, twin=twin)
    env.close()
    twin.close()


def _gait(t: int, high: np.ndarray) -> np.ndarray:
    """A smooth open-loop action sequence: each actuator a sine at full range with its own phase."""
    return (high * np.sin(0.3 * t + np.arange(len(high)))).astype(np.float32)  # [A]


# Measured on Warp's CPU device (float32) against gymnasium 1.4 on MuJoCo 4.0 (float64) with the gait above, from
# gymnasium's reset state (and again from its next reset state after each termination): the largest |obs difference|
# and |reward difference| over the horizon, and the tolerance the test allows:
# - HalfCheetah, 300 steps: 0.125 / 0.010 (allowed 0.5 / 0.05). Foot impacts amplify the float32 differences for a few
#   dozen steps (1e-5 before them), which die out once the cheetah has flipped and settles; with half the gait's
#   amplitude it keeps moving and they grow chaotically to O(1) after ~150 steps, as MuJoCo's own trajectory does from
#   a 1e-7 change of its state;
# - Hopper, 300 steps, 15 episodes: 1.1e-5 / 1.8e-6 (allowed 1e-4 / 2e-5);
# - Walker2d, 300 steps, 13 episodes: 9.7e-5 / 3.2e-6 (allowed 1e-3 / 3e-5);
# - Humanoid, 300 steps, 14 episodes: 0.10 / 4.8e-4 (allowed 0.5 / 5e-3); its observations reach ~150 (contact
#   forces, com inertia), the largest differences are contact forces at impacts;
# - Ant, 1 step: 1.4e-6 (allowed 2e-5). MuJoCo Warp sets the tangent directions of a capsule-plane contact along the
#   world axes where MuJoCo takes them from the capsule, and with the models' pyramidal friction cone the friction
#   forces depend on those directions: the two simulators part at the first foot contact (step 2), and terminations
#   differ later. With an elliptic cone on both models they follow each other through contacts (next test).
# Terminations agree at every compared step.
PARITY = {
    "HalfCheetah-v5": (300, 0.5, 0.05),
    "Hopper-v5": (300, 1e-4, 2e-5),
    "Walker2d-v5": (300, 1e-3, 3e-5),
    "Ant-v5": (1, 2e-5, 2e-5),
    "Humanoid-v5": (300, 0.5, 5e-3),
}


@pytest.mark.parametrize("task", list(PARITY))
def test_matches_gymnasium_from_the_same_state_and_actions(task):
    episodes = _follow_gymnasium(task, *PARITY[task])
    if task in ("Hopper-v5", "Walker2d-v5", "Humanoid-v5"):
        assert episodes >= 8  # the comparison crosses terminations and restarts


def test_ant_follows_gymnasium_through_contacts_with_an_elliptic_cone(monkeypatch):
    """Ant's observation and reward terms that only contacts exercise (clipped contact forces, contact cost, the torso's
    velocity), compared where the two simulators agree on contacts: both models switched to the elliptic friction cone,
    whose friction does not depend on the contact's tangent directions. Measured over 10 steps: 6.9e-5 / 8.9e-6
    (feet touch the floor from step 2 on); afterwards Ant's 10 ms steps amplify float32 differences as they amplify a
    1e-7 change of MuJoCo's own state."""
    load = warp_module._load_model

    def elliptic(task):
        model = load(task)
        model.opt.cone = 1  # mjCONE_ELLIPTIC
        return model

    monkeypatch.setattr(warp_module, "_load_model", elliptic)
    _follow_gymnasium("Ant-v5", 10, 5e-4, 1e-4, cone=1)


def _follow_gymnasium(task: str, horizon: int, obs_tol: float, reward_tol: float, cone: int | None = None) -> int:
    """Step gymnasium's env and a one-world warp env from gymnasium's reset state with the gait, asserting the
    tolerances at each step and restarting both from gymnasium's next reset state after a termination; returns the
    number of episodes compared."""
    filter_mujoco_warnings()
    ref = gymnasium.make(task).unwrapped
    if cone is not None:
        ref.model.opt.cone = cone
    env = make_env(f"warp:{task}", num_envs=1, seed=0)
    assert isinstance(env, WarpEnv)
    env.reset()
    high = ref.action_space.high

    def start(seed: int) -> None:
        ref_obs, _ = ref.reset(seed=seed)
        obs = env.set_state(torch.as_tensor(ref.data.qpos[None]), torch.as_tensor(ref.data.qvel[None]))
        np.testing.assert_allclose(obs[0].numpy(), ref_obs, atol=1e-5, rtol=0)

    start(0)
    episodes = 1
    for t in range(horizon):
        action = _gait(t, high)
        ref_obs, ref_reward, ref_terminated, _, _ = ref.step(action)
        out = env.step(torch.as_tensor(action[None]))
        np.testing.assert_allclose(out.final_obs[0].numpy(), ref_obs, atol=obs_tol, rtol=0, err_msg=f"step {t}")
        assert abs(out.reward[0].item() - ref_reward) <= reward_tol, f"step {t}"
        assert bool(out.terminated[0]) == ref_terminated, f"step {t}"
        if ref_terminated:
            episodes += 1
            start(1000 + t)
    env.close()
    ref.close()
    return episodes


def test_auto_reset_in_the_same_step():
    """A terminated Hopper world starts again in the step that ended it: its obs is a fresh start state near the
    initial pose, final_obs the fallen one, and its counter restarts; the running worlds go on untouched."""
    env = make_env("warp:Hopper-v5", num_envs=4, seed=3)
    assert isinstance(env, WarpEnv)
    obs = env.reset()
    init = obs.clone()
    action = torch.tensor([[1.0, -1.0, 1.0]]).repeat(4, 1)  # [N,A] a push that topples it
    seen = False
    for _ in range(200):
        out = env.step(action)
        if bool(out.terminated.any()):
            seen = True
            ended = out.terminated
            assert (out.info["elapsed_step"][ended] > 1).all()
            assert torch.allclose(out.obs[ended, :5], init[ended, :5], atol=0.011)  # qpos[1:] within 2x the noise
            assert not torch.allclose(out.final_obs[ended], out.obs[ended])
            assert torch.equal(out.final_obs[~out.done], out.obs[~out.done])
            nxt = env.step(action)
            assert (nxt.info["elapsed_step"][ended] == 1).all()
            break
    assert seen, "a full push should topple the hopper within 200 steps"
    env.close()


@pytest.mark.parametrize("task", ["Hopper-v5", "Ant-v5"])
def test_state_dict_round_trip_continues_bit_exactly(task):
    """A loaded env (made with another seed) continues exactly like the uninterrupted one, across auto-resets
    (Ant: with contacts and the reset kinematics)."""
    env = make_env(f"warp:{task},max_episode_steps=12", num_envs=3, seed=5)
    gen = torch.Generator().manual_seed(0)
    actions = [2 * torch.rand(3, env.spec.action_dim, generator=gen) - 1 for _ in range(40)]  # [N,A] each
    env.reset()
    for a in actions[:15]:
        env.step(a)
    snapshot = env.state_dict()
    expected = [env.step(a) for a in actions[15:]]
    other = make_env(f"warp:{task},max_episode_steps=12", num_envs=3, seed=99)
    other.reset()
    other.load_state_dict(snapshot)
    for a, want in zip(actions[15:], expected):
        got = other.step(a)
        for field in ("obs", "final_obs", "reward", "terminated", "truncated"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
    with pytest.raises(ValueError, match="state_dict is for env"):
        make_env("warp:HalfCheetah-v5", num_envs=3).load_state_dict(snapshot)
    with pytest.raises(ValueError, match="num_envs=2"):
        make_env(f"warp:{task}", num_envs=2).load_state_dict(snapshot)
    partial = {k: v for k, v in snapshot.items() if k != "qvel"}
    with pytest.raises(ValueError, match="lacks qvel"):
        other.load_state_dict(partial)


def test_graph_replay_equals_eager_launches():
    """The captured graph (Warp's CPU graph here) gives bit-identical trajectories to launching the kernels one by
    one, with contacts and resets."""
    runs = []
    for graph in (True, False):
        env = make_env("warp:Ant-v5,max_episode_steps=6", num_envs=2, seed=2, graph=graph)
        gen = torch.Generator().manual_seed(1)
        obs = [env.reset()]
        for _ in range(10):
            obs.append(env.step(2 * torch.rand(2, 8, generator=gen) - 1).obs)
        runs.append(torch.stack(obs))
    assert torch.equal(runs[0], runs[1])


def test_spec_listing_options_and_errors():
    env = make_env("warp:Hopper-v5,max_episode_steps=5,ctrl_cost_weight=0.01", num_envs=2)
    assert spec_of("warp:Hopper-v5,max_episode_steps=5,ctrl_cost_weight=0.01") == env.spec
    assert env.spec.obs_shape == (11,) and env.spec.dt == pytest.approx(0.008) and env.spec.max_episode_steps == 5
    assert spec_of("warp:Ant-v5").obs_shape == (105,) and spec_of("warp:Humanoid-v5").obs_shape == (348,)
    assert spec_of("warp:Humanoid-v5").action_high[0] == pytest.approx(0.4)
    assert spec_of("warp:Ant-v5,include_cfrc_ext_in_observation=false").obs_shape == (27,)
    assert {f"warp:{t}" for t in TASKS} <= set(list_envs("warp"))
    bad = [
        ("warp:HalfCheeta-v5", "unknown env id 'warp:HalfCheeta-v5'.*did you mean 'warp:HalfCheetah-v5'"),
        ("warp:Hopper-v5,ctrl_cost_weigth=1", "no option 'ctrl_cost_weigth'.*did you mean 'ctrl_cost_weight'"),
        ("warp:Hopper-v5,frame_skip=0", "frame_skip=0: expected an integer >= 1"),
        ("warp:Hopper-v5,terminate_when_unhealthy=3", "expected true or false"),
    ]
    with pytest.raises(UserInputError, match="graph='yes': expected true or false"):
        make_env("warp:Hopper-v5,graph=yes")
    for env_id, match in bad:
        for fn in (spec_of, make_env):
            with pytest.raises(UserInputError, match=match) as info:
                fn(env_id)
            assert str(info.value).count(". ") == 0, "the message is one sentence"
    with pytest.raises(UserInputError, match="device 'meta' for warp:Hopper-v5: expected 'cpu' or 'cuda"):
        make_env("warp:Hopper-v5", device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(UserInputError, match="device 'cuda' for warp:Hopper-v5"):
            make_env("warp:Hopper-v5", device="cuda")
    with pytest.raises(ValueError, match=r"expects float actions of shape \(2, 3\)"):
        env.step(torch.zeros(3, 3))


def _find_state(d: Any) -> dict:
    """The warp env's own state dict inside the state dicts of the wrappers around it."""
    if isinstance(d, dict) and "qpos" in d:
        return d
    children = d.values() if isinstance(d, dict) else d if isinstance(d, list) else []
    found = [s for c in children if (s := _find_state(c))]
    return found[0] if found else {}


def test_ppo_trains_checkpoints_and_resumes_from_the_cli(tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ctrl_rl", *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "MPLBACKEND": "Agg"})

    run = tmp_path / "run"
    small = ["--num-envs", "8", "--rollout-steps", "8", "--minibatch-size", "32", "--epochs", "1", "--no-progress"]
    r = cli("train", "ppo", "--env", "warp:HalfCheetah-v5", "--device", "cpu", "--run-dir", str(run),
            "--total-steps", "128", *small)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 128
    sim = _find_state(load_checkpoint(run / "checkpoints" / "latest.pt")["env_state"])  # under the loop's wrappers
    assert sim["env_id"] == "warp:HalfCheetah-v5" and sim["qpos"].shape == (8, 9)  # the simulator's state is saved
    r = cli("train", "ppo", "--resume", str(run), "--total-steps", "256", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 256


# ---- CUDA --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("task", ["HalfCheetah-v5", "Humanoid-v5"])
def test_cuda_check_env_and_graph_against_eager(task):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = make_env(f"warp:{task},max_episode_steps=8", num_envs=64, device="cuda", seed=1)
    check_env(env, steps=30)
    runs = []
    for graph in (True, False):
        e = make_env(f"warp:{task}", num_envs=64, device="cuda", seed=2, graph=graph, deterministic=True)
        gen = torch.Generator(device="cuda").manual_seed(1)
        obs = [e.reset()]
        for _ in range(10):
            obs.append(e.step(0.4 * (2 * torch.rand(64, e.spec.action_dim, generator=gen, device="cuda") - 1)).obs)
        runs.append(torch.stack(obs))
    torch.testing.assert_close(runs[0], runs[1], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_cuda_resume_repeats_within_float_noise():
    # On the CPU device resume is bit-exact (tested above). On an H200 (2026-11-26) this test, then asserting
    # torch.equal, failed: MuJoCo Warp 4.0 does not repeat contact-rich GPU steps bit for bit even with
    # deterministic=true (warp:Lift's repeats differ by 8e-7 after 20 steps), so the resumed run can only follow
    # the original within float noise amplified by the contacts. The tolerance below has not yet run on a GPU.
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = make_env("warp:Ant-v5,max_episode_steps=12", num_envs=16, device="cuda", seed=5, deterministic=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    actions = [2 * torch.rand(16, 8, generator=gen, device="cuda") - 1 for _ in range(30)]
    env.reset()
    for a in actions[:10]:
        env.step(a)
    snapshot = env.state_dict()
    expected = [env.step(a).obs for a in actions[10:]]
    other = make_env("warp:Ant-v5,max_episode_steps=12", num_envs=16, device="cuda", seed=9, deterministic=True)
    other.reset()
    other.load_state_dict(snapshot)
    for a, want in zip(actions[10:], expected):
        torch.testing.assert_close(other.step(a).obs, want, atol=1e-3, rtol=1e-3)
