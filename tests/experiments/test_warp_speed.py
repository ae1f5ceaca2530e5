"""The massively parallel PPO presets of the MuJoCo Warp tasks (experiments/presets/warp-*.json) and the benchmark
experiments/warp_speed/warp_speed.py: each preset holds its published update at 4096 worlds and keeps it at fewer
worlds under the co-scaling rule, and trains from the CLI on Warp's CPU device with a few worlds (HalfCheetah in the
default suite, the other four ``slow``: ~10 s each with a warm kernel cache); the script measures, writes its
results and refuses ``--device cuda`` / ``--time-to`` on a machine without CUDA. The ``gpu``-marked tests train the
preset with its 4096 worlds on CUDA and run the script there."""

import json
import os

import pytest
import torch

from ctrl_rl.algos.ppo import PPOConfig, scale_envs
from ctrl_rl.learn.config import from_dict, load_preset
from tests.scripts import cli, experiment_script

PRESETS = {"warp-halfcheetah": "HalfCheetah-v5", "warp-hopper": "Hopper-v5", "warp-walker2d": "Walker2d-v5",
           "warp-ant": "Ant-v5", "warp-humanoid": "Humanoid-v5"}
# The published update (experiments/warp_speed/README.md): samples per update (brax: batch_size x num_minibatches x
# unroll_length), minibatches, epochs (num_updates_per_batch), discount, learning rate, entropy cost. HalfCheetah,
# Ant, Humanoid: brax's training notebook; Hopper, Walker2d: MuJoCo Playground's dm_control suite config.
PUBLISHED = {"warp-halfcheetah": (512 * 32 * 20, 32, 8, 0.95, 3e-4, 1e-3),
             "warp-ant": (2048 * 32 * 5, 32, 4, 0.97, 3e-4, 1e-2),
             "warp-humanoid": (1024 * 32 * 10, 32, 8, 0.97, 3e-4, 1e-3),
             "warp-hopper": (1024 * 32 * 30, 32, 16, 0.995, 1e-3, 1e-2),
             "warp-walker2d": (1024 * 32 * 30, 32, 16, 0.995, 1e-3, 1e-2)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_holds_the_published_update_at_4096_worlds_and_256_co_scaled(name):
    p = load_preset(name)
    assert p.algo == "ppo" and p.run["env"] == f"warp:{PRESETS[name]}" and p.run["num_envs"] == 4096
    cfg = from_dict(PPOConfig, p.config, name)
    samples, minibatches, epochs, gamma, lr, ent = PUBLISHED[name]
    assert 4096 * cfg.rollout_steps == samples and samples // cfg.minibatch_size == minibatches
    assert (cfg.epochs, cfg.gamma, cfg.lr, cfg.ent_coef) == (epochs, gamma, lr, ent)
    # brax PPO's defaults: clip 0.3 without value clipping, no gradient clipping, 32x4 / 256x5 swish networks
    assert (cfg.clip_eps, cfg.clip_value_loss, cfg.max_grad_norm, cfg.activation) == (0.3, False, 0.0, "silu")
    assert cfg.actor_hidden == (32,) * 4 and cfg.critic_hidden == (256,) * 5
    # a CPU with 256 worlds: --scale-envs 16 gives the preset's 4096 and changes nothing of the inner loop
    n, scaled = scale_envs(256, cfg, 16)
    assert n == 4096 and scaled == cfg and (256 * cfg.rollout_steps) // cfg.minibatch_size == minibatches // 16


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n == "warp-halfcheetah" else pytest.mark.slow)
                                  for n in sorted(PRESETS)])
def test_preset_trains_two_iterations_from_the_cli_on_warps_cpu_device(name, tmp_path):
    pytest.importorskip("mujoco_warp")
    d = tmp_path / "run"
    r = cli("train", "ppo", "--preset", name, "--device", "cpu", "--run-dir", d, "--num-envs", "4",
            "--rollout-steps", "8", "--minibatch-size", "16", "--total-steps", "64", "--threads", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 64
    saved = json.loads((d / "config.json").read_text())
    assert saved["run"]["preset"] == name and saved["run"]["env"] == f"warp:{PRESETS[name]}"
    assert saved["config"]["epochs"] == PUBLISHED[name][2] and saved["config"]["critic_hidden"] == [256] * 5
    assert len((d / "metrics.jsonl").read_text().splitlines()) == 2


def test_script_refuses_cuda_and_time_to_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with experiment_script("experiments/warp_speed/warp_speed.py", "warp_speed") as mod:
        for args, words in ((["--device", "cuda"], "--device cuda needs a CUDA GPU"),
                            (["--time-to", "3000"], "--time-to 3000 trains 4096 worlds"),
                            (["--max-worlds", "100"], "--max-worlds 100 is not a power of two")):
            with pytest.raises(SystemExit) as e:
                mod.parse(args)
            assert e.value.code == 2 and words in capsys.readouterr().err


def test_script_measures_warp_and_envpool_and_writes_its_results(tmp_path, monkeypatch):
    pytest.importorskip("mujoco_warp")
    pytest.importorskip("envpool")
    with experiment_script("experiments/warp_speed/warp_speed.py", "warp_speed") as mod:
        monkeypatch.setattr(mod, "STEP_SAMPLES", 64)
        monkeypatch.setattr(mod, "PPO_SAMPLES", 64)
        p = mod.main(["--min-worlds", "8", "--max-worlds", "16", "--envpool-max-worlds", "8", "--repeats", "2",
                      "--threads", "1", "--out", str(tmp_path)])
    rows = {r["worlds"]: r for r in p["rows"]}
    assert sorted(rows) == [8, 16] and "envpool_step" in rows[8] and "envpool_step" not in rows[16]
    assert all(len(rows[8][k]["values"]) == 2 and rows[8][k]["median"] > 0
               for k in ("warp_step", "warp_ppo", "envpool_step", "envpool_ppo"))
    saved = json.loads((tmp_path / "warp_speed.json").read_text())
    assert saved["device_name"] and "load average" in saved["load_before"]
    assert "| 8 |" in (tmp_path / "warp_speed.md").read_text()
    assert (tmp_path / "warp_speed.png").stat().st_size > 1000


def test_time_to_records_every_logged_iteration_and_the_first_at_the_target(monkeypatch):
    calls = []

    def fake_cli(args):  # stands in for `train ppo` on a GPU: returns 1000, 2500, 3100 at 3 logged iterations
        calls.append(args)
        run = args[args.index("--run-dir") + 1]
        os.makedirs(run)
        rows = [{"step": 4096 * k, "wall_time": 2.0 * k, "episode_return": ret}
                for k, ret in enumerate([None, 1000.0, 2500.0, 3100.0], start=1)]
        with open(f"{run}/metrics.jsonl", "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows))
        return 0, ""

    with experiment_script("experiments/warp_speed/warp_speed.py", "warp_speed") as mod:
        monkeypatch.setattr(mod, "train_cli", fake_cli)
        out = mod.time_to("HalfCheetah-v5", 3000.0, [0, 1], budget=10**6)
    args = calls[0]
    assert args[args.index("--preset") + 1] == "warp-halfcheetah" and args[args.index("--num-envs") + 1] == "4096"
    assert args[args.index("--device") + 1] == "cuda"
    run = out["runs"][0]
    assert [e["return"] for e in run["evaluations"]] == [1000.0, 2500.0, 3100.0]
    assert (run["time_s"], run["step"], out["median_s"], out["reached"]) == (8.0, 4 * 4096, 8.0, "2 of 2 seeds")


# ---- CUDA --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_preset_trains_on_cuda_with_its_4096_worlds(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("mujoco_warp")
    d = tmp_path / "run"
    r = cli("train", "ppo", "--preset", "warp-halfcheetah", "--device", "cuda", "--run-dir", d, "--rollout-steps", "8",
            "--total-steps", str(2 * 4096 * 8), "--no-progress")
    assert r.returncode == 0, r.stderr
    saved = json.loads((d / "config.json").read_text())
    assert saved["run"]["num_envs"] == 4096 and saved["run"]["device"] == "cuda"
    assert len((d / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.gpu
def test_script_on_cuda_names_the_gpu_and_skips_envpool(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("mujoco_warp")
    with experiment_script("experiments/warp_speed/warp_speed.py", "warp_speed") as mod:
        monkeypatch.setattr(mod, "PPO_SAMPLES", 256)
        p = mod.main(["--device", "cuda", "--min-worlds", "64", "--max-worlds", "128", "--repeats", "1",
                      "--out", str(tmp_path)])
    assert p["device_name"] == torch.cuda.get_device_name(0)
    assert [sorted(r) for r in p["rows"]] == [["warp_ppo", "warp_step", "worlds"]] * 2
