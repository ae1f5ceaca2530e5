"""Stable-Baselines3 as the benchmarks run it beside ctrl_rl: each function builds SB3's model with the settings the
benchmark names and returns what that benchmark measures. SB3 is imported inside each function (the ``bench``
extra installs it).

Used by ``experiments/ppo_halfcheetah_sps/`` (PPO env-steps/s), ``experiments/time_to_3000/`` (PPO wall time to a
return), ``experiments/sac_updates/`` (SAC updates/s) and ``experiments/sac_default_speed/`` (whole SAC runs with
each library's defaults) and ``experiments/fast_sac/`` (SAC's evaluation return against wall time); each script's
docstring says what is matched.
"""

from __future__ import annotations

import time
from typing import Any


def ppo_steps_per_s(steps: int, seed: int, preset: dict | None = None) -> float:
    """SB3 PPO's env-steps/s over ``learn(steps)`` on HalfCheetah-v5 (DummyVecEnv of gymnasium envs). With a ctrl_rl
    ``preset`` (its ``run`` and ``config``): the same network, env count, rollout length, minibatch size, epochs and
    coefficients; without: SB3's defaults with 8 envs."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    if preset is not None:
        c, r = preset["config"], preset["run"]
        n_envs = r["num_envs"]
        kw: dict[str, Any] = dict(n_steps=c["rollout_steps"], batch_size=c["minibatch_size"], n_epochs=c["epochs"],
                  learning_rate=c["lr"], gamma=c["gamma"], gae_lambda=c["gae_lambda"], clip_range=c["clip_eps"],
                  max_grad_norm=c["max_grad_norm"],
                  policy_kwargs=dict(net_arch=dict(pi=list(c["actor_hidden"]), vf=list(c["critic_hidden"])),
                                     activation_fn=torch.nn.Tanh, log_std_init=c["init_log_std"]))
    else:
        n_envs, kw = 8, {}
    env = make_vec_env("HalfCheetah-v5", n_envs=n_envs, seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)
    t = time.perf_counter()
    model.learn(total_timesteps=steps)
    return model.num_timesteps / (time.perf_counter() - t)


def ppo_time_to_return(seed: int, budget_s: float, target: float) -> dict:
    """Wall time from the start of ``learn()`` until the mean of SB3 PPO's last 10 finished training episodes on
    HalfCheetah-v5 reaches ``target``, with the rl-zoo HalfCheetah hyperparameters (1 env, VecNormalize obs+reward,
    n_steps 512, batch 64, 20 epochs, lr 2.0633e-5, clip 0.1, gamma 0.98, lambda 0.92, ent 4.0e-4, vf 0.58, grad
    clip 0.8, 256x256 ReLU, log_std_init -2, no ortho init); stops at ``budget_s`` seconds (``time_s`` None)."""
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    class Stop(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0 = time.perf_counter()
            self.hit = None
            self.last = float("nan")

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            if len(self.returns) >= 10:
                self.last = float(np.mean(self.returns[-10:]))
                if self.last >= target and self.hit is None:
                    self.hit = (time.perf_counter() - self.t0, self.num_timesteps)
                    return False
            return time.perf_counter() - self.t0 < budget_s

        def _on_training_start(self) -> None:
            self.returns = []
            self.t0 = time.perf_counter()

    env = VecNormalize(make_vec_env("HalfCheetah-v5", n_envs=1, seed=seed), norm_obs=True, norm_reward=True)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, n_steps=512, batch_size=64, gamma=0.98,
                learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92,
                max_grad_norm=0.8, vf_coef=0.58096,
                policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                                   net_arch=dict(pi=[256, 256], vf=[256, 256])))
    cb = Stop()
    model.learn(total_timesteps=10_000_000, callback=cb)
    return {"seed": seed, "time_s": cb.hit[0] if cb.hit else None, "step": cb.hit[1] if cb.hit else None,
            "final_return": cb.last, "steps_run": model.num_timesteps}


def sac_updates_per_s(warmup: int, updates: int, seed: int, threads: int) -> float:
    """SB3 SAC's updates/s on gymnasium HalfCheetah-v5 with one env, 256x256 networks, batch 256, UTD 1, replay 1M:
    ``warmup`` random steps, then ``updates`` steps with one update each, timed by a callback from a tenth of the
    way in (start-up and warm-up excluded)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(threads)

    class Clock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0 = self.n0 = None

        def _on_step(self) -> bool:
            if self.t0 is None and self.num_timesteps >= warmup + updates // 10:
                self.t0, self.n0 = time.perf_counter(), self.num_timesteps
            return True

    clock = Clock()
    model = SAC("MlpPolicy", gym.make("HalfCheetah-v5"), batch_size=256, buffer_size=1_000_000, learning_starts=warmup,
                train_freq=1, gradient_steps=1, learning_rate=3e-4, tau=0.005, gamma=0.99, seed=seed,
                policy_kwargs=dict(net_arch=[256, 256]), verbose=0, device="cpu")
    model.learn(total_timesteps=warmup + updates, callback=clock)
    t0, n0 = clock.t0, clock.n0
    assert t0 is not None and n0 is not None, "the run ended before the clock started"
    return (int(model.num_timesteps) - n0) / (time.perf_counter() - t0)


def sac_default_run(warmup: int, learning: int, seed: int) -> dict:
    """SB3 SAC as a user starts it, its defaults except the warm-up: ``SAC("MlpPolicy", "HalfCheetah-v5",
    learning_starts=warmup, seed=seed).learn(warmup + learning)`` (256x256 networks, batch 256, UTD 1, replay 1M,
    gymnasium env, torch's default thread count, CPU). Returns the updates made and the torch threads used."""
    import torch
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", "HalfCheetah-v5", learning_starts=warmup, seed=seed, verbose=0, device="cpu")
    model.learn(total_timesteps=warmup + learning)
    return {"updates": int(model._n_updates), "torch_threads": torch.get_num_threads()}


def sac_eval_curve(seed: int, budget_steps: int, budget_s: float, eval_every: int, eval_episodes: int,
                   stop_return: float | None = None) -> dict:
    """SB3 SAC with rl-zoo's HalfCheetah settings (``hyperparams/sac.yml``: ``learning_starts`` 10,000 and SB3's SAC
    defaults otherwise: 1 gymnasium env, 256x256, batch 256, lr 3e-4, tau 0.005, gamma 0.99, UTD 1, replay 1M, entropy
    coefficient learned, torch's default thread count) on HalfCheetah-v5, its deterministic policy evaluated on a
    separate env every ``eval_every`` steps (``eval_episodes`` episodes, seeds seed + 10000 + k) from step 0.

    Stops at ``budget_steps`` env steps, at ``budget_s`` seconds of training (wall time of ``learn()`` less the time
    spent evaluating), or once an evaluation reaches ``stop_return``. Returns the curve ``[[step, train_s, wall_s,
    eval_return], ...]`` and the steps run."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    eval_env = gym.make("HalfCheetah-v5")

    def evaluate(model) -> float:
        total = []
        for k in range(eval_episodes):
            obs, _ = eval_env.reset(seed=seed + 10_000 + k)
            ret, done = 0.0, False
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, r, term, trunc, _ = eval_env.step(action)
                ret += float(r)
                done = term or trunc
            total.append(ret)
        return float(np.mean(total))

    class Curve(BaseCallback):
        def __init__(self):
            super().__init__()
            self.curve: list[list[float]] = []
            self.t0 = time.perf_counter()
            self.eval_s = 0.0
            self.next_eval = 0

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()
            self.record()  # step 0

        def train_s(self) -> float:
            return time.perf_counter() - self.t0 - self.eval_s

        def record(self) -> bool:
            """Evaluate now; False when the run should stop."""
            wall, train = time.perf_counter() - self.t0, self.train_s()
            t = time.perf_counter()
            ret = evaluate(self.model)
            self.eval_s += time.perf_counter() - t
            self.curve.append([int(self.num_timesteps), round(train, 3), round(wall, 3), ret])
            self.next_eval += eval_every
            return stop_return is None or ret < stop_return

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval and not self.record():
                return False
            return self.train_s() < budget_s

    cb = Curve()
    model = SAC("MlpPolicy", "HalfCheetah-v5", learning_starts=10_000, seed=seed, verbose=0, device="cpu")
    model.learn(total_timesteps=budget_steps, callback=cb)
    if not cb.curve or cb.curve[-1][0] != model.num_timesteps:
        cb.record()  # the return where the run stopped
    return {"curve": cb.curve, "steps_run": int(model.num_timesteps), "eval_s": round(cb.eval_s, 3)}
