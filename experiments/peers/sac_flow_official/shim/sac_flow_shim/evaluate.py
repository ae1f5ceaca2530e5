"""The deterministic evaluation that the official scripts do not have (they log training episodes only).

The policy is the official actor's own forward pass with every Gaussian draw replaced by zeros: ``jax.random.normal``
returns zeros while this module traces its policy function. For the Gaussian script (``sac_continuous_action_jax``)
that is ``tanh(mean) * scale + bias``; for the flows it is the noise-free Euler path from ``A_0 = 0`` (Flow-G:
``A_{i+1} = A_i + dt * v``; Flow-T: ``A_{i+1} = A_i + dt * mu_i``), both as in ctrl_rl's deterministic action. The
BatchRenorm layers use their running statistics (``training=False``), as the official action selection does.

Nothing the official training uses is touched: the parameters are read from the script's globals; the policy is a
``jax.jit`` of this module's own function around the unjitted ``flax.linen.Module.apply`` (never one of the
official jitted functions, whose trace caches a zero-noise trace could otherwise enter), and that function is only
ever traced and called inside the patch; the evaluation env is a fresh ``gym.make(env_id)`` per evaluation; no
global NumPy, Python or JAX random state is read or advanced. README.md lists the check that a run's training
episodes are identical with and without evaluations.
"""

from __future__ import annotations

import contextlib
import time

from . import record


@contextlib.contextmanager
def noise_free():
    """``jax.random.normal`` returns zeros inside the block."""
    import jax
    import jax.numpy as jnp

    normal = jax.random.normal

    def zeros(key, shape=(), dtype=float, *args, **kwargs):
        return jnp.zeros(shape, dtype)

    jax.random.normal = zeros
    try:
        yield
    finally:
        jax.random.normal = normal


class Evaluator:
    """``episodes`` episodes of the deterministic policy on ``gym.make(args.env_id)``, episode ``k`` reset with
    seed ``args.seed + seed_offset + k``; one ``eval`` row in shim.jsonl per call. ``script``: the script's globals."""

    def __init__(self, script: dict, episodes: int, seed_offset: int = 10_000):
        self.g, self.episodes, self.seed_offset = script, episodes, seed_offset
        self.policy = None
        self.probe = True  # the first call checks that the action does not depend on the key

    def build(self):
        """``(variables, act)``: a function of the script's globals giving the actor's current variables, and the
        jitted deterministic policy ``act(variables, obs [B,O], key) -> action [B,A]``."""
        import flax.linen as nn
        import jax

        g = self.g
        actor = g["actor"]
        if "sample_action_and_log_prob" in g:  # the Gaussian script: actor(obs) -> (mean, log_std)
            sample = g["sample_action_and_log_prob"]

            def variables(g):
                return g["actor_state"].params  # {"params": ...} as the script initialised it

            def act(v, obs, key):
                mean, log_std = nn.Module.apply(actor, v, obs)
                return sample(mean, log_std, actor.action_scale, actor.action_bias, key)[0]
        else:  # the flows: actor(obs, key, training) -> (action, log_prob)
            def variables(g):
                state = g["actor_state"]
                bn = g["args"].use_batch_norm
                return {"params": state.params, **({"batch_stats": state.batch_stats} if bn else {})}

            def act(v, obs, key):
                return nn.Module.apply(actor, v, obs, key=key, training=False)[0]
        return variables, jax.jit(act)

    def __call__(self, steps: int) -> None:
        import gymnasium as gym
        import jax
        import numpy as np

        g = self.g
        args = g["args"]
        t0 = time.perf_counter()
        key = jax.random.PRNGKey(0)  # a fixed key: with the draws zeroed, the action does not depend on it
        returns, lengths = [], []
        env = gym.make(args.env_id)
        try:
            with noise_free():
                if self.policy is None:
                    self.policy = self.build()
                variables, act = self.policy
                v = variables(g)
                if self.probe:
                    self.probe = False
                    probe = np.linspace(-1, 1, 2 * env.observation_space.shape[0], dtype=np.float32).reshape(2, -1)
                    a0, a1 = (np.asarray(act(v, probe, jax.random.PRNGKey(k))) for k in (0, 1))
                    if not np.array_equal(a0, a1):
                        raise RuntimeError("the evaluation policy is not deterministic: the official actor draws "
                                           "noise by another function than jax.random.normal")
                for k in range(self.episodes):
                    obs, _ = env.reset(seed=args.seed + self.seed_offset + k)
                    ret, n, done = 0.0, 0, False
                    while not done:
                        action = np.asarray(act(v, obs[None], key))[0]
                        obs, reward, terminated, truncated, _ = env.step(action)
                        ret, n, done = ret + float(reward), n + 1, terminated or truncated
                    returns.append(ret)
                    lengths.append(n)
        finally:
            env.close()
        record.write("shim", {"_event": "eval", "env_steps": steps, "return_mean": float(np.mean(returns)),
                              "return_std": float(np.std(returns)), "returns": returns, "lengths": lengths,
                              "eval_s": round(time.perf_counter() - t0, 3)})
        print(f"[shim] eval at {steps} env steps: return {np.mean(returns):.1f} +- {np.std(returns):.1f} "
              f"({self.episodes} episodes, {time.perf_counter() - t0:.1f} s)", flush=True)
