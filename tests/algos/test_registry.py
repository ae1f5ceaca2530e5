"""The algorithm registry: every built-in algorithm is an entry, and a new algorithm defined in this file trains
through the CLI entry point and the loop of its regime without any change to ctrl_rl.learn or ctrl_rl.cli."""

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from ctrl_rl.algos import registry
from ctrl_rl.algos.registry import AlgoEntry, register
from ctrl_rl.cli import main
from ctrl_rl.core.provenance import code_version
from ctrl_rl.errors import UserInputError
from ctrl_rl.learn.regimes import get_regime


@dataclass(frozen=True)
class ToyConfig:
    """A deterministic linear policy trained to imitate the action that maximises Pendulum's reward locally."""

    lr: float = 1e-2
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount (unused; the loops read it for reward scaling)."""
    noise: float = 0.3
    """Std of the Gaussian exploration noise."""


class ToyAlgo:
    """Regresses a linear policy onto the batch's actions weighted by their reward (a bandit-style update)."""

    def __init__(self, config: ToyConfig, spec, device="cpu", generator=None):
        self.config, self.device = config, torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(device=self.device)
        self.policy = nn.Linear(spec.obs_dim, spec.action_dim).to(self.device)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.updates = 0

    @torch.no_grad()
    def act(self, obs, deterministic=False):
        a = torch.tanh(self.policy(obs))
        if deterministic:
            return a
        return (a + self.config.noise * torch.randn(a.shape, generator=self.gen, device=a.device)).clamp(-1, 1)

    def update(self, batch):
        w = torch.softmax(batch.reward, 0).detach()  # [B]
        loss = (w[:, None] * (torch.tanh(self.policy(batch.obs)) - batch.action).square()).sum()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.updates += 1
        return {"loss/toy": loss.detach()}

    def parameters_finite(self):
        return all(bool(p.isfinite().all()) for p in self.policy.parameters())

    def exportable(self):
        return nn.Sequential(self.policy, nn.Tanh())

    def state_dict(self):
        return {"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "updates": self.updates,
                "gen": self.gen.get_state()}

    def load_state_dict(self, state):
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])
        self.updates = state["updates"]
        self.gen.set_state(state["gen"])


@pytest.fixture
def toy():
    entry = register(AlgoEntry("toy_bandit", ToyConfig, ToyAlgo, regime="off-policy", summary="a test algorithm",
                               run_defaults={"num_envs": 2, "total_steps": 400, "log_every": 50,
                                            "checkpoint_every": 100},
                               loop_defaults={"batch_size": 16, "learning_starts": 40}))
    yield entry
    registry.unregister("toy_bandit")


def test_every_builtin_algorithm_is_registered_with_a_regime_and_summary():
    names = registry.names()
    assert {"ppo", "sac", "sac_flow", "cql", "calql", "iql", "wsrl", "rlpd", "sac_flow_o2o"} <= set(names)
    for e in registry.entries():
        assert get_regime(e.regime) and e.summary and e.default_config() is not None


def test_a_toy_algorithm_trains_through_the_cli_entry_point_and_resumes(toy, tmp_path, capsys):
    d = tmp_path / "toy"
    assert main(["train", "toy_bandit", "--env", "torch:Pendulum", "--run-dir", str(d), "--no-progress",
                 "--lr", "0.02", "--utd-ratio", "0.5"]) == 0
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["algo"] == "toy_bandit" and cfg["config"]["lr"] == 0.02
    assert cfg["run"]["loop"]["batch_size"] == 16 and cfg["run"]["loop"]["utd_ratio"] == 0.5  # entry + flag
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 400 and "loss/toy" in rows[-1]
    # iterations 20..200 of 2 envs reach step >= 40 (the warm-up) and make 2 x 0.5 = 1 update each: the
    # off-policy loop drove the toy's update
    assert rows[-1]["updates"] == 181
    assert cfg["code"] == {"started": code_version()}  # the code the run ran: version and commit
    old = {**cfg["code"]["started"], "git": "0123456789ab"}
    (d / "config.json").write_text(json.dumps({**cfg, "code": {"started": old}}))  # as if started by other code
    assert main(["train", "toy_bandit", "--resume", str(d), "--total-steps", "600", "--no-progress"]) == 0
    assert [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()][-1]["step"] == 600
    assert json.loads((d / "config.json").read_text())["code"] == {"started": old, "resumed": code_version()}
    assert main(["eval", str(d), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert '"return_mean"' in out
    assert main(["list", "algos"]) == 0
    assert "toy_bandit" in capsys.readouterr().out


def test_unknown_algorithm_and_duplicate_registration_are_refused(toy):
    with pytest.raises(UserInputError, match="unknown algorithm 'toy_bandt'.*did you mean 'toy_bandit'"):
        registry.get("toy_bandt")
    with pytest.raises(ValueError, match="already registered"):
        register(toy)
    odd = AlgoEntry("x", ToyConfig, ToyAlgo, regime="bandit", summary="")  # refused when it is trained
    with pytest.raises(UserInputError, match="unknown regime 'bandit'"):
        get_regime(odd.regime)
