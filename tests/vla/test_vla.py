"""The VLA algorithms end to end on the tiny backbone: demonstrations in the LeRobot layout, the three heads through
the policy, LoRA, vla_bc, vla_habc and vla_rl from the CLI, export and deployment, and the bad inputs of the issue."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrl_rl.cli import main

pytest.importorskip("transformers")
pytest.importorskip("peft")

ENV = "manip:Reach,cameras=exterior1,image_size=24x32,language=true,max_episode_steps=15"
SMALL = ["--chunk", "2", "--eval-episodes", "2", "--max-text-len", "12", "--lora-rank", "4", "--batch-size", "4",
         "--threads", "1", "--no-progress", "--log-every", "1"]


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    """Six scripted Reach episodes (some noisy, so some fail) with one camera, in the LeRobot v3.0 layout."""
    d = tmp_path_factory.mktemp("vla") / "reach"
    assert main(["data", "generate", "--env", "manip:Reach", "--level", "scripted", "--format", "lerobot",
                 "--episodes", "6", "--noise", "0.6", "--cameras", "exterior1", "--image-size", "24x32",
                 "--out", str(d), "--no-progress"]) == 0
    return d


def _agent(head: str, demos: Path, name: str = "vla_bc", **over):
    from ctrl_rl.algos import registry
    from ctrl_rl.envs import spec_of

    spec = spec_of(ENV)
    torch.manual_seed(0)
    entry = registry.get(name)
    cfg = entry.default_config(head=head, chunk=2, max_text_len=12, lora_rank=4, flow_steps=3, **over)
    algo = entry.make(cfg, spec, torch.device("cpu"), torch.Generator().manual_seed(0))
    data = algo.model.load_demos(str(demos), "cartesian_velocity", None, "observation.state")
    algo.model.set_statistics(data.proprio, data.action)
    return algo, data


def _batch(data, n=4):
    return data.batch(torch.arange(n))


def _rl_batch(algo, data, ro, own=None, B=4) -> dict:
    """What the chunk-rollouts loop passes: the rollout, the demonstration and own-success batches it reads."""
    count = algo.batches_per_update()
    demos = data.sample(count["demos"] * B, torch.Generator().manual_seed(1), torch.device("cpu"))
    return {"rollout": ro, "demos": demos, "own": None if own is None else own.sample(count["own"] * B)}


def test_the_demonstrations_load_with_chunks_outcomes_and_the_robot_spec_keys(demos):
    from ctrl_rl.vla.data import load_demos

    d = load_demos(demos, ["exterior_image_1_left"], (24, 32), 3, 7, "cartesian_velocity")
    assert d.images["image/exterior_image_1_left"].dtype == torch.uint8
    assert d.images["image/exterior_image_1_left"].shape[1:] == (3, 24, 32)
    assert d.proprio.shape[1] == 8 and d.action.shape[1] == 7 and d.action_key == "action.env"
    assert d.success is not None and d.critic_state.shape[1] > 8
    # a chunk never leaves its episode: the last frame's chunk repeats its own action
    last = int(torch.nonzero(d.last)[0])
    assert torch.equal(d.chunk_rows[last], torch.full((3,), last))
    assert torch.equal(d.chunk_rows[0], torch.tensor([0, 1, 2])) or bool(d.last[:2].any())
    # the DROID action keys assemble the same 7-vector when action.env is not chosen
    d2 = load_demos(demos, ["exterior_image_1_left"], (24, 32), 3, 7, "cartesian_velocity",
                    action_key="action.cartesian_velocity+action.gripper_velocity")
    assert torch.allclose(d2.action, d.action)


def test_the_reference_lerobot_dataset_written_by_lerobot_loads():
    from ctrl_rl.storage.datasets.lerobot import read_lerobot
    from ctrl_rl.vla.data import load_demos

    root = Path(__file__).parents[1] / "storage" / "fixtures" / "lerobot_v30_reference"
    data = read_lerobot(root)
    cam = data.video_keys[0].removeprefix("observation.images.")
    A = data.features["action"]["shape"][0]
    d = load_demos(root, [cam], (16, 16), 4, A, action_key="action")
    assert d.num_frames == data.num_frames and d.images[f"image/{cam}"].shape[1:] == (3, 16, 16)


@pytest.mark.parametrize("head", ["tokens", "regression", "flow"])
def test_each_head_trains_samples_and_scores_its_samples(head, demos):
    algo, data = _agent(head, demos)
    b = _batch(data)
    before = algo.update(b)["loss/actor"].item()
    for _ in range(15):
        after = algo.update(b)["loss/actor"].item()
    assert after < before, (head, before, after)
    policy = algo.model.policy
    prefix = algo.model.prefix_from_batch(b)
    x, stored, logp = policy.sample(prefix, algo.gen, deterministic=False, sigma=0.1)
    assert x.shape == (4, 2, 7) and x.abs().max() <= 1
    with torch.no_grad():
        again = policy.log_prob(prefix, stored, 0.1)
    assert torch.allclose(again, logp, atol=1e-3, rtol=1e-4)
    det1, _, _ = policy.sample(prefix, algo.gen, deterministic=True)
    det2, _, _ = policy.sample(prefix, algo.gen, deterministic=True)
    assert torch.equal(det1, det2)


def test_lora_leaves_the_base_weights_untouched_and_changes_the_output_after_one_step(demos):
    algo, data = _agent("regression", demos)
    m = algo.model
    base = {n: p.detach().clone() for n, p in m.policy.backbone.vlm.named_parameters() if "lora_" not in n}
    assert base and all(not p.requires_grad for n, p in m.policy.backbone.vlm.named_parameters() if "lora_" not in n)
    assert 0 < m.trainable_fraction() < 0.5
    b = _batch(data)
    m.policy.eval()
    with torch.no_grad():
        cond0 = m.policy._queries(*m.prefix_from_batch(b))
    algo.update(b)
    m.policy.eval()
    with torch.no_grad():
        cond1 = m.policy._queries(*m.prefix_from_batch(b))
    assert not torch.allclose(cond0, cond1)
    for n, p in m.policy.backbone.vlm.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n]), n


@pytest.mark.parametrize("head", ["regression", "tokens"])
def test_the_merged_export_module_equals_the_adapted_model(head, demos):
    algo, data = _agent(head, demos)
    b = _batch(data, 2)
    for _ in range(3):
        algo.update(b)
    m = algo.model
    m.policy.eval()
    with torch.no_grad():
        x, _, _ = m.policy.sample(m.prefix_from_batch(b), None, deterministic=True)
        want = m.to_actions(x)  # [2,H,A]
        module = algo.exportable()
        assert not any("lora_" in n for n, _ in module.named_parameters())
        ids, _ = m.policy.text([data.instructions[int(i)] for i in b["task_index"]])
        state = torch.zeros(2, 20)
        state[:, list(m.columns)] = b["proprio"]
        got = module({"state": state, "language": ids, **b["images"]})
    assert torch.allclose(got, want, atol=1e-5)


def _train(tmp_path, demos, method, head="regression", extra=()):
    d = tmp_path / f"{method}-{head}"
    args = ["train", f"vla_{method}", "--env", ENV, "--dataset", str(demos), "--head", head,
            "--total-steps", "4", "--run-dir", str(d), *SMALL, *extra]
    return d, main(args)


def test_bc_from_the_cli_trains_evaluates_exports_and_deploys(tmp_path, demos, capsys):
    d, rc = _train(tmp_path, demos, "bc", extra=["--eval-episodes", "2"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4 and "eval_success_rate" in rows[-1] and 0 < rows[-1]["stats/trainable_fraction"] < 1
    capsys.readouterr()
    assert main(["eval", str(d), "--episodes", "2"]) == 0
    assert "success_rate" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["export", str(d), "--format", "onnx"]) == 0, capsys.readouterr().err
    meta = json.loads((d / "export" / "policy.json").read_text())
    assert meta["action"]["chunk"] == 2 and meta["language"]["tokenizer"] == "tokenizer.json"
    assert meta["parity"]["onnx"] <= 1e-5
    assert (d / "export" / "tokenizer.json").is_file()
    capsys.readouterr()
    assert main(["deploy", str(d / "export"), "--sim", ENV, "--episodes", "2", "--rate", "0"]) == 0, \
        capsys.readouterr().err
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 2 and out["success_rate"] is not None


def test_the_runtime_tokenises_the_instruction_as_training_did(tmp_path, demos):
    from ctrl_rl.deploy.runtime import Prompter
    from ctrl_rl.vla.export import ChunkPolicy

    algo, data = _agent("regression", demos)
    module = algo.exportable()
    assert isinstance(module, ChunkPolicy)
    module.save_tokenizer(tmp_path)
    p = Prompter(tmp_path, module.language_input())
    text = data.instructions[0]
    raw = np.zeros(64, np.int64)
    raw[: len(text.encode())] = np.frombuffer(text.encode(), np.uint8) + 1
    ids, _ = algo.model.policy.text([text])
    assert p(raw).tolist() == ids[0].tolist()


def test_habc_and_rl_from_the_cli(tmp_path, demos, capsys):
    d, rc = _train(tmp_path, demos, "habc", "flow", ["--habc-warmup", "1"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert "stats/weight_mean" in rows[-1] and "loss/viability" in rows[-1]
    saved = json.loads((d / "config.json").read_text())
    assert saved["algo"] == "vla_habc" and "sil_capacity" not in saved["config"]  # no flag it never reads
    r, rc = _train(tmp_path, demos, "rl", "regression", ["--num-envs", "2", "--rollout-chunks", "2",
                                                          "--total-steps", "2", "--target-kl", "1e-12"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 2 * 2 * 2 * 2 and "loss/sft" in rows[-1]
    # the KL stop: the first minibatch (ratio 1) steps, a later one exceeds 1.5e-12 and ends the update's passes
    assert 1 <= rows[-1]["stats/policy_steps"] < 2 * 2


def test_rl_with_group_relative_advantages(tmp_path, demos, capsys):
    from ctrl_rl.envs import make_env
    from ctrl_rl.vla.rollouts import ChunkCollector

    short = ENV.replace("max_episode_steps=15", "max_episode_steps=4")
    algo, data = _agent("regression", demos, "vla_rl", advantage="group", group_size=2)
    assert algo.episode_groups == 2
    env = make_env(short + ",group_size=2", 4, seed=0)
    ro = ChunkCollector(env, algo, 2, seed=0).collect()  # 2 chunks of 2 steps: one whole episode per env
    env.close()
    state = ro["obs"]["state"].view(2, 4, -1)  # [T,N,O]
    assert torch.equal(state[0, 0], state[0, 1]) and not torch.equal(state[0, 0], state[0, 2])
    adv, ret = algo.advantages(ro)
    adv = adv.view(2, 4)  # [T,N]: each env's return minus its pair's mean, on every chunk
    assert ret is None
    assert torch.allclose(adv[:, :2].sum(1), torch.zeros(2), atol=1e-6) and bool((adv[0] == adv[1]).all())
    assert float(adv.abs().sum()) > 0  # the Gaussian's noise made the pair's returns differ
    info = algo.update(_rl_batch(algo, data, ro))
    assert "loss/policy" in info and "loss/value" not in info  # no critic

    r, rc = _train(tmp_path, demos, "rl", "regression", ["--env", short, "--advantage", "group", "--group-size", "2",
                                                          "--num-envs", "4", "--rollout-chunks", "2",
                                                          "--total-steps", "2"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 2 * 4 * 2 * 2 and "stats/value_explained_var" not in rows[-1]
    # a rollout that would cut an episode: one sentence, exit 2, nothing written
    err = _error(capsys, ["train", "vla_rl", "--env", short, "--dataset", str(demos), "--advantage", "group",
                          "--group-size", "2", "--num-envs", "4", "--rollout-chunks", "3", "--total-steps", "1",
                          *SMALL, "--run-dir", str(tmp_path / "cut")])
    assert "--rollout-chunks 3" in err and "whole episodes" in err
    assert not (tmp_path / "cut" / "checkpoints").exists()


class _FirstEnvSucceeds:
    """A batched env whose env 0 reports every finished episode as successful (the tiny policy never succeeds)."""

    def __init__(self, env):
        self.env, self.num_envs = env, env.num_envs

    def reset(self, seed=None):
        return self.env.reset(seed=seed)

    def step(self, action):
        out = self.env.step(action)
        ok = torch.zeros_like(out.terminated)
        ok[0] = out.terminated[0] | out.truncated[0]
        out.info["episode_success"] = ok
        return out

    def close(self):
        self.env.close()


def test_self_imitation_keeps_the_chunks_of_successful_episodes_and_trains_on_them(tmp_path, demos, capsys):
    from ctrl_rl.envs import make_env
    from ctrl_rl.vla.rollouts import ChunkCollector, SuccessBuffer

    short = ENV.replace("max_episode_steps=15", "max_episode_steps=4")
    algo, data = _agent("regression", demos, "vla_rl", advantage="group", group_size=2, sil_coef=1.0,
                        sil_steps=2)
    assert algo.success_capacity == 10000 and algo.batches_per_update() == {"demos": 3, "own": 2 * 2 + 2}
    env = _FirstEnvSucceeds(make_env(short + ",group_size=2", 4, seed=0))
    collector = ChunkCollector(env, algo, 2, seed=0)
    ro = collector.collect()  # 2 chunks of 2 steps: one whole episode per env; env 0's succeeded
    assert ro["succeeded"].view(2, 4).tolist() == [[True, False, False, False]] * 2
    buf = SuccessBuffer(3, algo.gen)
    assert buf.sample(2) is None
    buf.add(ro)
    assert len(buf) == 2 and torch.equal(buf.chunk, ro["actions"].view(2, 4, 2, -1)[:, 0])
    buf.add(collector.collect())  # two more rows; the FIFO keeps the newest 3
    env.close()
    assert len(buf) == 3 and buf.added == 4
    info = algo.update(_rl_batch(algo, data, ro, buf))
    assert float(info["loss/self_imitation"]) > 0 and float(info["loss/self_imitation_steps"]) > 0

    # --ppo-epochs 0: no policy-gradient pass, only the self-imitation steps move the policy
    algo, data = _agent("regression", demos, "vla_rl", advantage="group", group_size=2, sil_coef=1.0,
                        sil_steps=1, ppo_epochs=0)
    policy = algo.model.policy
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    info = algo.update(_rl_batch(algo, data, ro, buf))
    assert "loss/policy" not in info and float(info["stats/policy_steps"]) == 0
    assert float(info["loss/self_imitation_steps"]) > 0
    assert any(not torch.equal(v, policy.state_dict()[k]) for k, v in before.items())
    assert torch.equal(before["head.log_std"], policy.state_dict()["head.log_std"])  # only a PG pass moves it

    r, rc = _train(tmp_path, demos, "rl", "regression", ["--env", short, "--advantage", "group", "--group-size", "2",
                                                          "--num-envs", "4", "--rollout-chunks", "2",
                                                          "--total-steps", "2", "--sil-coef", "0.5",
                                                          "--sil-steps", "1"])
    assert rc == 0, capsys.readouterr().err
    row = json.loads((r / "metrics.jsonl").read_text().splitlines()[-1])
    assert "loss/self_imitation" in row and row["stats/self_imitation_held"] <= row["stats/self_imitation_added"]


def test_critic_warmup_trains_only_the_value_function_then_the_policy(demos):
    from ctrl_rl.envs import make_env
    from ctrl_rl.vla.rollouts import ChunkCollector

    algo, data = _agent("regression", demos, "vla_rl", critic_warmup=1, value_epochs=2)
    policy = algo.model.policy
    env = make_env(ENV, 2, seed=0)
    collector = ChunkCollector(env, algo, 2, seed=0)
    policy0 = {k: v.clone() for k, v in policy.state_dict().items()}
    value0 = {k: v.clone() for k, v in algo.value.state_dict().items()}
    info = algo.update(_rl_batch(algo, data, collector.collect()))
    assert "loss/policy" not in info and "stats/value_explained_var" in info
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in policy0.items())
    assert any(not torch.equal(v, algo.value.state_dict()[k]) for k, v in value0.items())
    info = algo.update(_rl_batch(algo, data, collector.collect()))
    env.close()
    assert "loss/policy" in info
    assert any(not torch.equal(v, policy.state_dict()[k]) for k, v in policy0.items())


def test_rl_starts_from_a_bc_run(tmp_path, demos, capsys):
    from ctrl_rl.learn.checkpoint import load_checkpoint

    bc, rc = _train(tmp_path, demos, "bc", "tokens")
    assert rc == 0, capsys.readouterr().err
    # the policy's shape fields (the head) come from the BC run: --head regression would not fit its weights; during
    # the critic's warm-up the policy does not train, so the RL run's policy is the BC run's
    rl, rc = _train(tmp_path, demos, "rl", "regression", ["--init", str(bc), "--num-envs", "2", "--rollout-chunks", "1",
                                                          "--total-steps", "1", "--critic-warmup", "1"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((rl / "config.json").read_text())["config"]["head"] == "tokens"
    before = load_checkpoint(bc / "checkpoints" / "latest.pt")["algo_state"]["policy"]
    after = load_checkpoint(rl / "checkpoints" / "latest.pt")["algo_state"]["policy"]
    assert before.keys() == after.keys() and all(torch.equal(v, after[k]) for k, v in before.items())
    # an --init that is no run: one sentence, nothing written
    err = _error(capsys, ["train", "vla_rl", "--env", ENV, "--dataset", str(demos), "--init", str(tmp_path / "none"),
                          *SMALL, "--run-dir", str(tmp_path / "x")])
    assert "none" in err and not (tmp_path / "x").exists()


def _error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_bad_inputs_are_one_sentence_and_exit_2(tmp_path, demos, capsys):
    base = ["train", "vla_bc", "--dataset", str(demos), "--total-steps", "1", *SMALL]
    rl = ["train", "vla_rl", *base[2:]]
    # a camera the model expects that the dataset lacks
    err = _error(capsys, [*base,
                          "--env", "manip:Reach,cameras=wrist,image_size=24x32,language=true,max_episode_steps=15",
                          "--run-dir", str(tmp_path / "a")])
    assert "wrist_left" in err and "camera" in err
    assert not (tmp_path / "a" / "checkpoints").exists()
    # a backbone directory without a config, then without weights
    empty = tmp_path / "bb"
    empty.mkdir()
    err = _error(capsys, [*base, "--env", ENV, "--backbone", str(empty), "--run-dir", str(tmp_path / "b")])
    assert "config.json" in err
    (empty / "config.json").write_text("{}")
    err = _error(capsys, [*base, "--env", ENV, "--backbone", str(empty), "--run-dir", str(tmp_path / "c")])
    assert "weights" in err or "safetensors" in err
    # action dims of dataset and robot spec differ
    err = _error(capsys, [*base, "--env", ENV, "--action-key", "action", "--run-dir", str(tmp_path / "d")])
    assert "8 dims" in err and "7" in err
    # a LoRA target that matches no module
    err = _error(capsys, [*base, "--env", ENV, "--lora-targets", "qq_proj", "--run-dir", str(tmp_path / "e")])
    assert "qq_proj" in err
    # a dataset that is not one
    err = _error(capsys, ["train", "vla_bc", "--env", ENV, "--dataset", str(tmp_path / "nope"), "--total-steps", "1",
                          *SMALL, "--run-dir", str(tmp_path / "f")])
    assert "nope" in err
    # a negative self-imitation weight
    err = _error(capsys, [*rl, "--env", ENV, "--sil-coef", "-1", "--run-dir", str(tmp_path / "g")])
    assert "--sil-coef -1" in err
    # no policy-gradient passes and no self-imitation steps: nothing would train the policy
    err = _error(capsys, [*rl, "--env", ENV, "--ppo-epochs", "0", "--run-dir", str(tmp_path / "h")])
    assert "--ppo-epochs 0" in err and "--sil-steps 0" in err
    # imitation-only steps without self-imitation would be read by nothing
    err = _error(capsys, [*rl, "--env", ENV, "--sil-steps", "2", "--run-dir", str(tmp_path / "i")])
    assert "--sil-steps 2" in err and "--sil-coef" in err
    for name in "abcdefghi":
        assert not (tmp_path / name / "checkpoints").exists()
    shutil.rmtree(empty)


def test_each_algorithm_takes_only_the_flags_it_reads(tmp_path, demos, capsys):
    """No config holds a flag its algorithm never reads: another VLA algorithm's flag is an unknown flag here, and
    the old `--method` switch names the algorithm that replaced it."""
    base = ["--env", ENV, "--dataset", str(demos), *SMALL]
    for algo, flag in (("vla_bc", "--habc-beta"), ("vla_bc", "--sil-coef"), ("vla_habc", "--advantage"),
                       ("vla_rl", "--habc-warmup"), ("vla_bc", "--rollout-chunks")):
        err = _error(capsys, ["train", algo, *base, flag, "1", "--run-dir", str(tmp_path / "u")])
        assert f"unknown flag {flag!r} for `ctrl-rl train {algo}`" in err
    for method in ("bc", "habc", "rl"):
        err = _error(capsys, ["train", "vla", "--method", method, *base, "--run-dir", str(tmp_path / "u")])
        assert f"is now `ctrl-rl train vla_{method}`" in err
    err = _error(capsys, ["train", "vla", *base, "--run-dir", str(tmp_path / "u")])
    assert "['vla_bc', 'vla_habc', 'vla_rl']" in err
    assert not (tmp_path / "u").exists()


def test_bf16_and_gradient_checkpointing_train(demos):
    algo, data = _agent("flow", demos, bf16=True, gradient_checkpointing=True)
    assert next(algo.model.policy.backbone.parameters()).dtype == torch.bfloat16
    info = algo.update(_batch(data))
    assert torch.isfinite(info["loss/actor"]) and algo.parameters_finite()


def test_a_frozen_backbone_keeps_its_weights_while_the_head_trains(demos):
    algo, data = _agent("regression", demos, freeze_backbone=True)
    policy = algo.model.policy
    backbone0 = {k: v.clone() for k, v in policy.backbone.state_dict().items()}
    head0 = {k: v.clone() for k, v in policy.head.state_dict().items()}
    algo.update(_batch(data))
    assert all(torch.equal(v, policy.backbone.state_dict()[k]) for k, v in backbone0.items())
    assert any(not torch.equal(v, policy.head.state_dict()[k]) for k, v in head0.items())
    assert 0 < algo.model.trainable_fraction() < 1


def test_a_proprioception_of_another_width_is_refused(tmp_path, demos, capsys):
    err = _error(capsys, ["train", "vla_bc", "--env", ENV, "--dataset", str(demos), "--total-steps", "1", *SMALL,
                          "--state-key", "observation.state+observation.environment_state",
                          "--run-dir", str(tmp_path / "w")])
    assert "--proprio-columns" in err and "dims" in err
    assert not (tmp_path / "w" / "checkpoints").exists()
