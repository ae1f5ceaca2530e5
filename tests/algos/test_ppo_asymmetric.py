"""PPO's asymmetric actor-critic: the policy reads the parts a robot has, the critic may read privileged ones too
(``--critic-parts``); a privileged part never reaches the policy, and only the policy is exported."""

from __future__ import annotations

import json

import pytest
import torch

from ctrl_rl.algos.ppo import PPO, PPOConfig
from ctrl_rl.cli import main
from ctrl_rl.core.obs import ObsPart
from ctrl_rl.core.types import Rollout
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.errors import UserInputError

O, P, A, T, N = 3, 5, 2, 8, 16
SPEC = EnvSpec("envpool:Toy-v1", (O,), False, A, (-1.0,) * A, (1.0,) * A, obs_parts=(
    ObsPart("state", (O,), torch.float32), ObsPart("privileged_state", (P,), torch.float32)),
    privileged_parts=("privileged_state",))
CFG = PPOConfig(rollout_steps=T, epochs=2, minibatch_size=64, actor_hidden=(16,), critic_hidden=(16,))


def _obs(g: torch.Generator, *lead: int) -> dict[str, torch.Tensor]:
    return {"state": torch.randn(*lead, O, generator=g), "privileged_state": 3 + 2 * torch.randn(*lead, P, generator=g)}


def _rollout(seed: int) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    obs, final = _obs(g, T, N), _obs(g, T, N)
    # the return depends on the privileged part only: a critic that reads it can fit it
    reward = final["privileged_state"][..., 0] - 3
    return Rollout(obs=obs, action=torch.randn(T, N, A, generator=g).clamp(-1, 1), logp=-torch.rand(T, N, generator=g),
                   reward=reward, terminated=torch.zeros(T, N, dtype=torch.bool),
                   truncated=torch.rand(T, N, generator=g) < 0.1, final_obs=final)


def _ppo(seed: int = 0, **kw) -> PPO:
    return PPO(PPOConfig(**{**CFG.__dict__, **kw}), SPEC, "cpu", torch.Generator().manual_seed(seed))


def test_critic_reads_privileged_parts_and_the_actor_does_not():
    algo = _ppo(critic_parts=("privileged_state",))
    ac = algo.ac
    assert (ac.actor_parts, ac.critic_parts) == (("state",), ("state", "privileged_state"))
    assert ac.actor[0].in_features == O and ac.critic[0].in_features == O + P
    g = torch.Generator().manual_seed(1)
    obs = _obs(g, N)
    other = {**obs, "privileged_state": obs["privileged_state"] + 100.0}
    algo.gen.manual_seed(7)
    a1, l1 = algo.sample(obs)
    algo.gen.manual_seed(7)
    a2, l2 = algo.sample(other)
    assert torch.equal(a1, a2) and torch.equal(l1, l2)  # acting never looks at the privileged part
    assert torch.equal(algo.act(obs, deterministic=True), algo.act(other, deterministic=True))
    assert not torch.equal(ac.value(obs), ac.value(other))  # the value does

    critic_w = ac.critic[0].weight.detach().clone()  # [H, O+P]
    actor_before = [p.detach().clone() for p in ac.actor.parameters()]
    info = algo.update(_rollout(0))
    assert all(torch.isfinite(v).all() for v in info.values())
    assert not torch.equal(ac.critic[0].weight[:, O:], critic_w[:, O:])  # gradients reach the privileged columns
    assert any(not torch.equal(p, q) for p, q in zip(ac.actor.parameters(), actor_before))
    # the privileged part has its own normalizer, fed by the rollout (mean near 3, std near 2)
    norm = ac.part_norms["privileged_state"]
    assert torch.allclose(norm.mean, torch.full((P,), 3.0), atol=0.4) and (norm.var.sqrt() - 2).abs().max() < 0.4


def test_default_keeps_privileged_parts_from_both_networks():
    algo = _ppo()
    assert algo.ac.actor_parts == algo.ac.critic_parts == ("state",) and not algo.ac.asymmetric
    assert algo.ac.critic[0].in_features == O and len(algo.ac.part_norms) == 0
    assert algo.spec.is_flat and algo.spec.parts == (ObsPart("state", (O,), torch.float32),)  # what the export reads
    assert all(torch.isfinite(v).all() for v in algo.update(_rollout(1)).values())


def test_asking_the_actor_to_read_a_privileged_part_is_refused():
    with pytest.raises(UserInputError, match=r"--actor-parts names 'privileged_state', which envpool:Toy-v1 marks "
                                             r"privileged.*--critic-parts privileged_state") as e:
        _ppo(actor_parts=("state", "privileged_state"))
    assert str(e.value).count(". ") == 0  # one sentence
    with pytest.raises(UserInputError, match=r"--critic-parts names the observation part 'privleged_state', which "
                                             r"envpool:Toy-v1 does not have.*did you mean 'privileged_state'"):
        _ppo(critic_parts=("privleged_state",))


def test_state_dict_round_trip_continues_bit_identically():
    a = _ppo(3, critic_parts=("privileged_state",))
    a.update(_rollout(2))
    b = _ppo(4, critic_parts=("privileged_state",))
    b.load_state_dict(a.state_dict())
    ia, ib = a.update(_rollout(3)), b.update(_rollout(3))
    assert all(torch.equal(ia[k], ib[k]) for k in ia)
    assert all(torch.equal(x, y) for x, y in zip(a.ac.state_dict().values(), b.ac.state_dict().values()))


def test_cli_trains_go1_with_a_privileged_critic_resumes_and_exports_the_actor_only(tmp_path, capsys):
    pytest.importorskip("envpool")
    onnxruntime = pytest.importorskip("onnxruntime")
    d = tmp_path / "go1"
    args = ["train", "ppo", "--env", "envpool:Go1JoystickFlatTerrain-v1", "--num-envs", "4", "--total-steps", "256",
            "--rollout-steps", "32", "--minibatch-size", "64", "--epochs", "1", "--critic-parts", "privileged_state",
            "--checkpoint-every", "1", "--no-progress", "--run-dir", str(d)]
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    saved = json.loads((d / "config.json").read_text())
    assert saved["config"]["critic_parts"] == ["privileged_state"] and saved["config"]["actor_parts"] == []
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 256 and all(r["loss/value"] == r["loss/value"] for r in rows)  # finite

    # resume from the run's config and checkpoint with a larger budget: the saved critic parts are used
    assert main(["train", "ppo", "--resume", str(d), "--total-steps", "384", "--no-progress"]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 384

    assert main(["export", str(d)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    meta = json.loads((d / "export" / "policy.json").read_text())
    assert [(i["name"], i["shape"]) for i in meta["inputs"]] == [("state", ["batch", 48])]
    sess = onnxruntime.InferenceSession(str(d / "export" / "policy.onnx"))
    assert [i.name for i in sess.get_inputs()] == ["state"]
    action = sess.run(None, {"state": torch.randn(3, 48).numpy()})[0]
    assert action.shape == (3, 12)
    assert meta["dt"] == pytest.approx(0.02)

    # the deploy runtime runs it against the simulator, feeding only the policy's part
    assert main(["deploy", str(d / "export"), "--sim", "envpool:Go1JoystickFlatTerrain-v1", "--max-steps", "20",
                 "--rate", "0"]) == 0, capsys.readouterr().err


def test_sac_reads_no_privileged_part():
    """SAC has no critic-only inputs: on a task with a privileged part neither network reads it, and its export
    takes the robot's parts only."""
    from ctrl_rl.algos.sac import SAC, SACConfig

    algo = SAC(SACConfig(actor_hidden=(16,), critic_hidden=(16,)), SPEC, "cpu", torch.Generator().manual_seed(0))
    assert algo.spec.is_flat and algo.spec.obs_dim == O and algo.encoder is not None and algo.encoder.out_dim == O
    obs = _obs(torch.Generator().manual_seed(1), N)
    other = {**obs, "privileged_state": obs["privileged_state"] + 100.0}
    assert torch.equal(algo.act(obs, deterministic=True), algo.act(other, deterministic=True))
    policy = algo.exportable()
    assert torch.equal(policy(obs["state"]), algo.act(obs, deterministic=True))  # the export's tensor input


def test_impala_reads_no_privileged_part():
    from ctrl_rl.algos.impala import IMPALA, IMPALAConfig

    algo = IMPALA(IMPALAConfig(actor_hidden=(16,), critic_hidden=(16,)), SPEC, "cpu", torch.Generator().manual_seed(0))
    assert algo.ac.actor[0].in_features == algo.ac.critic[0].in_features == O
    assert algo.spec.is_flat and algo.spec.obs_dim == O  # the export reads state only
    obs = _obs(torch.Generator().manual_seed(1), N)
    assert torch.equal(algo.exportable()(obs["state"]), algo.act(obs, deterministic=True))
