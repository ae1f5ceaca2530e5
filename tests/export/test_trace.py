"""TorchScript export: ``torch.jit.trace(algo.exportable())`` gives the eager policy's actions (atol 1e-5)."""

import pytest
import torch

from ctrl_rl.algos import registry
from ctrl_rl.algos.sac import SAC, SACConfig
from ctrl_rl.algos.sac_flow import SACFlow, SACFlowConfig
from ctrl_rl.core.types import Transition
from ctrl_rl.envs.protocol import EnvSpec

SPEC = EnvSpec("synthetic:cont", (5,), False, 2, (-1.0, -1.0), (1.0, 1.0))
FLOW_SMALL = dict(critic_hidden=(32, 32), flow_hidden=32, noise_hidden=(32,), time_embed_dim=8, d_model=16)


def _batch(B=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transition(torch.randn(B, 5, generator=g), torch.rand(B, 2, generator=g) * 2 - 1,
                      torch.randn(B, generator=g), torch.randn(B, 5, generator=g), torch.rand(B, generator=g) < 0.1,
                      torch.zeros(B, dtype=torch.bool))


CASES = {
    "sac": lambda: SAC(SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16)), SPEC),
    "sac_crossq_brn": lambda: SAC(SACConfig(actor_hidden=(16, 16), critic_hidden=(16, 16), crossq=True,
                                            actor_batch_renorm=True, policy_delay=1, renorm_warmup=1), SPEC),
    "ravl": lambda: SAC(registry.get("ravl").default_config(actor_hidden=(16, 16), critic_hidden=(16, 16),
                                                            num_critics=3, target_subset=3), SPEC),
    **{f"sac_flow_{v}": (lambda v=v: SACFlow(SACFlowConfig(velocity=v, renorm_warmup=1, **FLOW_SMALL), SPEC))
       for v in ("gated", "decoded", "naive")},
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("case", sorted(CASES))
def test_traced_policy_matches_eager(case):
    torch.manual_seed(0)
    algo = CASES[case]()
    for k in range(3):  # moves the weights and, with BatchRenorm, the running statistics away from their init
        algo.update(_batch(seed=k))
    pol = algo.exportable()
    x = torch.randn(7, 5) * 2
    with torch.no_grad():
        traced = torch.jit.trace(pol, x)
        eager = pol(x)
        assert eager.shape == (7, 2) and eager.abs().max() <= 1
        assert torch.allclose(traced(x), eager, atol=1e-5)
        x2 = torch.randn(33, 5)  # another batch size through the same trace
        assert torch.allclose(traced(x2), pol(x2), atol=1e-5)
        # the export is the agent's deterministic action, and tracing left the agent's actor in training mode
        assert torch.allclose(algo.act(x, deterministic=True), eager, atol=1e-6) and algo.actor.training
