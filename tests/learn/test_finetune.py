"""Offline-to-online loops: WSRL, RLPD, retained-data fine-tuning and SAC Flow O2O on torch:Pendulum."""

import json

import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.algos.iql import IQLConfig
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.config import OfflineLoopConfig, OffPolicyLoopConfig, RunConfig
from ctrl_rl.learn.offline import train_offline
from ctrl_rl.learn.offpolicy import train_offpolicy
from ctrl_rl.learn.train import train
from tests.learn.test_offline import write_pendulum_dataset

NETS = dict(actor_hidden=(32, 32), critic_hidden=(32, 32))
WSRL = registry.get("wsrl")


def _loop(name="wsrl", **kw):
    """The entry's loop defaults with ``kw`` applied (what `ctrl-rl train NAME` would start from)."""
    return OffPolicyLoopConfig(**{**registry.get(name).loop_defaults, **kw})


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pendulum dataset and a small CQL run on it (4 critics), evaluated at its end with 2 episodes."""
    root = tmp_path_factory.mktemp("o2o")
    data = write_pendulum_dataset(root / "pendulum-random.hdf5")
    run = RunConfig(env="torch:Pendulum", dataset=data, total_steps=60, seed=0, progress=False, log_every=20,
                    checkpoint_every=60, eval_every=60, eval_episodes=2, threads=1,
                    loop=OfflineLoopConfig(batch_size=32, clip_actions=0.99999))
    train_offline(run, "cql", registry.get("cql").default_config(**NETS, num_critics=4), root / "cql")
    return data, root / "cql"


def _online(loop=None, **kw):
    base = dict(env="torch:Pendulum", num_envs=2, total_steps=400, seed=0, progress=False, log_every=50,
                checkpoint_every=100, threads=1)
    return RunConfig(**{**base, **kw}, loop=loop)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_wsrl_starts_at_the_offline_score_and_keeps_the_pretrained_networks_during_warmup(pretrained, tmp_path):
    data, cql_dir = pretrained
    offline_eval = [r for r in _rows(cql_dir) if "episode_return" in r][-1]["episode_return"]
    loop = _loop(init=str(cql_dir), batch_size=64, learning_starts=300)
    res = train_offpolicy(_online(loop, eval_every=200, eval_episodes=2, total_steps=200), "wsrl",
                          WSRL.default_config(), tmp_path / "w")
    evals = [r for r in _rows(tmp_path / "w") if "eval_return" in r]
    assert evals[0]["step"] == 0 and evals[0]["eval_return"] == pytest.approx(offline_eval, abs=1e-3)
    # 200 env steps < 300 warm-up steps: no update, so every pre-trained tensor is unchanged
    pre = load_checkpoint(cql_dir / "checkpoints" / "latest.pt")["algo_state"]
    post = res.algo.state_dict()
    for part in ("actor", "critic", "critic_target"):
        assert all(torch.equal(pre[part][k], post[part][k]) for k in pre[part]), part
    assert torch.equal(pre["log_alpha"], post["log_alpha"])
    # the network shapes came from the checkpoint (4 critics of 32x32), not WSRL's defaults (10 of 256x256)
    saved = json.loads((tmp_path / "w" / "config.json").read_text())["config"]
    assert saved["num_critics"] == 4 and saved["critic_hidden"] == [32, 32]


def test_wsrl_fine_tunes_with_split_batches(pretrained, tmp_path):
    _, cql_dir = pretrained
    loop = _loop(init=str(cql_dir), batch_size=64, learning_starts=100)
    before = load_checkpoint(cql_dir / "checkpoints" / "latest.pt")["algo_state"]["critic_updates"]
    res = train_offpolicy(_online(loop), "wsrl", WSRL.default_config(critic_splits=4), tmp_path / "w")
    last = _rows(tmp_path / "w")[-1]
    # batch updates start at step 100 (iteration 50): 151 iterations x 2 envs x UTD 1; 4 critic steps each
    assert last["updates"] == 302 and last["replay_size"] == 400
    assert res.algo.critic_updates - before == 4 * 302 and res.algo.parameters_finite()


def test_rlpd_and_retained_mix_offline_data(pretrained, tmp_path, monkeypatch):
    data, cql_dir = pretrained
    from ctrl_rl.storage import replay

    seen = []
    original = replay.MixedSampler.sample

    def spy(self, batch_size, generator=None):
        seen.append(self.split(batch_size))
        return original(self, batch_size, generator)

    monkeypatch.setattr(replay.MixedSampler, "sample", spy)
    train_offpolicy(_online(_loop("rlpd", batch_size=64, learning_starts=100), dataset=data), "rlpd",
                    registry.get("rlpd").default_config(**NETS, num_critics=2), tmp_path / "r")
    assert seen and set(seen) == {(8, 8)}  # 64 / 4 critic minibatches, half of each from the dataset
    seen.clear()
    loop = _loop(init=str(cql_dir), batch_size=64, learning_starts=100, offline_ratio=0.25)
    train_offpolicy(_online(loop, dataset=data), "wsrl", WSRL.default_config(), tmp_path / "k")
    assert set(seen) == {(12, 4)}


def test_resume_equals_uninterrupted(pretrained, tmp_path):
    data, cql_dir = pretrained
    loop = _loop(init=str(cql_dir), batch_size=32, learning_starts=100, offline_ratio=0.5, save_replay=True)
    run = _online(loop, dataset=data, total_steps=300)
    cfg = WSRL.default_config()
    full = train_offpolicy(run, "wsrl", cfg, tmp_path / "full")
    train_offpolicy(run, "wsrl", cfg, tmp_path / "cut", max_iterations=70)
    resumed = train_offpolicy(run, "wsrl", cfg, tmp_path / "cut", resume=True)
    a, b = full.algo.state_dict(), resumed.algo.state_dict()
    for part in ("actor", "critic"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part


def test_bad_offline_to_online_input_is_refused(pretrained, tmp_path):
    data, cql_dir = pretrained
    with pytest.raises(UserInputError, match="needs --init"):
        train_offpolicy(_online(), "wsrl", WSRL.default_config(), tmp_path / "a")
    with pytest.raises(UserInputError, match="needs --dataset"):
        train_offpolicy(_online(), "rlpd", registry.get("rlpd").default_config(**NETS), tmp_path / "b")
    with pytest.raises(UserInputError, match="offline-ratio 0"):
        train_offpolicy(_online(_loop(init=str(cql_dir)), dataset=data), "wsrl", WSRL.default_config(), tmp_path / "c")
    iql_dir = tmp_path / "iql"
    run = RunConfig(env="torch:Pendulum", dataset=data, total_steps=4, progress=False, threads=1, log_every=2,
                    loop=OfflineLoopConfig(batch_size=16))
    train_offline(run, "iql", IQLConfig(**NETS, value_hidden=(32, 32)), iql_dir)
    with pytest.raises(UserInputError, match="'iql' run"):
        train_offpolicy(_online(_loop(init=str(iql_dir))), "wsrl", WSRL.default_config(), tmp_path / "d")
    with pytest.raises(UserInputError, match="does not fit env"):
        train_offpolicy(_online(_loop(init=str(cql_dir)), env="torch:MountainCarContinuous"), "wsrl",
                        WSRL.default_config(), tmp_path / "e")
    assert not any((tmp_path / d).exists() for d in "abcde")  # refused before anything was written


def test_sac_flow_o2o_pretrains_offline_then_fine_tunes(pretrained, tmp_path):
    data, _ = pretrained
    entry = registry.get("sac_flow_o2o")
    cfg = entry.default_config(critic_hidden=(32, 32), flow_hidden=32, noise_hidden=(32,))
    loop = _loop("sac_flow_o2o", batch_size=32, offline_steps=40, learning_starts=100)
    run = _online(loop, dataset=data, total_steps=200, log_every=20, checkpoint_every=20, eval_every=100,
                  eval_episodes=2)
    d = tmp_path / "f"
    train(run, "sac_flow_o2o", cfg, d, max_iterations=30)  # stops inside the offline phase
    assert load_checkpoint(d / "pretrain" / "checkpoints" / "latest.pt")["counters"]["step"] == 30
    assert not (d / "checkpoints" / "latest.pt").exists()
    res = train(run, "sac_flow_o2o", cfg, d, resume=True)
    offline = _rows(d / "pretrain")
    assert offline[-1]["step"] == 40 and "loss/flow_matching" in offline[-1] and "episode_return" in offline[-1]
    rows = _rows(d)
    online = [r for r in rows if "loss/action_reg" in r]
    assert online and res.step == 200 and res.algo.parameters_finite()
    assert [r["step"] for r in rows if "eval_return" in r] == [0, 100, 200]
    # the online run started from the offline phase's checkpoint: its step-0 evaluation is the offline policy's
    assert rows[0]["eval_return"] == pytest.approx(offline[-1]["episode_return"], abs=1e-3)
    assert json.loads((d / "config.json").read_text())["run"]["loop"]["init"] == str(d / "pretrain")
