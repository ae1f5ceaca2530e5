"""Check the shim's deterministic evaluation policy against the official actors (run in the peer venv):

    /work/peers/sac-flow-venv/bin/python experiments/peers/sac_flow_official/check_policy.py [CHECKOUT]

The official modules are imported without running their ``__main__`` block. On random actors (Hopper's sizes,
perturbed parameters), the policy of ``sac_flow_shim.evaluate`` must be: for SAC, ``tanh(mean)`` from the actor's
own forward pass; for Flow-G, the Euler path from ``A_0 = 0`` written here from the official ``Actor.flow_step``
(``A_{i+1} = A_i + dt * v(s, A_i, t_i)``); for Flow-T, independent of the key and unlike the noisy action. Prints
the gaps and exits 1 when one is off.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    checkout = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/peers/SAC-FLOW")
    sys.path[:0] = [str(HERE / "shim"), str(checkout)]
    import torch.utils
    from sac_flow_shim import evaluate, tensorboard

    sys.modules["torch.utils.tensorboard"] = tensorboard
    torch.utils.tensorboard = tensorboard
    import jax
    import jax.numpy as jnp

    def module(name: str):
        spec = importlib.util.spec_from_file_location(name, checkout / "from_scratch_code" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def perturb(v):
        keys = iter(jax.random.split(jax.random.PRNGKey(3), len(jax.tree.leaves(v))))
        return jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape)
                            if getattr(x, "dtype", None) == jnp.float32 else x, v)

    class Args:
        use_batch_norm = True

    B, O, A, K = 3, 11, 3, 4
    obs = jnp.linspace(-1, 1, B * O).reshape(B, O)  # [B,O]
    scale, bias = jnp.full(A, 1.0), jnp.zeros(A)
    key = jax.random.PRNGKey(5)
    ok = True

    def shim_action(globals_: dict, v, k):
        _, act = evaluate.Evaluator(globals_, 1).build()
        with evaluate.noise_free():
            return act(v, obs, k)  # [B,A]

    m = module("sac_continuous_action_jax")
    actor = m.Actor(action_dim=A, action_scale=scale, action_bias=bias)
    v = perturb(actor.init(jax.random.PRNGKey(1), obs))
    mean, _ = actor.apply(v, obs)
    gap = float(jnp.abs(shim_action({"actor": actor, "sample_action_and_log_prob": m.sample_action_and_log_prob},
                                    v, key) - jnp.tanh(mean)).max())
    print(f"sac:    max |shim - tanh(mean)| = {gap:.2e}")
    ok &= gap < 1e-6

    m = module("SAC_flow_gru_jax")
    actor = m.Actor(action_dim=A, action_scale=scale, action_bias=bias, obs_dim=O, denoising_steps=K, hidden_dim=512)
    v = perturb(actor.init(jax.random.PRNGKey(1), obs, key=jax.random.PRNGKey(0), training=True))
    x, dt = jnp.zeros((B, A)), 1.0 / K  # [B,A]
    for i in range(K):
        u, _ = actor.apply(v, obs, x, jnp.full((B, 1), i * dt), False, method=m.Actor.flow_step)
        x = x + dt * u
    shim = shim_action({"actor": actor, "args": Args}, v, key)
    noisy = actor.apply(v, obs, key=key, training=False)[0]
    gap, moved = float(jnp.abs(shim - jnp.tanh(x)).max()), float(jnp.abs(noisy - jnp.tanh(x)).max())
    print(f"flow-g: max |shim - noise-free Euler path| = {gap:.2e} (noisy action: {moved:.2f} away)")
    ok &= gap < 1e-5 and moved > 1e-2

    m = module("SAC_flow_transformer_jax")
    actor = m.TransformerFlowActor(action_dim=A, action_scale=scale, action_bias=bias, obs_dim=O, d_model=96)
    v = perturb(actor.init(jax.random.PRNGKey(1), obs, key=jax.random.PRNGKey(0), training=True))
    a0, a1 = (shim_action({"actor": actor, "args": Args}, v, jax.random.PRNGKey(k)) for k in (5, 6))
    moved = float(jnp.abs(actor.apply(v, obs, key=key, training=False)[0] - a0).max())
    print(f"flow-t: key-independent {bool(jnp.array_equal(a0, a1))} (noisy action: {moved:.2f} away)")
    ok &= bool(jnp.array_equal(a0, a1)) and moved > 1e-2
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
