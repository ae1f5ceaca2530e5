"""Termination functions equal the Gymnasium MuJoCo v5 envs' own ``terminated``, step by step, near every bound."""

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from ctrl_rl.envs.gymnasium import make  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.world_models.termination import TERMINATIONS, get_termination, has_termination  # noqa: E402


# -- rollouts of the real envs ----------------------------------------------------------------------------------
# Start perturbations ``(env, rng) -> None`` applied after some resets, so that episodes also reach the bounds that
# random actions from the reset state do not (a hopper sinking upright, a walker or ant above its height bound).
def lift(dz: float, vz: float):
    """Lift the root by ``dz`` with vertical velocity ``vz`` (Walker2d's and Ant's upper height bounds)."""
    def start(env, rng):
        qpos, qvel = env.data.qpos.copy(), env.data.qvel.copy()
        k = 2 if env.model.nq == 15 else 1  # Ant's z is qpos[2] (free joint), the planar walkers' qpos[1]
        qpos[k] += dz * rng.uniform(0.8, 1.2)
        qvel[k] = vz
        env.set_state(qpos, qvel)
    return start


def press(vz: float):
    """The Ant upside down just above the floor, thrown down at up to ``vz``: the torso sinks through z = 0.2 (its
    lower bound, below the torso's radius 0.25) on some first steps and not on others."""
    def start(env, rng):
        qpos, qvel = env.data.qpos.copy(), env.data.qvel.copy()
        qpos[2], qpos[3:7], qvel[2] = rng.uniform(0.35, 0.45), [0.0, 1.0, 0.0, 0.0], vz * rng.uniform(0.4, 1.0)
        env.set_state(qpos, qvel)
    return start


def tip(w: float):
    """Walker2d's torso pitched about the hips at about ``w`` rad/s, either way, the legs held still: it passes
    angle +-1 (faster) or sinks through z = 0.8 (slower) first."""
    def start(env, rng):
        qvel = env.data.qvel.copy()
        qvel[2] = w * rng.uniform(0.5, 1.5) * rng.choice([-1.0, 1.0])
        qvel[3] = qvel[6] = -qvel[2]
        env.set_state(env.data.qpos.copy(), qvel)
    return start


def crouch(thigh: float, leg: float):
    """The hopper upright with folded knees, its foot on the floor: the torso starts near z = 0.7."""
    def start(env, rng):
        qpos = env.data.qpos.copy()
        qpos[3], qpos[4] = -thigh * rng.uniform(0.8, 1.2), -leg * rng.uniform(0.8, 1.2)
        env.set_state(qpos, np.zeros(env.model.nv))
        qpos[1] -= env.data.geom_xpos[-1][2] - 0.06 - 0.005  # foot capsule (radius 0.06) just above the floor
        env.set_state(qpos, np.zeros(env.model.nv))
    return start


# env id -> (episodes, steps per episode at most, start perturbations cycled over episodes (None: the reset state))
PLANS = {
    "Hopper-v5": (240, 150, [None, crouch(0.5, 1.1), crouch(0.2, 1.4)]),
    "Walker2d-v5": (240, 150, [None, tip(6.0), lift(0.55, 3.0), tip(9.0)]),
    "HalfCheetah-v5": (12, 150, [None]),
    "Ant-v5": (120, 60, [None, lift(0.24, 0.8), lift(0.2, 3.0), press(-20.0)]),
}


def rollouts(env_id: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Steps of ``env_id`` under three kinds of actions cycled over episodes: uniform in [-1, 1], bang-bang +-1,
    and a constant +-0.8 per joint plus noise (biased: the body falls one way). Float64, as the env returns them."""
    episodes, steps, starts = PLANS[env_id]
    env = make(env_id)
    rng = np.random.default_rng(seed)
    A = env.action_space.shape[0]
    out: dict[str, list] = {"obs": [], "act": [], "next_obs": [], "terminated": [], "qvel": []}
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        start = starts[ep % len(starts)]
        if start is not None:
            start(env.unwrapped, rng)
            obs = env.unwrapped._get_obs()
        bias = rng.choice([-0.8, 0.8], size=A)
        for _ in range(steps):
            kind = ep % 3
            a = (rng.uniform(-1, 1, A) if kind == 0 else rng.choice([-1.0, 1.0], size=A) if kind == 1
                 else np.clip(bias + rng.normal(0, 0.3, A), -1, 1)).astype(np.float32)
            nxt, _, term, trunc, _ = env.step(a)
            for k, v in zip(out, (obs, a, nxt, term, env.unwrapped.data.qvel.copy())):
                out[k].append(v)
            if term or trunc:
                break
            obs = nxt
    env.close()
    return {k: np.array(v) for k, v in out.items()}


@pytest.fixture(scope="module", params=list(PLANS))
def steps(request):
    return request.param, rollouts(request.param)


def _call(env_id, d, dtype=torch.float64, next_obs=None):
    fn = get_termination(env_id)
    t = lambda k: torch.as_tensor(d[k], dtype=dtype)  # noqa: E731
    nxt = t("next_obs") if next_obs is None else next_obs
    return fn(t("obs"), t("act"), nxt)


def test_function_equals_the_envs_terminated_on_every_step(steps):
    env_id, d = steps
    want = torch.as_tensor(d["terminated"])
    got = _call(env_id, d)
    assert got.dtype == torch.bool and got.shape == want.shape
    bad = np.flatnonzero((got != want).numpy())
    assert bad.size == 0, f"{env_id}: {bad.size} of {len(want)} steps differ, first at next_obs {d['next_obs'][bad[0]]}"
    # float32 observations (datasets, models) give the same answers here; leading dims are free
    assert torch.equal(_call(env_id, d, torch.float32), want)
    nxt = torch.as_tensor(d["next_obs"])
    n = len(nxt) // 2 * 2
    assert torch.equal(get_termination(env_id)(nxt[:n].view(2, n // 2, -1), None, nxt[:n].view(2, n // 2, -1)),
                       want[:n].view(2, n // 2))


def test_rollouts_end_in_terminations_except_halfcheetah(steps):
    env_id, d = steps
    n = int(d["terminated"].sum())
    assert n == 0 if env_id == "HalfCheetah-v5" else n >= 40, f"{env_id}: {n} terminal steps"
    if env_id == "Hopper-v5":  # the velocity range the clipped observation cannot show is not reached here
        assert np.abs(d["qvel"]).max() < 100


# (observation column, bound) of every bound the rollouts reach: z and torso angle
BOUNDS = {
    "Hopper-v5": [(0, 0.7), (1, -0.2), (1, 0.2)],
    "Walker2d-v5": [(0, 0.8), (0, 2.0), (1, -1.0), (1, 1.0)],
    "Ant-v5": [(0, 0.2), (0, 1.0)],
}


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_bound_moved_by_a_little_fails_on_these_rollouts(steps, sign):
    """Moving any one bound by 0.03 (either way) changes ``terminated`` on some step, so the equality test above
    would catch a wrong threshold. Values within 0.25 of the bound are shifted, which moves only that bound."""
    env_id, d = steps
    if env_id not in BOUNDS:
        pytest.skip("HalfCheetah-v5 has no bounds")
    want = torch.as_tensor(d["terminated"])
    for col, bound in BOUNDS[env_id]:
        nxt = torch.as_tensor(d["next_obs"]).clone()
        near = (nxt[:, col] - bound).abs() < 0.25
        nxt[near, col] += sign * 0.03
        moved = _call(env_id, d, next_obs=nxt)
        assert (moved != want).any(), f"{env_id}: moving bound {bound} of obs[{col}] by {-sign * 0.03} changes nothing"


def test_unobservable_and_non_finite_parts():
    # Hopper: a clipped velocity is healthy (|qvel| >= 100 cannot be seen); a position out of (-100, 100) is not
    hop = get_termination("Hopper-v5")
    base = torch.zeros(4, 11, dtype=torch.float64)
    base[:, 0] = 1.2
    base[1, 6] = 10.0  # clip(qvel) at its bound
    base[2, 3] = 100.0  # a joint angle at the state bound
    base[3, 6] = float("nan")
    assert hop(None, None, base).tolist() == [False, False, True, True]
    # Ant: non-finite qpos/qvel terminates, contact forces are not part of the check; 27-element layout accepted
    ant = get_termination("Ant-v5")
    s = torch.zeros(3, 105)
    s[:, 0] = 0.5
    s[1, 20] = float("inf")
    s[2, 60] = float("nan")
    assert ant(None, None, s).tolist() == [False, True, False]
    assert ant(None, None, s[:, :27]).tolist() == [False, True, False]
    # bounds: Ant's are closed, Hopper's and Walker2d's open
    assert ant(None, None, torch.tensor([[0.2] + [0.0] * 26, [1.0] + [0.0] * 26])).tolist() == [False, False]
    w = torch.zeros(2, 17, dtype=torch.float64)
    w[:, 0] = torch.tensor([0.8, 2.0], dtype=torch.float64)
    assert get_termination("Walker2d-v5")(None, None, w).tolist() == [True, True]


def test_ids_with_prefixes_and_neutral_options():
    for prefix in ("", "gym:", "gymnasium:", "envpool:", "true:"):
        for task, fn in TERMINATIONS.items():
            assert get_termination(prefix + task) is fn and has_termination(prefix + task)
    assert get_termination("Hopper-v5,max_episode_steps=500,ctrl_cost_weight=0.01") is TERMINATIONS["Hopper-v5"]


@pytest.mark.parametrize("env_id, match", [
    ("Humanoid-v5", "Hopper-v5, Walker2d-v5, HalfCheetah-v5, Ant-v5"),
    ("Hopper-v4", "--learn-termination"),
    ("dmc:cheetah-run", "no termination function"),
    ("torch:Pendulum", "--learn-termination"),
    ("hopper-medium-v5", "no termination function"),
    ("Hopper-v5,terminate_when_unhealthy=false", "terminate_when_unhealthy"),
    ("Ant-v5,exclude_current_positions_from_observation=false", "exclude_current_positions_from_observation"),
    ("Hopper-v5,oops", "option"),
])
def test_get_termination_refuses_other_tasks_in_one_sentence(env_id, match):
    with pytest.raises(UserInputError, match=match) as e:
        get_termination(env_id)
    assert "\n" not in str(e.value) and str(e.value).endswith(".")
    assert not has_termination(env_id)


def test_wrong_observation_size_is_refused():
    with pytest.raises(UserInputError, match="last dim of 11"):
        get_termination("Hopper-v5")(None, None, torch.zeros(5, 17))
    with pytest.raises(UserInputError, match="105 or 27"):
        get_termination("Ant-v5")(None, None, torch.zeros(5, 11))
