"""Offline-to-online loops: WSRL, RLPD, retained-data fine-tuning and SAC Flow O2O on torch:Pendulum."""

import json

import pytest
import torch

from ctrl_rl.algos.cql import CQLConfig
from ctrl_rl.algos.iql import IQLConfig
from ctrl_rl.algos.sac_flow import SACFlowO2OConfig
from ctrl_rl.algos.wsrl import RLPDConfig, WSRLConfig
from ctrl_rl.config import RunConfig
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.checkpoint import load_checkpoint
from ctrl_rl.learn.offline import train_offline
from ctrl_rl.learn.offpolicy import train_offpolicy
from tests.learn.test_offline import write_pendulum_dataset

NETS = dict(actor_hidden=(32, 32), critic_hidden=(32, 32))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pendulum dataset and a small CQL run on it (4 critics), evaluated at its end with 2 episodes."""
    root = tmp_path_factory.mktemp("o2o")
    data = write_pendulum_dataset(root / "pendulum-random.hdf5")
    run = RunConfig(env="torch:Pendulum", dataset=data, total_steps=60, seed=0, progress=False, log_every=20,
                    checkpoint_every=60, eval_every=60, eval_episodes=2, threads=1)
    train_offline(run, "cql", CQLConfig(**NETS, num_critics=4, batch_size=32), root / "cql")
    return data, root / "cql"


def _online(**kw):
    base = dict(env="torch:Pendulum", num_envs=2, total_steps=400, seed=0, progress=False, log_every=50,
                checkpoint_every=100, threads=1)
    return RunConfig(**{**base, **kw})


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_wsrl_starts_at_the_offline_score_and_keeps_the_pretrained_networks_during_warmup(pretrained, tmp_path):
    data, cql_dir = pretrained
    offline_eval = [r for r in _rows(cql_dir) if "episode_return" in r][-1]["episode_return"]
    cfg = WSRLConfig(init=str(cql_dir), batch_size=64, learning_starts=300)
    res = train_offpolicy(_online(eval_every=200, eval_episodes=2, total_steps=200), "wsrl", cfg, tmp_path / "w")
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
    cfg = WSRLConfig(init=str(cql_dir), batch_size=64, critic_splits=4, learning_starts=100)
    before = load_checkpoint(cql_dir / "checkpoints" / "latest.pt")["algo_state"]["critic_updates"]
    res = train_offpolicy(_online(), "wsrl", cfg, tmp_path / "w")
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
    train_offpolicy(_online(dataset=data), "rlpd", RLPDConfig(**NETS, num_critics=2, batch_size=64, learning_starts=100),
                    tmp_path / "r")
    assert seen and set(seen) == {(8, 8)}  # 64 / 4 critic minibatches, half of each from the dataset
    seen.clear()
    cfg = WSRLConfig(init=str(cql_dir), batch_size=64, learning_starts=100, offline_ratio=0.25)
    train_offpolicy(_online(dataset=data), "wsrl", cfg, tmp_path / "k")
    assert set(seen) == {(12, 4)}


def test_resume_equals_uninterrupted(pretrained, tmp_path):
    data, cql_dir = pretrained
    cfg = WSRLConfig(init=str(cql_dir), batch_size=32, learning_starts=100)
    run = _online(dataset=data, save_replay=True, total_steps=300)
    cfg = WSRLConfig(init=str(cql_dir), batch_size=32, learning_starts=100, offline_ratio=0.5)
    full = train_offpolicy(run, "wsrl", cfg, tmp_path / "full")
    train_offpolicy(run, "wsrl", cfg, tmp_path / "cut", max_iterations=70)
    resumed = train_offpolicy(run, "wsrl", cfg, tmp_path / "cut", resume=True)
    a, b = full.algo.state_dict(), resumed.algo.state_dict()
    for part in ("actor", "critic"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part


def test_bad_offline_to_online_input_is_refused(pretrained, tmp_path):
    data, cql_dir = pretrained
    with pytest.raises(UserInputError, match="needs --init"):
        train_offpolicy(_online(), "wsrl", WSRLConfig(), tmp_path / "a")
    with pytest.raises(UserInputError, match="needs --dataset"):
        train_offpolicy(_online(), "rlpd", RLPDConfig(**NETS), tmp_path / "b")
    with pytest.raises(UserInputError, match="offline-ratio 0"):
        train_offpolicy(_online(dataset=data), "wsrl", WSRLConfig(init=str(cql_dir)), tmp_path / "c")
    iql_dir = tmp_path / "iql"
    run = RunConfig(env="torch:Pendulum", dataset=data, total_steps=4, progress=False, threads=1, log_every=2)
    train_offline(run, "iql", IQLConfig(**NETS, value_hidden=(32, 32), batch_size=16), iql_dir)
    with pytest.raises(UserInputError, match="'iql' run"):
        train_offpolicy(_online(), "wsrl", WSRLConfig(init=str(iql_dir)), tmp_path / "d")
    with pytest.raises(UserInputError, match="does not fit env"):
        train_offpolicy(_online(env="torch:MountainCarContinuous"), "wsrl", WSRLConfig(init=str(cql_dir)), tmp_path / "e")
    assert not any((tmp_path / d).exists() for d in "abcde")  # refused before anything was written


def test_sac_flow_o2o_pretrains_offline_then_fine_tunes(pretrained, tmp_path):
    data, _ = pretrained
    cfg = SACFlowO2OConfig(critic_hidden=(32, 32), flow_hidden=32, noise_hidden=(32,), batch_size=32, offline_steps=40,
                           learning_starts=100)
    run = _online(dataset=data, total_steps=200, log_every=20, checkpoint_every=20, eval_every=100, eval_episodes=2)
    train_offpolicy(run, "sac_flow_o2o", cfg, tmp_path / "f", max_iterations=30)  # stops inside the offline phase
    assert load_checkpoint(tmp_path / "f" / "checkpoints" / "latest.pt")["counters"]["offline_step"] == 30
    res = train_offpolicy(run, "sac_flow_o2o", cfg, tmp_path / "f", resume=True)
    rows = _rows(tmp_path / "f")
    offline = [r for r in rows if r.get("phase") == "offline"]
    assert offline[-1]["offline_step"] == 40 and "loss/flow_matching" in offline[-1]
    online = [r for r in rows if "loss/action_reg" in r]
    assert online and res.step == 200 and res.algo.parameters_finite()
    assert [r["step"] for r in rows if "eval_return" in r and r.get("phase") != "offline"] == [0, 100, 200]
