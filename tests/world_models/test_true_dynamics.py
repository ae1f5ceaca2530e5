"""TrueDynamicsEnv: the BatchedEnv contract, start states from dataset rows, the real env's steps, exact resume."""

import io

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from ctrl_rl.envs.check import check_env  # noqa: E402
from ctrl_rl.envs.gymnasium import make  # noqa: E402
from ctrl_rl.errors import UserInputError  # noqa: E402
from ctrl_rl.world_models.termination import get_termination  # noqa: E402
from ctrl_rl.world_models.true_dynamics import TrueDynamicsEnv  # noqa: E402


def sim_rows(env_id: str, episodes: int = 3, steps: int = 50, seed: int = 0) -> dict[str, np.ndarray]:
    """Dataset-like rows from a Gymnasium env under random actions: the simulator state before each step
    (``data.qpos``, ``data.qvel``) and the observation of that state, float64."""
    env = make(env_id)
    raw = env.unwrapped
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {"qpos": [], "qvel": [], "obs": []}
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        for _ in range(steps):
            for k, v in zip(rows, (raw.data.qpos.copy(), raw.data.qvel.copy(), obs)):
                rows[k].append(v)
            obs, _, term, trunc, _ = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
            if term or trunc:
                break
    env.close()
    return {k: np.array(v) for k, v in rows.items()}


@pytest.fixture(scope="module")
def hopper():
    return sim_rows("Hopper-v5")


@pytest.fixture(scope="module")
def ant():
    return sim_rows("Ant-v5", episodes=2, steps=40)


def actions(n: int, a: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, a, generator=g) * 2 - 1 for _ in range(steps)]  # each [N,A]


def test_check_env_passes(hopper):
    env, twin = (TrueDynamicsEnv("Hopper-v5", hopper["qpos"], hopper["qvel"], num_envs=3, horizon=15, seed=1)
                 for _ in range(2))
    check_env(env, steps=50, twin=twin)
    assert env.spec.env_id == "true:Hopper-v5" and env.spec.backend == "true" and env.spec.max_episode_steps == 15
    env.close()
    twin.close()


def test_reset_and_auto_reset_observations_are_the_drawn_rows(hopper):
    env = TrueDynamicsEnv("gym:Hopper-v5", torch.as_tensor(hopper["qpos"]), hopper["qvel"], num_envs=12, horizon=2)
    obs = env.reset(seed=4)
    rows = env.start_rows
    assert torch.equal(obs, torch.as_tensor(hopper["obs"][rows.numpy()], dtype=torch.float32))
    assert len(set(rows.tolist())) > 6  # drawn at random from the ~150 rows
    assert torch.equal(obs, env.reset(seed=4)) and not torch.equal(obs, env.reset(seed=5))
    env.reset(seed=4)
    seen = []
    for a in actions(12, 3, 4):
        out = env.step(a)
        assert torch.equal(out.info["start_row"], rows)  # the rows the ending episodes started from
        rows = env.start_rows
        done = out.done
        assert done[out.info["elapsed_step"] == 2].all()
        assert torch.equal(out.obs[done], torch.as_tensor(hopper["obs"][rows[done].numpy()], dtype=torch.float32))
        seen.append(done)
    assert torch.stack(seen).sum() >= 24  # every env ended at least twice in 4 steps of a 2-step horizon
    env.close()


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"])
def test_generated_datasets_carry_the_state_of_their_observations(env_id):
    """Rows of ``ctrl-rl data generate`` (float32 ``infos/qpos``, ``infos/qvel``): setting a row's state gives the
    row's own observation exactly, and stepping it with the row's action gives its next observation."""
    from ctrl_rl.datagen.generate import collect

    rows = collect(env_id, None, 120, seed=0, num_envs=2, workers=1, max_episode_steps=40)
    env = TrueDynamicsEnv(env_id, rows["infos/qpos"], rows["infos/qvel"], num_envs=32, horizon=1)
    seen = set()
    for seed in range(4):
        obs = env.reset(seed=seed)
        r = env.start_rows.numpy()
        seen |= set(r.tolist())
        assert torch.equal(obs, torch.as_tensor(rows["observations"][r]))
        out = env.step(torch.as_tensor(rows["actions"][r]))
        # from the float32-rounded state: close to the recorded step, and the same termination
        assert np.allclose(out.final_obs.numpy(), rows["next_observations"][r], atol=1e-3)
        assert np.allclose(out.reward.numpy(), rows["rewards"][r], atol=1e-3)
        assert np.array_equal(out.terminated.numpy(), rows["terminals"][r])
    assert len(seen) > 60
    env.close()


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5"])
def test_steps_equal_a_fresh_gymnasium_env_set_to_the_same_state(env_id, hopper, ant):
    """Every episode, the first ones and those begun by auto-resets (after other episodes ran in the same
    simulator), steps exactly as a new Gymnasium env put in its start row's state with ``set_state``."""
    d = {"Hopper-v5": hopper, "Ant-v5": ant}[env_id]
    n = 4
    env = TrueDynamicsEnv(env_id, d["qpos"], d["qvel"], num_envs=n, horizon=8, seed=3)

    def fresh(row: int):
        ref = make(env_id).unwrapped
        ref.reset(seed=0)
        ref.set_state(d["qpos"][row], d["qvel"][row])
        return ref

    obs = env.reset()
    refs = [fresh(j) for j in env.start_rows.tolist()]
    for i, ref in enumerate(refs):  # Ant's contact forces (obs[27:]) are those of the state here, zeros there
        assert torch.equal(obs[i, :27], torch.as_tensor(ref._get_obs()[:27], dtype=torch.float32))
    episodes, terminated = n, 0
    for a in actions(n, env.spec.action_dim, 30, seed=1):
        out = env.step(a)
        sim = env.state_dict()  # float64 simulator states: a differing warm start shows there first
        for i, ref in enumerate(refs):
            o, r, term, _, _ = ref.step(a[i].numpy())
            assert torch.equal(out.final_obs[i], torch.as_tensor(o, dtype=torch.float32))
            assert out.reward[i].item() == np.float32(r) and out.terminated[i].item() == term
            if not out.done[i]:
                assert np.array_equal(sim["qpos"][i].numpy(), ref.data.qpos)
                assert np.array_equal(sim["qvel"][i].numpy(), ref.data.qvel)
        for i in torch.nonzero(out.done).flatten().tolist():
            refs[i] = fresh(int(env.start_rows[i]))
            episodes += 1
        terminated += int(out.terminated.sum())
    assert episodes >= 3 * n and (terminated > 0 or env_id == "Ant-v5")
    env.close()


def test_horizon_truncates_and_terminations_follow_the_task(hopper):
    env = TrueDynamicsEnv("Hopper-v5", hopper["qpos"], hopper["qvel"], num_envs=16, horizon=4, seed=2)
    assert env.spec.max_episode_steps == 4
    env.reset()
    elapsed = torch.zeros(16, dtype=torch.int64)
    fn = get_termination("Hopper-v5")
    terminated = 0
    for a in actions(16, 3, 24, seed=2):
        out = env.step(a.sign())  # bang-bang actions: some episodes terminate before the horizon
        elapsed += 1
        assert torch.equal(out.info["elapsed_step"], elapsed)
        assert torch.equal(out.truncated, (elapsed == 4) & ~out.terminated)
        assert torch.equal(out.terminated, fn(None, None, out.final_obs))
        assert not (out.final_obs[out.done] == out.obs[out.done]).all(dim=1).any()
        terminated += int(out.terminated.sum())
        elapsed[out.done] = 0
    assert terminated > 0
    env.close()
    default = TrueDynamicsEnv("Hopper-v5", hopper["qpos"], hopper["qvel"], num_envs=1)
    assert default.spec.max_episode_steps == 1000  # the task's time limit
    default.close()


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5"])
def test_state_dict_resume_continues_identically(env_id, hopper, ant):
    d = {"Hopper-v5": hopper, "Ant-v5": ant}[env_id]

    def make_env(seed):
        return TrueDynamicsEnv(env_id, d["qpos"], d["qvel"], num_envs=6, horizon=10, seed=seed)

    a_env = make_env(0)
    a_env.reset()
    acts = actions(6, a_env.spec.action_dim, 30, seed=5)
    for a in acts[:5]:
        a_env.step(a)
    buf = io.BytesIO()
    torch.save(a_env.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # checkpoints load this way
    b_env = make_env(99)
    b_env.reset()
    b_env.step(acts[0])  # a different simulator history, overwritten by the load
    b_env.load_state_dict(state)
    for a in acts[5:]:
        x, y = a_env.step(a), b_env.step(a)
        for k in ("obs", "reward", "terminated", "truncated", "final_obs"):
            assert torch.equal(getattr(x, k), getattr(y, k)), k
        assert all(torch.equal(x.info[k], y.info[k]) for k in x.info)
        # the simulators too, in float64 (a lost solver warm start shows here long before the float32 outputs)
        sa, sb = a_env.state_dict(), b_env.state_dict()
        differ = [k for k in sa if k != "env_id" and not torch.equal(sa[k], sb[k])]
        assert not differ, differ
    with pytest.raises(ValueError, match="Walker2d"):
        make_env(0).load_state_dict({**state, "env_id": "true:Walker2d-v5"})
    with pytest.raises(ValueError, match="num_envs=2"):
        TrueDynamicsEnv(env_id, d["qpos"], d["qvel"], num_envs=2).load_state_dict(state)


@pytest.mark.parametrize("change, match", [
    (lambda q, v: (q, v[:-1]), "expected one qvel row per qpos row"),
    (lambda q, v: (np.concatenate([q, q[:, :1]], 1), v), "nq=6"),
    (lambda q, v: (q, v[:, :5]), "nv=6"),
    (lambda q, v: (q[0], v), "2-D"),
    (lambda q, v: (q[:0], v[:0]), "non-empty"),
    (lambda q, v: (np.where(np.arange(len(q))[:, None] == 3, np.nan, q), v), "non-finite"),
])
def test_bad_dataset_states_are_refused_in_one_sentence(change, match, hopper):
    qpos, qvel = change(hopper["qpos"], hopper["qvel"])
    with pytest.raises(UserInputError, match=match) as e:
        TrueDynamicsEnv("Hopper-v5", qpos, qvel, num_envs=2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("env_id, kwargs, match", [
    ("Pendulum-v1", {}, "not a Gymnasium MuJoCo env"),
    ("NoSuchTask-v0", {}, "cannot be made by gymnasium"),
    ("Hopper-v5", {"num_envs": 0}, "num_envs"),
    ("Hopper-v5", {"horizon": 0}, "horizon"),
])
def test_bad_env_arguments_are_refused(env_id, kwargs, match, hopper):
    with pytest.raises(UserInputError, match=match):
        TrueDynamicsEnv(env_id, hopper["qpos"], hopper["qvel"], **{"num_envs": 2, **kwargs})
