"""d3rlpy 2.8.1 as the comparisons run it: its datasets, the settings of its own reproduction scripts, and the
update or fit that the benchmark times or scores. d3rlpy is imported inside each function (``make bench-offline``
installs it; it pins gymnasium 1.0.0, so it is not in the ``bench`` extra).

Used by ``experiments/offline_updates/offline_updates.py`` (gradient steps/s on the same synthetic batch) and
``experiments/d3rlpy_compare/d3rlpy_compare.py`` (scores on the same D4RL-layout file, evaluated by ctrl_rl's
evaluator). Each script's docstring lists the settings matched and the differences that stay.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


# ------------------------------------------------------------------ offline_updates: one gradient step at a time
def mdp_dataset(arrays: dict[str, np.ndarray]):
    """``offline_updates.synthetic_arrays`` as a d3rlpy MDPDataset."""
    import d3rlpy

    return d3rlpy.dataset.MDPDataset(arrays["obs"], arrays["action"], arrays["reward"], arrays["terminal"],
                                     arrays["timeout"])


def update_fns(algo_name: str, dataset, seed: int, hidden: list[int], batch: int
               ) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """(draw a batch, take a gradient step on it) of d3rlpy's IQL or CQL with the networks and weights that
    ``offline_updates.ctrl_rl_runner`` gives ctrl_rl."""
    import d3rlpy
    from d3rlpy.models.encoders import VectorEncoderFactory

    d3rlpy.seed(seed)
    enc = VectorEncoderFactory(hidden_units=hidden)
    if algo_name == "iql":
        cfg = d3rlpy.algos.IQLConfig(actor_encoder_factory=enc, critic_encoder_factory=enc, value_encoder_factory=enc,
                                     batch_size=batch, n_critics=2, expectile=0.7, weight_temp=3.0, max_weight=100.0,
                                     actor_learning_rate=3e-4, critic_learning_rate=3e-4)
    else:
        cfg = d3rlpy.algos.CQLConfig(actor_encoder_factory=enc, critic_encoder_factory=enc, batch_size=batch,
                                     n_critics=2, n_action_samples=10, conservative_weight=5.0, initial_alpha=1.0,
                                     alpha_learning_rate=0.0, initial_temperature=1.0, soft_q_backup=False,
                                     max_q_backup=False, actor_learning_rate=1e-4, critic_learning_rate=3e-4,
                                     temp_learning_rate=1e-4)
    algo = cfg.create(device="cpu:0")
    algo.build_with_dataset(dataset)
    return (lambda: dataset.sample_transition_batch(batch)), algo.update


# ------------------------------------------------------------------------ d3rlpy_compare: whole scored runs
def load_mdp_dataset(path: Path):
    """The D4RL-layout file as a d3rlpy MDPDataset (terminals and timeouts as d3rlpy's D4RL loader takes them)."""
    import d3rlpy
    import h5py

    with h5py.File(path, "r") as f:
        obs, act = np.asarray(f["observations"], np.float32), np.asarray(f["actions"], np.float32)
        rew = np.asarray(f["rewards"], np.float32)
        term, tout = np.asarray(f["terminals"], np.float32), np.asarray(f["timeouts"], np.float32)
    tout[-1] = 1.0 if not term[-1] else 0.0  # the file's last episode ends with it
    return d3rlpy.dataset.MDPDataset(obs, act, rew, term, tout)


def reproduction_config(algo: str):
    """d3rlpy's ``IQLConfig`` / ``CQLConfig`` with the settings of its ``reproductions/offline/{iql,cql}.py``."""
    import d3rlpy

    if algo == "iql":
        return d3rlpy.algos.IQLConfig(
            actor_learning_rate=3e-4, critic_learning_rate=3e-4, batch_size=256, weight_temp=3.0, max_weight=100.0,
            expectile=0.7, reward_scaler=d3rlpy.preprocessing.ReturnBasedRewardScaler(multiplier=1000.0),
            actor_optim_factory=d3rlpy.optimizers.AdamFactory(
                lr_scheduler_factory=d3rlpy.optimizers.CosineAnnealingLRFactory(T_max=500_000)))
    enc = d3rlpy.models.encoders.VectorEncoderFactory([256, 256, 256])
    return d3rlpy.algos.CQLConfig(
        actor_learning_rate=1e-4, critic_learning_rate=3e-4, temp_learning_rate=1e-4, actor_encoder_factory=enc,
        critic_encoder_factory=enc, batch_size=256, n_action_samples=10, alpha_learning_rate=0.0,
        conservative_weight=5.0)


def fit_with_ctrl_rl_eval(a: argparse.Namespace) -> None:
    """One d3rlpy run (d3rlpy_compare's worker process): fit ``a.algo`` on ``a.data`` for ``a.steps`` gradient steps,
    evaluating with ctrl_rl's evaluator (``a.eval_episodes`` episodes of ``a.env``) after every epoch of
    ``a.eval_every`` steps; rows go to ``a.run_dir``/metrics.jsonl as a ctrl_rl run writes them."""
    import d3rlpy
    import torch

    from ctrl_rl.learn.config import RunConfig
    from ctrl_rl.learn.evaluate import run_episodes
    from ctrl_rl.learn.runtime import build_env
    from ctrl_rl.storage.datasets.scores import normalized_score

    torch.set_num_threads(1)
    out = Path(a.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    d3rlpy.seed(a.seed)
    dataset = load_mdp_dataset(Path(a.data))
    algo = reproduction_config(a.algo).create(device="cpu:0")
    run = RunConfig(env=a.env, seed=a.seed, reward_scale=False)
    metrics = (out / "metrics.jsonl").open("w")
    t0 = time.perf_counter()
    eval_s = 0.0

    import gymnasium

    space = gymnasium.make(a.env).action_space
    if float(space.low.min()) != -1 or float(space.high.max()) != 1 or float(space.low.max()) != -1:
        raise SystemExit(f"{a.env}: actions are not in [-1, 1]; d3rlpy's actions would need rescaling here")

    def evaluate(algo_, epoch: int, total_step: int) -> None:
        nonlocal eval_s
        t = time.perf_counter()
        env = build_env(run, a.eval_episodes, a.seed + 10_000)  # ActionRescale is the identity on [-1, 1]
        try:
            returns, _, _ = run_episodes(lambda o: torch.as_tensor(algo_.predict(o.cpu().numpy())), env,
                                         a.seed + 10_000)
        finally:
            env.close()
        mean = float(returns.mean())
        eval_s += time.perf_counter() - t
        row = {"step": total_step, "episode_return": mean, "normalized_score": normalized_score(a.env, mean)[0],
               "wall_time": time.perf_counter() - t0, "eval_time": eval_s}
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    algo.fit(dataset, n_steps=a.steps, n_steps_per_epoch=a.eval_every, show_progress=False, save_interval=10**9,
             logger_adapter=d3rlpy.logging.NoopAdapterFactory(), epoch_callback=evaluate)
    metrics.close()
