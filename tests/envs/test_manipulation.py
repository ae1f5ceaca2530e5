"""The DROID-style Franka tabletop tasks (``manip:``): contract, observations, controller, limits, success,
experts, seeding, options, workers and a CLI smoke run. CPU only; images are rendered small (32x48)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")
pytest.importorskip("envpool_assets")

from ctrl_rl.core.obs import obs_equal  # noqa: E402
from ctrl_rl.envs.check import check_env  # noqa: E402
from ctrl_rl.envs.manipulation import TASKS  # noqa: E402
from ctrl_rl.envs.manipulation.control import euler_to_mat, mat_to_euler, rotvec  # noqa: E402
from ctrl_rl.envs.manipulation.experts import ScriptedExpert, expert_actions  # noqa: E402
from ctrl_rl.envs.manipulation.sim import decode_instruction, encode_instruction  # noqa: E402
from ctrl_rl.envs.manipulation.tasks import TASK_INFO  # noqa: E402
from ctrl_rl.envs.registry import list_envs, make_env  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.robots.spec import franka_droid  # noqa: E402

CAMS = ("exterior_image_1_left", "exterior_image_2_left", "wrist_image_left")
SMALL = "image_size=32x48"


def _make(env_id: str, n: int = 2, seed: int = 0, **kw):
    return make_env(env_id, num_envs=n, seed=seed, **kw)


def _sim(env, i: int = 0):
    return env._group.sims[i]  # white-box access to one env's MuJoCo state (in-process group)


# ---- the BatchedEnv contract --------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_every_task_passes_check_env_in_state_mode(task):
    env, twin = _make(f"manip:{task},max_episode_steps=12"), _make(f"manip:{task},max_episode_steps=12")
    try:
        assert env.spec.is_flat and env.spec.backend == "manip" and env.spec.env_id == f"manip:{task}"
        assert env.spec.obs_shape == (14 + len(TASK_INFO[task].privileged),)
        check_env(env, steps=30, twin=twin)
    finally:
        env.close()
        twin.close()


def test_camera_language_mode_passes_check_env():
    opts = f"cameras=all,{SMALL},language=true,randomize=true,max_episode_steps=3"
    env, twin = _make(f"manip:Lift,{opts}"), _make(f"manip:Lift,{opts}")
    try:
        check_env(env, steps=7, twin=twin)
    finally:
        env.close()
        twin.close()


def test_default_time_limits_and_spec():
    for task in TASKS:
        env = _make(f"manip:{task}", n=1)
        spec = env.spec
        assert spec.max_episode_steps == TASK_INFO[task].max_episode_steps
        assert spec.dt == pytest.approx(1 / 15) and spec.action_dim == 7
        assert spec.action_low == (-1.0,) * 7 and spec.action_high == (1.0,) * 7
        env.close()
    assert {f"manip:{t}" for t in TASKS} <= set(list_envs("manip"))


# ---- observations ------------------------------------------------------------------------------------------


def test_observation_parts_names_shapes_dtypes():
    env = _make(f"manip:PickPlace,cameras=all,{SMALL},language=true", n=3, seed=4)
    obs = env.reset()
    names = [p.name for p in env.spec.parts]
    assert names == ["state", *(f"image/{c}" for c in CAMS), "language"]
    assert obs["state"].shape == (3, 30) and obs["state"].dtype == torch.float32
    for c in CAMS:
        img = obs[f"image/{c}"]
        assert img.shape == (3, 3, 32, 48) and img.dtype == torch.uint8
        assert img.float().std() > 5  # a rendered scene, not a blank buffer
    lang = obs["language"]
    assert lang.shape == (3, 64) and lang.dtype == torch.int64 and (lang >= 0).all()
    for i in range(3):
        text = decode_instruction(lang[i])
        assert text == env.instructions[i] and text in TASK_INFO["PickPlace"].instructions
    out = env.step(torch.zeros(3, 7))
    assert out.info["instruction_index"].tolist() == [env.task_instructions.index(t) for t in env.instructions]
    env.close()


def test_only_requested_cameras_and_default_size():
    env = _make("manip:Reach,cameras=wrist", n=1)
    obs = env.reset()
    assert sorted(obs) == ["image/wrist_image_left", "state"]
    assert obs["image/wrist_image_left"].shape == (1, 3, 180, 320)  # DROID's frame size by default
    env.close()
    flat = _make("manip:Reach", n=1)
    assert isinstance(flat.reset(), torch.Tensor) and flat._group.renderer is None  # no rendering without cameras
    flat.close()


def test_state_layout_matches_the_simulator():
    env = _make("manip:Lift", n=1, seed=2)
    s = env.reset()[0].numpy()
    sim = _sim(env)
    assert np.allclose(s[:7], franka_droid().home, atol=1e-6)  # joint_position at the DROID home pose
    assert np.allclose(s[7:10], sim.ee_pos, atol=1e-6)  # cartesian_position xyz
    assert np.allclose(euler_to_mat(s[10:13]), sim.ee_rot, atol=1e-5)  # ... and its Euler angles
    assert s[13] == pytest.approx(0.0, abs=1e-6)  # gripper open
    cube, quat = sim.cube_pose
    assert np.allclose(s[14:17], cube, atol=1e-6) and np.allclose(s[21:24], cube - sim.ee_pos, atol=1e-6)
    assert quat[0] >= 0 and np.linalg.norm(s[17:21]) == pytest.approx(1.0, abs=1e-5)
    (a, b), (c, d) = env.spec.robot_state_layout.joint_position, env.spec.robot_state_layout.ee_position
    assert np.array_equal(s[a:b], s[:7]) and np.array_equal(s[c:d], s[7:10])  # what the deploy safety filter reads
    env.close()


def test_instruction_encoding():
    tok = encode_instruction("open the drawer")
    assert tok.shape == (64,) and tok.dtype == np.int64 and tok[0] == ord("o") + 1 and tok[15:].sum() == 0
    assert decode_instruction(tok) == "open the drawer"
    assert (encode_instruction("x" * 100) == ord("x") + 1).all()  # truncated to 64


# ---- controller: forward kinematics, IK, limits --------------------------------------------------------------


def _dh_tcp(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Franka's TCP pose from its published (modified) DH parameters, flange + 0.1034 m, -45 deg about z."""
    a = [0, 0, 0, 0.0825, -0.0825, 0, 0.088, 0]
    d = [0.333, 0, 0.316, 0, 0.384, 0, 0, 0.107]
    alpha = [0, -math.pi / 2, math.pi / 2, math.pi / 2, -math.pi / 2, math.pi / 2, math.pi / 2, 0]
    t = np.eye(4)
    for i, th in enumerate([*q, 0.0]):
        ca, sa, ct, st = math.cos(alpha[i]), math.sin(alpha[i]), math.cos(th), math.sin(th)
        t = t @ np.array([[ct, -st, 0, a[i]], [st * ca, ct * ca, -sa, -d[i] * sa], [st * sa, ct * sa, ca, d[i] * ca],
                          [0, 0, 0, 1]])
    c, s = math.cos(-math.pi / 4), math.sin(-math.pi / 4)
    t = t @ np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, 1, 0.1034], [0, 0, 0, 1]])
    return t[:3, 3], t[:3, :3]


def test_joint_angles_follow_franka_convention():
    import mujoco

    env = _make("manip:Reach", n=1)
    sim, rng = _sim(env), np.random.default_rng(0)
    spec = franka_droid()
    for _ in range(5):
        q = rng.uniform(spec.joint_pos_low, spec.joint_pos_high)
        sim.data.qpos[sim.qpos_idx] = q
        mujoco.mj_kinematics(sim.model, sim.data)
        p, r = _dh_tcp(q)
        assert np.linalg.norm(sim.ee_pos - p) < 1e-3  # the site sits 0.4 mm short of Franka's 0.1034 m
        assert np.abs(sim.ee_rot - r).max() < 1e-5
    env.close()


def test_rotation_helpers():
    rng = np.random.default_rng(1)
    for _ in range(20):
        e = rng.uniform([-3, -1.5, -3], [3, 1.5, 3])
        assert np.allclose(mat_to_euler(euler_to_mat(e)), e, atol=1e-9)
        v = rng.normal(size=3) * 0.5
        import mujoco

        q, r = np.empty(4), np.empty(9)
        mujoco.mju_axisAngle2Quat(q, v / np.linalg.norm(v), np.linalg.norm(v))
        mujoco.mju_quat2Mat(r, q)
        assert np.allclose(rotvec(r.reshape(3, 3)), v, atol=1e-9)


@pytest.mark.parametrize("axis,sign", [(0, 1), (1, -1), (2, 1), (2, -1), (1, 1)])
def test_cartesian_action_moves_the_end_effector_by_the_scaled_amount(axis, sign):
    env = _make("manip:Reach", n=1, seed=1)
    env.reset()
    cmd = 0.5
    a = torch.zeros(1, 7)
    a[0, axis] = sign * cmd
    sim = _sim(env)
    moves = []
    for _ in range(3):
        p0, r0 = sim.ee_pos, sim.ee_rot
        env.step(a)
        moves.append(sim.ee_pos - p0)
        assert np.linalg.norm(rotvec(sim.ee_rot @ r0.T)) < 0.02  # orientation held (< 1.2 deg per step)
    for m in moves[1:]:  # after the first step from rest
        assert sign * m[axis] == pytest.approx(cmd * 0.075, rel=0.15)
        off = np.delete(m, axis)
        assert np.linalg.norm(off) < 0.2 * cmd * 0.075
    env.close()


def test_cartesian_rotation_and_gripper():
    env = _make("manip:Reach", n=1, seed=1)
    env.reset()
    sim = _sim(env)
    for _ in range(2):
        r0 = sim.ee_rot
        env.step(torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]]))
        w = rotvec(sim.ee_rot @ r0.T)  # world-frame rotation of this step
        assert w[2] == pytest.approx(0.5 * 0.15, rel=0.15) and np.abs(w[:2]).max() < 0.01
    g = [sim.gripper]
    for _ in range(10):
        env.step(torch.tensor([[0.0] * 6 + [1.0]]))
        g.append(sim.gripper)
    # the command reaches 1 after 4 steps of 0.25; the model's heavy fingers follow within ~0.6 s
    assert g[0] < 0.01 and np.all(np.diff(g) >= -1e-3) and g[4] > 0.3 and g[-1] > 0.9
    env.close()


@pytest.mark.parametrize("action", ["cartesian_velocity", "joint_velocity"])
def test_joint_limits_are_never_exceeded(action):
    env = _make(f"manip:Reach,action={action},max_episode_steps=200", n=3, seed=5)
    spec = franka_droid()
    low, high = torch.tensor(spec.joint_pos_low), torch.tensor(spec.joint_pos_high)
    gen = torch.Generator().manual_seed(0)
    env.reset()
    a_dim = env.spec.action_dim
    direction = torch.sign(torch.rand(3, a_dim, generator=gen) - 0.5)  # [N,A] held for a while: drives into limits
    for t in range(150):
        if t % 25 == 0:
            direction = torch.sign(torch.rand(3, a_dim, generator=gen) - 0.5)
        out = env.step(direction)
        q = out.final_obs[:, :7]  # [N,7]
        assert ((q >= low) & (q <= high)).all(), f"step {t}: {q}"
    env.close()


def test_joint_velocity_action_space():
    env = _make("manip:Reach,action=joint_velocity", n=1)
    assert env.spec.action_dim == 8 and env.spec.action_units == ("rad",) * 7 + ("1",)
    assert env.spec.action_space_name == "joint_velocity"
    q0 = env.reset()[0, :7].clone()
    a = torch.zeros(1, 8)
    a[0, 0] = 0.5  # joint 1 at 0.1 rad per step
    for _ in range(3):
        q = env.step(a).obs[0, :7]
    assert (q - q0)[0].item() == pytest.approx(0.3, rel=0.15)
    assert (q - q0)[1:].abs().max() < 0.02
    env.close()


def test_robot_and_action_units_for_export():
    env = _make("manip:Lift", n=1)
    assert env.spec.robot == franka_droid() and env.robot is env.spec.robot
    assert env.spec.action_units == ("m", "m", "m", "rad", "rad", "rad", "1")
    assert env.spec.action_space_name == "cartesian_velocity"
    env.close()


# ---- success, rewards ----------------------------------------------------------------------------------------


def test_success_detection_and_sparse_reward():
    import mujoco

    env = _make("manip:Reach,reward=sparse", n=1, seed=3)
    env.reset()
    sim = _sim(env)
    out = env.step(torch.zeros(1, 7))
    assert not out.info["success"][0] and out.reward[0] == 0.0  # the target starts away from the gripper
    sim.set_target(sim.ee_pos)
    out = env.step(torch.zeros(1, 7))
    assert out.info["success"][0] and out.reward[0] == 1.0
    env.close()

    env = _make("manip:Lift", n=1, seed=3)
    env.reset()
    sim = _sim(env)
    r_low = env.step(torch.zeros(1, 7)).reward[0].item()
    assert not env.step(torch.zeros(1, 7)).info["success"][0]
    pos, quat = sim.cube_pose
    sim.set_cube(pos + np.array([0, 0, 0.2]), quat)  # in the air (falls back during the step, but from 0.2 m)
    mujoco.mj_forward(sim.model, sim.data)
    out = env.step(torch.zeros(1, 7))
    assert out.info["success"][0] and out.reward[0] > r_low
    env.close()


def test_terminate_on_success_option():
    env = _make("manip:Reach,terminate_on_success=true", n=2, seed=3)
    obs = env.reset()
    _sim(env, 0).set_target(_sim(env, 0).ee_pos)
    out = env.step(torch.zeros(2, 7))
    assert out.terminated.tolist() == [True, False] and not out.truncated.any()
    assert not torch.equal(out.obs[0], out.final_obs[0]) and torch.equal(out.obs[1], out.final_obs[1])
    del obs
    env.close()


# ---- experts -------------------------------------------------------------------------------------------------


def _expert_success(task: str, n: int, seed: int, extra: str = "") -> float:
    env = _make(f"manip:{task}{extra}", n=n, seed=seed)
    state = env.reset()
    done = np.zeros(n, dtype=bool)
    for _ in range(env.spec.max_episode_steps):
        out = env.step(torch.from_numpy(expert_actions(task, state)))
        done |= out.info["success"].numpy()
        if done.all():
            break
        state = out.obs
    env.close()
    return float(done.mean())


@pytest.mark.parametrize("task", TASKS)
def test_experts_succeed(task):
    assert _expert_success(task, n=2, seed=11) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("randomize", [False, True], ids=["nominal", "randomized"])
@pytest.mark.parametrize("task", TASKS)
def test_experts_succeed_90_percent_over_20_episodes(task, randomize):
    assert _expert_success(task, n=20, seed=2024, extra=f",randomize={str(randomize).lower()}") >= 0.9


def test_scripted_expert_policy_on_dict_obs():
    env = _make(f"manip:Reach,cameras=wrist,{SMALL}", n=2)
    act = ScriptedExpert("Reach")(env.reset())
    assert act.shape == (2, 7) and act.dtype == torch.float32 and act.abs().max() <= 1
    env.close()


# ---- seeding, workers ------------------------------------------------------------------------------------------


def test_same_seed_same_observations_different_seed_different():
    a, b, c = _make("manip:Push", seed=5), _make("manip:Push", seed=5), _make("manip:Push", seed=6)
    oa, ob, oc = a.reset(), b.reset(), c.reset()
    assert torch.equal(oa, ob) and not torch.equal(oa, oc)
    act = torch.full((2, 7), 0.3)
    assert torch.equal(a.step(act).obs, b.step(act).obs)
    assert torch.equal(a.reset(seed=9), c.reset(seed=9))  # reset(seed) re-seeds
    for e in (a, b, c):
        e.close()


def test_closing_one_camera_env_leaves_the_others_rendering():
    """Each renderer frees its GL objects in its own context: closing env b once blacked out env c's images."""
    opts = f"manip:Lift,cameras=exterior1,{SMALL}"
    b = _make(opts, seed=5)
    ob = b.reset()["image/exterior_image_1_left"]
    c = _make(opts, seed=5)  # its context is now the current one
    b.close()
    oc = c.reset()["image/exterior_image_1_left"]
    c.close()
    assert float(oc.float().mean()) > 20 and torch.equal(ob, oc)


def test_group_size_makes_each_block_of_envs_replay_the_same_episodes():
    env = _make("manip:Lift,language=true,randomize=true,max_episode_steps=3,group_size=2", n=4, seed=3)
    plain = _make("manip:Lift,language=true,randomize=true,max_episode_steps=3", n=4, seed=3)
    try:
        obs = env.reset()["state"]
        assert torch.equal(obs[0], obs[1]) and torch.equal(obs[2], obs[3]) and not torch.equal(obs[0], obs[2])
        assert torch.equal(obs[0], plain.reset()["state"][0])  # block 0 draws env 0's stream
        a = torch.zeros(4, 7)
        a[1, 0] = 1.0  # env 1 acts differently: its episode diverges, the next one starts where env 0's does
        for _ in range(2):
            out = env.step(a)
        assert not torch.equal(out.obs["state"][0], out.obs["state"][1])
        out = env.step(a)  # the time limit: every env starts its second episode
        assert bool(out.truncated.all())
        assert torch.equal(out.obs["state"][0], out.obs["state"][1])
        assert torch.equal(out.obs["state"][2], out.obs["state"][3])
        assert env.instructions[0] == env.instructions[1]
    finally:
        env.close()
        plain.close()


def test_workers_match_in_process():
    opts = f"manip:Lift,cameras=wrist,{SMALL},randomize=true,max_episode_steps=4"
    local = _make(opts, n=3, seed=8)
    pool = _make(opts + ",workers=2", n=3, seed=8)
    try:
        assert obs_equal(local.reset(), pool.reset())
        gen = torch.Generator().manual_seed(0)
        for _ in range(5):  # crosses an auto-reset
            a = torch.rand(3, 7, generator=gen) * 2 - 1
            x, y = local.step(a), pool.step(a)
            assert obs_equal(x.obs, y.obs) and obs_equal(x.final_obs, y.final_obs)
            assert torch.equal(x.reward, y.reward) and torch.equal(x.truncated, y.truncated)
        assert pool.instructions == local.instructions
    finally:
        local.close()
        pool.close()


# ---- options -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id,match", [
    ("manip:Fly", "unknown manipulation task 'Fly'"),
    ("manip:Lift,cameras=top", "unknown camera 'top'"),
    ("manip:Lift,cameras=all,image_size=big", "image_size='big'"),
    ("manip:Lift,cameras=all,image_size=4x4", "image_size='4x4'"),
    ("manip:Lift,colour=red", "no option 'colour'"),
    ("manip:Lift,reward=shaped", "reward='shaped'"),
    ("manip:Lift,action=torque", "action='torque'"),
    ("manip:Lift,workers=-1", "workers=-1"),
    ("manip:Lift,group_size=0", "group_size=0"),
])  # fmt: skip
def test_bad_options_raise_one_sentence(env_id, match):
    with pytest.raises(UserInputError, match=match) as info:
        make_env(env_id)
    msg = str(info.value)
    assert msg.count(". ") == 0 and "expected" in msg


def test_option_forms():
    env = _make("manip:Reach,cameras=exterior2+wrist,image_size=90x160,language=true", n=1)
    assert [p.name for p in env.spec.parts] == ["state", "image/exterior_image_2_left", "image/wrist_image_left",
                                                "language"]
    assert env.spec.parts[1].shape == (3, 90, 160)
    env.close()


# ---- CLI ------------------------------------------------------------------------------------------------------------


def test_cli_trains_ppo_on_manip_reach(capsys, tmp_path):
    from ctrl_rl.cli import main

    code = main(["train", "ppo", "--env", "manip:Reach", "--num-envs", "4", "--total-steps", "256", "--rollout-steps",
                 "16", "--minibatch-size", "32", "--epochs", "1", "--no-progress", "--threads", "1", "--run-dir",
                 str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["step"] == 256
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["run"]["env"] == "manip:Reach"
